"""Would `pulumi up` succeed? Check the account before paying for half a cluster.

Checks, in order, each ending in a `Finding` that says what to change:
  credentials  who we are (STS); without credentials nothing else can run
  region       the stack's aws:region is an EC2 region
  offering     the instance type is offered in the region and in the zone the cluster will use
               (the subnetId's zone, else the first default subnet in an offering zone, as infra does)
  quota        Service Quotas' standard spot / on-demand vCPU quotas cover nodes x vCPUs on top of
               what already runs in the account
  dry-run      `run_instances(DryRun=True)` with the stack's image, type, zone, market, IMDSv2 and
               encrypted root volume: DryRunOperation means AWS would accept the launch
  admin-cidr   the caller's public address is inside adminCidrs (else SSH to the master is refused)

`preflight_for_train(inventory)` is the smaller set `fab train` runs on a cluster that is up:
credentials, every node's instance still running, and no spot interruption notice on its spot request.

An API that denies access is reported as a warning and the other checks still run; throttling is
retried by the clients' adaptive retry mode (node_setup/aws.py). `PreflightReport.exit_code` is 1
when any check found that the launch would fail.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable

from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError

from cluster import catalog
from cluster.images import CANONICAL_OWNER, UBUNTU_2404_AMD64  # the image infra/lookups.py picks
from cluster.inventory import Inventory, Node
from cluster.spec import ClusterSpec
from cluster.tags import CLUSTER_KEY
from node_setup import aws

OK, WARN, FAIL, SKIPPED = "ok", "warn", "FAIL", "skipped"

# Service Quotas, service code ec2.
SPOT_QUOTA_CODE = "L-34B43A08"  # All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests
ON_DEMAND_QUOTA_CODE = "L-1216C47A"  # Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances
STANDARD_FAMILIES = set("acdhimrtz")

ACCESS_DENIED_CODES = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation",
                       "UnauthorizedAccess", "AuthFailure"}
CREDENTIAL_CODES = {"InvalidClientTokenId", "ExpiredToken", "ExpiredTokenException", "SignatureDoesNotMatch",
                    "UnrecognizedClientException", "InvalidAccessKeyId"}
PUBLIC_IP_URL = "https://checkip.amazonaws.com"


@dataclass(frozen=True)
class Finding:
    check: str
    status: str  # ok, warn, FAIL, skipped
    message: str
    fix: str = ""


@dataclass
class PreflightReport:
    region: str
    findings: list[Finding] = field(default_factory=list)

    def add(self, check: str, status: str, message: str, fix: str = "") -> Finding:
        finding = Finding(check, status, message, fix)
        self.findings.append(finding)
        return finding

    @property
    def failures(self) -> list[Finding]:
        return [f for f in self.findings if f.status == FAIL]

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def status_of(self, check: str) -> str | None:
        found = [f.status for f in self.findings if f.check == check]
        for status in (FAIL, WARN, OK, SKIPPED):
            if status in found:
                return status
        return None

    def render(self) -> str:
        lines = []
        for f in self.findings:
            lines.append(f"[{f.status:>7}] {f.check:<10} {f.message}")
            if f.fix:
                lines.append(f"{'':>10} {'':<10} -> {f.fix}")
        verdict = "launch should succeed" if self.ok else f"launch would fail ({len(self.failures)} problem(s))"
        lines.append(f"preflight ({self.region}): {verdict}")
        return "\n".join(lines)


@dataclass
class AwsClients:
    """The clients preflight uses; tests hand in moto clients or named test doubles."""
    sts: object
    ec2: object
    quotas: object

    @classmethod
    def for_region(cls, region: str) -> "AwsClients":
        return cls(sts=aws.client("sts", region), ec2=aws.client("ec2", region),
                   quotas=aws.client("service-quotas", region))


def lookup_public_ip(timeout: float = 3.0) -> str | None:
    """This machine's public IPv4 address as AWS sees it, or None when it cannot be learnt."""
    try:
        with urllib.request.urlopen(PUBLIC_IP_URL, timeout=timeout) as resp:  # noqa: S310 - fixed https URL
            text = resp.read(64).decode().strip()
        return str(ipaddress.ip_address(text))
    except (OSError, ValueError):
        return None


