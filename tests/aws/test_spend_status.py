"""`fab status`'s spend on an AWS cluster: instances in moto with known launch times, prices from a
test double.

moto's spot price history is fake (every zone at $0.00001) and moto has no Pricing API, so the
prices come from `FakePriceBook`, a test double named as one, in place of node_setup/aws/pricing.py's
PriceBook. The nodes cannot be reached over SSH here: `unreachable_nodes` and `job_on_master`
stand in for the master's answers (node_setup/ssh/job.py), so the table and JSON are what is checked.
"""

from __future__ import annotations

import datetime as dt
import json
import re

import boto3
import pytest
from invoke import Context

from cluster.cost.costplan import Price
from cluster.stack.tags import ROLE_MASTER, ROLE_WORKER
from node_setup.aws import pricing
from node_setup.ssh import job as ssh_job
from node_setup.ssh.fanout import NodeOutcome
from node_setup.tasks import common
from node_setup.tasks import jobs as job_tasks
from node_setup.tasks import spend as node_spend
from tests.aws.test_discovery import Launcher

moto = pytest.importorskip("moto")
from moto.core import DEFAULT_ACCOUNT_ID  # noqa: E402
from moto.ec2.models import ec2_backends  # noqa: E402

NOW = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.timezone.utc)
SPOT_USD, ON_DEMAND_USD = 2.0, 3.0


class FakePriceBook:
    """Test double for pricing.PriceBook: fixed prices, and the questions it was asked."""

    asked: list[tuple[str, bool, str | None]] = []
    unknown: set[str] = set()  # instance types it has no price for
    by_type: dict[str, tuple[float, float]] = {}  # instance type -> (spot, on-demand) $/hour; others SPOT/ON_DEMAND_USD

    def __init__(self, region, **_):
        self.region = region

    def price(self, instance_type, *, spot, zone=None):
        FakePriceBook.asked.append((instance_type, spot, zone))
        if instance_type in self.unknown:
            raise LookupError(f"no price for instance type {instance_type!r} (test double)")
        market = "spot" if spot else "on-demand"
        spot_usd, on_demand_usd = self.by_type.get(instance_type, (SPOT_USD, ON_DEMAND_USD))
        return Price(spot_usd if spot else on_demand_usd, market, f"{market} price double, {zone}", zone)


@pytest.fixture
def price_double(monkeypatch):
    """FakePriceBook in place of the AWS price book, asked nothing yet; the clock at NOW."""
    monkeypatch.setattr(pricing, "PriceBook", FakePriceBook)
    monkeypatch.setattr(FakePriceBook, "asked", [])
    monkeypatch.setattr(FakePriceBook, "unknown", set())
    monkeypatch.setattr(FakePriceBook, "by_type", {})
    monkeypatch.setattr(node_spend, "clock", NOW.timestamp)


@pytest.fixture
def cluster(mocked_aws, price_double):
    """Cluster demo: an on-demand master up 3 hours, spot workers up 2 hours and 30 minutes."""
    launch = Launcher(mocked_aws)
    ec2 = ec2_backends[DEFAULT_ACCOUNT_ID][mocked_aws]
    for role, rank, ip, spot, up in ((ROLE_MASTER, 0, "0.10", False, dt.timedelta(hours=3)),
                                     (ROLE_WORKER, 1, "0.11", True, dt.timedelta(hours=2)),
                                     (ROLE_WORKER, 2, "0.12", True, dt.timedelta(minutes=30))):
        instance_id = launch("demo", role, rank, ip=ip, spot=spot, instance_type="c6i.16xlarge")
        ec2.get_instance(instance_id).launch_time = (NOW - up).replace(tzinfo=None)  # moto keeps naive UTC
    return mocked_aws


@pytest.fixture
def unreachable_nodes(monkeypatch):
    """No SSH: every node answers `true`, and no job has been started."""
    monkeypatch.setattr(common, "connect", lambda inventory: {n.name: object() for n in inventory.nodes})

    def no_job(master, job_id):
        raise ssh_job.JobError("no job has been started on this cluster yet")

    monkeypatch.setattr(ssh_job, "resolve_job_id", no_job)
    monkeypatch.setattr(job_tasks, "on_nodes",
                        lambda conns, command, timeout: [NodeOutcome(name, True, "") for name in conns])


