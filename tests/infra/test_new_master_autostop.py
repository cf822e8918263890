"""The setup step arms a new master's idle auto-stop (infra/setup_step.py's arm_new_master): a master that
replaced a lost or auto-stopped one comes back from a `pulumi up` no `fab` may follow, and nothing else would
stop the cluster. The stack's autoStopIdle reaches the step's inputs (under the Pulumi mocks); the arming
runs over a scripted connection (`MasterDouble`, a test double of the Fabric connection that records what is
written and run, and answers the service's `status` lines); the workers' group is found by its tags in the
real code, here its record is given (a test double of node_setup/aws/worker_group.py's group_file)."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest

from cluster.node import autostop
from infra import setup_step
from infra.setup_step import ProfileSetupProvider, arm_new_master
from tests.infra.conftest import SETUP, minimal_config

GROUP = {f"{autostop.STATE_DIR}/{autostop.GROUP_FILE}": ("name=xeon-dev-worker-5a6b7c\nregion=us-east-1\n"
                                                        "master=xeon-dev-master-5a6b7c\n")}
KEY = "AAAAC3NzaC1lZDI1NTE5AAAAIMasterHostKeyOfTheNewMaster0000000000000000"


class MasterDouble:
    """Test double of the step's Fabric connection to the new master."""

    def __init__(self):
        self.files: dict[str, str] = {}
        self.commands: list[str] = []
        key = SimpleNamespace(get_name=lambda: "ssh-ed25519", get_base64=lambda: KEY)
        self.client = SimpleNamespace(get_transport=lambda: SimpleNamespace(get_remote_server_key=lambda: key))

    def put(self, data: io.StringIO, remote: str):
        self.files[remote.removesuffix(".xc-new")] = data.getvalue()

    def run(self, command, **kwargs):
        self.commands.append(command)
        armed = f"{autostop.SERVICE_PATH} arm " in command
        out = f"armed={'yes' if armed else 'no'}\nidle=7200\nnow=100\nsince=100\ndeadline=7300\nrunning=0\n"
        return SimpleNamespace(ok=True, exited=0, stdout=out, stderr="")


@pytest.mark.parametrize("idle, seconds", [("2h", 7200), ("off", None)])
def test_the_stacks_idle_time_reaches_the_setup_step(harness, idle, seconds):
    harness.run(minimal_config(autoStopIdle=idle))
    (step,) = harness.monitor.of_type(SETUP)
    assert step.inputs.get("auto_stop_idle_s") == seconds and step.inputs["region"] == "us-east-1"


def test_a_new_master_is_set_up_and_armed_and_an_address_change_only_recorded(monkeypatch):
    seams = []
    monkeypatch.setattr(setup_step, "run_profile_setup",
                        lambda props, **kw: seams.append(kw) or {**props, "auto_stop": "auto-stop: armed, 2h idle"})
    olds = {"instance_id": "i-0old", "auto_stop_idle_s": 7200}
    outs = ProfileSetupProvider().update("id", olds, {**olds, "instance_id": "i-0new"}).outs
    assert seams == [{"arm": arm_new_master}] and outs["auto_stop"] == "auto-stop: armed, 2h idle"
    assert "auto_stop" in setup_step.OUTPUT_ONLY  # what the arming said is never a difference
    ProfileSetupProvider().update("id", olds, {**olds, "host": "198.51.100.10"})
    assert len(seams) == 1  # the same master: nothing run, nothing armed


def test_the_new_master_is_armed_with_itself_as_the_node_list_and_the_group_to_stop_first(monkeypatch):
    monkeypatch.setattr("node_setup.aws.worker_group.group_file", lambda cluster, region, autoscaling=None: dict(GROUP))
    master = MasterDouble()
    props = {"cluster": "xeon-dev", "host": "198.51.100.7", "user": "ubuntu", "region": "us-east-1",
             "auto_stop_idle_s": 7200}
    said = arm_new_master(master, props)
    assert said.startswith("auto-stop: armed, 2h idle")
    nodes = master.files[f"{autostop.STATE_DIR}/{autostop.NODES_FILE}"]
    assert nodes.split() == ["node0"]  # the master alone: the group's workers go with the group, set to 0 first
    assert master.files[f"{autostop.STATE_DIR}/{autostop.KNOWN_HOSTS_FILE}"].split()[-1] == KEY
    assert master.files[next(iter(GROUP))] == GROUP[next(iter(GROUP))]
    assert any(f"{autostop.SERVICE_PATH} arm 7200 " in c for c in master.commands)


def test_nothing_is_armed_without_the_group_or_with_the_auto_stop_off(monkeypatch):
    monkeypatch.setattr("node_setup.aws.worker_group.group_file", lambda cluster, region, autoscaling=None: {})
    master = MasterDouble()
    props = {"cluster": "xeon-dev", "host": "198.51.100.7", "user": "ubuntu", "region": "us-east-1",
             "auto_stop_idle_s": 7200}
    assert arm_new_master(master, props).startswith("not armed: the workers' group was not found")
    assert arm_new_master(master, {**props, "auto_stop_idle_s": None}) == "not armed: autoStopIdle is off"
    assert master.files == {} and master.commands == []
