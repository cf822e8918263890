"""Reading an inventory file (cluster/inventory.py's format): the user's own, or the one `fab local-up`
wrote for a local cluster (its `kind: local`), which gets the local cluster's facts and its nodes' start
times from the state file beside it. The inventory file's and the local cluster's backends discover through it."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Mapping

import yaml

from cluster.backend import FILE, LOCAL
from cluster.inventory import KEY_ENV, ClusterSelectionError, Inventory, InventoryError
from cluster.job.jobplan import LOCAL_OUTPUT_ROOT
from node_setup.local import state as local_state


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
    kind = LOCAL if isinstance(data, Mapping) and data.get("kind") == LOCAL else FILE
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
    return local_cluster(inventory, file) if kind == LOCAL else inventory


def local_cluster(inventory: Inventory, inventory_file: Path) -> Inventory:
    """A local cluster's inventory with its facts and its nodes' start times."""
    return with_start_times(local_facts(inventory), inventory_file)


def local_facts(inventory: Inventory) -> Inventory:
    """The local cluster's facts: its nodes are namespaces of this machine, so they share its cores and its
    disk (jobs write under LOCAL_OUTPUT_ROOT/<cluster>, which every node sees) and have no route out."""
    return replace(inventory, shared_output_root=f"{LOCAL_OUTPUT_ROOT}/{inventory.name}", shared_cores=True,
                   offline=True)


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
