"""What every cluster node shares, whichever group launches it (infra/node_group.py).

- `NodeNetwork`: the kept subnet (infra/placement.py), the security groups, the key pair, the placement group
  and whether the node gets a public address (in the default VPC).
- `replacement_key`: the market and the instance type, which replace a group when they change (the
  `replacement_trigger`: a launch template's spot options that vanish show no diff in the provider).
- `SHUTDOWN_BEHAVIOR`: every node, spot or on-demand, terminates when it shuts itself down (the idle
  auto-stop), so nothing of it is left billing; a one-time spot instance cannot be stopped anyway.
- Generous create/update/delete timeouts: metal instances can take far longer than the provider's defaults
  to start and to terminate, and a group waits for its instances.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import pulumi

from cluster.stack.spec import ClusterSpec

# A metal instance can take over 20 minutes just to start, and as long to shut down.
INSTANCE_TIMEOUTS = pulumi.CustomTimeouts(create="40m", update="40m", delete="40m")

# What a shutdown from inside the instance does (the idle auto-stop's `shutdown -h now`, cluster/node/autostop.py):
# terminate, spot or on-demand, so that a stopped cluster bills no instance and no volume (only the
# image's snapshot and the bucket). A one-time spot instance cannot be stopped at all.
SHUTDOWN_BEHAVIOR = "terminate"


@dataclass(frozen=True)
class NodeNetwork:
    subnet_id: pulumi.Input[str]
    security_group_ids: Sequence[pulumi.Input[str]]
    key_name: pulumi.Input[str]
    placement_group: pulumi.Input[str] | None
    public_ip: bool | None  # True in the default VPC; None leaves it to the subnet


def replacement_key(spec: ClusterSpec, spot: bool) -> dict[str, str]:
    """What replaces a node when it changes: its market and its instance type."""
    return {"market": "spot" if spot else "on-demand", "instanceType": spec.instance_type}


def engine_supports(feature: str) -> bool:
    """Whether the Pulumi CLI running this program supports a resource-monitor feature (e.g. ERROR_HOOKS)."""
    from pulumi.runtime.proto import resource_pb2
    from pulumi.runtime.settings import monitor_supports_feature

    return monitor_supports_feature(getattr(resource_pb2, f"RESOURCE_MONITOR_FEATURE_{feature}"))
