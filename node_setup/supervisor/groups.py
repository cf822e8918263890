"""What differs per kind of cluster, for the supervisor on the master: one backend each.

A backend answers three questions: the cluster's group of machines now (`members`: slot name ->
Member), a machine's state (`instance_state`) and its console (`console`: the text whose host key
blocks cluster/console.py reads).

- `LocalGroup`: the local group keeper's record (node_setup/local/keeper.py writes GROUP_FILE in the
  cluster's data directory, which every node shares with the host) and each node's console file.
- `AwsGroup`: the workers' Auto Scaling group, EC2's instance states and GetConsoleOutput, through
  the node role's read-only statement (docs/security.md); boto3 is imported only here.
- `StaticGroup`: an inventory file's own machines: nothing comes back, a silent node is lost.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from cluster import names
from cluster.supervision import Member

GROUP_FILE = "group.json"  # in the local cluster's data directory (node_setup/local/keeper.py)
CONSOLE_FILE = "console.log"  # in a local node's directory (node_setup/local/console.py)
_INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}\Z")
# The worker group's name and region as the spec carries them (node_setup/tasks/managed.py writes them):
# an Auto Scaling group name as the Pulumi program makes it, and an AWS region name.
_GROUP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}\Z")
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-[0-9]\Z")
_STATES = ("pending", "running", "shutting-down", "terminated", "stopping", "stopped", "gone")


def checked_member(entry: dict, where: str) -> Member:
    """A member from a record that came from outside the supervisor, every value checked whole."""
    try:
        name = names.alias(str(entry.get("name")), f"{where} name")
        address = names.host(str(entry.get("address")), f"{where} address")
    except names.UnsafeValue as exc:
        raise ValueError(str(exc)) from None
    instance_id, state = str(entry.get("instance_id")), str(entry.get("state") or "running")
    if not _INSTANCE_ID.match(instance_id):
        raise ValueError(f"{where} instance_id: {instance_id!r} is not allowed; allowed: i- and 8 to 17 hex digits")
    if state not in _STATES:
        raise ValueError(f"{where} state: {state!r} is not allowed; allowed: {', '.join(_STATES)}")
    return Member(name, address, instance_id, state)


def checked_group(group_name: object, region: object) -> tuple[str, str]:
    """The worker group's name and region, each checked whole (ValueError naming the one refused)."""
    name, where = str(group_name), str(region)
    if not _GROUP_NAME.match(name):
        raise ValueError(f"worker_group: {name[:80]!r} is not allowed; allowed: letters, digits, '.', '_', '-' "
                         "(an Auto Scaling group name, up to 255)")
    if not _REGION.match(where):
        raise ValueError(f"region: {where[:40]!r} is not allowed; allowed: an AWS region name, e.g. us-east-1")
    return name, where


class StaticGroup:
    """An inventory file's machines: the same ones always; no replacement, no console."""

    def __init__(self, members: list[Member]):
        self._members = {m.name: m for m in members}

    def members(self) -> dict[str, Member]:
        return dict(self._members)

    def instance_state(self, member: Member) -> str | None:
        return None  # unknown: a silent machine of an inventory file counts as gone

    def console(self, member: Member) -> str:
        return ""


class LocalGroup:
    """The local cluster's group: what its keeper on the host records, read from the shared data directory."""

    def __init__(self, data_dir: str):
        self.data_dir = Path(data_dir)

    def _entries(self) -> list[dict]:
        try:
            data = json.loads((self.data_dir / GROUP_FILE).read_text())
        except (OSError, ValueError):
            return []
        entries = data.get("members") if isinstance(data, dict) else None
        return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []

    def members(self) -> dict[str, Member]:
        found = {}
        for entry in self._entries():
            try:
                member = checked_member(entry, f"{GROUP_FILE} member")
            except ValueError:
                continue
            found[member.name] = member
        return found

    def instance_state(self, member: Member) -> str | None:
        for entry in self._entries():
            if entry.get("instance_id") == member.instance_id:
                return str(entry.get("state") or "running")
        return "gone"  # the keeper no longer lists it: replaced

    def console(self, member: Member) -> str:
        # the node's directory is its slot's; its console shows the machine there now, which must be this one
        if self.instance_state(member) != "running":
            return ""
        try:
            return (self.data_dir / names.alias(member.name, "node") / CONSOLE_FILE).read_text(errors="replace")
        except (OSError, names.UnsafeValue):
            return ""


class AwsGroup:
    """The workers' Auto Scaling group, read with the node role (boto3 in the node venv).

    A lost worker's slot is filled by the group's newest in-service instance that is no member yet.
    Not run against AWS here; the same loop is rehearsed on the local cluster.
    """

    def __init__(self, region: str, group_name: str, members: list[Member]):
        self.group_name, self.region = checked_group(group_name, region)
        self._known = {m.instance_id: m for m in members}
        self._clients: dict[str, object] = {}

    def _client(self, service: str):
        if service not in self._clients:
            import boto3  # the node venv has it (the training profile)

            self._clients[service] = boto3.client(service, region_name=self.region)
        return self._clients[service]

    def members(self) -> dict[str, Member]:
        groups = self._client("autoscaling").describe_auto_scaling_groups(
            AutoScalingGroupNames=[self.group_name]).get("AutoScalingGroups") or []
        ids = [i["InstanceId"] for g in groups for i in g.get("Instances", [])
               if i.get("LifecycleState") == "InService"]
        found = {m.name: m for m in self._known.values()}
        new = []
        if ids:
            answer = self._client("ec2").describe_instances(InstanceIds=ids)
            for reservation in answer.get("Reservations", []):
                for instance in reservation.get("Instances", []):
                    if instance["InstanceId"] not in self._known and instance.get("PrivateIpAddress"):
                        new.append(instance)
        taken = {m.name for m in self._known.values() if m.instance_id in ids}
        free = sorted(n for n in found if n not in taken)
        for instance, slot in zip(sorted(new, key=lambda i: str(i.get("LaunchTime"))), free):
            member = checked_member({"name": slot, "address": instance["PrivateIpAddress"],
                                     "instance_id": instance["InstanceId"],
                                     "state": instance.get("State", {}).get("Name")}, "EC2 instance")
            self._known[member.instance_id] = member
            found[slot] = member
        return found

    def instance_state(self, member: Member) -> str | None:
        answer = self._client("ec2").describe_instances(InstanceIds=[member.instance_id])
        for reservation in answer.get("Reservations", []):
            for instance in reservation.get("Instances", []):
                return instance.get("State", {}).get("Name")
        return "gone"

    def console(self, member: Member) -> str:
        import base64

        answer = self._client("ec2").get_console_output(InstanceId=member.instance_id, Latest=True)
        try:
            return base64.b64decode(answer.get("Output") or "").decode("utf-8", errors="replace")
        except ValueError:
            return answer.get("Output") or ""
