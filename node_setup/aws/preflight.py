"""Would `pulumi up` succeed? Check the account before paying for half a cluster.

Checks, in order, each ending in a `Finding` that says what to change:
  credentials  who we are (STS); without credentials nothing else can run
  region       the stack's aws:region is an EC2 region
  offering     the instance type is offered in the region and in the zone the cluster will use
               (the subnetId's zone, else the zone of the subnet the program picks: the lowest
               default (or vpcId) subnet id in an offering zone, cluster/stack/subnet_choice.py)
  quota        Service Quotas' standard spot / on-demand vCPU quotas cover nodes x vCPUs on top of
               what already runs in the account (node_setup/aws/quotas.py)
  dry-run      `run_instances(DryRun=True)` for the master and for one worker as the group's launch
               template launches it (its tags, root device and spot options), with the stack's image
               (the same lookup as infra/lookups.py, filters from cluster/stack/images.py; the baked image
               the workers boot does not exist yet), type, zone, market, shutdown behaviour `terminate`,
               IMDSv2, encrypted root volume, the master's tags (so ec2:CreateTags, which tagging on
               launch needs, is tested too) and the default security group of the VPC it launches
               into: DryRunOperation means AWS would accept the launch. What `pulumi up` creates
               first cannot be named before it exists, so the dry run leaves out the instance
               profile, the placement group, the cluster's own security groups and the key pair:
               naming a missing one fails with "does not exist" instead of testing the permission
  pass-role    the caller may pass the node role to EC2 (iam:PassRole, which launching with the
               instance profile needs): IAM's policy simulator (SimulatePrincipalPolicy) for the
               caller's user or role, on a role named like the one `pulumi up` makes
               (node_setup/aws/pass_role.py)
  console      the caller may read the console of the cluster's instances (ec2:GetConsoleOutput), where
               `pulumi up`'s setup step verifies the master's host key and `fab` each new node's: the
               same simulator, for the same caller, on an instance of the region with the cluster's tag
               (node_setup/aws/console_read.py)
  ebs-key      the Auto Scaling service role may use the account's default EBS key, which encrypts
               the workers' volumes: a customer managed key needs its policy or a grant to name the
               role, which the dry run (the caller's credentials) cannot show (node_setup/aws/ebs_key.py)
  admin-cidr   the caller's public address is inside adminCidrs (else SSH to the master is refused)

`fab preflight --pick-zone` ranks the region's zones that offer the instance type (`rank_zones`):
EC2's spot placement score for the cluster's node count in one zone (1 to 10: how likely the
request succeeds) first, then the latest spot price. A capacity refusal in the dry run names the
next-best zone from that ranking.

The checks before `fab train` on a cluster that is up are in node_setup/aws/train_checks.py.

An API that denies access is reported as a warning and the other checks still run; throttling is
retried by the clients' adaptive retry mode (node_setup/aws/clients.py). `Report.exit_code` is 1
when any check found that the launch would fail.
"""

from __future__ import annotations

import ipaddress
import urllib.request
from typing import Callable

from botocore.exceptions import ClientError

from cluster.stack import catalog
from cluster.stack.images import BASE_IMAGE_FILTERS, CANONICAL_OWNER  # the image infra/lookups.py picks
from cluster.stack import subnet_choice
from cluster.stack.spec import ClusterSpec, next_master_type
from cluster.stack.tags import PROFILE_KEY, ROLE_KEY, ROLE_MASTER, ROLE_WORKER, SSH_USER_KEY, cluster_tags, node_tags
from node_setup.aws import errors
from node_setup.aws.console_read import check_console_read
from node_setup.aws.ebs_key import check_ebs_key
from node_setup.aws.zones import next_best_zone_fix, offered
from node_setup.aws.findings import (FAIL, OK, SKIPPED, WARN, AwsClients, Report, check_credentials, check_region,
                                     denied, run_checks)
from node_setup.aws.pass_role import check_pass_role
from node_setup.aws.quotas import check_quotas

PUBLIC_IP_URL = "https://checkip.amazonaws.com"

