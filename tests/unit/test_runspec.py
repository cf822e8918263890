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
from tests.spec_key import made_spec_key

moto = pytest.importorskip("moto")

RUN = "20261123-101500-ab12"
AGAIN = "20261124-090000-cd34"
BUCKET = "xc-checkpoints"
URI = f"s3://{BUCKET}/runs/qa"
KEY = made_spec_key()
OTHER_KEY = made_spec_key()  # another controller's
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
    (lambda d: d.update(signature="hmac-sha256:" + "0" * 64), "does not match"),  # the older scheme's
    (lambda d: d.update(signature=d["signature"].replace("A", "B", 1)), "does not match"),
])
def test_a_spec_anyone_else_changed_is_refused_in_one_line_naming_where(change, said):
    with pytest.raises(runspec.RunSpecError) as caught:
        runspec.read(_spec(change), URI, KEY)
    message = str(caught.value)
    assert message.startswith(f"{URI}: ") and said in message and "\n" not in message


def test_a_spec_signed_with_another_key_is_refused():
    with pytest.raises(runspec.RunSpecError, match="signature does not match"):
        runspec.read(_spec(key=OTHER_KEY), URI, KEY)


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
    text, where, _ = managed.read_spec(inventory, checkpoint_uri="", output_dir="runs/qa", master=master)
    assert where == f"node0:runs/qa/{runspec.RUN_FOLDER}/{sv.SPEC_FILE}" and text == in_bucket.decode()


def test_a_spec_copied_over_another_runs_or_from_another_cluster_is_refused(s3, monkeypatch):
    """Run A's validly signed spec written in run B's place in the bucket (every node's role may write it):
    resuming B refuses it, as it refuses a spec signed for another cluster or kind."""
    monkeypatch.setattr(managed, "_spec_key", lambda: KEY)
    inventory = _inventory()
    other_uri = f"s3://{BUCKET}/runs/other"
    s3.put_object(Bucket=BUCKET, Key=f"runs/other/{runspec.RUN_FOLDER}/{sv.SPEC_FILE}",
                  Body=runspec.signed_text(_request(), inventory.kind, KEY, cluster=inventory.name).encode())
    with pytest.raises(invoke.exceptions.Exit, match="signed for the run of checkpoint URI 's3://xc-checkpoints/runs/qa'"):
        managed.resumed_request(inventory, dict(checkpoint_uri=other_uri, env="HF_TOKEN=x"), run_id=AGAIN, s3=s3)
    text = runspec.signed_text(_request(), "file", KEY, cluster="lab")
    here = runspec.Binding("lab", "file", checkpoint_uri=URI)
    assert runspec.read(text, "here", KEY, here).cluster == "lab"  # the run's own place
    for binding, said in ((dataclasses.replace(here, checkpoint_uri=other_uri), "signed for the run of checkpoint"),
                          (dataclasses.replace(here, cluster="prod"), "signed for cluster 'lab'"),
                          (dataclasses.replace(here, kind="aws"), "signed for kind 'file'"),
                          (runspec.Binding("lab", "file", output_dir="runs/other"), "output directory")):
        with pytest.raises(runspec.RunSpecError, match=said):
            runspec.read(text, "here", KEY, binding)


def test_a_spec_whose_bound_fields_are_not_its_requests_is_refused_even_when_signed():
    data = json.loads(runspec.signed_text(_request(), "file", KEY, cluster="lab"))
    data["run"] = AGAIN
    data[runspec.SIGNATURE] = runspec.signature(data, KEY)
    with pytest.raises(runspec.RunSpecError, match="not the run's it holds"):
        runspec.read(json.dumps(data), "here", KEY)


def test_after_fab_forget_spec_key_a_spec_signed_before_is_refused(tmp_path, monkeypatch):
    from node_setup.ssh import keys

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    old = keys.spec_key()
    text = runspec.signed_text(_request(), "file", old, cluster="lab")
    assert runspec.read(text, "here", keys.spec_key()).request.run_id == RUN
    done = fab_in_process("forget", "--spec-key")
    assert done.returncode == 0 and "specs signed before can no longer be resumed" in done.stdout, done.stderr
    new = keys.spec_key()
    assert new != old and (tmp_path / "config/xeon-cluster/keys" / keys.SPEC_KEY_FILE).stat().st_mode & 0o777 == 0o600
    with pytest.raises(runspec.RunSpecError, match="signature does not match"):
        runspec.read(text, "here", new)


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