def _error_code(exc: ClientError) -> str:
    code = exc.response.get("Error", {}).get("Code", "")
    if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 403 and code in ("", "403"):
        return "AccessDenied"
    return code


def _is_denied(exc: Exception) -> bool:
    return isinstance(exc, ClientError) and (_error_code(exc) in ACCESS_DENIED_CODES
                                             or "not authorized" in str(exc))


def _denied(report: PreflightReport, check: str, action: str, exc: Exception) -> None:
    report.add(check, WARN, f"could not check: access denied to {action}",
               f"allow {action} for your IAM identity, or check this by hand")


def _describe(exc: Exception) -> str:
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        return f"{_error_code(exc)}: {err.get('Message', '')}".strip()
    return str(exc)


# --- checks --------------------------------------------------------------------------------------


def check_credentials(report: PreflightReport, clients: AwsClients) -> bool:
    try:
        ident = clients.sts.get_caller_identity()
    except (NoCredentialsError, PartialCredentialsError) as exc:
        report.add("credentials", FAIL, "no usable AWS credentials", aws.explain_credentials_error(exc) or "")
        return False
    except ClientError as exc:
        if _error_code(exc) in CREDENTIAL_CODES:
            report.add("credentials", FAIL, f"AWS rejected the credentials ({_describe(exc)})",
                       "refresh them (`aws sso login`, or new access keys) and check AWS_PROFILE")
            return False
        report.add("credentials", WARN, f"could not ask STS who we are ({_describe(exc)})")
        return True
    except BotoCoreError as exc:
        report.add("credentials", FAIL, f"cannot reach AWS ({exc})", "check the network and aws:region")
        return False
    report.add("credentials", OK, f"account {ident.get('Account')} as {ident.get('Arn')}")
    return True


def check_region(report: PreflightReport, region: str) -> bool:
    try:
        aws.resolve_region(region)
    except aws.AwsSetupError as exc:
        report.add("region", FAIL, str(exc), "`pulumi config set aws:region <region>` with a region listed above")
        return False
    report.add("region", OK, region)
    return True


def _offered(ec2, location_type: str, types: list[str]) -> dict[str, set[str]]:
    """Instance type -> the locations (region or zones) where it is offered."""
    found: dict[str, set[str]] = {t: set() for t in types}
    pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
        LocationType=location_type, Filters=[{"Name": "instance-type", "Values": types}])
    for page in pages:
        for offer in page.get("InstanceTypeOfferings", []):
            found.setdefault(offer["InstanceType"], set()).add(offer["Location"])
    return found


def _default_subnets(ec2) -> dict[str, str]:
    """Zone -> default subnet id, in the default VPC."""
    subnets = {}
    for page in ec2.get_paginator("describe_subnets").paginate(
            Filters=[{"Name": "default-for-az", "Values": ["true"]}]):
        for subnet in page.get("Subnets", []):
            subnets[subnet["AvailabilityZone"]] = subnet["SubnetId"]
    return subnets


def check_offering(report: PreflightReport, clients: AwsClients, spec: ClusterSpec) -> str | None:
    """The zone the cluster will launch in (None if unknown or not offered)."""
    itype = spec.instance_type
    try:
        in_region = _offered(clients.ec2, "region", sorted({itype, *catalog.known_types()}))
    except ClientError as exc:
        if _is_denied(exc):
            _denied(report, "offering", "ec2:DescribeInstanceTypeOfferings", exc)
            return None
        raise
    if not in_region.get(itype):
        others = sorted(t for t, where in in_region.items() if where and t != itype)
        report.add("offering", FAIL, f"{itype} is not offered in {spec.region}",
                   f"set instanceType to one offered here ({', '.join(others) or 'none of the catalog'}) "
                   "or choose another aws:region")
        return None
    zones = _offered(clients.ec2, "availability-zone", [itype]).get(itype, set())
    if spec.subnet_id:
        try:
            subnet = clients.ec2.describe_subnets(SubnetIds=[spec.subnet_id])["Subnets"][0]
        except ClientError as exc:
            report.add("offering", FAIL, f"subnetId {spec.subnet_id!r}: {_describe(exc)}",
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


def _quota_value(quotas, code: str) -> float:
    try:
        return float(quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])
    except ClientError as exc:
        if _error_code(exc) != "NoSuchResourceException":
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
                if inst["InstanceType"][0] not in STANDARD_FAMILIES:
                    continue
                market = "spot" if inst.get("InstanceLifecycle") == "spot" else "on-demand"
                counts[market].append(inst["InstanceType"])
    sizes = _vcpus(ec2, {t for types in counts.values() for t in types})
    return {market: sum(sizes.get(t, 0) for t in types) for market, types in counts.items()}