@pytest.fixture
def job_on_master(monkeypatch, unreachable_nodes):
    """A running job, as the master would report it."""
    monkeypatch.setattr(ssh_job, "resolve_job_id", lambda master, job_id: "job-7")
    monkeypatch.setattr(ssh_job, "rank_states", lambda conns, job_id: {
        name: NodeOutcome(name, True, f"{rank} running") for rank, name in enumerate(conns)})
    monkeypatch.setattr(ssh_job, "job_state", lambda master, job_id: ("running", "4242"))
    monkeypatch.setattr(ssh_job, "read_metadata", lambda master, job_id: {
        "started": "2026-05-01T11:50:00Z", "world_size": 3, "hosts": ["node0", "node1", "node2"],
        "output_dir": "xeon-cluster-runs/job-7", "rank_hosts": ["node0", "node1", "node2"], "launcher": "mpirun"})
    monkeypatch.setattr(ssh_job, "log_tail", lambda master, job_id, lines=20: "[0] step 12/40 loss 1.25\n")
    monkeypatch.setattr(ssh_job, "log_first", lambda master, job_id, text: "")  # no MFU line in the log
    monkeypatch.setattr(ssh_job, "read_remote_record", lambda conn, path: None)  # no progress record yet


def status(capsys, *flags):
    job_tasks.status(Context(), cluster="demo", **{f: True for f in flags})
    return capsys.readouterr().out


def test_status_shows_each_node_s_market_uptime_price_and_spend(cluster, unreachable_nodes, capsys):
    out = status(capsys)
    rows = {line.split()[0]: line for line in out.splitlines() if re.match(r"^  node\d ", line)}
    assert re.search(r"on-demand\s+3h 00m 00s\s+\$3\.0000\s+\$9\.00\s+yes", rows["node0"]), out
    assert re.search(r"spot\s+2h 00m 00s\s+\$2\.0000\s+\$4\.00\s+yes", rows["node1"]), out
    assert re.search(r"spot\s+30m 00s\s+\$2\.0000\s+\$1\.00\s+yes", rows["node2"]), out
    assert "total: 3 node(s), $7.0000/hour, $14.00 spent so far" in out
    assert "price: c6i.16xlarge: spot price double, us-east-1a" in out
    # one price per instance type, market and zone: the master on-demand, the workers at their zone's spot price
    assert sorted(set(FakePriceBook.asked)) == [("c6i.16xlarge", False, "us-east-1a"),
                                                ("c6i.16xlarge", True, "us-east-1a")]
    assert "no job started yet" in out


def test_status_json_is_the_only_output_and_carries_spend_total_and_job(cluster, job_on_master, capsys):
    data = json.loads(status(capsys, "json"))  # the whole of stdout is one JSON object
    assert data["cluster"] == "demo" and data["kind"] == "aws"
    master, spot_worker = data["nodes"][0], data["nodes"][1]
    assert master["name"] == "node0" and master["market"] == "on-demand" and master["spot"] is False
    assert master["launched_at"] == "2026-05-01T09:00:00Z" and master["uptime_seconds"] == 3 * 3600
    assert master["usd_per_hour"] == ON_DEMAND_USD and master["spent_usd"] == pytest.approx(9.0)
    assert spot_worker["market"] == "spot" and spot_worker["spent_usd"] == pytest.approx(4.0)
    assert spot_worker["price_source"] == "c6i.16xlarge: spot price double, us-east-1a"
    assert [n["ranks"] for n in data["nodes"]] == ["1 running (r0)", "1 running (r1)", "1 running (r2)"]
    assert data["total"] == {"nodes": 3, "usd_per_hour": 7.0, "spent_usd": 14.0, "unpriced": []}
    job = data["job"]
    assert job["id"] == "job-7" and job["state"] == "running" and job["described"] == "running (job script pid 4242)"
    assert job["world_size"] == 3 and job["output_dir"] == "xeon-cluster-runs/job-7"
    assert "step 12/40 loss 1.25" in job["last_log_line"]


def test_a_node_without_a_price_is_named_and_left_out_of_the_total(cluster, unreachable_nodes, capsys, monkeypatch):
    launch = Launcher(cluster)
    instance_id = launch("demo", ROLE_WORKER, 3, ip="0.13", spot=True, instance_type="m5.large")
    ec2_backends[DEFAULT_ACCOUNT_ID][cluster].get_instance(instance_id).launch_time = (
        NOW - dt.timedelta(hours=1)).replace(tzinfo=None)
    FakePriceBook.unknown.add("m5.large")
    data = json.loads(status(capsys, "json"))
    node3 = data["nodes"][3]
    assert node3["market"] == "spot" and node3["uptime_seconds"] == 3600
    assert node3["usd_per_hour"] is None and node3["spent_usd"] is None
    assert "no price for m5.large" in node3["price_source"]
    assert data["total"] == {"nodes": 4, "usd_per_hour": 7.0, "spent_usd": 14.0, "unpriced": ["node3"]}
    text = status(capsys)
    assert "not counted: node3, spend unknown" in text
    assert re.search(r"^  node3 .* spot\s+1h 00m 00s\s+-\s+-\s+yes", text, re.M), text


