"""Would `pulumi up` succeed? Check the account before paying for half a cluster.

Checks, in order, each ending in a `Finding` that says what to change:
  credentials  who we are (STS); without credentials nothing else can run
  region       the stack's aws:region is an EC2 region
  offering     the instance type is offered in the region and in the zone the cluster will use
               (the subnetId's zone, else the first default subnet in an offering zone, as infra does)
  quota        Service Quotas' standard spot / on-demand vCPU quotas cover nodes x vCPUs on top of
               what already runs in the account
  dry-run      `run_instances(DryRun=True)` with the stack's image (the same lookup as infra/lookups.py,
               filters from cluster/images.py), type, zone, market, shutdown behaviour `terminate`,
               IMDSv2, encrypted root volume, the master's tags (so ec2:CreateTags, which tagging on
               launch needs, is tested too) and the default security group of the VPC it launches
               into: DryRunOperation means AWS would accept the launch. What `pulumi up` creates
               first cannot be named before it exists, so the dry run leaves out the instance
               profile, the placement group, the cluster's own security groups and the key pair:
               naming a missing one fails with "does not exist" instead of testing the permission
  pass-role    the caller may pass the node role to EC2 (iam:PassRole, which launching with the
               instance profile needs): IAM's policy simulator (SimulatePrincipalPolicy) for the
               caller's user or role, on a role named like the one `pulumi up` makes
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
import re
import urllib.request
from typing import Callable

from botocore.exceptions import ClientError

from cluster import catalog
from cluster.images import BASE_IMAGE_FILTERS, CANONICAL_OWNER  # the image infra/lookups.py picks
from cluster.spec import ClusterSpec
from cluster.tags import CLUSTER_KEY, ROLE_MASTER, cluster_tags, node_tags
from node_setup.aws import errors
from node_setup.aws.zones import next_best_zone_fix, offered
from node_setup.aws.findings import (FAIL, OK, SKIPPED, WARN, AwsClients, Report, check_credentials, check_region,
                                     denied, run_checks)

# Service Quotas, service code ec2.
SPOT_QUOTA_CODE = "L-34B43A08"  # All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests
ON_DEMAND_QUOTA_CODE = "L-1216C47A"  # Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances
STANDARD = "Standard"
# The vCPU quota group of an instance family, by the letters before its generation digit ("r7iz"
# -> "r", "inf2" -> "inf", "u7i-12tb" -> "u"): not by the first letter alone, or inf, trn, dl, hpc,
# im/is and u- types would all pass for (or fall out of) the Standard group.
QUOTA_GROUPS = {
    **{prefix: STANDARD for prefix in ("a", "c", "d", "h", "i", "im", "is", "m", "r", "t", "z")},
    "f": "F", "g": "G and VT", "gr": "G and VT", "vt": "G and VT", "p": "P", "x": "X", "inf": "Inf",
    "trn": "Trn", "dl": "DL", "hpc": "HPC", "u": "High Memory", "mac": "Mac",
}

PUBLIC_IP_URL = "https://checkip.amazonaws.com"

# What a node does when it shuts itself down (infra/node.py SHUTDOWN_BEHAVIOR), spot or on-demand.
SHUTDOWN_BEHAVIOR = "terminate"
# The service the node role is passed to (infra/node_role.py EC2_SERVICE), and the role's name as
# `pulumi up` makes it: Pulumi names the role `<cluster>-node-` plus 7 random hex characters.
EC2_SERVICE = "ec2.amazonaws.com"
NODE_ROLE_NAME_SUFFIX = "-node-0000000"


def lookup_public_ip(timeout: float = 3.0) -> str | None:
    """This machine's public IPv4 address as AWS sees it, or None when it cannot be learnt."""
    try:
        with urllib.request.urlopen(PUBLIC_IP_URL, timeout=timeout) as resp:  # noqa: S310 - fixed https URL
            text = resp.read(64).decode().strip()
        return str(ipaddress.ip_address(text))
    except (OSError, ValueError):
        return None


