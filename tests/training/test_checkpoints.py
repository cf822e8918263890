"""Checkpoint completeness, S3 upload with verification, newest-complete selection (moto)."""

import json
import os
import shutil

import pytest

from training import checkpoint_s3, checkpoints
from training.errors import BadInput


def make_checkpoint(root, step, payload=b"weights", run_id=None):
    directory = root / f"checkpoint-{step}"
    (directory / "sub").mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(payload * 100)
    (directory / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (directory / "sub" / "rng_state.pth").write_bytes(b"rng")
    if run_id is None:
        checkpoints.write_manifest(directory, step)
    else:
        checkpoints.write_manifest(directory, step, run_id=run_id)
    return directory


def test_manifest_marks_complete_and_truncation_breaks_it(tmp_path):
    directory = make_checkpoint(tmp_path, 10)
    assert checkpoints.local_complete(directory)
    (directory / "model.safetensors").write_bytes(b"cut")
    assert not checkpoints.local_complete(directory)


def test_newest_local_skips_checkpoints_without_manifest(tmp_path):
    make_checkpoint(tmp_path, 10)
    make_checkpoint(tmp_path, 20)
    unfinished = tmp_path / "checkpoint-30"
    unfinished.mkdir()
    (unfinished / "model.safetensors").write_bytes(b"half")
    assert checkpoints.newest_local(tmp_path) == checkpoints.Found(20, str(tmp_path / "checkpoint-20"))
    assert checkpoints.newest_local(tmp_path / "missing") is None


def test_s3_uri_parsing_follows_the_controllers_rule():
    from cluster.job.job_args import parse_s3_uri

    assert checkpoint_s3.parse_s3_uri("s3://my-bucket/jobs/run-1/") == ("my-bucket", "jobs/run-1")
    assert checkpoint_s3.parse_s3_uri("s3://my-bucket") == ("my-bucket", "")
    for bad in ("s3://My_Bucket/x", "s3://ab/x", "s3://my-bucket/a/../b", "https://my-bucket/x"):
        with pytest.raises(ValueError) as controller:
            parse_s3_uri(bad, "--checkpoint_uri")
        with pytest.raises(BadInput) as job:
            checkpoint_s3.parse_s3_uri(bad)
        assert str(job.value) == str(controller.value)  # one rule, one message


def test_upload_verify_and_choose_newest_complete(mocked_s3, tmp_path):
    s3 = mocked_s3
    s3.create_bucket(Bucket="ckpt")
    uri = "s3://ckpt/jobs/run-1"
    first = checkpoint_s3.upload_checkpoint(s3, make_checkpoint(tmp_path / "a", 100), uri)
    second = checkpoint_s3.upload_checkpoint(s3, make_checkpoint(tmp_path / "a", 200, b"newer"), uri)
    assert (first, second) == (f"{uri}/checkpoint-100", f"{uri}/checkpoint-200")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="ckpt", Prefix="jobs/run-1/checkpoint-200/")["Contents"]]
    assert sorted(keys) == sorted(f"jobs/run-1/checkpoint-200/{n}" for n in (
        "model.safetensors", "trainer_state.json", "sub/rng_state.pth", checkpoints.MANIFEST))
    # a newer upload that was cut off before its manifest, and one whose object does not match
    s3.put_object(Bucket="ckpt", Key="jobs/run-1/checkpoint-300/model.safetensors", Body=b"partial")
    broken = make_checkpoint(tmp_path / "b", 400)
    checkpoint_s3.upload_checkpoint(s3, broken, uri)
    s3.put_object(Bucket="ckpt", Key="jobs/run-1/checkpoint-400/model.safetensors", Body=b"overwritten")
    assert checkpoint_s3.newest_s3(s3, uri) == checkpoints.Found(200, f"{uri}/checkpoint-200")

    target = tmp_path / "restore" / "checkpoint-200"
    checkpoint_s3.download_checkpoint(s3, f"{uri}/checkpoint-200", target)
    assert (target / "model.safetensors").read_bytes() == b"newer" * 100
    assert checkpoints.local_complete(target)
    # one rank: a local copy older than S3's: resume takes S3's; a newer local one wins
    local_root = tmp_path / "local"
    make_checkpoint(local_root, 150)

    def choose():
        return checkpoints.choose_resume([checkpoints.local_checkpoints(local_root)],
                                         checkpoint_s3.s3_checkpoints(s3, uri))

    assert choose().location == f"{uri}/checkpoint-200"
    make_checkpoint(local_root, 250)
    assert choose() == checkpoints.Found(250, str(local_root / "checkpoint-250"))


