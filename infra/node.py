"""One cluster node as an EC2 instance with the hardening every node shares.

IMDSv2 only with hop limit 1 (no container or forwarded request can read the metadata), an
encrypted root volume, the cluster's instance profile (infra/node_role.py: checkpoints in the
bucket), spot as a one-time request that terminates on interruption (a one-time spot instance
cannot be stopped; the training job checkpoints on the interruption notice instead).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import pulumi
import pulumi_aws as aws

from cluster.spec import ClusterSpec
from cluster.tags import PROFILE_KEY, SSH_USER_KEY, node_tags


@dataclass(frozen=True)
class NodeNetwork:
    subnet_id: str
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


def node_instance(name: str, spec: ClusterSpec, *, ami: pulumi.Input[str], role: str, rank: int,
                  spot: bool, network: NodeNetwork, instance_profile: pulumi.Input[str],
                  tags: dict[str, str], opts: pulumi.ResourceOptions) -> aws.ec2.Instance:
    # Discovery reads the login user and the profile from the nodes' tags.
    instance_tags = {**node_tags(tags, role, rank, name), SSH_USER_KEY: spec.ssh_user,
                     PROFILE_KEY: spec.software_profile}
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
        instance_initiated_shutdown_behavior="terminate" if spot else None,
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
        opts=opts,
    )
