"""Recovery of a lost master through the Pulumi CLI: never killed, only the master targeted, and decided from
facts: a stack file that differs from what the last `pulumi up` recorded stops it with the command for the
user, before anything is refreshed or updated. The workers are an Auto Scaling group: the stack holds the
group, not their instances, so a worker's instance id is never targeted.

The stack is the one the program itself makes: infra/__main__.py run under the project's Pulumi mocks
(tests/infra/conftest.py), exported with every resource's dependencies, so the master's dependents are the
real ones (the setup step, the image, its snapshot tags, the workers' template and group). The Pulumi CLI is
tests/aws/fake_pulumi_stack.py, a test double installed as `pulumi` on PATH, whose `up` runs longer than the
fab process would wait for anything else (FAKE_PULUMI_UP_SECONDS); EC2 (the wait for the lost master to
terminate) is moto in the test of the waiter and a test double elsewhere.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import boto3
import pytest

from cluster.inventory import Inventory, Node
from cluster.run import stack_recovery as sr
from cluster.stack import node_replacement as nr
from cluster.stack.spec import ClusterSpec
from node_setup import pulumi_recovery
from node_setup.aws import termination
from node_setup.tasks import managed
from tests.conftest import AWS_TEST_REGION as REGION
from tests.infra.conftest import STACK, exported_state, fresh_run, minimal_config, stack_file_text

FAKE = Path(__file__).with_name("fake_pulumi_stack.py")
UP_SECONDS = 1.5  # the fake `pulumi up`'s duration
SETUP_TYPE = "pulumi-python:dynamic/xeon-cluster:ProfileSetup"


@pytest.fixture(scope="module")
def deployed() -> dict:
    """The stack the program makes for the minimal config, as `pulumi stack export` shows it."""
    monitor, outputs = fresh_run(minimal_config())
    return exported_state(monitor, outputs)


def master_id(state: dict) -> str:
    (found,) = [r["id"] for r in state["deployment"]["resources"]
                if r["type"] == sr.INSTANCE_TYPE and sr.MASTER_COMPONENT in sr.urn_parents(r["urn"])]
    return found


def urn_of(state: dict, typ: str) -> str:
    (found,) = [r["urn"] for r in state["deployment"]["resources"] if r["type"] == typ]
    return found


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
    monkeypatch.setenv("FAKE_PULUMI_UP_SECONDS", str(UP_SECONDS))

    class Cli:
        project = tmp_path  # where Pulumi.<stack>.yaml is (Pulumi's project directory, `--cwd`)

        def write(self, st: dict, **stack_file) -> None:
            """The stack's state, and the stack file as it is now (minimal_config with `stack_file`'s changes)."""
            (tmp_path / "state.json").write_text(json.dumps(st, indent=2) + "\n")
            (tmp_path / f"Pulumi.{STACK}.yaml").write_text(stack_file_text(minimal_config(**stack_file)))

        def calls(self) -> list:
            if not log.exists():
                return []
            return [json.loads(line) if line.startswith("[") else line for line in log.read_text().splitlines()]

    return Cli()


def terminated(ids, region, timeout_s):
    """Test double of the wait for EC2's `terminated` (the waiter itself: test_waiter_reports_...)."""
    return {}


def _ops(calls) -> list[str]:
    return [c[0] if c[0] != "stack" else "export" for c in calls if isinstance(c, list)]