def test_download_refuses_bytes_that_do_not_match(mocked_s3, tmp_path):
    s3 = mocked_s3
    s3.create_bucket(Bucket="ckpt")
    checkpoint_s3.upload_checkpoint(s3, make_checkpoint(tmp_path, 5), "s3://ckpt/r")
    s3.put_object(Bucket="ckpt", Key="r/checkpoint-5/trainer_state.json", Body=b'{"global_step": 6}')
    with pytest.raises(checkpoints.CheckpointError, match="do not match the manifest"):
        checkpoint_s3.download_checkpoint(s3, "s3://ckpt/r/checkpoint-5", tmp_path / "out" / "checkpoint-5")
    assert not (tmp_path / "out" / "checkpoint-5").exists()


def test_upload_detects_a_short_object(mocked_s3, tmp_path, monkeypatch):
    s3 = mocked_s3
    s3.create_bucket(Bucket="ckpt")
    directory = make_checkpoint(tmp_path, 7)
    real_upload = s3.upload_file

    def lossy_upload(filename, bucket, key, ExtraArgs=None):  # a transfer that silently lost bytes
        if key.endswith("model.safetensors"):
            s3.put_object(Bucket=bucket, Key=key, Body=open(filename, "rb").read()[:10])
        else:
            real_upload(filename, bucket, key, ExtraArgs=ExtraArgs)

    monkeypatch.setattr(s3, "upload_file", lossy_upload)
    with pytest.raises(checkpoints.CheckpointError, match="bytes on S3"):
        checkpoint_s3.upload_checkpoint(s3, directory, "s3://ckpt/r")
    assert checkpoint_s3.newest_s3(s3, "s3://ckpt/r") is None  # no manifest was written
    assert os.path.exists(directory / checkpoints.MANIFEST)


def test_prune_keeps_the_newest_complete_and_anything_newer(mocked_s3, tmp_path):
    s3 = mocked_s3
    s3.create_bucket(Bucket="ckpt")
    for step in (10, 20, 30):
        checkpoint_s3.upload_checkpoint(s3, make_checkpoint(tmp_path, step), "s3://ckpt/r")
    s3.put_object(Bucket="ckpt", Key="r/checkpoint-40/model.safetensors", Body=b"in flight")
    s3.put_object(Bucket="ckpt", Key="r/checkpoint-5/model.safetensors", Body=b"old leftover")
    assert checkpoint_s3.prune_s3(s3, "s3://ckpt/r", keep=2, run_id=None) == [5, 10]
    left = {o["Key"].split("/")[1] for o in s3.list_objects_v2(Bucket="ckpt", Prefix="r/")["Contents"]}
    assert left == {"checkpoint-20", "checkpoint-30", "checkpoint-40"}
    assert checkpoint_s3.newest_s3(s3, "s3://ckpt/r").step == 30
    assert checkpoint_s3.prune_s3(s3, "s3://ckpt/r", keep=2, run_id=None) == []


def test_upload_detects_changed_bytes_of_the_same_size(mocked_s3, tmp_path, monkeypatch):
    s3 = mocked_s3
    s3.create_bucket(Bucket="ckpt")
    directory = make_checkpoint(tmp_path, 8)
    real_upload = s3.upload_file

    def corrupting_upload(filename, bucket, key, ExtraArgs=None):  # same length, one byte flipped
        if key.endswith("model.safetensors"):
            body = bytearray(open(filename, "rb").read())
            body[0] ^= 0xFF
            s3.put_object(Bucket=bucket, Key=key, Body=bytes(body), ChecksumAlgorithm="SHA256")
        else:
            real_upload(filename, bucket, key, ExtraArgs=ExtraArgs)

    monkeypatch.setattr(s3, "upload_file", corrupting_upload)
    with pytest.raises(checkpoints.CheckpointError, match="SHA-256 on S3 differs"):
        checkpoint_s3.upload_checkpoint(s3, directory, "s3://ckpt/r")
    assert checkpoint_s3.newest_s3(s3, "s3://ckpt/r") is None


