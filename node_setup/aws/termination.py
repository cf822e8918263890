"""Wait for lost instances to be `terminated` before Pulumi refreshes them.

The provider drops an instance from the stack's state only once EC2 reports it `terminated`; a
refresh while it is still `shutting-down` (a spot reclaim, the idle auto-stop) changes nothing and
the following `pulumi up` creates no replacement. So the refresh waits until EC2 reports it gone
(polled, bounded: cluster/run/stack_recovery.py's TERMINATED_WAIT_S), saying how long it has waited
now and then when asked to. `cluster_masters` finds a cluster's master instances by their tags (what
`fab up` waits for before its `pulumi up --refresh`, and checks for afterwards).
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

from botocore.exceptions import ClientError

from cluster.durations import format_duration
from cluster.run.stack_recovery import TERMINATED_POLL_S, TERMINATED_WAIT_S
from cluster.stack.tags import CLUSTER_KEY, MANAGED_BY_KEY, MANAGED_BY_VALUE, ROLE_KEY, ROLE_MASTER
from node_setup.aws import clients

PROGRESS_S = 60.0  # while waiting: one line this often saying what is still not terminated
SHUTTING_DOWN = "shutting-down"
RUNNING = "running"
# The states of an instance EC2 still has (a `terminated` one is gone).
LIVE_STATES = ("pending", RUNNING, SHUTTING_DOWN, "stopping", "stopped")


def not_terminated(instance_ids: Sequence[str], region: str | None, *, ec2=None) -> dict[str, str]:
    """{instance id: state} of those not `terminated` now (an id EC2 no longer knows counts as gone)."""
    ec2 = ec2 or clients.client("ec2", region)
    try:
        pages = ec2.get_paginator("describe_instances").paginate(InstanceIds=list(instance_ids))
        states = {i["InstanceId"]: i["State"]["Name"] for page in pages
                  for res in page["Reservations"] for i in res["Instances"]}
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "InvalidInstanceID.NotFound":
            return {}
        raise
    return {iid: state for iid, state in states.items() if state != "terminated"}


def cluster_masters(cluster: str, region: str | None, *, ec2=None) -> dict[str, str]:
    """{instance id: state} of the cluster's master instances (found by the tags infra/ writes) that EC2
    still has: running, on their way (pending) or going (shutting-down, stopping, stopped)."""
    ec2 = ec2 or clients.client("ec2", region)
    filters = [{"Name": f"tag:{MANAGED_BY_KEY}", "Values": [MANAGED_BY_VALUE]},
               {"Name": f"tag:{CLUSTER_KEY}", "Values": [cluster]},
               {"Name": f"tag:{ROLE_KEY}", "Values": [ROLE_MASTER]},
               {"Name": "instance-state-name", "Values": list(LIVE_STATES)}]
    pages = ec2.get_paginator("describe_instances").paginate(Filters=filters)
    return {i["InstanceId"]: i["State"]["Name"] for page in pages
            for res in page["Reservations"] for i in res["Instances"] if i["State"]["Name"] != "terminated"}


def states_text(states: dict[str, str]) -> str:
    """`i-a: shutting-down, i-b: running`, sorted by id."""
    return ", ".join(f"{iid}: {state}" for iid, state in sorted(states.items()))


def wait_terminated(instance_ids: Sequence[str], region: str | None, *, timeout_s: float = TERMINATED_WAIT_S,
                    poll_s: float = TERMINATED_POLL_S, ec2=None, say: Callable[[str], None] | None = None,
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> dict[str, str]:
    """Wait (polling every `poll_s`, at most `timeout_s`) until every instance is terminated; {id: state} of
    those that are still not (empty when all went). With `say`, a line every PROGRESS_S of the wait says
    which are still there."""
    if not instance_ids:
        return {}
    ec2 = ec2 or clients.client("ec2", region)
    start = said = clock()
    while True:
        left = not_terminated(instance_ids, region, ec2=ec2)
        now = clock()
        if not left or now - start >= timeout_s:
            return left
        if say is not None and now - said >= PROGRESS_S:
            said = now
            say(f"  still not terminated after {format_duration(now - start)} ({states_text(left)}); waiting at "
                f"most {format_duration(timeout_s)}")
        sleep(min(poll_s, max(0.0, timeout_s - (now - start))))