def check_quotas(report: PreflightReport, clients: AwsClients, spec: ClusterSpec) -> None:
    itype = spec.instance_type
    if itype[0] not in STANDARD_FAMILIES:
        report.add("quota", SKIPPED, f"{itype} is not a standard (A, C, D, H, I, M, R, T, Z) type; "
                   "check its family's vCPU quota in the Service Quotas console")
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
        if not _is_denied(exc):
            raise
        _denied(report, "quota", "ec2:DescribeInstances (vCPUs already running are not counted)", exc)
        in_use = {"spot": 0, "on-demand": 0}
    for market, (nodes, code, title) in needs.items():
        if nodes == 0:
            continue
        needed = nodes * vcpus
        try:
            quota = _quota_value(clients.quotas, code)
        except ClientError as exc:
            if _is_denied(exc):
                _denied(report, "quota", f"servicequotas:GetServiceQuota ({market} quota {code}, "
                        f"{needed} vCPUs needed)", exc)
            else:
                report.add("quota", WARN, f"could not read the {market} quota {code} ({_describe(exc)}); "
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
        {"Name": "name", "Values": [UBUNTU_2404_AMD64]}, {"Name": "architecture", "Values": ["x86_64"]},
        {"Name": "root-device-type", "Values": ["ebs"]}])["Images"]
    return max(images, key=lambda i: i.get("CreationDate", "")) if images else None


def dry_run_params(spec: ClusterSpec, image: dict, zone: str | None, spot: bool) -> dict:
    """run_instances arguments with the stack's real settings (no resources the stack has not made yet)."""
    params: dict = {
        "DryRun": True, "ImageId": image["ImageId"], "InstanceType": spec.instance_type,
        "MinCount": 1, "MaxCount": 1,
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 1},
        "BlockDeviceMappings": [{"DeviceName": image.get("RootDeviceName", "/dev/sda1"), "Ebs": {
            "VolumeSize": spec.root_volume_gib, "VolumeType": spec.root_volume_type, "Encrypted": True,
            "DeleteOnTermination": True}}],
    }
    if spec.subnet_id:
        params["SubnetId"] = spec.subnet_id
    elif zone:
        params["Placement"] = {"AvailabilityZone": zone}
    if spot:
        options = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
        if spec.spot_max_price:
            options["MaxPrice"] = f"{spec.spot_max_price:.4f}"
        params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": options}
        params["InstanceInitiatedShutdownBehavior"] = "terminate"
    return params


def check_dry_run(report: PreflightReport, clients: AwsClients, spec: ClusterSpec, zone: str | None) -> None:
    try:
        image = _base_image(clients.ec2, spec)
    except ClientError as exc:
        if _is_denied(exc):
            _denied(report, "dry-run", "ec2:DescribeImages", exc)
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
    markets = sorted({spec.master_spot, spec.worker_spot if spec.worker_count else spec.master_spot})
    for spot in markets:
        market = "spot" if spot else "on-demand"
        try:
            clients.ec2.run_instances(**dry_run_params(spec, image, zone, spot))
        except ClientError as exc:
            code = _error_code(exc)
            if code == "DryRunOperation":
                report.add("dry-run", OK, f"AWS would launch {market} {spec.instance_type} from {image['ImageId']}"
                           + (f" in {zone}" if zone else ""))
                continue
            if _is_denied(exc):
                report.add("dry-run", FAIL, f"launching {market} {spec.instance_type} is not allowed ({_describe(exc)})",
                           "grant ec2:RunInstances (and ec2:CreateTags) to your IAM identity, or lift the "
                           "SCP/permission boundary that denies it")
                continue
            report.add("dry-run", FAIL, f"AWS refused a {market} {spec.instance_type} launch ({_describe(exc)})",
                       _dry_run_fix(code, spec))
        else:  # pragma: no cover - AWS never launches with DryRun=True
            report.add("dry-run", WARN, "run_instances with DryRun=True returned without DryRunOperation")