# ---- item: file names from a manifest never leave the checkpoint folder

def hostile_manifest(s3, bucket, prefix, names_and_bodies, step=5, run_id="r1"):
    """A manifest on S3 naming `names` with the right sizes and digests, and objects at those keys."""
    import hashlib

    files = {}
    for name, body in names_and_bodies.items():
        s3.put_object(Bucket=bucket, Key=f"{prefix}/checkpoint-{step}/{name}", Body=body)
        files[name] = {"size": len(body), "sha256": hashlib.sha256(body).hexdigest()}
    manifest = {"step": step, "created": "2026-01-01T00:00:00Z", "run_id": run_id, "files": files}
    s3.put_object(Bucket=bucket, Key=f"{prefix}/checkpoint-{step}/{checkpoints.MANIFEST}", Body=json.dumps(manifest))


@pytest.mark.parametrize("name", ["../../../escaped.bin", "sub/../../../../escaped.bin", "/abs/escaped.bin",
                                  "./model.safetensors", "a//b", checkpoints.MANIFEST])
def test_a_hostile_s3_manifest_writes_nothing_outside_and_is_never_chosen(mocked_s3, tmp_path, name):
    s3 = mocked_s3
    s3.create_bucket(Bucket="ckpt")
    hostile_manifest(s3, "ckpt", "r", {"model.safetensors": b"ok" * 10, name: b"#!/bin/sh\necho owned\n"})
    destination = tmp_path / "a" / "b" / "out" / "checkpoint-5"
    with pytest.raises(checkpoints.UnsafeCheckpoint, match="outside|not allowed"):
        checkpoint_s3.download_checkpoint(s3, "s3://ckpt/r/checkpoint-5", destination)
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == [], written
    assert not os.path.exists("/abs/escaped.bin")
    assert checkpoint_s3.newest_s3(s3, "s3://ckpt/r") is None
    assert checkpoint_s3.s3_checkpoints(s3, "s3://ckpt/r") == []


def test_a_local_checkpoint_with_links_or_escaping_names_is_not_complete(tmp_path):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"weights" * 100)  # same size as the real file
    linked = make_checkpoint(tmp_path / "out", 10)
    (linked / "model.safetensors").unlink()
    (linked / "model.safetensors").symlink_to(outside)
    assert not checkpoints.local_complete(linked)

    escaping = make_checkpoint(tmp_path / "out", 20)
    manifest = json.loads((escaping / checkpoints.MANIFEST).read_text())
    manifest["files"]["../../outside.bin"] = manifest["files"].pop("model.safetensors")
    (escaping / checkpoints.MANIFEST).write_text(json.dumps(manifest))
    assert not checkpoints.local_complete(escaping)

    linked_dir = make_checkpoint(tmp_path / "out", 30)
    shutil.rmtree(linked_dir / "sub")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "rng_state.pth").write_bytes(b"rng")
    (linked_dir / "sub").symlink_to(elsewhere)  # a linked folder: files "inside" live elsewhere
    assert not checkpoints.local_complete(linked_dir)

    good = make_checkpoint(tmp_path / "out", 5)
    assert checkpoints.local_complete(good)
    assert checkpoints.newest_local(tmp_path / "out") == checkpoints.Found(5, str(good))