# What a node does when it shuts itself down (infra/node.py SHUTDOWN_BEHAVIOR), spot or on-demand.
SHUTDOWN_BEHAVIOR = "terminate"
# The root device both groups' launch templates name (infra/node_group.py ROOT_DEVICE).
# tests/infra/test_preflight_template.py compares the worker dry run with the template.
WORKER_ROOT_DEVICE = "/dev/sda1"


def lookup_public_ip(timeout: float = 3.0) -> str | None:
    """This machine's public IPv4 address as AWS sees it, or None when it cannot be learnt."""
    try:
        with urllib.request.urlopen(PUBLIC_IP_URL, timeout=timeout) as resp:  # noqa: S310 - fixed https URL
            text = resp.read(64).decode().strip()
        return str(ipaddress.ip_address(text))
    except (OSError, ValueError):
        return None


def _default_subnets(ec2) -> dict[str, str]:
    """Default subnet id -> its zone, in the default VPC."""
    return _subnet_zones(ec2, [{"Name": "default-for-az", "Values": ["true"]}])


def _subnet_zones(ec2, filters: list[dict]) -> dict[str, str]:
    subnets = {}
    for page in ec2.get_paginator("describe_subnets").paginate(Filters=filters):
        for subnet in page.get("Subnets", []):
            subnets[subnet["SubnetId"]] = subnet["AvailabilityZone"]
    return subnets


def planned_subnet(ec2, spec: ClusterSpec, zones) -> tuple[str, str] | None:
    """(subnet id, zone) the program will launch in without subnetId: the default subnets (or vpcId's
    subnets) in `zones`, by the program's rule (cluster/stack/subnet_choice.py); None if none qualifies."""
    if spec.vpc_id:
        subnet_zones = _subnet_zones(ec2, [{"Name": "vpc-id", "Values": [spec.vpc_id]}])
    else:
        subnet_zones = _default_subnets(ec2)
    return subnet_choice.chosen(subnet_zones, zones, spec.availability_zone)


def check_offering(report: Report, clients: AwsClients, spec: ClusterSpec) -> str | None:
    """The zone the cluster will launch in (None if unknown or not offered). With instanceTypes every listed
    type is checked, and the cluster's zone is one that offers them all (infra/lookups.py's rule)."""
    itype = ", ".join(spec.types)  # what the findings name: the one type, or every listed one
    key = "instanceTypes" if spec.instance_types else "instanceType"
    try:
        in_region = offered(clients.ec2, "region", sorted({*spec.types, *catalog.known_types()}))
    except ClientError as exc:
        if errors.is_denied(exc):
            denied(report, "offering", "ec2:DescribeInstanceTypeOfferings", exc)
            return None
        raise
    missing = [t for t in spec.types if not in_region.get(t)]
    if missing:
        others = sorted(t for t, where in in_region.items() if where and t not in spec.types)
        report.add("offering", FAIL, f"{', '.join(missing)} is not offered in {spec.region}",
                   f"set {key} to {'types' if spec.instance_types else 'one'} offered here "
                   f"({', '.join(others) or 'none of the catalog'}) or choose another aws:region")
        return None
    by_type = offered(clients.ec2, "availability-zone", list(spec.types))
    zones = set.intersection(*(by_type.get(t, set()) for t in spec.types))
    if spec.instance_types:
        for t in spec.types:
            report.add("offering", OK, f"{t} is offered in {', '.join(sorted(by_type.get(t, set()))) or 'no zone'}")
    if spec.subnet_id:
        try:
            subnet = clients.ec2.describe_subnets(SubnetIds=[spec.subnet_id])["Subnets"][0]
        except ClientError as exc:
            report.add("offering", FAIL, f"subnetId {spec.subnet_id!r}: {errors.describe(exc)}",
                       f"set subnetId to a subnet of {spec.region}")
            return None
        zone = subnet["AvailabilityZone"]
        if zone not in zones:
            report.add("offering", FAIL, f"{itype} {'are not all' if spec.instance_types else 'is not'} offered in "
                       f"{zone}, the zone of subnetId {spec.subnet_id}",
                       f"set subnetId to a subnet in one of: {', '.join(sorted(zones))}")
            return None
        report.add("offering", OK, f"{itype} is offered in {zone} (subnet {spec.subnet_id})")
        return zone
    if spec.availability_zone and spec.availability_zone not in zones:
        report.add("offering", FAIL, f"{itype} is not offered in availabilityZone {spec.availability_zone}",
                   f"set availabilityZone to one of: {', '.join(sorted(zones))} "
                   "(`fab preflight --pick-zone --write` picks the best)")
        return None
    pick = planned_subnet(clients.ec2, spec, zones)
    where = f"VPC {spec.vpc_id}" if spec.vpc_id else f"the default VPC of {spec.region}"
    if pick is None:
        report.add("offering", FAIL, f"no subnet of {where} is in a zone offering {itype} "
                   f"({', '.join(sorted(zones)) or 'none'})"
                   + (f" and in availabilityZone {spec.availability_zone}" if spec.availability_zone else ""),
                   "set subnetId to a subnet in one of those zones"
                   + ("" if spec.vpc_id else " (or create a default VPC)"))
        return None
    subnet, zone = pick
    missing = sorted(set(_default_subnets(clients.ec2).values()) - zones) if not spec.vpc_id else []
    extra = f"; not offered in {', '.join(missing)}" if missing else ""
    together = " (each of them)" if spec.instance_types else ""
    report.add("offering", OK, f"{itype} is offered{together} in {', '.join(sorted(zones))}{extra}; the cluster "
               f"will use {zone} (subnet {subnet} of {where}, the lowest subnet id there, as `pulumi up` picks)")
    return zone