# ---------------------------------------------------------------- your own program: its workdir copied again


def _workdir(root: Path) -> Path:
    proj = root / "proj"
    (proj / "lib").mkdir(parents=True)
    (proj / "train.py").write_text("print('train')\n")
    (proj / "lib" / "steps.py").write_text("STEPS = 40\n")
    (proj / "data.txt").write_text("a b c\n")
    return proj


def _own_request(proj: Path) -> rq.RunRequest:
    """A 2-node supervised run of your own script, its workdir scanned as fab train scans it."""
    from node_setup.tasks.job_options import own_program

    options = dict(nodes=2, managed=True, script=str(proj / "train.py"), args="--epochs 2", output_dir="runs/own",
                   resume_arg="--from {checkpoint}")
    own = own_program(options, _inventory().profile)
    return request_from_options(options, _inventory(), run_id=RUN, own=own)[0]


def test_the_digest_comparison_names_files_changed_added_and_removed():
    a, b, c = "a" * 64, "b" * 64, "c" * 64
    recorded = (("data.txt", a), ("lib/steps.py", b), ("train.py", c))
    assert not runspec.workdir_changes(recorded, recorded)
    now = (("lib/steps.py", a), ("new.txt", a), ("train.py", c))
    assert runspec.workdir_changes(recorded, now) == runspec.WorkdirChanges(
        changed=("lib/steps.py",), added=("new.txt",), removed=("data.txt",))


def test_the_refusal_is_one_line_naming_the_files_and_how_to_go_on():
    changes = runspec.WorkdirChanges(changed=("lib/steps.py",), added=tuple(f"n{i}.txt" for i in range(7)),
                                     removed=("data.txt",))
    line = changes.refusal("/home/u/proj", RUN)
    assert line == (f"--resume: the workdir /home/u/proj is not as run {RUN} recorded it (changed: lib/steps.py; "
                    "added: n0.txt, n1.txt, n2.txt, n3.txt, n4.txt and 2 more; removed: data.txt); the run copies it "
                    "again from here: restore those files to continue the run as it was, or give "
                    "--workdir-changed-ok to continue with the workdir as it is now (recorded with the run)")


def test_your_programs_spec_records_its_workdir_and_digest_signed(tmp_path):
    proj = _workdir(tmp_path)
    request = _own_request(proj)
    assert request.own.workdir == str(proj.resolve())
    assert dict(request.own.workdir_files) == {f.path: f.digest for f in request.own.copy.files}
    assert set(dict(request.own.workdir_files)) == {"train.py", "lib/steps.py", "data.txt"}
    found = runspec.read(runspec.signed_text(request, "file", KEY), "here", KEY)
    assert found.request.own.workdir_files == request.own.workdir_files and found.request.own.copy is None
    # the digest is part of what is signed: a digest changed in the spec is refused
    data = json.loads(runspec.signed_text(request, "file", KEY))
    data["request"]["program"]["workdir_files"][0][1] = "0" * 64
    with pytest.raises(runspec.RunSpecError, match="signature does not match"):
        runspec.read(json.dumps(data), "here", KEY)


def test_a_spec_of_your_program_without_a_workdir_digest_is_refused(tmp_path):
    request = _own_request(_workdir(tmp_path))
    data = json.loads(runspec.signed_text(request, "file", KEY))
    del data["request"]["program"]["workdir_files"]
    data[runspec.SIGNATURE] = runspec.signature(data, KEY)
    with pytest.raises(runspec.RunSpecError, match="records no digest of its workdir"):
        runspec.read(json.dumps(data), "here", KEY)


def _resume_own(tmp_path, monkeypatch, **options):
    """The run of `_own_request` handed off to a LocalMaster, then `fab train --managed --resume`'s request."""
    monkeypatch.setattr(managed, "_spec_key", lambda: KEY)
    master = LocalMaster(tmp_path / "home")
    master.home.mkdir()
    monkeypatch.setattr(common, "connect", lambda inventory: {"node0": master})
    managed.publish_spec(master, _own_request(tmp_path / "proj"), _inventory(), "runs/own", key=KEY)
    return managed.resumed_request(_inventory(), {"output_dir": "runs/own", **options}, run_id=AGAIN)