def _dry_run_fix(code: str, spec: ClusterSpec) -> str:
    if code.startswith("InvalidAMIID"):
        return "set baseAmi to an AMI of this region"
    if code in ("InsufficientInstanceCapacity", "Unsupported"):
        return "choose another zone (subnetId) or another instanceType from the catalog"
    if code in ("SpotMaxPriceTooLow", "MaxSpotInstanceCountExceeded"):
        return "raise spotMaxPrice or leave it unset (pays at most the on-demand price)"
    if code in ("VcpuLimitExceeded", "InstanceLimitExceeded"):
        return "request a higher vCPU quota in Service Quotas"
    return "fix the setting named in AWS's message and run `fab preflight` again"


def check_admin_cidr(report: PreflightReport, spec: ClusterSpec,
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
                  public_ip: Callable[[], str | None] | None = lookup_public_ip) -> PreflightReport:
    """Every check for `spec`; never raises for an AWS answer, returns the findings instead."""
    report = PreflightReport(region=spec.region)
    if not check_region(report, spec.region):
        return report
    clients = clients or AwsClients.for_region(spec.region)
    if not check_credentials(report, clients):
        report.add("checks", SKIPPED, "offering, quota and dry-run need credentials")
        check_admin_cidr(report, spec, public_ip)
        return report
    _run_checks(report, (
        ("offering", lambda done: check_offering(report, clients, spec)),
        ("quota", lambda done: check_quotas(report, clients, spec)),
        ("dry-run", lambda done: check_dry_run(report, clients, spec, done.get("offering"))),
    ))
    check_admin_cidr(report, spec, public_ip)
    return report


def _run_checks(report: PreflightReport, checks, service: str = "") -> None:
    """Run `(name, check)` in order; each check gets the results of the earlier ones by name.

    A denied or failing AWS call becomes a finding of that check and the next check still runs.
    """
    done: dict[str, Any] = {}
    for name, check in checks:
        try:
            done[name] = check(done)
        except ClientError as exc:
            if _is_denied(exc):
                _denied(report, name, service + _operation_of(exc), exc)
            else:
                report.add(name, WARN, f"could not check: {_describe(exc)}")
        except BotoCoreError as exc:
            report.add(name, WARN, f"could not check: {exc}")


def _operation_of(exc: ClientError) -> str:
    match = re.search(r"calling the (\w+) operation", str(exc))
    return match.group(1) if match else "an AWS API"


# --- before `fab train` on a running AWS cluster -------------------------------------------------

# Spot request status codes that mean AWS has decided to take the instance back (two-minute notice).
SPOT_NOTICE_CODES = {"marked-for-termination", "marked-for-stop", "marked-for-hibernation"}


def _replace_fix(node: Node) -> str:
    if node.rank == 0:
        return "run `pulumi up` again to replace it (the master cannot be left out), then rerun"
    return (f"run `pulumi up` again to replace it, or use fewer --nodes (--nodes {node.rank} leaves out "
            f"{node.name} and every node after it), then rerun")


