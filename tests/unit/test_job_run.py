"""Every path of `fab train` runs the same lifecycle (node_setup/tasks/job_run.py): the busy-node check and the
version warning hold for the built-in job, `--managed` and `--managed --resume` alike. The nodes are a test
double of the lifecycle's transport (`Nodes`): it answers the preparation as job-busy.sh and the venv's
marker would, and records what would have been started."""

from __future__ import annotations

import dataclasses

import pytest
from invoke import Exit

from cluster.inventory import Inventory
from cluster.job import jobcommands
from cluster.job.jobplan import plan
from cluster.job.train_options import request_from_options
from cluster.run import runspec
from node_setup.job_lifecycle.transport import Answer
from node_setup.tasks import job_run, managed
from tests.spec_key import made_spec_key

RUN = "20261127-101500-ab12"
OTHER = "20261127-090000-cd34"
HERE = "0.1.0+src.aaaaaaaaaaaa"
KEY = made_spec_key()


class Nodes:
    """Test double of the lifecycle's transport: node -> its venv's version; `busy` nodes run a rank of OTHER."""

    master = "node0"

    def __init__(self, versions: dict[str, str], busy: tuple[str, ...] = ()):
        self.versions, self.busy = versions, busy
        self.conns = {name: object() for name in versions}
        self.started: list[str] = []

    def run(self, nodes, command, *, timeout=None):
        answers = []
        for node in nodes:
            out, code = "", 0
            if command.startswith("cd && ( echo"):  # the preparation: version, busy check, job directory
                out = f"{jobcommands.INSTALLED}{self.versions[node]}\n"
                if node in self.busy and jobcommands.BUSY in command:  # with the busy check (job-busy.sh)
                    out, code = out + f"{jobcommands.BUSY}{OTHER} rank 1\n", 4
            elif "setsid nohup" in command:
                self.started.append(node)
                out = "4242\n"
            answers.append(Answer(node, code, out))
        return answers

    def put(self, node, path, data, *, mode=0o644):
        pass

    def trust(self, inventory):
        return None

    def close(self):
        pass


def inventory() -> Inventory:
    return Inventory.from_mapping({"name": "lab", "sockets": 1, "physical_cores": 4,
                                   "hosts": [{"name": f"node{i}", "address": f"192.0.2.{10 + i}"} for i in range(3)]},
                                  default_name="lab")


def requests() -> dict:
    base = dict(nodes=3, synthetic_examples=200, max_steps=6, checkpoint_uri="s3://ckpt-bucket/r1")
    plain = request_from_options(base, inventory(), run_id=RUN)[0]
    supervised = request_from_options({**base, "managed": True}, inventory(), run_id=RUN)[0]
    found = runspec.read(runspec.signed_text(supervised, "file", KEY), "spec", KEY)
    return {"built-in": plain, "--managed": supervised, "--managed --resume": runspec.resumed(found, {}, RUN)}


@pytest.fixture
def nodes(monkeypatch):
    from node_setup.ssh import transport
    from node_setup.tasks import common

    made: list[Nodes] = []
    monkeypatch.setattr(job_run, "preflight", lambda inventory: None)
    monkeypatch.setattr(common, "connect", lambda inventory: {})
    monkeypatch.setattr(transport, "FabricTransport", lambda inventory, conns: made[-1])
    monkeypatch.setattr("node_setup.controller.project_version", lambda: HERE)
    handed: list[str] = []
    monkeypatch.setattr(managed, "hand_off",
                        lambda request, inventory, job, life, **_: handed.append(request.run_id) or 0)
    monkeypatch.setattr(job_run, "follow_to_end", lambda life, job, **_: 0)
    monkeypatch.setattr("node_setup.tasks.spend.RunCostClock.at_launch", lambda job: type(
        "Clock", (), {"at_end": lambda self, master, job, code: None})())

    def use(versions, busy=()):
        made.append(Nodes(versions, busy))
        return made[-1], handed

    return use


@pytest.mark.parametrize("path", ["built-in", "--managed", "--managed --resume"])
def test_a_node_that_runs_another_job_stops_every_path_before_anything_starts(nodes, path, capsys):
    fake, handed = nodes({"node0": HERE, "node1": HERE, "node2": HERE}, busy=("node1",))
    run = requests()[path]
    with pytest.raises(Exit) as stopped:
        job_run.run(run, inventory(), plan(run, inventory()))
    assert stopped.value.code == 1 and f"cannot launch: job {OTHER} still runs on node1 (rank 1)" in \
        str(stopped.value.message)
    assert fake.started == [] and handed == []


@pytest.mark.parametrize("path", ["built-in", "--managed", "--managed --resume"])
def test_nodes_with_another_toolkit_are_named_on_every_path(nodes, path, capsys):
    fake, handed = nodes({"node0": HERE, "node1": "0.1.0+src.bbbbbbbbbbbb", "node2": HERE})
    run = requests()[path]
    assert job_run.run(run, inventory(), plan(run, inventory())) == 0
    out = capsys.readouterr().out
    assert f"warning: the nodes' xeon-cluster is not this checkout's ({HERE}): node1 0.1.0+src.bbbbbbbbbbbb;" in out
    assert (handed == [RUN]) == (path != "built-in") and (fake.started == ["node0"]) == (path == "built-in")


def test_allow_busy_is_the_request_s_and_lets_the_launch_go_on(nodes):
    fake, _ = nodes({"node0": HERE, "node1": HERE, "node2": HERE}, busy=("node1",))
    run = dataclasses.replace(requests()["built-in"], allow_busy=True)
    assert job_run.run(run, inventory(), plan(run, inventory())) == 0 and fake.started == ["node0"]