def test_your_program_is_resumed_with_its_workdir_copied_again_when_it_is_as_recorded(tmp_path, monkeypatch, capsys):
    _workdir(tmp_path)
    resumed = _resume_own(tmp_path, monkeypatch)
    first = _own_request(tmp_path / "proj")
    assert resumed.resume and resumed.run_id == AGAIN and resumed.output_dir == "runs/own" and resumed.managed
    assert resumed.own.workdir_files == first.own.workdir_files and not resumed.own.workdir_changed_ok
    assert resumed.own.copy is not None and resumed.own.copy.files == first.own.copy.files  # what the upload copies
    assert (resumed.own.script, resumed.own.args, resumed.own.resume_arg) == ("train.py", ("--epochs", "2"),
                                                                               "--from {checkpoint}")
    assert "its workdir " + str((tmp_path / "proj").resolve()) + " copied again (3 file(s), as the run recorded " \
        "them)" in capsys.readouterr().out


def _change(proj: Path) -> None:
    (proj / "lib" / "steps.py").write_text("STEPS = 80\n")
    (proj / "new.txt").write_text("n\n")
    (proj / "data.txt").unlink()


def test_a_workdir_that_changed_is_refused_on_resume_in_one_line_and_exit_2(tmp_path, monkeypatch):
    proj = _workdir(tmp_path)
    _resume_own(tmp_path, monkeypatch)  # the spec is written
    _change(proj)
    with pytest.raises(invoke.Exit) as caught:
        managed.resumed_request(_inventory(), {"output_dir": "runs/own"}, run_id=AGAIN)
    message = str(caught.value.message)
    assert caught.value.code == common.BAD_INPUT and "\n" not in message
    assert message.startswith(f"error: --resume: the workdir {proj.resolve()} is not as run {RUN} recorded it "
                              "(changed: lib/steps.py; added: new.txt; removed: data.txt)")


def test_workdir_changed_ok_goes_on_and_the_new_run_records_it_with_the_new_digest(tmp_path, monkeypatch):
    proj = _workdir(tmp_path)
    _resume_own(tmp_path, monkeypatch)
    _change(proj)
    resumed = managed.resumed_request(_inventory(), {"output_dir": "runs/own", "workdir_changed_ok": True},
                                      run_id=AGAIN)
    assert resumed.own.workdir_changed_ok
    assert set(dict(resumed.own.workdir_files)) == {"train.py", "lib/steps.py", "new.txt"}
    again = runspec.read(runspec.signed_text(resumed, "file", KEY), "here", KEY).request
    assert again.own.workdir_changed_ok and again.own.workdir_files == resumed.own.workdir_files


def test_a_workdir_no_longer_here_is_refused_in_one_line(tmp_path, monkeypatch):
    import shutil

    proj = _workdir(tmp_path)
    _resume_own(tmp_path, monkeypatch)
    shutil.rmtree(proj)
    with pytest.raises(invoke.Exit, match=rf"^error: --resume: the run's workdir {proj.resolve()} is not a folder on "
                                          "this machine"):
        managed.resumed_request(_inventory(), {"output_dir": "runs/own", "workdir_changed_ok": True}, run_id=AGAIN)


def test_workdir_changed_ok_is_refused_where_no_workdir_is_copied_again():
    found = runspec.read(_spec(), "here", KEY)
    with pytest.raises(runspec.RunSpecError, match=rf"^--workdir-changed-ok: run {RUN} ran the built-in job"):
        runspec.resumed(found, {"HF_TOKEN": "x"}, AGAIN, workdir_changed_ok=True)
    with pytest.raises(rq.RequestError, match=r"^--workdir-changed-ok: only with --managed --resume"):
        request_from_options(dict(nodes=2, workdir_changed_ok=True), _inventory(), run_id=RUN)


@pytest.mark.parametrize("body", ["[" * 60_000, '{"format": 1e400}', '{"format": NaN}'])
def test_a_spec_nested_past_the_parser_or_with_numbers_past_a_float_is_one_refusal(body):
    with pytest.raises(runspec.RunSpecError, match="^here: not JSON"):
        runspec.read(body, "here", KEY)