def _base_image(ec2, spec: ClusterSpec) -> dict | None:
    if spec.base_ami:
        images = ec2.describe_images(ImageIds=[spec.base_ami])["Images"]
        return images[0] if images else None
    images = ec2.describe_images(Owners=[CANONICAL_OWNER], Filters=[
        {"Name": name, "Values": [value]} for name, value in BASE_IMAGE_FILTERS])["Images"]
    return max(images, key=lambda i: i.get("CreationDate", "")) if images else None


def launch_tags(spec: ClusterSpec, role: str = ROLE_MASTER) -> dict[str, str]:
    """The tags the Pulumi program gives the master (infra/node.py) or, with `role` worker, each worker
    of the group (the launch template's tag specifications, infra/node_group.py), for the dry run."""
    base = cluster_tags(spec.cluster_name, spec.stack, dict(spec.tags))
    if role == ROLE_WORKER:
        tags = {**base, ROLE_KEY: ROLE_WORKER, "Name": f"{spec.cluster_name}-worker"}
        tags.update({k: v for k, v in ((SSH_USER_KEY, spec.ssh_user), (PROFILE_KEY, spec.software_profile)) if v})
        return tags
    return node_tags(base, ROLE_MASTER, 0, f"{spec.cluster_name}-master",
                     ssh_user=spec.ssh_user, profile=spec.software_profile)


def launch_security_group(ec2, spec: ClusterSpec) -> str | None:
    """The default security group of the VPC the dry run launches into: subnetId's VPC, else the
    default VPC (a launch that names only a zone, or nothing, goes to its default subnet). None if
    there is none. The cluster's own groups do not exist before `pulumi up`."""
    if spec.subnet_id:
        vpcs = [s["VpcId"] for s in ec2.describe_subnets(SubnetIds=[spec.subnet_id])["Subnets"]]
    else:
        vpcs = [v["VpcId"] for v in ec2.describe_vpcs(
            Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]]
    if not vpcs:
        return None
    groups = ec2.describe_security_groups(Filters=[{"Name": "vpc-id", "Values": [vpcs[0]]},
                                                   {"Name": "group-name", "Values": ["default"]}])["SecurityGroups"]
    return groups[0]["GroupId"] if groups else None