def _default_subnets(ec2) -> dict[str, str]:
    """Zone -> default subnet id, in the default VPC."""
    subnets = {}
    for page in ec2.get_paginator("describe_subnets").paginate(
            Filters=[{"Name": "default-for-az", "Values": ["true"]}]):
        for subnet in page.get("Subnets", []):
            subnets[subnet["AvailabilityZone"]] = subnet["SubnetId"]
    return subnets


def check_offering(report: Report, clients: AwsClients, spec: ClusterSpec) -> str | None:
    """The zone the cluster will launch in (None if unknown or not offered)."""
    itype = spec.instance_type
    try:
        in_region = offered(clients.ec2, "region", sorted({itype, *catalog.known_types()}))
    except ClientError as exc:
        if errors.is_denied(exc):
            denied(report, "offering", "ec2:DescribeInstanceTypeOfferings", exc)
            return None
        raise
    if not in_region.get(itype):
        others = sorted(t for t, where in in_region.items() if where and t != itype)
        report.add("offering", FAIL, f"{itype} is not offered in {spec.region}",
                   f"set instanceType to one offered here ({', '.join(others) or 'none of the catalog'}) "
                   "or choose another aws:region")
        return None
    zones = offered(clients.ec2, "availability-zone", [itype]).get(itype, set())
    if spec.subnet_id:
        try:
            subnet = clients.ec2.describe_subnets(SubnetIds=[spec.subnet_id])["Subnets"][0]
        except ClientError as exc:
            report.add("offering", FAIL, f"subnetId {spec.subnet_id!r}: {errors.describe(exc)}",
                       f"set subnetId to a subnet of {spec.region}")
            return None
        zone = subnet["AvailabilityZone"]
        if zone not in zones:
            report.add("offering", FAIL, f"{itype} is not offered in {zone}, the zone of subnetId {spec.subnet_id}",
                       f"set subnetId to a subnet in one of: {', '.join(sorted(zones))}")
            return None
        report.add("offering", OK, f"{itype} is offered in {zone} (subnet {spec.subnet_id})")
        return zone
    defaults = _default_subnets(clients.ec2)
    usable = sorted(z for z in defaults if z in zones)
    if spec.availability_zone:
        if spec.availability_zone not in zones:
            report.add("offering", FAIL, f"{itype} is not offered in availabilityZone {spec.availability_zone}",
                       f"set availabilityZone to one of: {', '.join(sorted(zones))} "
                       "(`fab preflight --pick-zone --write` picks the best)")
            return None
        usable = [z for z in usable if z == spec.availability_zone]
    if spec.vpc_id:
        report.add("offering", OK, f"{itype} is offered in {', '.join(sorted(zones))}; the cluster takes a "
                   f"subnet of VPC {spec.vpc_id} in one of them")
        return None
    if not usable:
        report.add("offering", FAIL, f"no default subnet of {spec.region} is in a zone offering {itype} "
                   f"({', '.join(sorted(zones)) or 'none'})",
                   "set subnetId to a subnet in one of those zones (or create a default VPC)")
        return None
    missing = sorted(set(defaults) - zones)
    extra = f"; not offered in {', '.join(missing)}" if missing else ""
    report.add("offering", OK, f"{itype} is offered in {', '.join(usable)}{extra}; the cluster will use "
               f"{usable[0]} (subnet {defaults[usable[0]]})")
    return usable[0]


def quota_group(instance_type: str) -> str | None:
    """The Service Quotas vCPU group the type counts against ("Standard", "Inf", ...), None if unknown."""
    prefix = re.match(r"[a-z]*", instance_type.split(".")[0].lower()).group(0)
    return QUOTA_GROUPS.get(prefix)


def _quota_value(quotas, code: str) -> float:
    try:
        return float(quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])
    except ClientError as exc:
        if errors.code(exc) != "NoSuchResourceException":
            raise
    # Never-adjusted quotas may only be listed as AWS defaults.
    return float(quotas.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])


def _vcpus(ec2, types: set[str]) -> dict[str, int]:
    known = {t: catalog.lookup(t).vcpus for t in types if catalog.lookup(t)}
    unknown = sorted(types - set(known))
    if unknown:
        for page in ec2.get_paginator("describe_instance_types").paginate(InstanceTypes=unknown):
            for info in page.get("InstanceTypes", []):
                known[info["InstanceType"]] = info["VCpuInfo"]["DefaultVCpus"]
    return known


