"""What the program looks up in the account before it creates anything: base image, placement, a kept image.

All lookups run before the first resource is registered, so a failed lookup (no default VPC, an
instance type not offered in the region) stops `pulumi up` with a clear message and nothing made.

They run on every `pulumi up`, and their answers can change (Canonical publishes a newer image,
a default subnet is added): they are only first choices. The stack keeps the first answers
(infra/placement.py) and both groups take the kept ones, so a new answer here replaces nothing;
`baseAmi` / `subnetId` (or `availabilityZone` with `zoneMove`) move the cluster on purpose.

The kept images (`keepImage`, cluster/stack/image_reuse.py) are read here as `fab preflight` reads them
(node_setup/aws/images.py): the images of this account with the kept filters, each described, and the choice
this stack recorded beside its stack marker; the rule that picks is image_reuse's, for both.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi_aws as aws

from cluster.stack import image_reuse
from cluster.stack.images import BASE_IMAGE_FILTERS, CANONICAL_OWNER
from cluster.stack.spec import ClusterSpec
from cluster.stack.subnet_choice import choose_subnet
from cluster.stack.tags import CLUSTER_KEY, IMAGE_SOURCE_KEY, STACK_MARKER_KEY


class AccountLookupError(RuntimeError):
    """A lookup in the account found nothing usable; the message says what to set instead."""


@dataclass(frozen=True)
class Placement:
    vpc_id: str
    subnet_id: str
    default_vpc: bool  # in the default VPC nodes get a public address for outbound internet


def base_ami_id(spec: ClusterSpec) -> str:
    """The image nodes boot from before baking: `baseAmi`, or the newest Ubuntu 24.04 amd64 (a first
    choice: the stack keeps the one it has, infra/placement.py).

    List lookups (get_ami_ids, get_vpcs, get_subnets) return empty instead of failing, so the
    program can say what to set; a failed invoke would surface only the provider's message.
    """
    if spec.base_ami:
        return spec.base_ami
    found = aws.ec2.get_ami_ids(
        owners=[CANONICAL_OWNER],
        filters=[{"name": name, "values": [value]} for name, value in BASE_IMAGE_FILTERS],
        sort_ascending=False,  # newest first
    )
    if not found.ids:
        raise AccountLookupError(
            f"baseAmi: not set and no Ubuntu 24.04 amd64 image from Canonical ({CANONICAL_OWNER}) was "
            f"found in region {spec.region}; set baseAmi to an Ubuntu 24.04 amd64 AMI id")
    return found.ids[0]


def _offered_zones(spec: ClusterSpec) -> list[str]:
    """The zones that offer every type of the stack (with instanceTypes, each: the group may launch any)."""
    zones: set[str] | None = None
    for itype in spec.types:
        offers = aws.ec2.get_instance_type_offerings(
            location_type="availability-zone", filters=[{"name": "instance-type", "values": [itype]}])
        zones = set(offers.locations or []) if zones is None else zones & set(offers.locations or [])
    return sorted(zones or ())


def _types_shown(spec: ClusterSpec) -> str:
    return spec.instance_type if not spec.instance_types else "every one of " + ", ".join(spec.types)


def placement(spec: ClusterSpec) -> Placement:
    """The VPC and the one subnet every node goes into (a cluster placement group is one zone).

    Without subnetId: the lowest-sorting default (or VPC) subnet id in a zone offering the type(s) (in
    availabilityZone when it is set; cluster/stack/subnet_choice.py, the rule `fab preflight` checks with), a
    first choice: the stack keeps the one it has (infra/placement.py).
    """
    if spec.subnet_id:
        subnet = aws.ec2.get_subnet(id=spec.subnet_id)
        if spec.vpc_id and subnet.vpc_id != spec.vpc_id:
            raise AccountLookupError(
                f"subnetId: {spec.subnet_id!r} is in VPC {subnet.vpc_id}, not in vpcId {spec.vpc_id!r}; "
                "allowed: a subnet of vpcId (or leave vpcId unset)")
        return Placement(vpc_id=subnet.vpc_id, subnet_id=spec.subnet_id, default_vpc=False)

    if spec.vpc_id:
        vpc_id, default_vpc = spec.vpc_id, False
    else:
        defaults = aws.ec2.get_vpcs(filters=[{"name": "is-default", "values": ["true"]}]).ids or []
        if not defaults:
            raise AccountLookupError(
                f"vpcId: not set and region {spec.region} has no default VPC; set vpcId and subnetId "
                "to a subnet with outbound internet (NAT)")
        vpc_id, default_vpc = defaults[0], True

    zones = _offered_zones(spec)
    if not zones:
        raise AccountLookupError(
            (f"instanceTypes: {', '.join(spec.types)} are not offered together in any one availability zone"
             if spec.instance_types else f"instanceType: {spec.instance_type!r} is not offered in any availability "
             "zone") + f" of {spec.region}; allowed: a type offered there, or another aws:region")
    if spec.availability_zone:
        if spec.availability_zone not in zones:
            raise AccountLookupError(
                f"availabilityZone: {spec.availability_zone!r} does not offer {_types_shown(spec)}; allowed: "
                f"{', '.join(zones)} (`fab preflight --pick-zone` ranks them)")
        zones = [spec.availability_zone]
    filters: list[aws.ec2.GetSubnetsFilterArgsDict] = [{"name": "vpc-id", "values": [vpc_id]},
                                                       {"name": "availability-zone", "values": zones}]
    if default_vpc:
        filters.append({"name": "default-for-az", "values": ["true"]})
    subnet_id = choose_subnet(aws.ec2.get_subnets(filters=filters).ids or [])
    if not subnet_id:
        raise AccountLookupError(
            f"subnetId: not set and VPC {vpc_id} has no subnet in a zone offering {_types_shown(spec)} "
            f"({', '.join(zones)}); set subnetId")
    return Placement(vpc_id=vpc_id, subnet_id=subnet_id, default_vpc=default_vpc)


def _described(found) -> dict:
    """pulumi_aws's get_ami result in DescribeImages' shape (what image_reuse.KeptImage reads)."""
    def field(item, name):
        return item.get(name) if isinstance(item, dict) else getattr(item, name, None)

    mappings = []
    for mapping in found.block_device_mappings or []:
        ebs = field(mapping, "ebs") or {}
        if ebs.get("snapshot_id"):
            mappings.append({"DeviceName": field(mapping, "device_name"),
                             "Ebs": {"SnapshotId": ebs["snapshot_id"], "VolumeSize": int(ebs.get("volume_size") or 0)}})
    return {"ImageId": found.image_id or found.id, "Name": found.name, "State": found.state,
            "Architecture": found.architecture, "CreationDate": found.creation_date,
            "RootDeviceName": found.root_device_name, "BlockDeviceMappings": mappings,
            "Tags": [{"Key": k, "Value": v} for k, v in (found.tags or {}).items()]}


def kept_images() -> list[image_reuse.KeptImage]:
    """The account's kept images in the stack's region (owned here, with the kept filters)."""
    filters: list[aws.ec2.GetAmiIdsFilterArgsDict] = [{"name": name, "values": [value]}
                                                      for name, value in image_reuse.KEPT_FILTERS]
    ids = aws.ec2.get_ami_ids(owners=["self"], filters=filters).ids or []
    return [image_reuse.KeptImage.from_description(_described(aws.ec2.get_ami(
        owners=["self"], filters=[{"name": "image-id", "values": [image_id]}]))) for image_id in ids]


def previous_image_source(spec: ClusterSpec) -> str | None:
    """The image choice this stack recorded beside its stack marker (None: no marker, a new stack)."""
    ids = aws.ec2.get_security_groups(filters=[
        {"name": f"tag:{STACK_MARKER_KEY}", "values": [spec.stack]},
        {"name": f"tag:{CLUSTER_KEY}", "values": [spec.cluster_name]}]).ids or []
    if not ids:
        return None
    return image_reuse.previous_source(dict(aws.ec2.get_security_group(id=ids[0]).tags or {}), IMAGE_SOURCE_KEY)


def image_choice(spec: ClusterSpec) -> image_reuse.Choice:
    """The image this stack's nodes boot: a kept one that matches, or a bake of its own (image_reuse.choose)."""
    return image_reuse.choose(image_reuse.wanted(spec), kept_images(), previous_image_source(spec))
