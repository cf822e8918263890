"""Before `fab train` on an AWS cluster that is up: credentials, every node's instance still
running, and no spot interruption notice on its spot request.

Never raises for an AWS answer: a denied or failing API is a finding and the other checks run.
"""

from __future__ import annotations

from datetime import datetime, timezone

from cluster.inventory import Inventory, Node
from node_setup.aws import clients as aws
from node_setup.aws.findings import FAIL, OK, SKIPPED, WARN, AwsClients, Report, check_credentials, run_checks

# Spot request status codes that mean AWS has decided to take the instance back (two-minute notice).
SPOT_NOTICE_CODES = {"marked-for-termination", "marked-for-stop", "marked-for-hibernation"}


def _replace_fix(node: Node) -> str:
    if node.rank == 0:
        return "run `pulumi up --refresh` to replace it (the master cannot be left out), then rerun"
    return (f"run `pulumi up --refresh` to replace it, or use fewer --nodes (--nodes {node.rank} leaves out "
            f"{node.name} and every node after it), then rerun")


def check_nodes(report: Report, clients: AwsClients, inventory: Inventory) -> dict[str, dict]:
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


def _since(when) -> str:
    """', since 2026-01-01 12:00 UTC (7 min ago)' for the time a spot request's status changed, or ''."""
    if not isinstance(when, datetime):
        return ""
    when = when if when.tzinfo else when.replace(tzinfo=timezone.utc)
    minutes = max(0, int((datetime.now(timezone.utc) - when).total_seconds() // 60))
    return f", since {when.astimezone(timezone.utc):%Y-%m-%d %H:%M} UTC ({minutes} min ago)"


def check_spot_notices(report: Report, clients: AwsClients, inventory: Inventory,
                       records: dict[str, dict] | None) -> None:
    """No spot node has an interruption notice (its spot request says marked-for-termination/stop).

    The request id comes from the instance record; when describe_instances was not allowed
    (`records` None) the requests are looked up by instance id instead.
    """
    node_of = {n.instance_id: n for n in inventory.nodes if n.spot and n.instance_id}
    spot_nodes = list(node_of.values())
    if not spot_nodes:
        return
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
    status_of = {r.get("InstanceId"): r.get("Status", {}) for r in requests}
    noticed = 0
    for node in spot_nodes:
        status = status_of.get(node.instance_id, {})
        code = status.get("Code", "")
        if code not in SPOT_NOTICE_CODES:
            continue
        noticed += 1
        report.add("spot", FAIL, f"{node.name} ({node.role}, {node.instance_id}) has a spot interruption notice "
                   f"({code}{_since(status.get('UpdateTime'))}): AWS takes it back within two minutes",
                   _replace_fix(node).replace("replace it", "replace it once it is gone"))
    if not noticed:
        report.add("spot", OK, f"no spot interruption notice on {', '.join(n.name for n in spot_nodes)}")


def preflight_for_train(inventory: Inventory, clients: AwsClients | None = None) -> Report:
    """What `fab train` checks on an AWS cluster before launching (the AWS backend's `preflight_for_run`).

    Never raises for an AWS answer: a denied or failing API is a finding and the other checks run.
    """
    region = inventory.region or aws.resolve_region(None)
    report = Report(region=region)
    clients = clients or AwsClients(sts=aws.client("sts", region), ec2=aws.client("ec2", region), quotas=None)
    if not check_credentials(report, clients):
        report.add("checks", SKIPPED, "node states and spot notices need credentials")
        return report
    run_checks(report, (
        ("nodes", lambda done: check_nodes(report, clients, inventory)),
        ("spot", lambda done: check_spot_notices(report, clients, inventory, done.get("nodes"))),
    ), service="ec2:")
    return report
