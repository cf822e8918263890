"""Recovery of a lost master through the Pulumi CLI: never killed, only the master targeted, and a
stack with other pending changes left to the user. The workers are an Auto Scaling group: the stack
holds the group, not their instances, so a worker's instance id is never targeted.

EC2 is moto (the lost master is terminated there, or left running for "AWS is slower"); the Pulumi
CLI is tests/aws/fake_pulumi_stack.py, a test double installed as `pulumi` on PATH, whose `up` runs
longer than the fab process would wait for anything else (FAKE_PULUMI_UP_SECONDS).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import boto3
import pytest

from cluster.run import stack_recovery as sr
from cluster.inventory import Inventory, Node
from node_setup import pulumi_recovery
from node_setup.aws import termination
from node_setup.tasks import managed
from tests.conftest import AWS_TEST_REGION as REGION

FAKE = Path(__file__).with_name("fake_pulumi_stack.py")
PROJECT = "xeon-cluster"
UP_SECONDS = 1.5  # the fake `pulumi up`'s duration


def urn(kind: str, name: str, parent: str = "") -> str:
    chain = f"{parent}${kind}" if parent else kind
    return f"urn:pulumi:dev::{PROJECT}::{chain}::{name}"


MASTER_URN = urn("aws:ec2/instance:Instance", "demo-master", sr.MASTER_COMPONENT)
SETUP_URN = urn("pulumi-python:dynamic:Resource", "demo-image-setup", "xeon-cluster:infra:BakedImage")
GROUP_URN = urn("aws:autoscaling/group:Group", "demo-workers", "xeon-cluster:infra:Workers")
BUCKET_URN = urn("aws:s3/bucket:Bucket", "demo-checkpoints")


def state(master_id: str) -> dict:
    """The stack's export: the master's instance; the workers only as their group."""
    return {"version": 3, "deployment": {"resources": [
        {"urn": urn(sr.STACK_TYPE, "xeon-cluster-dev"), "type": sr.STACK_TYPE},
        {"urn": BUCKET_URN, "type": "aws:s3/bucket:Bucket", "id": "demo-bucket"},
        {"urn": MASTER_URN, "type": sr.INSTANCE_TYPE, "id": master_id, "dependencies": [BUCKET_URN]},
        {"urn": SETUP_URN, "type": "pulumi-python:dynamic:Resource", "id": "setup-x",
         "dependencies": [MASTER_URN]},
        {"urn": GROUP_URN, "type": "aws:autoscaling/group:Group", "id": "demo-workers",
         "dependencies": [BUCKET_URN]},
    ]}}


@pytest.fixture
def fake_cli(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "pulumi"
    exe.write_text(f"#!{sys.executable}\n" + FAKE.read_text())
    exe.chmod(0o755)
    log = tmp_path / "pulumi.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_PULUMI_LOG", str(log))
    monkeypatch.setenv("FAKE_PULUMI_STATE", str(tmp_path / "state.json"))
    monkeypatch.setenv("FAKE_PULUMI_PREVIEW", str(tmp_path / "preview.json"))
    monkeypatch.setenv("FAKE_PULUMI_UP_SECONDS", str(UP_SECONDS))

    class Cli:
        def write(self, st: dict, steps: list[dict]) -> None:
            (tmp_path / "state.json").write_text(json.dumps(st, indent=2) + "\n")
            (tmp_path / "preview.json").write_text(json.dumps({"steps": steps, "changeSummary": {}}, indent=2) + "\n")

        def calls(self) -> list:
            return [json.loads(line) if line.startswith("[") else line for line in log.read_text().splitlines()]

    return Cli()


def _instances(count: int) -> list[str]:
    """Instances in moto: the master first, then workers (the group's, not in the stack)."""
    ec2 = boto3.client("ec2", region_name=REGION)
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    return [i["InstanceId"] for i in ec2.run_instances(ImageId=ami, MinCount=count, MaxCount=count,
                                                       InstanceType="t3.micro")["Instances"]]


def _inventory(master_id: str, worker_id: str) -> Inventory:
    return Inventory(name="demo", kind="aws", user="ubuntu", region=REGION, nodes=(
        Node("demo-master", "203.0.113.10", "10.0.0.10", 0, role="master", instance_id=master_id),
        Node("demo-worker-1", "10.0.0.11", "10.0.0.11", 1, instance_id=worker_id)))


def _recover(inventory: Inventory, monkeypatch) -> list[str]:
    """What `fab train --managed` runs when its run ended master-lost on AWS; what it said."""
    said: list[str] = []
    monkeypatch.setattr(managed, "_stack", lambda inv: "dev")  # the stack file Pulumi.dev.yaml, here a given
    monkeypatch.setattr(managed, "say", said.append)
    managed.recover_master(inventory)
    return said


def _ops(calls) -> list[str]:
    return [c[0] if c[0] != "stack" else "export" for c in calls if isinstance(c, list)]


def test_a_slow_pulumi_is_never_killed_and_only_the_lost_master_is_targeted(mocked_aws, fake_cli, monkeypatch):
    master_id, worker_id = _instances(2)
    boto3.client("ec2", region_name=REGION).terminate_instances(InstanceIds=[master_id])
    fake_cli.write(state(master_id), [
        {"op": "same", "urn": BUCKET_URN}, {"op": "same", "urn": GROUP_URN},
        {"op": "create", "urn": MASTER_URN}, {"op": "replace", "urn": SETUP_URN}])

    said = _recover(_inventory(master_id, worker_id), monkeypatch)

    calls = fake_cli.calls()
    assert _ops(calls) == ["export", "refresh", "preview", "up", "export"]
    assert "up finished" in calls and not [c for c in calls if str(c).startswith("signal")]
    refresh, up = [c for c in calls if isinstance(c, list)][1:4:2]
    assert [refresh[i + 1] for i, a in enumerate(refresh) if a == "--target"] == [MASTER_URN]
    assert [up[i + 1] for i, a in enumerate(up) if a == "--target"] == [MASTER_URN]
    assert "--target-dependents" in up and "--yes" in up and "--refresh" not in up
    assert any("pulumi | fake pulumi: created" in line for line in said)  # streamed as it came
    assert any(f"demo-master: {master_id}" in line for line in said)  # what the stack holds afterwards
    assert said[-1].startswith("the master is back")


def test_a_pending_unrelated_change_stops_recovery_with_the_command(mocked_aws, fake_cli, monkeypatch):
    master_id, worker_id = _instances(2)
    boto3.client("ec2", region_name=REGION).terminate_instances(InstanceIds=[master_id])
    fake_cli.write(state(master_id), [
        {"op": "create", "urn": MASTER_URN},
        {"op": "replace", "urn": SETUP_URN},  # the master's setup step: its dependent, allowed
        {"op": "update", "urn": GROUP_URN}])  # a changed launch template: the workers', not the master's

    said = _recover(_inventory(master_id, worker_id), monkeypatch)

    assert _ops(fake_cli.calls()) == ["export", "refresh", "preview"]  # no up
    stop = [line for line in said if "pending change(s) besides the lost master" in line]
    assert stop and "update demo-workers" in stop[0] and stop[0].endswith("pulumi up --refresh --stack dev")
    assert "demo-image-setup" not in stop[0]


def test_without_the_pulumi_cli_the_command_is_said_and_nothing_runs(mocked_aws, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no `pulumi` on PATH
    said = _recover(_inventory("i-0123456789abcdef0", "i-0fedcba9876543210"), monkeypatch)
    assert said == ["replace the master yourself: `pulumi up --refresh --stack dev`, then `fab train --managed "
                    "--resume` with the same options continues the run"]


def test_a_master_aws_has_not_terminated_yet_runs_no_pulumi(mocked_aws, fake_cli, monkeypatch):
    master_id, _ = _instances(2)  # the master still runs: AWS is slower than the wait
    fake_cli.write(state(master_id), [])
    said: list[str] = []
    result = pulumi_recovery.replace_lost_master(
        "dev", master_id, region=REGION, say=said.append, timeout_s=0.2,
        wait_terminated=lambda ids, region, timeout_s: termination.wait_terminated(ids, region, timeout_s=timeout_s,
                                                                                   poll_s=0.1))
    assert result == pulumi_recovery.NOT_TERMINATED
    assert not Path(os.environ["FAKE_PULUMI_LOG"]).exists()  # no Pulumi command at all
    assert any(f"{master_id}: running" in line and "pulumi up --refresh --stack dev" in line for line in said)


def test_a_worker_id_is_not_in_the_stack_and_runs_no_update(mocked_aws, fake_cli, monkeypatch):
    master_id, worker_id = _instances(2)
    boto3.client("ec2", region_name=REGION).terminate_instances(InstanceIds=[worker_id])
    fake_cli.write(state(master_id), [{"op": "create", "urn": MASTER_URN}])
    said: list[str] = []
    result = pulumi_recovery.replace_lost_master("dev", worker_id, region=REGION, say=said.append)
    assert result == pulumi_recovery.NOT_IN_STACK
    assert _ops(fake_cli.calls()) == ["export"]


def test_ctrl_c_during_the_update_is_passed_once_and_pulumi_finishes(mocked_aws, fake_cli, monkeypatch):
    master_id, _ = _instances(2)
    boto3.client("ec2", region_name=REGION).terminate_instances(InstanceIds=[master_id])
    fake_cli.write(state(master_id), [{"op": "create", "urn": MASTER_URN}])
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        if "creating the replacement" in line:  # the user presses Ctrl-C while Pulumi creates
            os.kill(os.getpid(), signal.SIGINT)

    result = pulumi_recovery.replace_lost_master("dev", master_id, region=REGION, say=say)
    calls = fake_cli.calls()
    assert calls.count("signal INT") == 1 and "up finished" in calls  # cancelled cleanly, never killed
    assert result == pulumi_recovery.REPLACED  # the double exits 0 after its clean cancel
    assert any("holds now" in line for line in said)


def test_waiter_reports_instances_that_are_gone(mocked_aws):
    ids = _instances(2)
    boto3.client("ec2", region_name=REGION).terminate_instances(InstanceIds=ids[:1])
    assert termination.wait_terminated(ids[:1], REGION, timeout_s=1, poll_s=0.1) == {}
    assert termination.not_terminated(ids, REGION) == {ids[1]: "running"}


def test_other_changes_ignore_the_master_its_dependents_and_no_ops():
    st = state("i-m")
    allowed = {MASTER_URN} | sr.dependents(st, [MASTER_URN])
    assert allowed == {MASTER_URN, SETUP_URN}
    preview = {"steps": [{"op": "same", "urn": BUCKET_URN}, {"op": "replace", "urn": SETUP_URN},
                         {"op": "update", "urn": GROUP_URN}, {"op": "create", "urn": MASTER_URN}]}
    assert sr.other_changes(preview, allowed) == [("update", GROUP_URN)]


def test_only_the_masters_instance_is_found_by_id():
    st = state("i-m")
    other = urn("aws:ec2/instance:Instance", "demo-bastion")  # an instance outside the master's component
    st["deployment"]["resources"].append({"urn": other, "type": sr.INSTANCE_TYPE, "id": "i-b"})
    assert sr.master_urn(st, "i-m") == MASTER_URN
    assert sr.master_urn(st, "i-b") is None
    assert sr.master_urn(st, "i-unknown") is None
