"""One request, the same command lines on every path: `fab train` (the built-in job), `--managed` (what the
supervisor on the master starts from its spec), `--managed --resume` (the request read back from the signed
spec) and the supervisor's relaunch after a recovery; under mpirun and under torchrun."""

from __future__ import annotations

import dataclasses
import json

import pytest

from cluster.inventory import Inventory
from cluster.job.jobplan import Restart, plan
from cluster.job.launch import job_dir
from cluster.job.train_options import request_from_options
from cluster.run import runspec
from cluster.run import supervision as sv
from cluster.run.supervision import Member
from tests.spec_key import made_spec_key

RUN = "20261126-101500-ab12"
KEY = made_spec_key()


def inventory() -> Inventory:
    return Inventory.from_mapping({"name": "lab", "instance_type": "r7iz.metal-16xl",
                                   "hosts": [{"name": f"node{i}", "address": f"192.0.2.{10 + i}",
                                              "private_address": f"10.0.0.{10 + i}"} for i in range(3)]},
                                  default_name="lab")


def request(**more):
    options = dict(nodes=3, synthetic_examples=200, max_steps=6, checkpoint_every=60.0, output_dir="runs/r1",
                   checkpoint_uri="s3://ckpt-bucket/r1", env="FI_PROVIDER=tcp WANDB_API_KEY=k3y-value",
                   extra="--learning_rate 3e-5 --save_steps 3", **more)
    return request_from_options(options, inventory(), run_id=RUN)[0]


def command(job) -> tuple:
    """What the job runs: mpirun's argv, or every node's torchrun command; and the preparation on every node."""
    return job.launch.argv, tuple(job.launch.node_commands.items()), job.prepare


def from_the_supervisors_spec(run, tmp_path):
    """The request as the supervisor on the master reads it: its spec and its secret values' file."""
    from node_setup.supervisor.onmaster import read_request

    spec, secrets = runspec.handoff(run, kind="file", run_nodes=inventory().to_mapping(),
                                    cluster=inventory().to_mapping(), instance_ids={}, context={})
    (tmp_path / sv.SECRETS_FILE).write_text(json.dumps(secrets))
    return read_request(tmp_path, json.loads(json.dumps(spec)))


def test_one_request_gives_the_same_mpirun_command_on_every_path(tmp_path):
    managed = request(managed=True, max_recoveries=2)
    built_in = plan(dataclasses.replace(managed, managed=None), inventory())
    assert command(plan(managed, inventory())) == command(built_in)
    supervisors = from_the_supervisors_spec(managed, tmp_path)
    assert command(plan(supervisors, inventory())) == command(built_in)

    resumed_here = plan(dataclasses.replace(managed, resume=True), inventory())
    assert "--resume" in resumed_here.launch.program
    found = runspec.read(runspec.signed_text(managed, "file", KEY), "spec", KEY)
    again = runspec.resumed(found, {"WANDB_API_KEY": "k3y-value"}, RUN)
    assert command(plan(again, inventory())) == command(resumed_here)
    relaunched = plan(supervisors, inventory(), restart=Restart(resume=True))
    assert command(relaunched) == command(resumed_here)


def test_the_supervisors_relaunch_runs_the_planned_command(tmp_path, monkeypatch):
    """Job.launch on the master (its transport a recording test double) writes the job script of that plan."""
    from node_setup.supervisor import onmaster
    from tests.unit.test_supervisor import new_key, recording_shell

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(onmaster, "new_job_id", lambda: RUN)
    known = tmp_path / ".ssh" / "xeon-cluster-lab.known_hosts"
    known.parent.mkdir()
    known.write_text("".join(f"node{i} {new_key()}\n" for i in range(3)))
    from cluster.job.demo import SYNTHETIC_MODEL_DIR

    demo = tmp_path / "xeon-cluster-data" / "synthetic-qa-200" / "train.json"  # made already: not made again here
    demo.parent.mkdir(parents=True)
    demo.write_text("{}")
    (tmp_path / SYNTHETIC_MODEL_DIR).mkdir()  # the demo's model too: else the preparation, run for real here, runs
    # the node venv's python to make it (it failed where no local cluster had made that venv yet)
    supervisors = from_the_supervisors_spec(request(managed=True), tmp_path)
    shell = recording_shell()
    job = onmaster.Job(supervisors, shell, onmaster.Nodes(shell, inventory(), None, "/venv/bin/python"))
    members = [Member(n.name, n.private_address, f"i-{i:016x}") for i, n in enumerate(inventory().nodes)]
    assert job.launch(members, resume=True, batch=None) == RUN
    written = (tmp_path / job_dir(RUN) / "run.sh").read_text()
    wanted = plan(dataclasses.replace(request(managed=True), resume=True), inventory())
    assert written == wanted.launch.script()


def test_one_request_gives_the_same_torchrun_commands_when_read_back():
    elastic = request(launcher="torchrun", min_nodes=2)
    read = type(elastic).from_mapping(json.loads(json.dumps(elastic.to_mapping())))
    here, there = plan(elastic, inventory()), plan(read, inventory())
    assert here.launch.launcher == "torchrun" and len(here.launch.node_commands) == 3
    assert command(there) == command(here)
    assert "--resume" in here.launch.program  # elastic: a restarted rank continues the newest checkpoint


@pytest.mark.parametrize("path", ["managed", "resumed"])
def test_the_interpreter_is_the_profiles_never_the_specs(path, tmp_path):
    run = request(managed=True)
    read = from_the_supervisors_spec(run, tmp_path) if path == "managed" else runspec.resumed(
        runspec.read(runspec.signed_text(run, "file", KEY), "spec", KEY), {"WANDB_API_KEY": "x"}, RUN)
    job = plan(read, inventory())
    assert job.launch.program[0] == "/opt/xeon-cluster/venv-stock/bin/python"
    assert job.prepare[0].split("|| ")[1].startswith("/opt/xeon-cluster/venv-stock/bin/python -m training.synthetic")


def test_the_pytorchjob_runs_the_program_fab_train_runs_under_torchrun():
    """The PyTorchJob's entry point takes the request: each pod's torchrun runs `-m training` with the arguments
    fab train's torchrun runs (nodes without a catalogued type, so neither adds --instance_type), read back or not."""
    from cluster.job import k8s

    nodes = Inventory.from_mapping({"name": "lab", "sockets": 1, "physical_cores": 4,
                                    "hosts": [f"192.0.2.{10 + i}" for i in range(3)]}, default_name="lab")
    options = dict(nodes=3, synthetic_examples=200, max_steps=6, output_dir="runs/r1", launcher="torchrun",
                   min_nodes=2, env="FI_PROVIDER=tcp", extra="--learning_rate 3e-5")
    run = request_from_options(options, nodes, run_id=RUN)[0]
    read = type(run).from_mapping(json.loads(json.dumps(run.to_mapping())))
    on_nodes = plan(run, nodes).launch.program
    for each in (run, read):
        job = k8s.plan_pytorchjob(each, image="registry.example.com/xeon-cluster:0.1.0")
        assert job.pod.program == ("-m", "training", *on_nodes[3:]) and on_nodes[1:3] == ("-m", "training")
        assert job.min_nodes == 2 and job.pod.env["FI_PROVIDER"] == "tcp"