def check_nodes(report: PreflightReport, clients: AwsClients, inventory: Inventory) -> dict[str, dict]:
    """Every node's instance is running; returns instance id -> describe_instances record."""
    by_id = {n.instance_id: n for n in inventory.nodes if n.instance_id}
    unknown = [n.name for n in inventory.nodes if not n.instance_id]
    if unknown:
        report.add("nodes", WARN, f"no instance id known for {', '.join(unknown)}: not checked")
    if not by_id:
        return {}
    records: dict[str, dict] = {}
    # A filter, not InstanceIds: an id AWS has forgotten is simply missing instead of failing the call.
    pages = clients.ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": "instance-id", "Values": sorted(by_id)}])
    for page in pages:
        for reservation in page.get("Reservations", []):
            for inst in reservation.get("Instances", []):
                records[inst["InstanceId"]] = inst
    bad = 0
    for node in inventory.nodes:
        if not node.instance_id:
            continue
        inst = records.get(node.instance_id)
        state = inst["State"]["Name"] if inst else "gone"
        if state == "running":
            continue
        bad += 1
        if state == "pending":
            report.add("nodes", FAIL, f"{node.name} ({node.role}, {node.instance_id}) is still starting (pending)",
                       "wait until it is running, then rerun")
            continue
        reason = inst.get("StateReason", {}).get("Message", "") if inst else ""
        what = "no longer exists" if inst is None else f"is {state}" + (f" ({reason})" if reason else "")
        report.add("nodes", FAIL, f"{node.name} ({node.role}, {node.instance_id}) {what}", _replace_fix(node))
    if not bad:
        report.add("nodes", OK, f"all {len(by_id)} node(s) running: "
                   + ", ".join(f"{n.name} {n.instance_id}" for n in inventory.nodes if n.instance_id))
    return records


def check_spot_notices(report: PreflightReport, clients: AwsClients, inventory: Inventory,
                       records: dict[str, dict] | None) -> None:
    """No spot node has an interruption notice (its spot request says marked-for-termination/stop).

    The request id comes from the instance record; when describe_instances was not allowed
    (`records` None) the requests are looked up by instance id instead.
    """
    spot_nodes = [n for n in inventory.nodes if n.spot and n.instance_id]
    if not spot_nodes:
        return
    node_of = {n.instance_id: n for n in spot_nodes}
    if records is None:
        query = {"Filters": [{"Name": "instance-id", "Values": sorted(node_of)}]}
    else:
        request_ids = sorted(records[i]["SpotInstanceRequestId"] for i in node_of
                             if records.get(i, {}).get("SpotInstanceRequestId")
                             and records[i]["State"]["Name"] == "running")
        if not request_ids:
            report.add("spot", SKIPPED, "interruption notices not knowable: AWS names no spot request for "
                       f"{', '.join(n.name for n in spot_nodes)}")
            return
        query = {"SpotInstanceRequestIds": request_ids}
    requests = clients.ec2.describe_spot_instance_requests(**query).get("SpotInstanceRequests", [])
    code_of = {r.get("InstanceId"): r.get("Status", {}).get("Code", "") for r in requests}
    noticed = 0
    for node in spot_nodes:
        code = code_of.get(node.instance_id, "")
        if code not in SPOT_NOTICE_CODES:
            continue
        noticed += 1
        report.add("spot", FAIL, f"{node.name} ({node.role}, {node.instance_id}) has a spot interruption notice "
                   f"({code}): AWS takes it back within two minutes", _replace_fix(node).replace(
                       "replace it", "replace it once it is gone"))
    if not noticed:
        report.add("spot", OK, f"no spot interruption notice on {', '.join(n.name for n in spot_nodes)}")


def preflight_for_train(inventory: Inventory, clients: AwsClients | None = None) -> PreflightReport | None:
    """What `fab train` checks on an AWS cluster before launching; None for other kinds of cluster.

    Never raises for an AWS answer: a denied or failing API is a finding and the other checks run.
    """
    if inventory.kind != "aws":
        return None
    region = inventory.region or aws.resolve_region(None)
    report = PreflightReport(region=region)
    clients = clients or AwsClients(sts=aws.client("sts", region), ec2=aws.client("ec2", region), quotas=None)
    if not check_credentials(report, clients):
        report.add("checks", SKIPPED, "node states and spot notices need credentials")
        return report
    _run_checks(report, (
        ("nodes", lambda done: check_nodes(report, clients, inventory)),
        ("spot", lambda done: check_spot_notices(report, clients, inventory, done.get("nodes"))),
    ), service="ec2:")
    return report