def dry_run_params(spec: ClusterSpec, image: dict, zone: str | None, spot: bool,
                   security_group: str | None = None, role: str = ROLE_MASTER,
                   instance_type: str | None = None) -> dict:
    """run_instances arguments with the stack's real settings and tags (tagging on launch needs
    ec2:CreateTags) and an existing security group; not the resources the stack has not made yet
    (see the module docstring). With `role` worker: what the workers' launch template holds (its
    tags, root device, spot options, IMDSv2, encrypted volume), less its instance profile. `instance_type`:
    one of instanceTypes (the group may launch any); the first by default, the master's."""
    tags = [{"Key": k, "Value": v} for k, v in sorted(launch_tags(spec, role).items())]
    device = WORKER_ROOT_DEVICE if role == ROLE_WORKER else image.get("RootDeviceName", WORKER_ROOT_DEVICE)
    params: dict = {
        "DryRun": True, "ImageId": image["ImageId"], "InstanceType": instance_type or spec.instance_type,
        "MinCount": 1, "MaxCount": 1,
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 1},
        "BlockDeviceMappings": [{"DeviceName": device, "Ebs": {
            "VolumeSize": spec.root_volume_gib, "VolumeType": spec.root_volume_type, "Encrypted": True,
            "DeleteOnTermination": True}}],
        "TagSpecifications": [{"ResourceType": kind, "Tags": tags} for kind in ("instance", "volume")],
        "InstanceInitiatedShutdownBehavior": SHUTDOWN_BEHAVIOR,
    }
    if security_group:
        params["SecurityGroupIds"] = [security_group]
    if spec.subnet_id:
        params["SubnetId"] = spec.subnet_id
    elif zone:
        params["Placement"] = {"AvailabilityZone": zone}
    if spot:
        options = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
        if spec.spot_max_price:
            options["MaxPrice"] = f"{spec.spot_max_price:.4f}"
        params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": options}
    return params


def check_dry_run(report: Report, clients: AwsClients, spec: ClusterSpec, zone: str | None) -> None:
    try:
        image = _base_image(clients.ec2, spec)
    except ClientError as exc:
        if errors.is_denied(exc):
            denied(report, "dry-run", "ec2:DescribeImages", exc)
            return
        image = None
    if image is None:
        what = f"baseAmi {spec.base_ami!r}" if spec.base_ami else "an Ubuntu 24.04 amd64 image from Canonical"
        report.add("dry-run", FAIL, f"{what} was not found in {spec.region}",
                   "set baseAmi to an x86_64 AMI id of this region")
        return
    if image.get("Architecture", "x86_64") != "x86_64":
        report.add("dry-run", FAIL, f"image {image['ImageId']} is {image.get('Architecture')}, but "
                                    f"{spec.instance_type} "
                   "is x86_64", "set baseAmi to an x86_64 AMI")
        return
    try:
        group = launch_security_group(clients.ec2, spec)
    except ClientError:
        group = None  # DescribeVpcs/DescribeSecurityGroups not allowed: launch without naming a group
    # The master as infra/node.py launches it (the first type), then one worker as the group's launch template
    # would, of each type the group may launch.
    launches = [(ROLE_MASTER, spec.master_spot, spec.instance_type)] + (
        [(ROLE_WORKER, spec.worker_spot, t) for t in spec.types] if spec.worker_count else [])
    for role, spot, itype in launches:
        market = "spot" if spot else "on-demand"
        who = ("the master" if role == ROLE_MASTER
               else f"a worker of the group ({spec.worker_count} from its launch template"
               + (f", any of {len(spec.types)} types" if spec.instance_types else "") + ")")
        try:
            clients.ec2.run_instances(**dry_run_params(spec, image, zone, spot, group, role, itype))
        except ClientError as exc:
            code = errors.code(exc)
            if code == "DryRunOperation":
                baked = (" (the base image: the baked one the workers boot does not exist yet)"
                         if role == ROLE_WORKER and spec.bake else "")
                report.add("dry-run", OK, f"AWS would launch {who}: {market} {itype} from "
                           f"{image['ImageId']}{baked}"
                           + (f" in {zone}" if zone else "") + " with the cluster's tags, IMDSv2 and an encrypted "
                           "root volume"
                           + (f" and the VPC's default security group {group}" if group else "")
                           + " (not tested before `pulumi up` makes them: the node role's instance profile "
                           "(not yet made; iam:PassRole: the pass-role check), placement group, the cluster's "
                           "security groups, key pair)")
                continue
            if errors.is_denied(exc):
                report.add("dry-run", FAIL, f"launching {who} ({market} {itype}) is not allowed "
                                            f"({errors.describe(exc)})",
                           "grant ec2:RunInstances (and ec2:CreateTags) to your IAM identity, or lift the "
                           "SCP/permission boundary that denies it")
                continue
            refused = f"AWS refused a {market} {itype} launch of {who} ({errors.describe(exc)})"
            others = [t for t in spec.types if t != itype]
            if code in CAPACITY_CODES and role == ROLE_WORKER and others:
                # The group goes on to the other listed types; the next dry runs say whether they have room.
                report.add("dry-run", WARN, f"{refused}; the group launches its workers from its other types "
                           f"({', '.join(others)})")
                continue
            fix = _dry_run_fix(code, spec)
            if code in CAPACITY_CODES:
                fix = next_best_zone_fix(clients.ec2, spec, zone) or fix
                if next_master_type(spec.types):
                    fix = f"{next_master_type(spec.types)}, or: {fix}"
            report.add("dry-run", FAIL, refused, fix)
        else:  # pragma: no cover - AWS never launches with DryRun=True
            report.add("dry-run", WARN, "run_instances with DryRun=True returned without DryRunOperation")


