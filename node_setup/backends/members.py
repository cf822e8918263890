"""A machine's record as it comes from outside the supervisor (the local keeper's file, EC2's answers,
the run's spec), every value checked whole before it is used."""

from __future__ import annotations

import re

from cluster import names
from cluster.run.supervision import Member

_INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}\Z")
_INSTANCE_TYPE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,63}\Z")  # an EC2 type (r7iz.metal-16xl), or none
# The worker group's name and region as the spec carries them (node_setup/tasks/managed.py writes them):
# an Auto Scaling group name as the Pulumi program makes it, and an AWS region name.
_GROUP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}\Z")
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-[0-9]\Z")
STATES = ("pending", "running", "shutting-down", "terminated", "stopping", "stopped", "gone")


def checked_member(entry: dict, where: str) -> Member:
    """A member from a record that came from outside the supervisor, every value checked whole."""
    try:
        name = names.alias(str(entry.get("name")), f"{where} name")
        address = names.host(str(entry.get("address")), f"{where} address")
    except names.UnsafeValue as exc:
        raise ValueError(str(exc)) from None
    instance_id, state = str(entry.get("instance_id")), str(entry.get("state") or "running")
    instance_type = str(entry.get("instance_type") or "")
    if not _INSTANCE_ID.match(instance_id):
        raise ValueError(f"{where} instance_id: {instance_id!r} is not allowed; allowed: i- and 8 to 17 hex digits")
    if state not in STATES:
        raise ValueError(f"{where} state: {state!r} is not allowed; allowed: {', '.join(STATES)}")
    if instance_type and not _INSTANCE_TYPE.match(instance_type):
        raise ValueError(f"{where} instance_type: {instance_type[:80]!r} is not allowed; allowed: an EC2 type such "
                         "as r7iz.metal-16xl")
    return Member(name, address, instance_id, state, instance_type)


def checked_group(group_name: object, region: object) -> tuple[str, str]:
    """The worker group's name and region, each checked whole (ValueError naming the one refused)."""
    name, where = str(group_name), str(region)
    if not _GROUP_NAME.match(name):
        raise ValueError(f"worker_group: {name[:80]!r} is not allowed; allowed: letters, digits, '.', '_', '-' "
                         "(an Auto Scaling group name, up to 255)")
    if not _REGION.match(where):
        raise ValueError(f"region: {where[:40]!r} is not allowed; allowed: an AWS region name, e.g. us-east-1")
    return name, where