def _in_use(ec2, cluster_name: str) -> dict[str, int]:
    """vCPUs of running/pending standard-family instances by market, not counting this cluster's own."""
    counts: dict[str, list[str]] = {"spot": [], "on-demand": []}
    for page in ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}]):
        for reservation in page.get("Reservations", []):
            for inst in reservation.get("Instances", []):
                tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                if tags.get(CLUSTER_KEY) == cluster_name:
                    continue  # re-running preflight on an up cluster: its nodes are not extra
                if quota_group(inst["InstanceType"]) != STANDARD:
                    continue
                market = "spot" if inst.get("InstanceLifecycle") == "spot" else "on-demand"
                counts[market].append(inst["InstanceType"])
    sizes = _vcpus(ec2, {t for types in counts.values() for t in types})
    return {market: sum(sizes.get(t, 0) for t in types) for market, types in counts.items()}


def check_quotas(report: Report, clients: AwsClients, spec: ClusterSpec) -> None:
    itype = spec.instance_type
    group = quota_group(itype)
    if group != STANDARD:
        report.add("quota", SKIPPED, f"{itype} counts against {f'the {group}' if group else 'its own'} vCPU quota, "
                   "not the Standard (A, C, D, H, I, M, R, T, Z) one this check reads; check it in the "
                   "Service Quotas console")
        return
    try:
        vcpus = _vcpus(clients.ec2, {itype})[itype]
    except (ClientError, KeyError) as exc:
        report.add("quota", WARN, f"could not learn the vCPUs of {itype} ({exc})")
        return
    spot_nodes = int(spec.master_spot) + (spec.worker_count if spec.worker_spot else 0)
    needs = {"spot": (spot_nodes, SPOT_QUOTA_CODE, "All Standard Spot Instance Requests"),
             "on-demand": (spec.node_count - spot_nodes, ON_DEMAND_QUOTA_CODE,
                           "Running On-Demand Standard instances")}
    try:
        in_use = _in_use(clients.ec2, spec.cluster_name)
    except ClientError as exc:
        if not errors.is_denied(exc):
            raise
        denied(report, "quota", "ec2:DescribeInstances (vCPUs already running are not counted)", exc)
        in_use = {"spot": 0, "on-demand": 0}
    for market, (nodes, code, title) in needs.items():
        if nodes == 0:
            continue
        needed = nodes * vcpus
        try:
            quota = _quota_value(clients.quotas, code)
        except ClientError as exc:
            if errors.is_denied(exc):
                denied(report, "quota", f"servicequotas:GetServiceQuota ({market} quota {code}, "
                        f"{needed} vCPUs needed)", exc)
            else:
                report.add("quota", WARN, f"could not read the {market} quota {code} ({errors.describe(exc)}); "
                           f"the cluster needs {needed} {market} vCPUs")
            continue
        available = quota - in_use[market]
        busy = f", {in_use[market]} already in use" if in_use[market] else ""
        what = f"{market} vCPU quota {code} ({title}) is {quota:g}{busy}; {nodes} x {itype} need {needed}"
        if needed <= available:
            report.add("quota", OK, what)
            continue
        fits = int(available // vcpus) if available > 0 else 0
        fix = (f"request at least {int(in_use[market] + needed)} vCPUs: `aws service-quotas "
               f"request-service-quota-increase --service-code ec2 --quota-code {code} --desired-value "
               f"{int(in_use[market] + needed)} --region {spec.region}`")
        if fits:
            fix += f"; or run {fits} node(s) (workerCount {max(0, fits - 1)})"
        smaller = sorted((t.vcpus, t.name) for t in catalog.CATALOG.values()
                         if t.vcpus * nodes <= available and t.name != itype)
        if smaller:
            fix += f"; or a smaller type that fits: {', '.join(n for _, n in smaller[-3:])}"
        if market == "spot":
            fix += "; or on-demand nodes (masterSpot/workerSpot false) if that quota has room"
        report.add("quota", FAIL, what, fix)


def _base_image(ec2, spec: ClusterSpec) -> dict | None:
    if spec.base_ami:
        images = ec2.describe_images(ImageIds=[spec.base_ami])["Images"]
        return images[0] if images else None
    images = ec2.describe_images(Owners=[CANONICAL_OWNER], Filters=[
        {"Name": name, "Values": [value]} for name, value in BASE_IMAGE_FILTERS])["Images"]
    return max(images, key=lambda i: i.get("CreationDate", "")) if images else None


def launch_tags(spec: ClusterSpec) -> dict[str, str]:
    """The tags the Pulumi program gives the master (infra/node.py), for the dry run."""
    name = f"{spec.cluster_name}-master"
    return node_tags(cluster_tags(spec.cluster_name, spec.stack, dict(spec.tags)), ROLE_MASTER, 0, name,
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
                   security_group: str | None = None) -> dict:
    """run_instances arguments with the stack's real settings and tags (tagging on launch needs
    ec2:CreateTags) and an existing security group; not the resources the stack has not made yet
    (see the module docstring)."""
    tags = [{"Key": k, "Value": v} for k, v in sorted(launch_tags(spec).items())]
    params: dict = {
        "DryRun": True, "ImageId": image["ImageId"], "InstanceType": spec.instance_type,
        "MinCount": 1, "MaxCount": 1,
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 1},
        "BlockDeviceMappings": [{"DeviceName": image.get("RootDeviceName", "/dev/sda1"), "Ebs": {
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
        report.add("dry-run", FAIL, f"image {image['ImageId']} is {image.get('Architecture')}, but {spec.instance_type} "
                   "is x86_64", "set baseAmi to an x86_64 AMI")
        return
    try:
        group = launch_security_group(clients.ec2, spec)
    except ClientError:
        group = None  # DescribeVpcs/DescribeSecurityGroups not allowed: launch without naming a group
    markets = sorted({spec.master_spot, spec.worker_spot if spec.worker_count else spec.master_spot})
    for spot in markets:
        market = "spot" if spot else "on-demand"
        try:
            clients.ec2.run_instances(**dry_run_params(spec, image, zone, spot, group))
        except ClientError as exc:
            code = errors.code(exc)
            if code == "DryRunOperation":
                report.add("dry-run", OK, f"AWS would launch {market} {spec.instance_type} from {image['ImageId']}"
                           + (f" in {zone}" if zone else "") + " with the cluster's tags"
                           + (f" and the VPC's default security group {group}" if group else "")
                           + " (not tested before `pulumi up` makes them: the node role's instance profile "
                           "(iam:PassRole: the pass-role check), placement group, the cluster's security groups, "
                           "key pair)")
                continue
            if errors.is_denied(exc):
                report.add("dry-run", FAIL, f"launching {market} {spec.instance_type} is not allowed ({errors.describe(exc)})",
                           "grant ec2:RunInstances (and ec2:CreateTags) to your IAM identity, or lift the "
                           "SCP/permission boundary that denies it")
                continue
            fix = _dry_run_fix(code, spec)
            if code in CAPACITY_CODES:
                fix = next_best_zone_fix(clients.ec2, spec, zone) or fix
            report.add("dry-run", FAIL, f"AWS refused a {market} {spec.instance_type} launch ({errors.describe(exc)})",
                       fix)
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


def _arn_parts(arn: str) -> tuple[str, str, str, str] | None:
    """(partition, service, account, resource) of an ARN, None if it is not one."""
    parts = arn.split(":", 5)
    if len(parts) != 6 or parts[0] != "arn":
        return None
    return parts[1], parts[2], parts[4], parts[5]


def role_arn_of_session(caller_arn: str) -> str | None:
    """The IAM role ARN behind an assumed-role session ARN, without the role's path (the session ARN
    does not carry it): arn:aws:sts::<account>:assumed-role/<role>/<session> ->
    arn:aws:iam::<account>:role/<role>. None for any other ARN."""
    parts = _arn_parts(caller_arn)
    if not parts or parts[1] != "sts" or not parts[3].startswith("assumed-role/"):
        return None
    partition, _, account, resource = parts
    return f"arn:{partition}:iam::{account}:role/{resource.split('/')[1]}"


def policy_source_arn(iam, caller_arn: str) -> str | None:
    """The ARN SimulatePrincipalPolicy takes for the caller: an IAM user's ARN as it is, the role of an
    assumed-role session (with its path, from iam:GetRole when allowed: IAM Identity Center roles live
    under /aws-reserved/...), None for the root user and federated users (not simulated)."""
    parts = _arn_parts(caller_arn)
    if not parts:
        return None
    partition, _, account, resource = parts
    if resource.startswith("user/"):
        return f"arn:{partition}:iam::{account}:{resource}"
    role = role_arn_of_session(caller_arn)
    if role is None:
        return None
    try:
        return iam.get_role(RoleName=role.rsplit("/", 1)[1])["Role"]["Arn"]
    except ClientError:
        return role  # right for a role without a path; otherwise the simulation says NoSuchEntity


def node_role_arn(spec: ClusterSpec, source_arn: str) -> str:
    """An ARN like the node role's that `pulumi up` makes (infra/node_role.py), in the caller's account."""
    partition, _, account, _ = _arn_parts(source_arn)
    return f"arn:{partition}:iam::{account}:role/{spec.cluster_name}{NODE_ROLE_NAME_SUFFIX}"


def check_pass_role(report: Report, clients: AwsClients, spec: ClusterSpec) -> None:
    """Would launching with the node role's instance profile pass iam:PassRole? Asked of IAM's policy
    simulator for the caller's identity policies (with SCPs and permission boundaries, not an
    assumed role's session policy), since the role itself does not exist before `pulumi up`."""
    if clients.iam is None:
        report.add("pass-role", SKIPPED, "iam:PassRole of the node role is not checked (no IAM client)")
        return
    caller = clients.sts.get_caller_identity()["Arn"]
    source = policy_source_arn(clients.iam, caller)
    if source is None:
        report.add("pass-role", SKIPPED, f"{caller} is not an IAM user or role session, which IAM's policy "
                   "simulator needs; make sure it may pass the node role to EC2 (iam:PassRole)")
        return
    role = node_role_arn(spec, source)
    try:
        answer = clients.iam.simulate_principal_policy(
            PolicySourceArn=source, ActionNames=["iam:PassRole"], ResourceArns=[role],
            ContextEntries=[{"ContextKeyName": "iam:PassedToService", "ContextKeyValues": [EC2_SERVICE],
                             "ContextKeyType": "string"}])
    except ClientError as exc:
        why = "access denied to iam:SimulatePrincipalPolicy" if errors.is_denied(exc) else errors.describe(exc)
        report.add("pass-role", WARN, f"could not check that {source} may pass the node role to EC2 "
                   f"(iam:PassRole): {why}",
                   f"allow iam:SimulatePrincipalPolicy on {source} for your IAM identity, or make sure it may "
                   f"pass roles named {spec.cluster_name}-node-* to {EC2_SERVICE}")
        return
    decision = answer["EvaluationResults"][0]["EvalDecision"]
    if decision == "allowed":
        report.add("pass-role", OK, f"{source} may pass the node role ({role}) to {EC2_SERVICE}")
        return
    report.add("pass-role", FAIL, f"{source} may not pass the node role to EC2: iam:PassRole on {role} is "
               f"{decision}; launching the nodes with its instance profile would fail",
               f"allow iam:PassRole on arn:...:role/{spec.cluster_name}-node-* (condition iam:PassedToService "
               f"{EC2_SERVICE}) for your IAM identity, or lift the SCP/permission boundary that denies it")


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
        report.add("checks", SKIPPED, "offering, quota, dry-run and pass-role need credentials")
        check_admin_cidr(report, spec, public_ip)
        return report
    run_checks(report, (
        ("offering", lambda done: check_offering(report, clients, spec)),
        ("quota", lambda done: check_quotas(report, clients, spec)),
        ("dry-run", lambda done: check_dry_run(report, clients, spec, done.get("offering"))),
        ("pass-role", lambda done: check_pass_role(report, clients, spec)),
    ))
    check_admin_cidr(report, spec, public_ip)
    return report
