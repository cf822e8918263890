"""A lost master's run continued: the run's request signed into its spec beside its checkpoints at the
hand-off, read back by `fab train --managed --resume` (cluster/run/runspec.py, node_setup/tasks/managed.py)
with moto's S3 and a local stand-in for the master; a spec anyone else wrote or changed is refused.

`LocalMaster` is a test double of the master's SSH connection (this machine's shell and files, HOME at a
temporary folder). tests/ssh/test_spec_refused.py refuses changed specs on a local cluster.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import invoke
import pytest

from cluster.inventory import Inventory
from cluster.job import request as rq
from cluster.job.train_options import request_from_options
from cluster.run import runspec
from cluster.run import supervision as sv
from node_setup.tasks import common, managed
from tests.fab_run import fab_in_process

moto = pytest.importorskip("moto")

RUN = "20261123-101500-ab12"
AGAIN = "20261124-090000-cd34"
BUCKET = "xc-checkpoints"
URI = f"s3://{BUCKET}/runs/qa"
KEY = b"k" * 32
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


def _inventory() -> Inventory:
    return Inventory.from_mapping({"name": "lab", "user": "ubuntu", "instance_type": "r7iz.metal-16xl",
                                   "hosts": ["192.0.2.10", "192.0.2.11", "192.0.2.12"]}, default_name="lab")


def _request() -> rq.RunRequest:
    """A 2-node supervised run of the demo with --checkpoint-uri and a secret-looking --env."""
    options = dict(nodes=2, synthetic_examples=3000, max_steps=800, checkpoint_uri=URI, output_dir="runs/qa",
                   env="FI_PROVIDER=tcp HF_TOKEN=hf_s3cr3t", managed=True,
                   max_recoveries=2, wait_for_capacity=120.0, extra="--learning_rate 3e-5")
    return request_from_options(options, _inventory(), run_id=RUN)[0]


@pytest.fixture
def s3(aws_credentials):
    import boto3

    with moto.mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


def test_the_spec_is_the_request_signed_with_its_secret_values_and_machines_left_out():
    text = runspec.signed_text(_request(), "file", KEY)
    assert "hf_s3cr3t" not in text and "192.0.2." not in text and "/bin/python" not in text
    found = runspec.read(text, "here", KEY)
    assert found.withheld == ("HF_TOKEN",) and found.kind == "file"
    assert found.request == _request().with_env({"HF_TOKEN": runspec.WITHHELD})
    again = runspec.resumed(found, {"HF_TOKEN": "hf_again"}, AGAIN)
    assert again == dataclasses.replace(_request().with_env({"HF_TOKEN": "hf_again"}), run_id=AGAIN, resume=True)


def _spec(change=None, *, key=KEY) -> str:
    data = json.loads(runspec.signed_text(_request(), "file", key))
    if change is not None:
        change(data)
    return json.dumps(data)


@pytest.mark.parametrize(("change", "said"), [
    (lambda d: d["request"]["env"].append(["PYTHONWARNINGS", "ignore::UserWarning"]), "does not match"),
    (lambda d: d["request"]["env"].append(["CCL_LOG_LEVEL", "debug"]), "does not match"),
    (lambda d: d["request"]["program"]["extra"].append(["--push_to_hub"]), "does not match"),
    (lambda d: d.update(python="/tmp/evil/bin/python"), "does not match"),
    (lambda d: d["request"]["program"]["demo"].update(examples=7), "does not match"),
    (lambda d: d.pop(runspec.SIGNATURE), "it is not signed"),
    (lambda d: d.update(signature="hmac-sha256:" + "0" * 64), "does not match"),
])
def test_a_spec_anyone_else_changed_is_refused_in_one_line_naming_where(change, said):
    with pytest.raises(runspec.RunSpecError) as caught:
        runspec.read(_spec(change), URI, KEY)
    message = str(caught.value)
    assert message.startswith(f"{URI}: ") and said in message and "\n" not in message


def test_a_spec_signed_with_another_key_is_refused():
    with pytest.raises(runspec.RunSpecError, match="signature does not match"):
        runspec.read(_spec(key=b"x" * 32), URI, KEY)


@pytest.mark.parametrize(("change", "said"), [
    (lambda d: d["request"].update(nodes=0), "--nodes: 0 is not allowed"),
    (lambda d: d["request"]["env"].append(["LD_PRELOAD", "/tmp/x.so"]), "--env: LD_PRELOAD changes how"),
    (lambda d: d.update(format=7), "format 7"),
    (lambda d: d.update(withheld=[]), "withheld"),
    (lambda d: d.update(extra_field=1), "unknown field 'extra_field'"),
])
def test_a_signed_spec_is_still_checked_whole(change, said):
    """Signed by this controller (a bug, an older version): every field is checked all the same."""
    data = json.loads(_spec())
    change(data)
    data[runspec.SIGNATURE] = runspec.signature(data, KEY)
    with pytest.raises(runspec.RunSpecError) as caught:
        runspec.read(json.dumps(data), URI, KEY)
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_a_withheld_env_value_not_given_again_is_refused_in_one_line():
    found = runspec.read(_spec(), "here", KEY)
    with pytest.raises(runspec.RunSpecError, match=r"^--env: HF_TOKEN withheld from the run's spec"):
        runspec.resumed(found, {}, AGAIN)


def test_the_spec_written_at_the_hand_off_is_read_back_and_the_run_resumes(s3, tmp_path, monkeypatch):
    monkeypatch.setattr(managed, "_spec_key", lambda: KEY)
    inventory = _inventory()
    master = LocalMaster(tmp_path)
    lines = managed.publish_spec(master, _request(), inventory, "runs/qa", key=KEY, s3=s3)
    assert lines == [f"the run's spec is beside its checkpoints: {URI}/{runspec.RUN_FOLDER}/{sv.SPEC_FILE}"]
    in_bucket = s3.get_object(Bucket=BUCKET, Key=f"runs/qa/{runspec.RUN_FOLDER}/{sv.SPEC_FILE}")["Body"].read()
    assert json.loads(in_bucket) == json.loads((tmp_path / "runs/qa" / runspec.RUN_FOLDER / sv.SPEC_FILE).read_text())

    options = dict(checkpoint_uri=URI, env="HF_TOKEN=hf_again")
    resumed = managed.resumed_request(inventory, options, run_id=AGAIN, s3=s3)
    assert resumed == dataclasses.replace(_request().with_env({"HF_TOKEN": "hf_again"}), run_id=AGAIN, resume=True)
    # the output directory on the master holds the same spec (a local cluster's shared disk)
    text, where = managed.read_spec(inventory, checkpoint_uri="", output_dir="runs/qa", master=master)
    assert where == f"node0:runs/qa/{runspec.RUN_FOLDER}/{sv.SPEC_FILE}" and text == in_bucket.decode()


def test_the_supervisors_spec_holds_no_secret_value_they_go_apart():
    inventory = _inventory()
    spec, secrets = runspec.handoff(_request(), kind="file", run_nodes=inventory.first(2).to_mapping(),
                                    cluster=inventory.to_mapping(), instance_ids={}, context={})
    assert "hf_s3cr3t" not in json.dumps(spec) and secrets == {"HF_TOKEN": _request().env_map()["HF_TOKEN"]}
    assert rq.RunRequest.from_mapping(spec["request"]).env_map()["HF_TOKEN"] == runspec.WITHHELD


@pytest.mark.parametrize(("body", "said"), [
    (None, f"error: --resume: no run spec at {URI}/{runspec.RUN_FOLDER}/{sv.SPEC_FILE} (not found)"),
    (b"{not json", f"error: {URI}/{runspec.RUN_FOLDER}/{sv.SPEC_FILE}: not JSON"),
    (b'{"format": 2, "kind": "file", "request": {}}', f"error: {URI}/{runspec.RUN_FOLDER}/{sv.SPEC_FILE}: it is "
                                                      "not signed"),
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
