"""An AWS cluster found by its tags: running instances -> an Inventory, master first.

The master's `address` is its public IP and so is `Inventory.gateway`; workers are addressed by
private IP and reached through the master (the gateway is used for every node whose address
differs from it), because only the master admits SSH from outside the cluster (infra/network.py).
Without a public IP on the master the controller is assumed to be inside the VPC (or routed into
it): every node is addressed by private IP, and the master's private IP is the gateway, so the
workers are still reached through the master.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from typing import Any, Iterable, Mapping, Sequence

from cluster.inventory import KEY_ENV, ClusterSelectionError, Inventory, Node
from cluster.node.profiles import DEFAULT_PROFILE, PROFILES
from cluster.stack.tags import (CLUSTER_KEY, MANAGED_BY_KEY, MANAGED_BY_VALUE, PROFILE_KEY, RANK_KEY, ROLE_KEY,
                          ROLE_MASTER, ROLE_WORKER, SSH_USER_KEY)
from node_setup.aws import clients, errors

DEFAULT_AWS_USER = "ubuntu"
ALTERNATIVES = ("start one with `pulumi up`, or use a cluster without AWS: `fab local-up --nodes 4` then "
                "`--cluster local`, or `--cluster path/to/inventory.yaml` for machines reachable by SSH")
# States in which an instance still belongs to a cluster that may come (back) up.
NOT_YET_RUNNING_STATES = ("pending", "stopping", "stopped")


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


def _launched_at(instance: Mapping[str, Any]) -> float | None:
    """EC2's LaunchTime as Unix seconds (boto3 gives a datetime; an ISO text is read too)."""
    launched = instance.get("LaunchTime")
    if isinstance(launched, str):
        try:
            launched = dt.datetime.fromisoformat(launched.replace("Z", "+00:00"))
        except ValueError:
            return None
    if not isinstance(launched, dt.datetime):
        return None
    return (launched if launched.tzinfo else launched.replace(tzinfo=dt.timezone.utc)).timestamp()


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
            "`pulumi up --refresh` (plain `pulumi up` does not see it is gone), then rerun")
    master = masters[0]
    master_tags = _tags(master)
    profile = master_tags.get(PROFILE_KEY, DEFAULT_PROFILE)
    if profile not in PROFILES:
        raise ClusterSelectionError(f"cluster {name!r}: tag {PROFILE_KEY}={profile!r} names no profile; "
                                    f"allowed: {', '.join(sorted(PROFILES))}")
    public_ip = master.get("PublicIpAddress")
    gateway = public_ip or master.get("PrivateIpAddress")  # the only node that admits the controller's SSH
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
            launched_at=_launched_at(instance),
            zone=instance.get("Placement", {}).get("AvailabilityZone"),
        ))
    return Inventory(name=name, kind="aws", user=master_tags.get(SSH_USER_KEY) or DEFAULT_AWS_USER,
                     nodes=tuple(nodes), key_path=key_path, gateway=gateway or None, profile=profile,
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


def find_cluster(cluster: str | None, region: str | None) -> Inventory:
    what = f"--cluster {cluster}" if cluster else "finding the running cluster"
    try:
        region = clients.resolve_region(region)
        ec2 = clients.client("ec2", region)
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
    except clients.AwsSetupError as exc:
        raise ClusterSelectionError(f"{what}: {exc}; or use `--cluster local` / `--cluster inventory.yaml` "
                                    "for a cluster without AWS") from None
    except errors.AWS_ERRORS as exc:
        hint = errors.credentials_hint(exc)
        if hint is None and errors.code(exc):
            hint = (f"AWS refused DescribeInstances in {region} ({errors.describe(exc)}); check the credentials "
                    "and that they allow ec2:DescribeInstances")
        raise ClusterSelectionError(f"{what}: {hint or exc}") from None
    return inventory_from_instances(cluster, running[cluster], region=region, key_path=os.environ.get(KEY_ENV) or None)


def _not_running_message(cluster: str, region: str, running: Mapping[str, list], waiting: Sequence[Mapping]) -> str:
    message = f"no running xeon-cluster cluster named {cluster!r} in region {region}"
    if waiting:
        states = sorted({i.get("State", {}).get("Name", "?") for i in waiting})
        message += (f"; {len(waiting)} of its instances are {'/'.join(states)}: wait for them to start "
                    "or run `pulumi up --refresh`")
    if running:
        message += f". Running clusters: {_summary(running)}; pick one with --cluster NAME"
    else:
        message += f". {ALTERNATIVES[0].upper()}{ALTERNATIVES[1:]}"
    return message