def _targets(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--target"]


def _recover(inventory: Inventory, project: Path, monkeypatch) -> list[str]:
    """What `fab train --managed` runs when its run ended master-lost on AWS (the stack file in `project`);
    what it said."""
    said: list[str] = []
    monkeypatch.setattr(managed, "_stack", lambda inv: STACK)  # the stack file Pulumi.dev.yaml, here a given
    monkeypatch.setattr(managed, "say", said.append)
    monkeypatch.setattr("node_setup.controller.PROJECT_ROOT", project)
    monkeypatch.setattr(pulumi_recovery, "replace_lost_master", _with_termination_double(REPLACE_LOST_MASTER))
    managed.recover_master(inventory)
    return said


REPLACE_LOST_MASTER = pulumi_recovery.replace_lost_master


def _with_termination_double(replace):
    def call(*args, **kwargs):
        return replace(*args, wait_terminated=terminated, **kwargs)
    return call


def _inventory(master: str) -> Inventory:
    return Inventory(name="xeon-dev", kind="aws", user="ubuntu", region=REGION, nodes=(
        Node("node0", "203.0.113.10", "10.0.0.10", 0, role="master", instance_id=master),
        Node("node1", "10.0.0.11", "10.0.0.11", 1, instance_id="i-0fedcba9876543210")))


def test_a_slow_pulumi_is_never_killed_and_only_the_lost_master_is_targeted(fake_cli, deployed, monkeypatch):
    fake_cli.write(deployed)
    master = master_id(deployed)

    said = _recover(_inventory(master), fake_cli.project, monkeypatch)

    calls = fake_cli.calls()
    assert _ops(calls) == ["export", "refresh", "up", "export"]
    assert "up finished" in calls and not [c for c in calls if str(c).startswith("signal")]
    refresh, up = [c for c in calls if isinstance(c, list)][1:3]
    master_urn = sr.master_urn(deployed, master)
    assert _targets(refresh) == _targets(up) == [master_urn]
    assert "--target-dependents" in up and "--yes" in up and "--refresh" not in up
    assert any("pulumi | fake pulumi: created" in line for line in said)  # streamed as it came
    assert any(f"xeon-dev-master: {master}" in line for line in said)  # what the stack holds afterwards
    assert said[-1].startswith("the master is back")


@pytest.mark.parametrize("change, named", [
    ({"rootVolumeGib": 300}, "rootVolumeGib: replaces every worker"),  # the workers' template
    ({"workerCount": 5}, "workerCount"),  # the group, a dependent of the master (its subnet)
    ({"softwareProfile": "intel"}, "softwareProfile: replaces the image"),  # a re-bake
])
def test_a_pending_change_on_the_programs_own_graph_stops_recovery_before_pulumi_changes_anything(
        fake_cli, deployed, monkeypatch, change, named):
    """The master's dependents on the program's graph are most of the cluster, so a preview of the targeted
    update (which shows the image and the group replaced whatever is pending) cannot tell a pending change
    from the master's own replacement; the recorded settings can."""
    master_urn = sr.master_urn(deployed, master_id(deployed))
    dependents_of_master = {r["urn"] for r in deployed["deployment"]["resources"]
                            if master_urn in r.get("dependencies", [])}
    assert urn_of(deployed, SETUP_TYPE) in dependents_of_master  # the real graph: not the hand-made one
    fake_cli.write(deployed, **change)

    said = _recover(_inventory(master_id(deployed)), fake_cli.project, monkeypatch)

    assert _ops(fake_cli.calls()) == ["export"]  # no refresh, no up
    stop = [line for line in said if "differs from what its last `pulumi up` recorded" in line]
    assert stop and named in stop[0] and stop[0].endswith(f"pulumi up --refresh --stack {STACK}")


def test_a_stack_without_recorded_settings_or_stack_file_is_left_to_the_user(fake_cli, deployed, monkeypatch):
    older = json.loads(json.dumps(deployed))
    older["deployment"]["resources"][0]["outputs"].pop(nr.OUTPUT)  # deployed by an older version
    fake_cli.write(older)
    said = _recover(_inventory(master_id(deployed)), fake_cli.project, monkeypatch)
    assert _ops(fake_cli.calls()) == ["export"]
    assert any("no nodeSettings output" in line for line in said)
    (fake_cli.project / f"Pulumi.{STACK}.yaml").unlink()
    said = _recover(_inventory(master_id(deployed)), fake_cli.project, monkeypatch)
    assert _ops(fake_cli.calls()) == ["export"]  # not even the export: nothing to compare with
    assert any("cannot compare the stack with its stack file" in line for line in said)


def test_without_the_pulumi_cli_the_command_is_said_and_nothing_runs(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no `pulumi` on PATH
    said = _recover(_inventory("i-0123456789abcdef0"), tmp_path, monkeypatch)
    assert said == ["replace the master yourself: `pulumi up --refresh --stack dev`, then `fab train --managed "
                    "--resume` with the same options continues the run"]


def test_a_master_aws_has_not_terminated_yet_is_neither_refreshed_nor_updated(fake_cli, deployed):
    fake_cli.write(deployed)
    master = master_id(deployed)
    said: list[str] = []
    result = pulumi_recovery.replace_lost_master(
        STACK, master, region=REGION, say=said.append, cwd=str(fake_cli.project), timeout_s=0.2,
        wait_terminated=lambda ids, region, timeout_s: {master: "shutting-down"})  # AWS is slower than the wait
    assert result == pulumi_recovery.NOT_TERMINATED
    assert _ops(fake_cli.calls()) == ["export"]  # read, then nothing changed
    assert any(f"{master}: shutting-down" in line and "pulumi up --refresh --stack dev" in line for line in said)


def test_a_worker_id_is_not_in_the_stack_and_runs_no_update(fake_cli, deployed):
    fake_cli.write(deployed)
    said: list[str] = []
    result = pulumi_recovery.replace_lost_master(STACK, "i-0fedcba9876543210", region=REGION, say=said.append,
                                                 cwd=str(fake_cli.project), wait_terminated=terminated)
    assert result == pulumi_recovery.NOT_IN_STACK
    assert _ops(fake_cli.calls()) == ["export"]


def test_ctrl_c_during_the_update_is_passed_once_and_pulumi_finishes(fake_cli, deployed):
    fake_cli.write(deployed)
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        if "creating the replacement" in line:  # the user presses Ctrl-C while Pulumi creates
            os.kill(os.getpid(), signal.SIGINT)

    result = pulumi_recovery.replace_lost_master(STACK, master_id(deployed), region=REGION, say=say,
                                                 cwd=str(fake_cli.project), wait_terminated=terminated)
    calls = fake_cli.calls()
    assert calls.count("signal INT") == 1 and "up finished" in calls  # cancelled cleanly, never killed
    assert result == pulumi_recovery.REPLACED  # the double exits 0 after its clean cancel
    assert any("holds now" in line for line in said)


def test_waiter_reports_instances_that_are_gone(mocked_aws):
    ec2 = boto3.client("ec2", region_name=REGION)
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ids = [i["InstanceId"] for i in ec2.run_instances(ImageId=ami, MinCount=2, MaxCount=2,
                                                      InstanceType="t3.micro")["Instances"]]
    ec2.terminate_instances(InstanceIds=ids[:1])
    assert termination.wait_terminated(ids[:1], REGION, timeout_s=1, poll_s=0.1) == {}
    assert termination.not_terminated(ids, REGION) == {ids[1]: "running"}


def test_pending_settings_name_each_difference_and_what_it_replaces():
    spec = ClusterSpec.from_config(minimal_config(), stack=STACK, region=REGION)
    deployed_settings = nr.node_settings(spec)
    assert sr.pending_settings(dict(deployed_settings), deployed_settings) == []
    # privateKeyPath is a path on the controller: never recorded, never a difference
    moved = ClusterSpec.from_config(minimal_config(privateKeyPath="/elsewhere/key"), stack=STACK, region=REGION)
    assert sr.pending_settings(nr.node_settings(moved), deployed_settings) == []
    changed = ClusterSpec.from_config(minimal_config(tags=["team=ml"], adminCidrs=["198.51.100.0/24"]),
                                      stack=STACK, region=REGION)
    assert sr.pending_settings(nr.node_settings(changed), deployed_settings) == [
        "adminCidrs", "tags: replaces every worker (the group is replaced, deleting first)"]
    assert sr.pending_settings(nr.node_settings(spec), None)[0].startswith("no nodeSettings output")


def test_only_the_masters_instance_is_found_by_id(deployed):
    st = json.loads(json.dumps(deployed))
    other = "urn:pulumi:dev::xeon-cluster::aws:ec2/instance:Instance::xeon-dev-bastion"  # outside the component
    st["deployment"]["resources"].append({"urn": other, "type": sr.INSTANCE_TYPE, "id": "i-b"})
    master = master_id(deployed)
    assert sr.master_urn(st, master).endswith("::xeon-dev-master")
    assert sr.master_urn(st, "i-b") is None
    assert sr.master_urn(st, "i-unknown") is None
