"""Run identity, one process per run (no launcher): two runs that share a --checkpoint_uri prefix
or an --output_dir, and the --checkpoint_uri probe at start. S3 is moto on 127.0.0.1."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.training.conftest import REPO, mpi_env, rank_command, read_summary, warm_env
from training import checkpoint_s3, checkpoints

pytestmark = pytest.mark.slow


def run_job(demo, output_dir, s3_env, *extra, timeout=240):
    env = {k: v for k, v in mpi_env(s3_env).items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    args = [*demo["args"], "--output_dir", str(output_dir), "--checkpoint_minutes", "0", "--spot_watch", "off",
            "--per_device_train_batch_size", "16", "--max_eval_samples", "0", "--bf16", "false", *extra]
    return subprocess.run([*rank_command(), *args], env=warm_env(env), cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def one_error(result) -> str:
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-4000:]
    assert "Traceback" not in result.stderr
    return errors[0]


@pytest.fixture
def s3(moto_s3_server):
    import boto3

    client = boto3.client("s3", region_name="us-east-1", endpoint_url=moto_s3_server["AWS_ENDPOINT_URL_S3"],
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    client.create_bucket(Bucket="ckpt")
    return client


def test_two_runs_sharing_a_prefix(qa_demo, tmp_path, s3, moto_s3_server):
    uri = "s3://ckpt/shared"
    first = run_job(qa_demo, tmp_path / "a", moto_s3_server, "--checkpoint_uri", uri, "--max_steps", "6",
                    "--save_steps", "2")
    assert first.returncode == 0, first.stderr[-4000:]
    run_a = read_summary(tmp_path / "a")["run_id"]
    assert re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{8}", run_a)
    on_s3 = checkpoint_s3.s3_checkpoints(s3, uri)
    assert sorted(f.step for f in on_s3) == [4, 6] and {f.run_id for f in on_s3} == {run_a}

    # a fresh run into the same prefix stops at once, naming the prefix, the run and the ways out
    line = one_error(run_job(qa_demo, tmp_path / "b", moto_s3_server, "--checkpoint_uri", uri, "--max_steps", "2"))
    assert f"--checkpoint_uri {uri} already holds checkpoints of run {run_a} (newest: checkpoint-6)" in line
    assert "--resume to continue that run" in line and "another --checkpoint_uri" in line
    assert sorted(f.step for f in checkpoint_s3.s3_checkpoints(s3, uri)) == [4, 6]  # nothing pruned
    # the same for a fresh run into the first run's output directory
    line = one_error(run_job(qa_demo, tmp_path / "a", moto_s3_server, "--max_steps", "2"))
    assert f"--output_dir {tmp_path / 'a'} already holds checkpoints of run {run_a}" in line
    assert "another --output_dir" in line

    # --resume continues the first run: same id, from its newest checkpoint, pruning only its own
    resumed = run_job(qa_demo, tmp_path / "c", moto_s3_server, "--checkpoint_uri", uri, "--max_steps", "10",
                      "--save_steps", "2", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    summary = read_summary(tmp_path / "c")
    assert summary["run_id"] == run_a and summary["start_step"] == 6 and summary["steps"] == 10
    assert summary["resumed_from"] == {"step": 6, "location": f"{uri}/checkpoint-6"}
    assert sorted(f.step for f in checkpoint_s3.s3_checkpoints(s3, uri)) == [8, 10]
    manifest = json.loads((tmp_path / "c" / "checkpoint-10" / checkpoints.MANIFEST).read_text())
    assert manifest["run_id"] == run_a


@pytest.mark.parametrize("uri, expected", [
    ("s3://kept-bucket-of-an-old-stack/run", r"--checkpoint_uri s3://kept-bucket-of-an-old-stack/run: cannot write "
                                             r"there \(NoSuchBucket"),
    ("s3://Bad_Bucket/run", r"--checkpoint_uri: 's3://Bad_Bucket/run' is not allowed; allowed: s3://BUCKET/PREFIX"),
])
def test_an_unusable_checkpoint_uri_stops_at_start(qa_demo, tmp_path, s3, moto_s3_server, uri, expected):
    result = run_job(qa_demo, tmp_path / "out", moto_s3_server, "--checkpoint_uri", uri, "--max_steps", "50")
    line = one_error(result)
    assert re.search(expected, line), line
    assert not (tmp_path / "out" / "summary.json").exists()
