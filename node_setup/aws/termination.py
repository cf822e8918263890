"""Wait for lost instances to be `terminated` before Pulumi refreshes them.

The provider drops an instance from the stack's state only once EC2 reports it `terminated`; a
refresh while it is still `shutting-down` (a spot reclaim, the idle auto-stop) changes nothing and
the following `pulumi up` creates no replacement. So the refresh waits for EC2's own
`instance_terminated` waiter, bounded (cluster/run/stack_recovery.py's TERMINATED_WAIT_S).
"""

from __future__ import annotations

import math
from typing import Sequence

from botocore.exceptions import ClientError, WaiterError

from cluster.run.stack_recovery import TERMINATED_POLL_S, TERMINATED_WAIT_S
from node_setup.aws.clients import client


def not_terminated(instance_ids: Sequence[str], region: str | None, *, ec2=None) -> dict[str, str]:
    """{instance id: state} of those not `terminated` now (an id EC2 no longer knows counts as gone)."""
    ec2 = ec2 or client("ec2", region)
    try:
        pages = ec2.get_paginator("describe_instances").paginate(InstanceIds=list(instance_ids))
        states = {i["InstanceId"]: i["State"]["Name"] for page in pages
                  for res in page["Reservations"] for i in res["Instances"]}
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "InvalidInstanceID.NotFound":
            return {}
        raise
    return {iid: state for iid, state in states.items() if state != "terminated"}


def wait_terminated(instance_ids: Sequence[str], region: str | None, *, timeout_s: float = TERMINATED_WAIT_S,
                    poll_s: float = TERMINATED_POLL_S, ec2=None) -> dict[str, str]:
    """Wait (EC2's waiter, at most `timeout_s`) until every instance is terminated; {id: state} of those
    that are still not (empty when all went)."""
    if not instance_ids:
        return {}
    ec2 = ec2 or client("ec2", region)
    attempts = max(1, math.ceil(timeout_s / poll_s)) if poll_s > 0 else 1
    try:
        ec2.get_waiter("instance_terminated").wait(InstanceIds=list(instance_ids),
                                                    WaiterConfig={"Delay": poll_s, "MaxAttempts": attempts})
    except WaiterError:
        pass  # timed out or failed: the states below say which are left
    return not_terminated(instance_ids, region, ec2=ec2)