def test_nodes_of_several_types_each_show_their_type_market_and_own_price(mocked_aws, price_double,
                                                                           unreachable_nodes, capsys):
    """A cluster of instanceTypes with onDemandFallback: the master (the first type, on demand), a spot worker
    of the second type and a worker the fallback launched on demand, of the third; each type priced apart."""
    FakePriceBook.by_type.update({"m7i.48xlarge": (3.0, 9.0), "c7i.48xlarge": (2.5, 8.0),
                                  "r7i.48xlarge": (4.0, 12.0)})
    launch = Launcher(mocked_aws)
    ec2 = ec2_backends[DEFAULT_ACCOUNT_ID][mocked_aws]
    for role, rank, ip, itype, spot in ((ROLE_MASTER, 0, "0.10", "m7i.48xlarge", False),
                                        (ROLE_WORKER, 1, "0.11", "c7i.48xlarge", True),
                                        (ROLE_WORKER, 2, "0.12", "r7i.48xlarge", False)):
        instance_id = launch("demo", role, rank, ip=ip, spot=spot, instance_type=itype)
        ec2.get_instance(instance_id).launch_time = (NOW - dt.timedelta(hours=2)).replace(tzinfo=None)
    out = status(capsys)
    rows = {line.split()[0]: line for line in out.splitlines() if re.match(r"^  node\d ", line)}
    # by hand: 2 hours at each node's own type and market
    assert re.search(r"m7i\.48xlarge\s+on-demand\s+2h 00m 00s\s+\$9\.0000\s+\$18\.00\s", rows["node0"]), out
    assert re.search(r"c7i\.48xlarge\s+spot\s+2h 00m 00s\s+\$2\.5000\s+\$5\.00\s", rows["node1"]), out
    assert re.search(r"r7i\.48xlarge\s+on-demand\s+2h 00m 00s\s+\$12\.0000\s+\$24\.00\s", rows["node2"]), out
    assert "total: 3 node(s), $23.5000/hour, $47.00 spent so far" in out
    sources = {line.strip() for line in out.splitlines() if line.startswith("  price: ")}
    assert sources == {"price: m7i.48xlarge: on-demand price double, us-east-1a",
                       "price: c7i.48xlarge: spot price double, us-east-1a",
                       "price: r7i.48xlarge: on-demand price double, us-east-1a"}
    data = json.loads(status(capsys, "json"))
    assert [(n["type"], n["market"], n["spot"], n["usd_per_hour"]) for n in data["nodes"]] == [
        ("m7i.48xlarge", "on-demand", False, 9.0), ("c7i.48xlarge", "spot", True, 2.5),
        ("r7i.48xlarge", "on-demand", False, 12.0)]
    assert data["total"] == {"nodes": 3, "usd_per_hour": 23.5, "spent_usd": 47.0, "unpriced": []}


def test_the_price_book_asks_aws_once_per_type_market_and_zone(mocked_aws):
    ec2 = boto3.client("ec2", region_name=mocked_aws)
    book = pricing.PriceBook(mocked_aws, ec2=ec2)
    first = book.price("r7iz.metal-16xl", spot=True, zone="us-east-1b")
    assert first.market == "spot" and first.zone == "us-east-1b"  # moto's history has every offering zone
    assert book.price("r7iz.metal-16xl", spot=True, zone="us-east-1b") is first
    assert book.price("r7iz.metal-16xl", spot=True, zone="us-east-1c").zone == "us-east-1c"


def test_status_shows_a_running_job_s_latest_mfu(cluster, job_on_master, capsys, monkeypatch):
    from cluster.cost import flops

    peak = flops.Peak(cores=32, ghz=3.5, flops_per_cycle=64, precision=flops.FP32_AVX512, source="catalog: c6i")
    log = "\n".join(f"[0] rank 0 INFO training: {flops.progress_line(step, tflops * 1e12, peak)}"
                    for step, tflops in ((20, 0.5), (40, 0.7168))) + "\n[0] step 41/80 loss 1.1\n"
    monkeypatch.setattr(ssh_job, "log_tail", lambda master, job_id, lines=20: log)
    out = status(capsys)
    assert "  MFU: step 40: model FLOP/s per node 0.717 TFLOP/s, MFU 10.00% of 7.168 TFLOP/s" in out, out
    data = json.loads(status(capsys, "json"))
    assert data["job"]["mfu"] == pytest.approx(0.1) and "loss 1.1" in data["job"]["last_log_line"]


