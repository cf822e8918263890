"""Which nodes `--cluster` means: an AWS cluster found by its tags, `local`, or an inventory file.

    resolve_cluster(None)                  the only xeon-cluster cluster running in the region
    resolve_cluster("demo")                AWS cluster "demo" (tag xeon-cluster:cluster=demo)
    resolve_cluster("local")               the local cluster named local (`fab local-up`)
    resolve_cluster("local:bench8")        the local cluster named bench8
    resolve_cluster("lab.yaml")            an inventory file (cluster/inventory.py format)

Every task calls this once and then works on the returned Inventory (master first). Every
failure is a ClusterSelectionError whose message says what was looked for, what was found and
what to do.

AWS nodes: the master's `address` is its public IP and so is `Inventory.gateway`; workers are
addressed by private IP and reached through the master (the gateway is used for every node whose
address differs from it). Without a public IP on the master the controller is assumed to be
inside the VPC: every node is addressed by private IP and there is no gateway.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from cluster.inventory import Inventory, InventoryError, Node
from cluster.profiles import DEFAULT_PROFILE, PROFILES
from cluster.tags import (CLUSTER_KEY, MANAGED_BY_KEY, MANAGED_BY_VALUE, PROFILE_KEY, RANK_KEY, ROLE_KEY,
                          ROLE_MASTER, ROLE_WORKER, SSH_USER_KEY)
from node_setup import local_cluster

LOCAL = "local"
KEY_ENV = "XEON_CLUSTER_SSH_KEY"
DEFAULT_AWS_USER = "ubuntu"
INVENTORY_SUFFIXES = (".yaml", ".yml")
# States in which an instance still belongs to a cluster that may come (back) up.
NOT_YET_RUNNING_STATES = ("pending", "stopping", "stopped")

ALTERNATIVES = ("start one with `pulumi up`, or use a cluster without AWS: `fab local-up --nodes 4` then "
                "`--cluster local`, or `--cluster path/to/inventory.yaml` for machines reachable by SSH")


class ClusterSelectionError(ValueError):
    """`--cluster` cannot be resolved; the message says what to do."""


def resolve_cluster(cluster: str | None, region: str | None = None) -> Inventory:
    """The Inventory that `--cluster` names (see the module docstring); master first."""
    cluster = (cluster or "").strip() or None
    if cluster is None:
        return _aws(None, region)
    if cluster == LOCAL or cluster.startswith(LOCAL + ":"):
        return local_inventory(cluster.partition(":")[2] or local_cluster.DEFAULT_NAME)
    if _looks_like_path(cluster):
        return load_inventory_file(cluster)
    return _aws(cluster, region)


def _looks_like_path(value: str) -> bool:
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
    return replace(inventory, key_path=key)


def local_inventory(name: str = local_cluster.DEFAULT_NAME) -> Inventory:
    """The inventory `fab local-up --name NAME` wrote, if that cluster is running."""
    try:
        paths = local_cluster.paths_for(name)
    except local_cluster.LocalClusterError as exc:
        raise ClusterSelectionError(f"--cluster local:{name}: {exc}") from None
    state = local_cluster.load_state(paths)
    flag = "" if name == local_cluster.DEFAULT_NAME else f" --name {name}"
    if state is None:
        others = local_cluster.list_clusters()
        found = f" (local clusters here: {', '.join(others)}; pick one with --cluster local:NAME)" if others else ""
        raise ClusterSelectionError(f"no local cluster named {name!r} is up{found}: start it with "
                                    f"`fab local-up --nodes 4{flag}`")
    if not local_cluster.is_running(state):
        raise ClusterSelectionError(f"local cluster {name!r} is not running (its sshd processes or namespaces are gone, "
                                    f"e.g. after a reboot): restart it with `fab local-up --replace --nodes "
                                    f"{len(state.nodes)}{flag}`")
    return load_inventory_file(paths.inventory_path)


# ---------------------------------------------------------------- AWS


def _tags(instance: Mapping[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


def _rank(instance: Mapping[str, Any]) -> float:
    try:
        return int(_tags(instance).get(RANK_KEY, ""))
    except ValueError:
        return float("inf")


def _ip_key(instance: Mapping[str, Any]) -> tuple[int, int]:
    try:
        return 0, int(ipaddress.ip_address(instance.get("PrivateIpAddress", "")))
    except ValueError:
        return 1, 0


def node_order_key(instance: Mapping[str, Any]) -> tuple:
    """Master first, then workers by rank tag, then by private IP (a stable order across runs)."""
    return (_tags(instance).get(ROLE_KEY) != ROLE_MASTER, _rank(instance), _ip_key(instance),
            instance.get("InstanceId", ""))


def group_by_cluster(instances: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for instance in instances:
        groups.setdefault(_tags(instance).get(CLUSTER_KEY, "(untagged)"), []).append(instance)
    return dict(sorted(groups.items()))


def inventory_from_instances(name: str, instances: Iterable[Mapping[str, Any]], *, region: str | None,
                             key_path: str | None) -> Inventory:
    """An AWS cluster's running instances as an Inventory (pure: takes describe_instances records)."""
    ordered = sorted(instances, key=node_order_key)
    masters = [i for i in ordered if _tags(i).get(ROLE_KEY) == ROLE_MASTER]
    if len(masters) != 1:
        found = ", ".join(f"{i.get('InstanceId')} ({_tags(i).get(ROLE_KEY, 'no role tag')})" for i in ordered)
        problem = "no running master" if not masters else f"{len(masters)} running masters"
        raise ClusterSelectionError(
            f"cluster {name!r}: {problem} (running: {found}); a reclaimed spot master is replaced by "
            "`pulumi up`, then rerun")
    master = masters[0]
    master_tags = _tags(master)
    profile = master_tags.get(PROFILE_KEY, DEFAULT_PROFILE)
    if profile not in PROFILES:
        raise ClusterSelectionError(f"cluster {name!r}: tag {PROFILE_KEY}={profile!r} names no profile; "
                                    f"allowed: {', '.join(sorted(PROFILES))}")
    public_ip = master.get("PublicIpAddress")
    nodes = []
    for rank, instance in enumerate(ordered):
        private_ip = instance.get("PrivateIpAddress")
        if not private_ip:
            raise ClusterSelectionError(f"cluster {name!r}: instance {instance.get('InstanceId')} has no private IP")
        is_master = instance is master
        nodes.append(Node(
            name=f"node{rank}",
            address=public_ip if is_master and public_ip else private_ip,
            private_address=private_ip,
            rank=rank,
            role=ROLE_MASTER if is_master else ROLE_WORKER,
            instance_type=instance.get("InstanceType"),
            spot=instance.get("InstanceLifecycle") == "spot",
            instance_id=instance.get("InstanceId"),
            state=instance.get("State", {}).get("Name", "running"),
        ))
    return Inventory(name=name, kind="aws", user=master_tags.get(SSH_USER_KEY) or DEFAULT_AWS_USER,
                     nodes=tuple(nodes), key_path=key_path, gateway=public_ip or None, profile=profile,
                     instance_type=master.get("InstanceType"), region=region)


