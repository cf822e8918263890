"""Which nodes `--cluster` means: an AWS cluster found by its tags, `local`, or an inventory file.

    resolve_cluster(None)                  the only xeon-cluster cluster running in the region
    resolve_cluster("demo")                AWS cluster "demo" (tag xeon-cluster:cluster=demo)
    resolve_cluster("local")               the local cluster named local (`fab local-up`)
    resolve_cluster("local:bench8")        the local cluster named bench8
    resolve_cluster("lab.yaml")            an inventory file (cluster/inventory.py format)

Every task calls this once and then works on the returned Inventory (master first). Every
failure is a ClusterSelectionError whose message says what was looked for, what was found and
what to do.

AWS clusters are found by node_setup/aws/discovery.py, imported only when one is asked for (boto3).
The error and the key variable both kinds share are cluster/inventory.py's (so neither module imports
the other's caller).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Mapping

import yaml

from cluster.inventory import KEY_ENV, ClusterSelectionError, Inventory, InventoryError
from node_setup.local import cluster as local_cluster
from node_setup.local import state as local_state

__all__ = ["KEY_ENV", "ClusterSelectionError", "resolve_cluster", "load_inventory_file", "local_inventory"]

LOCAL = "local"
INVENTORY_SUFFIXES = (".yaml", ".yml")


def resolve_cluster(cluster: str | None, region: str | None = None) -> Inventory:
    """The Inventory that `--cluster` names (see the module docstring); master first."""
    cluster = (cluster or "").strip() or None
    if cluster is None:
        return _aws_cluster(None, region)
    if cluster == LOCAL or cluster.startswith(LOCAL + ":"):
        return local_inventory(cluster.partition(":")[2] or local_state.DEFAULT_NAME)
    if looks_like_path(cluster):
        return load_inventory_file(cluster)
    return _aws_cluster(cluster, region)


def _aws_cluster(cluster: str | None, region: str | None) -> Inventory:
    from node_setup.aws.discovery import find_cluster  # boto3: only when an AWS cluster is asked for

    return find_cluster(cluster, region)


def looks_like_path(value: str) -> bool:
    return os.sep in value or value.endswith(INVENTORY_SUFFIXES) or Path(value).is_file()


# ---------------------------------------------------------------- inventory files and the local cluster


def load_inventory_file(path: str | os.PathLike) -> Inventory:
    """Parse an inventory YAML file; `key` may use ~ or be relative to the file."""
    file = Path(path).expanduser()
    try:
        text = file.read_text()
    except FileNotFoundError:
        raise ClusterSelectionError(f"--cluster {path}: inventory file not found; give an existing YAML "
                                    "file (format: see cluster/inventory.py), an AWS cluster name or `local`") from None
    except OSError as exc:
        raise ClusterSelectionError(f"--cluster {path}: cannot read the inventory file: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ClusterSelectionError(f"--cluster {path}: inventory file is not valid YAML{at}: {problem}") from None
    kind = "local" if isinstance(data, Mapping) and data.get("kind") == "local" else "file"
    try:
        inventory = Inventory.from_mapping(data, default_name=file.stem, kind=kind)
    except InventoryError as exc:
        raise ClusterSelectionError(f"--cluster {path}: {exc}") from None
    key = inventory.key_path or os.environ.get(KEY_ENV) or None
    if key:
        key_path = Path(key).expanduser()
        if not key_path.is_absolute():
            key_path = file.resolve().parent / key_path
        key = str(key_path)
    inventory = replace(inventory, key_path=key)
    return with_start_times(inventory, file) if kind == "local" else inventory


def local_inventory(name: str = local_state.DEFAULT_NAME) -> Inventory:
    """The inventory `fab local-up --name NAME` wrote, if that cluster is running."""
    try:
        paths = local_state.paths_for(name)
    except local_state.LocalClusterError as exc:
        raise ClusterSelectionError(f"--cluster local:{name}: {exc}") from None
    state = local_state.load_state(paths)
    flag = "" if name == local_state.DEFAULT_NAME else f" --name {name}"
    if state is None:
        others = local_state.list_clusters()
        found = f" (local clusters here: {', '.join(others)}; pick one with --cluster local:NAME)" if others else ""
        raise ClusterSelectionError(f"no local cluster named {name!r} is up{found}: start it with "
                                    f"`fab local-up --nodes 4{flag}`")
    if not local_cluster.is_running(state):
        raise ClusterSelectionError(f"local cluster {name!r} is not running (its sshd processes or namespaces are "
                                    f"gone, "
                                    f"e.g. after a reboot): restart it with `fab local-up --replace --nodes "
                                    f"{len(state.nodes)}{flag}`")
    return load_inventory_file(paths.inventory_path)


def with_start_times(inventory: Inventory, inventory_file: Path) -> Inventory:
    """A local cluster's nodes with their start times, from the state file next to its inventory file:
    each node's sshd's start (a node brought back later started later), else when local-up ran."""
    try:
        state = local_state.load_state(local_state.ClusterPaths(inventory.name, inventory_file.resolve().parent,
                                                                local_state.data_root()))
    except local_state.LocalClusterError:
        state = None
    if state is None:
        return inventory
    started = {n.name: None if n.reclaimed_at else (n.sshd_pid and process_started_at(n.sshd_pid)) or state.created_at
               or None for n in state.nodes}
    return replace(inventory, nodes=tuple(replace(n, launched_at=started.get(n.name)) for n in inventory.nodes))


def process_started_at(pid: int, proc: Path = Path("/proc")) -> float | None:
    """When process `pid` started (Unix seconds), from /proc; None when it cannot be read."""
    try:
        fields = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        boot = next(float(line.split()[1]) for line in (proc / "stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in clock ticks
    except (OSError, IndexError, ValueError, StopIteration):
        return None