def _dry_run_fix(code: str, spec: ClusterSpec) -> str:
    if code.startswith("InvalidAMIID"):
        return "set baseAmi to an AMI of this region"
    if code in CAPACITY_CODES:
        return "choose another zone (subnetId) or another instanceType from the catalog"
    if code in ("SpotMaxPriceTooLow", "MaxSpotInstanceCountExceeded"):
        return "raise spotMaxPrice or leave it unset (pays at most the on-demand price)"
    if code in ("VcpuLimitExceeded", "InstanceLimitExceeded"):
        return "request a higher vCPU quota in Service Quotas"
    return "fix the setting named in AWS's message and run `fab preflight` again"


# What EC2 answers when a zone has no room (or no such type) for the launch.
CAPACITY_CODES = ("InsufficientInstanceCapacity", "InsufficientCapacity", "Unsupported")


def check_admin_cidr(report: Report, spec: ClusterSpec,
                     public_ip: Callable[[], str | None] | None) -> None:
    if public_ip is None:
        report.add("admin-cidr", SKIPPED, "the caller's address check is off (--no-ip-check)")
        return
    address = public_ip()
    if not address:
        report.add("admin-cidr", SKIPPED, "could not learn this machine's public address; make sure "
                   f"adminCidrs ({', '.join(spec.admin_cidrs)}) contains it")
        return
    ip = ipaddress.ip_address(address)
    inside = [c for c in spec.admin_cidrs if ip in ipaddress.ip_network(c, strict=False)]
    if inside:
        report.add("admin-cidr", OK, f"{address} is inside adminCidrs {inside[0]}")
    else:
        report.add("admin-cidr", FAIL, f"this machine's address {address} is outside adminCidrs "
                   f"({', '.join(spec.admin_cidrs)}): SSH to the master would be refused",
                   f"`pulumi config set --path 'adminCidrs[0]' {address}/32` (or add it)")


def run_preflight(spec: ClusterSpec, *, clients: AwsClients | None = None,
                  public_ip: Callable[[], str | None] | None = lookup_public_ip) -> Report:
    """Every check for `spec`; never raises for an AWS answer, returns the findings instead."""
    report = Report(region=spec.region)
    if not check_region(report, spec.region):
        return report
    clients = clients or AwsClients.for_region(spec.region)
    if not check_credentials(report, clients):
        report.add("checks", SKIPPED, "offering, quota, dry-run, pass-role and console need credentials")
        check_admin_cidr(report, spec, public_ip)
        return report
    run_checks(report, (
        ("offering", lambda done: check_offering(report, clients, spec)),
        ("quota", lambda done: check_quotas(report, clients, spec)),
        ("dry-run", lambda done: check_dry_run(report, clients, spec, done.get("offering"))),
        ("pass-role", lambda done: check_pass_role(report, clients, spec)),
        ("console", lambda done: check_console_read(report, clients, spec, done.get("pass-role"))),
        ("ebs-key", lambda done: check_ebs_key(report, clients, spec)),
    ))
    check_admin_cidr(report, spec, public_ip)
    return report
