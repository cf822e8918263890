"""What `fab train` says at the end of a run and at launch (node_setup/tasks/train.py), from the
job's summary.json; the master is a stand-in (no SSH), the summary is what the job writes."""

from __future__ import annotations

import json
from types import SimpleNamespace as NS

import pytest

from cluster.job import jobreport
from cluster.inventory import Inventory, Node
from node_setup.tasks import job_run as fab_train

OUT = "xeon-cluster-runs/job-1"
URI = "s3://ckpt/run1"


def summary(status="interrupted", uri=URI, records=(), interrupted_at=30):
    return {"status": status, "exit_code": 75 if status == "interrupted" else 0, "world_size": 4, "steps": 30,
            "interruption": {"step": interrupted_at, "seen_by_rank": 2} if status == "interrupted" else None,
            "checkpoints": list(records),
            "checkpoint_upload_errors": [{"step": r["step"], "error": r["upload_error"]}
                                         for r in records if r["upload_error"]],
            "settings": {"checkpoint_uri": uri}}


def record(step, uri=URI, error=None):
    return {"step": step, "path": f"{OUT}/checkpoint-{step}", "upload_error": error,
            "uri": None if error or not uri else f"{uri}/checkpoint-{step}"}


def follow_to_end(monkeypatch, capsys, code, text):
    monkeypatch.setattr(fab_train.jobs, "follow", lambda *a, **k: None)
    monkeypatch.setattr(fab_train.jobs, "log_text", lambda master, job_id: "")
    monkeypatch.setattr(fab_train.jobs, "read_remote_record", lambda conn, path: text)
    plan = NS(job_id="job-1", launch=NS(rank_hosts=["node0", "node1"], launcher="mpirun"), output_dir=OUT, user=None,
              inventory=NS(master=NS(name="node0")))
    life = NS(transport=NS(master="node0", conns={"node0": object()}), stop=lambda job, grace=10: [],
              outcome=lambda job: jobreport.outcome(f"exited {code}", "", job.launch.rank_hosts))  # the job's end
    assert fab_train.follow_to_end(life, plan) == code
    return capsys.readouterr().out


def test_reclaim_with_the_checkpoint_saved_and_uploaded(monkeypatch, capsys):
    out = follow_to_end(monkeypatch, capsys, 75, json.dumps(summary(records=[record(20), record(30)])))
    assert f"checkpoint-30 is saved in {OUT}/checkpoint-30 on node0 and uploaded to {URI}/checkpoint-30" in out
    assert "fab train --resume" in out


def test_reclaim_whose_upload_failed_does_not_claim_the_checkpoint_is_safe(monkeypatch, capsys):
    records = [record(20), record(30, error="ClientError: AccessDenied")]
    out = follow_to_end(monkeypatch, capsys, 75, json.dumps(summary(records=records)))
    assert "the checkpoint is saved" not in out
    assert f"checkpoint-30 is saved only in {OUT}/checkpoint-30 on node0: its upload to {URI} failed " \
           "(ClientError: AccessDenied)" in out
    assert f"the newest checkpoint on S3 is checkpoint-20 ({URI}/checkpoint-20)" in out


def test_reclaim_without_a_checkpoint_uri_says_it_is_on_local_disk_only(monkeypatch, capsys):
    out = follow_to_end(monkeypatch, capsys, 75, json.dumps(summary(uri=None, records=[record(30, uri=None)])))
    assert "the checkpoint is saved" not in out
    assert f"checkpoint-30 is saved only on node0's local disk ({OUT}/checkpoint-30)" in out
    assert "--checkpoint-uri" in out


@pytest.mark.parametrize("text, expected", [
    (None, "no readable summary.json"),
    (json.dumps(summary(records=[record(20)])), "no checkpoint was saved at step 30"),
])
def test_reclaim_without_a_saved_checkpoint_says_so(monkeypatch, capsys, text, expected):
    out = follow_to_end(monkeypatch, capsys, 75, text)
    assert "the checkpoint is saved" not in out and expected in out


def test_a_completed_run_names_its_failed_uploads(monkeypatch, capsys):
    records = [record(10, error="EndpointConnectionError: could not connect"), record(20)]
    out = follow_to_end(monkeypatch, capsys, 0, json.dumps(summary(status="completed", records=records)))
    assert "checkpoint upload errors: 1 of 2 (checkpoint-10: EndpointConnectionError: could not connect)" in out


def inventory(kind, spot):
    nodes = tuple(Node(name=f"node{i}", address=f"10.0.0.{i + 10}", private_address=f"10.0.0.{i + 10}", rank=i,
                       spot=spot if i else False) for i in range(2))
    return Inventory(name="c1", kind=kind, user="ubuntu", nodes=nodes)


def test_a_spot_cluster_without_a_checkpoint_uri_is_warned_at_launch():
    line = jobreport.spot_warning(inventory("aws", True), None)
    assert line.startswith("warning: node1 is a spot instance") and "\n" not in line
    assert "a reclaim loses the run's progress" in line and "--checkpoint-uri s3://" in line
    assert jobreport.spot_warning(inventory("aws", True), URI) is None
    assert jobreport.spot_warning(inventory("aws", False), None) is None
    assert jobreport.spot_warning(inventory("local", None), None) is None


def test_nodes_with_another_xeon_cluster_than_this_checkout_are_named_at_launch():
    now = "0.1.0+src.aaaaaaaaaaaa"
    assert jobreport.software_warning({"node0": now, "node1": now}, now) is None
    line = jobreport.software_warning({"node0": now, "node1": "0.1.0+src.bbbbbbbbbbbb", "node2": ""}, now)
    assert line.startswith(f"warning: the nodes' xeon-cluster is not this checkout's ({now}): ") and "\n" not in line
    assert "node1 0.1.0+src.bbbbbbbbbbbb, node2 none;" in line and "node0" not in line
    assert "`fab setup` with the same --cluster" in line


def test_the_pre_launch_check_says_since_when_a_notice_is_pending():
    from datetime import datetime, timedelta, timezone

    from node_setup.aws import train_checks
    from node_setup.aws.findings import FAIL, Report

    nodes = inventory("aws", True).nodes
    nodes = tuple(Node(name=n.name, address=n.address, private_address=n.private_address, rank=n.rank,
                       spot=n.spot, instance_id=f"i-{n.rank:08x}") for n in nodes)
    marked = datetime.now(timezone.utc) - timedelta(minutes=7)

    class Ec2:
        def describe_spot_instance_requests(self, **query):
            return {"SpotInstanceRequests": [{"InstanceId": "i-00000001", "Status": {
                "Code": "marked-for-termination", "UpdateTime": marked,
                "Message": "Spot Instance terminated due to no available capacity."}}]}

    report = Report(region="us-east-1")
    records = {"i-00000001": {"SpotInstanceRequestId": "sir-1", "State": {"Name": "running"}}}
    train_checks.check_spot_notices(report, NS(ec2=Ec2()), Inventory(name="c1", kind="aws", user="u", nodes=nodes),
                                    records)
    [finding] = report.findings
    assert finding.status == FAIL and "marked-for-termination" in finding.message
    assert f"since {marked:%Y-%m-%d %H:%M} UTC (7 min ago)" in finding.message
