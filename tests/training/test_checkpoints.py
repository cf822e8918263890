"""Checkpoint completeness, S3 upload with verification, newest-complete selection (moto)."""

import json
import os

import pytest

from training import checkpoints
from training.errors import BadInput


def make_checkpoint(root, step, payload=b"weights"):
    directory = root / f"checkpoint-{step}"
    (directory / "sub").mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(payload * 100)
    (directory / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (directory / "sub" / "rng_state.pth").write_bytes(b"rng")
    checkpoints.write_manifest(directory, step)
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


def test_s3_uri_parsing():
    assert checkpoints.parse_s3_uri("s3://my-bucket/jobs/run-1/") == ("my-bucket", "jobs/run-1")
    assert checkpoints.parse_s3_uri("s3://my-bucket") == ("my-bucket", "")
    with pytest.raises(BadInput, match="not a valid S3 bucket name"):
        checkpoints.parse_s3_uri("s3://My_Bucket/x")


def test_upload_verify_and_choose_newest_complete(mocked_s3, tmp_path):
    s3 = mocked_s3
    s3.create_bucket(Bucket="ckpt")
    uri = "s3://ckpt/jobs/run-1"
    first = checkpoints.upload_checkpoint(s3, make_checkpoint(tmp_path / "a", 100), uri)
    second = checkpoints.upload_checkpoint(s3, make_checkpoint(tmp_path / "a", 200, b"newer"), uri)
    assert (first, second) == (f"{uri}/checkpoint-100", f"{uri}/checkpoint-200")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="ckpt", Prefix="jobs/run-1/checkpoint-200/")["Contents"]]
    assert sorted(keys) == sorted(f"jobs/run-1/checkpoint-200/{n}" for n in (
        "model.safetensors", "trainer_state.json", "sub/rng_state.pth", checkpoints.MANIFEST))
    # a newer upload that was cut off before its manifest, and one whose object does not match
    s3.put_object(Bucket="ckpt", Key="jobs/run-1/checkpoint-300/model.safetensors", Body=b"partial")
    broken = make_checkpoint(tmp_path / "b", 400)
    checkpoints.upload_checkpoint(s3, broken, uri)
    s3.put_object(Bucket="ckpt", Key="jobs/run-1/checkpoint-400/model.safetensors", Body=b"overwritten")
    assert checkpoints.newest_s3(s3, uri) == checkpoints.Found(200, f"{uri}/checkpoint-200")

    target = tmp_path / "restore" / "checkpoint-200"
    checkpoints.download_checkpoint(s3, f"{uri}/checkpoint-200", target)
    assert (target / "model.safetensors").read_bytes() == b"newer" * 100
    assert checkpoints.local_complete(target)
    # local copy older than S3's: resume takes S3's; a newer local one wins
    local_root = tmp_path / "local"
    make_checkpoint(local_root, 150)
    assert checkpoints.choose_resume(str(local_root), uri, s3).location == f"{uri}/checkpoint-200"
    make_checkpoint(local_root, 250)
    assert checkpoints.choose_resume(str(local_root), uri, s3) == checkpoints.Found(250, str(local_root / "checkpoint-250"))


def test_download_refuses_bytes_that_do_not_match(mocked_s3, tmp_path):
    s3 = mocked_s3
    s3.create_bucket(Bucket="ckpt")
    checkpoints.upload_checkpoint(s3, make_checkpoint(tmp_path, 5), "s3://ckpt/r")
    s3.put_object(Bucket="ckpt", Key="r/checkpoint-5/trainer_state.json", Body=b'{"global_step": 6}')
    with pytest.raises(checkpoints.CheckpointError, match="do not match the manifest"):
        checkpoints.download_checkpoint(s3, "s3://ckpt/r/checkpoint-5", tmp_path / "out" / "checkpoint-5")
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
        checkpoints.upload_checkpoint(s3, directory, "s3://ckpt/r")
    assert checkpoints.newest_s3(s3, "s3://ckpt/r") is None  # no manifest was written
    assert os.path.exists(directory / checkpoints.MANIFEST)


def test_prune_keeps_the_newest_complete_and_anything_newer(mocked_s3, tmp_path):
    s3 = mocked_s3
    s3.create_bucket(Bucket="ckpt")
    for step in (10, 20, 30):
        checkpoints.upload_checkpoint(s3, make_checkpoint(tmp_path, step), "s3://ckpt/r")
    s3.put_object(Bucket="ckpt", Key="r/checkpoint-40/model.safetensors", Body=b"in flight")
    s3.put_object(Bucket="ckpt", Key="r/checkpoint-5/model.safetensors", Body=b"old leftover")
    assert checkpoints.prune_s3(s3, "s3://ckpt/r", keep=2) == [5, 10]
    left = {o["Key"].split("/")[1] for o in s3.list_objects_v2(Bucket="ckpt", Prefix="r/")["Contents"]}
    assert left == {"checkpoint-20", "checkpoint-30", "checkpoint-40"}
    assert checkpoints.newest_s3(s3, "s3://ckpt/r").step == 30
    assert checkpoints.prune_s3(s3, "s3://ckpt/r", keep=2) == []


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
        checkpoints.upload_checkpoint(s3, directory, "s3://ckpt/r")
    assert checkpoints.newest_s3(s3, "s3://ckpt/r") is None