def test_status_finds_the_mfu_line_the_job_logged_once_before_the_log_s_end(cluster, job_on_master, capsys,
                                                                             monkeypatch):
    """The built-in job logs its MFU once, at its first logging step: long before the end `fab status` reads."""
    from cluster.cost import flops

    peak = flops.Peak(cores=32, ghz=3.5, flops_per_cycle=64, precision=flops.FP32_AVX512, source="catalog: c6i")
    first = f"[0] rank 0 INFO training: {flops.progress_line(20, 0.5e12, peak)}\n"
    monkeypatch.setattr(ssh_job, "log_tail", lambda master, job_id, lines=20: "[0] step 900/1000 loss 0.4\n")
    asked = []
    monkeypatch.setattr(ssh_job, "log_first", lambda master, job_id, text: asked.append(text) or first)
    out = status(capsys)
    assert "  MFU: step 20: model FLOP/s per node 0.500 TFLOP/s" in out and asked == [flops.PROGRESS_MARKER], out


def test_status_shows_a_running_job_s_progress_and_its_cost_so_far(cluster, job_on_master, capsys, monkeypatch):
    """The job's progress record (xeon_cluster/progress.py's, read from its output folder on the master): step of
    total, samples/s, the time left at that pace, and its 3 nodes' $7.00/hour since it started 10 minutes ago."""
    record = {"format": 1, "step": 120, "total": 400, "steps_per_second": 0.5, "samples_per_second": 48.0,
              "updated": NOW.timestamp() - 3}
    read = {"xeon-cluster-runs/job-7/progress.json": json.dumps(record)}
    monkeypatch.setattr(ssh_job, "read_remote_record", lambda conn, path: read.get(path))
    out = status(capsys)
    assert "  progress: step 120 of 400 (30%), 48 samples/s, about 9m20s left, $1.17 so far (record 3s old)" in out
    data = json.loads(status(capsys, "json"))
    assert data["job"]["progress"] == {"step": 120, "total": 400, "samples_per_second": 48.0, "seconds_left": 560,
                                       "cost_so_far_usd": 1.1667}
    read["xeon-cluster-runs/job-7/progress.json"] = '{"format": 1, "step": "\u001b[2J"}'
    out = status(capsys)
    assert "  progress: the master: ~/xeon-cluster-runs/job-7/progress.json: not JSON (Invalid control" in out
    assert "\x1b" not in out


def test_an_ended_job_shows_no_rank_running_and_no_record_from_before_its_start(cluster, job_on_master, capsys,
                                                                                 monkeypatch):
    """After a silent loss the job script has ended (exit 255) while a rank is still alive: that rank is shown as
    left over, never "running" beside "finished"; the output folder's progress record is an earlier job's (it
    was updated before this job started): not shown as this job's progress."""
    monkeypatch.setattr(ssh_job, "job_state", lambda master, job_id: ("exited", "255"))
    started = dt.datetime(2026, 5, 1, 11, 50, tzinfo=dt.timezone.utc).timestamp()
    record = {"format": 1, "step": 46, "total": 400, "steps_per_second": 0.5, "samples_per_second": 48.0,
              "updated": started - 66}
    monkeypatch.setattr(ssh_job, "read_remote_record", lambda conn, path: json.dumps(record))
    out = status(capsys)
    assert "job job-7: finished, exit code 255" in out, out
    assert " running (r" not in out and "1 left after the job's end (r0)" in out, out
    assert ("  progress: none yet from this job (the record in ~/xeon-cluster-runs/job-7/progress.json is from "
            "before it started)") in out, out
    assert "step 46 of 400" not in out


def test_status_of_a_job_the_master_does_not_hold_is_one_line_and_exit_2(cluster, job_on_master, capsys, monkeypatch):
    from invoke import Exit

    monkeypatch.setattr(ssh_job, "resolve_job_id", lambda master, job_id: job_id)
    monkeypatch.setattr(ssh_job, "job_state", lambda master, job_id: ("missing", ""))
    with pytest.raises(Exit) as refused:
        job_tasks.status(Context(), cluster="demo", job="20260501-115000-dead")
    assert refused.value.code == 2 and capsys.readouterr().out == ""
    assert str(refused.value.message) == ("error: --job: job '20260501-115000-dead' is not on the master node0; "
                                          "`fab jobs` lists the jobs there")