def test_download_replaces_a_linked_destination_instead_of_writing_through_it(mocked_s3, tmp_path):
    s3 = mocked_s3
    s3.create_bucket(Bucket="ckpt")
    checkpoint_s3.upload_checkpoint(s3, make_checkpoint(tmp_path / "src", 5), "s3://ckpt/r")
    victim = tmp_path / "victim"
    victim.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "checkpoint-5").symlink_to(victim)
    (out / "checkpoint-5.download").symlink_to(victim)
    checkpoint_s3.download_checkpoint(s3, "s3://ckpt/r/checkpoint-5", out / "checkpoint-5")
    assert list(victim.iterdir()) == []
    assert checkpoints.local_complete(out / "checkpoint-5") and not (out / "checkpoint-5").is_symlink()


# ---- item: run identity: prune only within a run

def test_prune_deletes_only_the_runs_own_older_checkpoints(mocked_s3, tmp_path):
    s3 = mocked_s3
    s3.create_bucket(Bucket="ckpt")
    uri = "s3://ckpt/shared"
    for step in (100, 200):  # an older run, further along
        checkpoint_s3.upload_checkpoint(s3, make_checkpoint(tmp_path / "old", step, run_id="old-run"), uri)
    checkpoint_s3.upload_checkpoint(s3, make_checkpoint(tmp_path / "new", 10, run_id="new-run"), uri)
    assert checkpoint_s3.prune_s3(s3, uri, keep=2, run_id="new-run") == []  # its own first checkpoint stays
    for step in (20, 30):
        checkpoint_s3.upload_checkpoint(s3, make_checkpoint(tmp_path / "new", step, run_id="new-run"), uri)
    assert checkpoint_s3.prune_s3(s3, uri, keep=2, run_id="new-run") == [10]
    left = sorted((f.run_id, f.step) for f in checkpoint_s3.s3_checkpoints(s3, uri))
    assert left == [("new-run", 20), ("new-run", 30), ("old-run", 100), ("old-run", 200)]

    local = tmp_path / "new"
    make_checkpoint(local, 300, run_id="old-run")  # another run's, in the same folder
    assert checkpoints.prune_local(local, keep=2, run_id="new-run") == [10]
    assert sorted(f.step for f in checkpoints.local_checkpoints(local)) == [20, 30, 300]


# ---- item: resume from the newest checkpoint every rank can read

def found(step, run="r", created=None, where="local"):
    return checkpoints.Found(step, f"{where}/checkpoint-{step}", run, created or f"2026-01-01T00:00:{step:02d}Z")


def test_resume_takes_the_newest_checkpoint_every_rank_can_read():
    # rank 0 has 3 and 6 on its disk (6's upload failed); S3 has 3; the workers have nothing
    rank0, remote = [found(3), found(6)], [found(3, where="s3://b/p")]
    chosen = checkpoints.choose_resume([rank0, [], []], remote)
    assert chosen.step == 3 and chosen.location == "local/checkpoint-3"
    assert checkpoints.choose_resume([rank0, [found(6)]], []).step == 6  # a shared folder
    assert checkpoints.choose_resume([rank0, []], []) is None
    assert checkpoints.choose_resume([[], []], [found(4, where="s3://b/p")]).location == "s3://b/p/checkpoint-4"
    # another run's checkpoint with the same step is not the same checkpoint
    assert checkpoints.choose_resume([[found(6, "a")], [found(6, "b")]], []) is None
    # two runs readable by all: the run written last is continued, at its newest step
    both = [found(50, "old", "2026-01-01T00:00:00Z"), found(8, "new", "2026-01-02T00:00:00Z"),
            found(4, "new", "2026-01-01T12:00:00Z")]
    assert checkpoints.choose_resume([both, both], []) == both[1]


# ---- item: --checkpoint_uri is checked at start

def test_probe_names_the_uri_and_the_error(mocked_s3):
    s3 = mocked_s3
    s3.create_bucket(Bucket="ckpt")
    checkpoint_s3.probe_uri(s3, "s3://ckpt/run")
    assert "Contents" not in s3.list_objects_v2(Bucket="ckpt")  # the probe object is gone again
    with pytest.raises(BadInput, match=r"^--checkpoint_uri s3://kept-bucket/run: .*NoSuchBucket"):
        checkpoint_s3.probe_uri(s3, "s3://kept-bucket/run")
