"""`fab preflight`'s quota check: do Service Quotas' vCPU quotas for spot and on-demand Standard
instances cover the cluster's nodes x vCPUs on top of what already runs in the account?

Types outside the Standard (A, C, D, H, I, M, R, T, Z) families count against other quotas
(`quota_group`) and are not read here. Called by `run_preflight` (node_setup/aws/preflight.py).
"""

from __future__ import annotations

import re

from botocore.exceptions import ClientError

from cluster.stack import catalog
from cluster.stack.spec import ClusterSpec
from cluster.stack.tags import CLUSTER_KEY
from node_setup.aws import errors
from node_setup.aws.findings import FAIL, OK, SKIPPED, WARN, AwsClients, Report, denied

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


def quota_group(instance_type: str) -> str | None:
    """The Service Quotas vCPU group the type counts against ("Standard", "Inf", ...), None if unknown."""
    prefix = re.split(r"[^a-z]", instance_type.split(".")[0].lower(), maxsplit=1)[0]
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
    known = {t: info.vcpus for t in types if (info := catalog.lookup(t))}
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


def _who(master: bool, workers: int) -> str:
    """"the master and 3 workers of the group", "2 workers of the group", "the master"."""
    group = f"{workers} worker{'s' if workers != 1 else ''} of the group" if workers else ""
    return " and ".join(part for part in ("the master" if master else "", group) if part)


def check_quotas(report: Report, clients: AwsClients, spec: ClusterSpec) -> None:
    """With instanceTypes, every listed type: each must count against the Standard quota this check reads, and
    the nodes need the most vCPUs any of them has (one shape: the same for all)."""
    itype = "/".join(spec.types)  # how the findings name the nodes' type(s)
    others = [(t, quota_group(t)) for t in spec.types if quota_group(t) != STANDARD]
    if others:
        t, group = others[0]
        report.add("quota", SKIPPED, f"{t} counts against {f'the {group}' if group else 'its own'} vCPU quota, "
                   "not the Standard (A, C, D, H, I, M, R, T, Z) one this check reads; check it in the "
                   "Service Quotas console")
        return
    try:
        sizes = _vcpus(clients.ec2, set(spec.types))
        vcpus = max(sizes[t] for t in spec.types)
    except (ClientError, KeyError) as exc:
        report.add("quota", WARN, f"could not learn the vCPUs of {itype} ({exc})")
        return
    spot_nodes = int(spec.master_spot) + (spec.worker_count if spec.worker_spot else 0)
    needs = {"spot": (spot_nodes, SPOT_QUOTA_CODE, "All Standard Spot Instance Requests"),
             "on-demand": (spec.node_count - spot_nodes, ON_DEMAND_QUOTA_CODE,
                           "Running On-Demand Standard instances")}
    # Which nodes count in each market: the master, and the workers' Auto Scaling group at workerCount
    # (it is replaced deleting first, so never more than workerCount workers run).
    counted = {market: _who(spec.master_spot == (market == "spot"),
                            spec.worker_count if spec.worker_spot == (market == "spot") else 0)
               for market in needs}
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
        what = (f"{market} vCPU quota {code} ({title}) is {quota:g}{busy}; {nodes} x {itype} "
                f"({counted[market]}) need {needed}")
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
                         if t.vcpus * nodes <= available and t.name not in spec.types)
        if smaller:
            fix += f"; or a smaller type that fits: {', '.join(n for _, n in smaller[-3:])}"
        if market == "spot":
            fix += "; or on-demand nodes (masterSpot/workerSpot false) if that quota has room"
        report.add("quota", FAIL, what, fix)