def _describe(ec2, filters: list[dict]) -> list[dict]:
    instances = []
    for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
        for reservation in page.get("Reservations", []):
            instances.extend(reservation.get("Instances", []))
    return instances


def _managed_filter(states: Iterable[str], cluster: str | None = None) -> list[dict]:
    filters = [{"Name": f"tag:{MANAGED_BY_KEY}", "Values": [MANAGED_BY_VALUE]},
               {"Name": "instance-state-name", "Values": list(states)}]
    if cluster:
        filters.append({"Name": f"tag:{CLUSTER_KEY}", "Values": [cluster]})
    return filters


def _summary(groups: Mapping[str, list]) -> str:
    return ", ".join(f"{name} ({len(nodes)} node{'s' if len(nodes) != 1 else ''})" for name, nodes in groups.items())


def _aws(cluster: str | None, region: str | None) -> Inventory:
    from botocore.exceptions import BotoCoreError, ClientError

    from node_setup import aws

    what = f"--cluster {cluster}" if cluster else "finding the running cluster"
    try:
        region = aws.resolve_region(region)
        ec2 = aws.client("ec2", region)
        running = group_by_cluster(_describe(ec2, _managed_filter(["running"])))
        if cluster is None:
            if not running:
                raise ClusterSelectionError(f"no xeon-cluster cluster is running in region {region}: {ALTERNATIVES}")
            if len(running) > 1:
                raise ClusterSelectionError(
                    f"several xeon-cluster clusters are running in region {region}: {_summary(running)}; "
                    "pick one with --cluster NAME")
            cluster = next(iter(running))
        elif cluster not in running:
            waiting = _describe(ec2, _managed_filter(NOT_YET_RUNNING_STATES, cluster))
            raise ClusterSelectionError(_not_running_message(cluster, region, running, waiting))
    except aws.AwsSetupError as exc:
        raise ClusterSelectionError(f"{what}: {exc}; or use `--cluster local` / `--cluster inventory.yaml` "
                                    "for a cluster without AWS") from None
    except ClientError as exc:
        error = exc.response.get("Error", {})
        raise ClusterSelectionError(f"{what}: AWS refused DescribeInstances in {region} "
                                    f"({error.get('Code')}: {error.get('Message')}); check the credentials "
                                    "and that they allow ec2:DescribeInstances") from None
    except BotoCoreError as exc:
        message = aws.explain_credentials_error(exc) or str(exc)
        raise ClusterSelectionError(f"{what}: {message}") from None
    return inventory_from_instances(cluster, running[cluster], region=region, key_path=os.environ.get(KEY_ENV) or None)


def _not_running_message(cluster: str, region: str, running: Mapping[str, list], waiting: list[Mapping]) -> str:
    message = f"no running xeon-cluster cluster named {cluster!r} in region {region}"
    if waiting:
        states = sorted({i.get("State", {}).get("Name", "?") for i in waiting})
        message += (f"; {len(waiting)} of its instances are {'/'.join(states)}: wait for them to start "
                    "or run `pulumi up`")
    if running:
        message += f". Running clusters: {_summary(running)}; pick one with --cluster NAME"
    else:
        message += f". {ALTERNATIVES[0].upper()}{ALTERNATIVES[1:]}"
    return message


def resolve_for_task(cluster: str | None, region: str | None, exit_code: int = 2) -> Inventory:
    """`resolve_cluster` for a fab task: any failure ends the task with its message and `exit_code`."""
    from invoke import Exit

    try:
        return resolve_cluster(cluster or None, region or None)
    except ValueError as exc:  # ClusterSelectionError, InventoryError
        raise Exit(f"error: {exc}", code=exit_code) from None
    except Exception as exc:  # AWS credential / region problems carry their own advice
        raise Exit(f"error: cannot find the cluster: {exc}", code=exit_code) from None
