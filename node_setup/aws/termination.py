"""The cluster's master instances as EC2 has them, found by their tags: `cluster_masters` (what `fab up` checks
after its `pulumi up --refresh` and its wait for the master's group: it never says a cluster is up without a
running master)."""

from __future__ import annotations

from cluster.stack.tags import CLUSTER_KEY, MANAGED_BY_KEY, MANAGED_BY_VALUE, ROLE_KEY, ROLE_MASTER
from node_setup.aws import clients

SHUTTING_DOWN = "shutting-down"
RUNNING = "running"
# The states of an instance EC2 still has (a `terminated` one is gone).
LIVE_STATES = ("pending", RUNNING, SHUTTING_DOWN, "stopping", "stopped")


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
