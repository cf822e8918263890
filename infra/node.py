"""One cluster node as an EC2 instance with the hardening and the lifecycle every node shares.

Hardening: IMDSv2 only with hop limit 1 (no container or forwarded request can read the
metadata), an encrypted root volume, the cluster's instance profile (infra/node_role.py:
checkpoints in the bucket), spot as a one-time request that terminates on interruption (a
one-time spot instance cannot be stopped; the training job checkpoints on the interruption notice
instead), and every node, spot or on-demand, terminates when it shuts itself down (the idle
auto-stop), so nothing of it is left billing.

Lifecycle (docs/aws-lifecycle.md):
- `delete_before_replace`: a replaced node is terminated before its replacement is launched, so
  old and new never run at once (beyond the vCPU quota `fab preflight` checked, and the placement
  group's room). The engine then also deletes, first, whatever must be replaced with it.
- Market and instance type force a replacement (`replacement_trigger`, and `replace_on_changes`
  for the type): the provider shows no diff when the spot options vanish (spot -> on-demand,
  hashicorp/terraform-provider-aws#38141), and it would change the type in place by stop/modify/
  start, which AWS refuses for a one-time spot instance.
- `ignore_changes` (`keep`): the master keeps the base image and subnet it was created with when
  they were looked up (not set in the stack), so a newer Ubuntu image or another default subnet
  does not replace the cluster on the next `pulumi up`; workers follow the master's.
- Capacity errors on launch are retried a few times by an error hook (`capacity_retry_hook`), then
  reported with what to change.
- Generous create/delete timeouts: metal instances can take far longer than the provider's
  defaults to start and to terminate.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Sequence

import pulumi
import pulumi_aws as aws

from cluster.stack.spec import ClusterSpec, next_master_type
from cluster.stack.tags import node_tags

# aws_instance's own defaults are 10 min (create) and 20 min (delete); a metal instance can take
# over 20 minutes just to start (canonical/pycloudlib#192), and as long to shut down.
INSTANCE_TIMEOUTS = pulumi.CustomTimeouts(create="40m", update="40m", delete="40m")

# What a shutdown from inside the instance does (the idle auto-stop's `shutdown -h now`, cluster/node/autostop.py):
# terminate, spot or on-demand, so that a stopped cluster bills no instance and no volume (only the
# image's snapshot and the bucket), and `pulumi up --refresh` launches it again. A one-time spot
# instance cannot be stopped at all.
SHUTDOWN_BEHAVIOR = "terminate"

# Launch failures worth retrying: no capacity for this type (or this spot market) in the zone now.
CAPACITY_ERRORS = ("InsufficientInstanceCapacity", "InsufficientCapacity", "no Spot capacity")
# Seconds to wait before each retry of a launch that failed for capacity (then give up).
CAPACITY_RETRY_DELAYS_S = (120, 300, 600)


@dataclass(frozen=True)
class NodeNetwork:
    subnet_id: pulumi.Input[str]
    security_group_ids: Sequence[pulumi.Input[str]]
    key_name: pulumi.Input[str]
    placement_group: pulumi.Input[str] | None
    public_ip: bool | None  # True in the default VPC; None leaves it to the subnet


def market_options(spot: bool, max_price: float | None) -> aws.ec2.InstanceInstanceMarketOptionsArgs | None:
    if not spot:
        return None
    return aws.ec2.InstanceInstanceMarketOptionsArgs(
        market_type="spot",
        spot_options=aws.ec2.InstanceInstanceMarketOptionsSpotOptionsArgs(
            spot_instance_type="one-time",
            instance_interruption_behavior="terminate",
            # Unset: pay the spot price, at most the on-demand price.
            max_price=f"{max_price:.4f}" if max_price else None,
        ),
    )


def replacement_key(spec: ClusterSpec, spot: bool) -> dict[str, str]:
    """What replaces a node when it changes: its market and its instance type."""
    return {"market": "spot" if spot else "on-demand", "instanceType": spec.instance_type}


def engine_supports(feature: str) -> bool:
    """Whether the Pulumi CLI running this program supports a resource-monitor feature (e.g. ERROR_HOOKS)."""
    from pulumi.runtime.proto import resource_pb2
    from pulumi.runtime.settings import monitor_supports_feature

    return monitor_supports_feature(getattr(resource_pb2, f"RESOURCE_MONITOR_FEATURE_{feature}"))


# ------------------------------------------------------------------------- capacity retries


def is_capacity_error(message: str) -> bool:
    return any(marker in message for marker in CAPACITY_ERRORS)


def capacity_retry_delay(errors: Sequence[str], delays: Sequence[float] = CAPACITY_RETRY_DELAYS_S) -> float | None:
    """Seconds to wait before retrying a launch, or None to give up.

    `errors` are the failures seen so far, newest first (as the engine hands them to an error
    hook): retry while the newest is a capacity error and retries are left.
    """
    if not errors or not is_capacity_error(errors[0]) or len(errors) > len(delays):
        return None
    return delays[len(errors) - 1]


def capacity_message(name: str, inputs, attempts: int, types: Sequence[str] = ()) -> str:
    """The one line that says what to change when AWS has no capacity left for a node. `types`: the stack's
    instanceTypes, whose first the node is: listing another first is the change of type."""
    inputs = inputs or {}
    market = "spot" if inputs.get("instanceMarketOptions") else "on-demand"
    itype = inputs.get("instanceType", "this instance type")
    flag = "masterSpot" if name.endswith("-master") else "workerSpot"
    other_type = next_master_type(types) or "instanceType"
    return (f"{name}: AWS has no {market} capacity for {itype} in this zone (InsufficientInstanceCapacity, "
            f"{attempts} attempt(s)). Run `pulumi up` again later, or change one of: {flag}: false "
            f"(on-demand), subnetId (another zone), placementGroup: false, {other_type}; "
            "`fab preflight` checks the new settings")


def capacity_retry_hook(name: str, delays: Sequence[float] = CAPACITY_RETRY_DELAYS_S,
                        sleep=asyncio.sleep, types: Sequence[str] = ()) -> pulumi.ErrorHook:
    """An error hook for instances: retry a launch that failed for capacity, then say what to do (`types`: the
    stack's instanceTypes, for capacity_message)."""

    async def on_error(args: pulumi.ErrorHookArgs) -> bool:
        if args.failed_operation != "create":
            return False
        delay = capacity_retry_delay(args.errors, delays)
        if delay is None:
            if args.errors and is_capacity_error(args.errors[0]):
                pulumi.log.error(capacity_message(args.name, args.new_inputs, len(args.errors), types))
            return False
        pulumi.log.warn(f"{args.name}: no capacity for it right now (InsufficientInstanceCapacity); retry "
                        f"{len(args.errors)} of {len(delays)} in {delay:.0f} s")
        await sleep(delay)
        return True

    return pulumi.ErrorHook(name, on_error)


# ------------------------------------------------------------------------------------- node


def node_instance(name: str, spec: ClusterSpec, *, ami: pulumi.Input[str], role: str, rank: int,
                  spot: bool, network: NodeNetwork, instance_profile: pulumi.Input[str],
                  tags: dict[str, str], opts: pulumi.ResourceOptions, keep: Sequence[str] = (),
                  on_error: pulumi.ErrorHook | None = None) -> aws.ec2.Instance:
    """One node. `keep`: inputs whose first value is kept (ignore_changes), e.g. ["ami", "subnetId"]."""
    # Discovery reads the login user and the profile from the nodes' tags.
    instance_tags = node_tags(tags, role, rank, name, ssh_user=spec.ssh_user, profile=spec.software_profile)
    lifecycle = pulumi.ResourceOptions(
        delete_before_replace=True,
        replace_on_changes=["instanceType"],
        replacement_trigger=replacement_key(spec, spot),
        ignore_changes=list(keep) or None,
        custom_timeouts=INSTANCE_TIMEOUTS,
        hooks=pulumi.ResourceHookBinding(on_error=[on_error]) if on_error else None,
    )
    return aws.ec2.Instance(
        name,
        ami=ami,
        instance_type=spec.instance_type,
        subnet_id=network.subnet_id,
        vpc_security_group_ids=list(network.security_group_ids),
        key_name=network.key_name,
        placement_group=network.placement_group,
        associate_public_ip_address=network.public_ip,
        instance_market_options=market_options(spot, spec.spot_max_price),
        instance_initiated_shutdown_behavior=SHUTDOWN_BEHAVIOR,
        # The credentials the training job finds in IMDS (checkpoints in the cluster's bucket).
        iam_instance_profile=instance_profile,
        metadata_options=aws.ec2.InstanceMetadataOptionsArgs(
            http_endpoint="enabled",
            http_tokens="required",
            http_put_response_hop_limit=1,
        ),
        root_block_device=aws.ec2.InstanceRootBlockDeviceArgs(
            encrypted=True,
            volume_size=spec.root_volume_gib,
            volume_type=spec.root_volume_type,
            delete_on_termination=True,
            tags=instance_tags,
        ),
        tags=instance_tags,
        opts=pulumi.ResourceOptions.merge(opts, lifecycle),
    )
