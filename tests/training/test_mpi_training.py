"""Real 2-rank runs of the job under Intel MPI's mpirun (impi-rt wheel) on this host, with gloo,
with the ccl and IPEX test doubles, with a fake metadata service announcing a spot interruption
and an S3 stand-in, and with bad input (one message, on rank 0)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.training.conftest import DOUBLES, FakeImds, mpi_env, read_summary, requires_mpi, run_mpi

pytestmark = [pytest.mark.mpi, pytest.mark.slow, requires_mpi]


def demo_args(demo: dict, output_dir, *extra: str) -> list[str]:
    """The demo's arguments; the spot watcher is off unless a test points it at a fake (so even
    on an EC2 test machine the real metadata service is never asked)."""
    return [*demo["args"], "--output_dir", str(output_dir), "--checkpoint_minutes", "0",
            "--per_device_train_batch_size", "16", "--logging_steps", "5", "--seed", "7",
            "--spot_watch", "off", *extra]


def chance_exact_match(validation_file: str) -> float:
    """Expected exact match (%) of guessing one context word uniformly at random."""
    document = json.loads(Path(validation_file).read_text())
    contexts = [p["context"] for article in document["data"] for p in article["paragraphs"]]
    return 100.0 * sum(1.0 / len(c.split()) for c in contexts) / len(contexts)


def explain(result) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-6000:]}"


def gloo_args(demo: dict, output_dir, grad_comm: str) -> list[str]:
    """3 epochs of 2 gloo ranks, gradients sent as `grad_comm` (bf16: the job's default) in buckets of 1 MB: the
    demo model's 0.5 MB of gradients make one bucket at that cap as at DDP's default (a first bucket of 1 MB)."""
    return demo_args(demo, output_dir, "--num_train_epochs", "3", "--dist_backend", "gloo", "--grad_comm", grad_comm,
                     "--ddp_bucket_mb", "1")


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory, qa_demo) -> dict:
    """The 2-rank gloo run under the job's default bf16 gradient communication (one launch, read by two tests)."""
    out = tmp_path_factory.mktemp("gloo") / "out"
    args = gloo_args(qa_demo, out, "bf16")
    result = run_mpi([args, args], mpi_env())
    assert result.returncode == 0, explain(result)
    return {"out": out, "result": result, "summary": read_summary(out)}


def test_two_ranks_gloo_learn_and_end_identical(qa_demo, gloo_run):
    out, result, summary = gloo_run["out"], gloo_run["result"], gloo_run["summary"]
    assert summary["status"] == "completed" and summary["world_size"] == 2
    assert summary["settings"]["backend"] == "gloo" and summary["settings"]["launcher"] == "intel-mpi"
    digests = summary["weights_sha256_per_rank"]
    assert len(digests) == 2 and digests[0] == digests[1], "the two model copies differ after training"
    assert summary["last_logged_loss"] < summary["first_logged_loss"]
    chance = chance_exact_match(qa_demo["validation_file"])
    assert summary["metrics"]["exact_match"] > 3 * chance, (summary["metrics"], chance)
    assert summary["metrics"]["f1"] > 3 * chance
    assert summary["global_batch_size"] == 2 * summary["per_rank_batch_size"]
    assert summary["samples_per_second"] > 0 and summary["tokens_per_second"] > summary["samples_per_second"]
    steps = summary["step_time_seconds"]
    assert steps["count"] == summary["steps"] and steps["p50"] <= steps["p90"] <= steps["p99"]
    assert 0 < summary["time_to_first_step_seconds"] < summary["wall_seconds"]
    assert (out / "summary.json").exists() and (out / "model.safetensors").exists()
    printed = result.stdout[result.stdout.index('{\n  "status"'):]
    assert json.loads(printed)["weights_sha256_per_rank"] == digests  # rank 0 printed the same summary


def test_ccl_and_ipex_paths_through_test_doubles(qa_demo, tmp_path):
    out, record = tmp_path / "out", tmp_path / "doubles.jsonl"
    args = demo_args(qa_demo, out, "--max_steps", "6", "--bf16", "true", "--max_eval_samples", "16")
    env = mpi_env({"PYTHONPATH": f"{DOUBLES}:{mpi_env()['PYTHONPATH']}", "XEON_TEST_DOUBLE_LOG": str(record)})
    result = run_mpi([args, args], env)
    assert result.returncode == 0, explain(result)
    events = [json.loads(line) for line in record.read_text().splitlines()]
    ccl = [e for e in events if e["double"] == "ccl"]
    ipex = [e for e in events if e["double"] == "ipex"]
    assert sorted(e["rank"] for e in ccl) == [0, 1] and all(e["size"] == 2 for e in ccl)
    assert sorted(e["rank"] for e in ipex) == [0, 1], "ipex.optimize must run once on every rank"
    assert all(e["dtype"] == "torch.bfloat16" and e["optimizer"] == "AdamW" and e["training"] for e in ipex)
    summary = read_summary(out)
    assert summary["settings"]["backend"] == "ccl"
    assert "oneccl_bindings_for_pytorch" in summary["settings"]["backend_reason"]
    assert summary["settings"]["ipex"] == "0.0+ipex-test-double"
    assert summary["steps"] == 6 and summary["weights_sha256_per_rank"][0] == summary["weights_sha256_per_rank"][1]
    assert "backend ccl" in result.stderr


def test_spot_notice_checkpoints_uploads_and_resume_finishes(qa_demo, tmp_path, moto_s3_server):
    import boto3

    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=moto_s3_server["AWS_ENDPOINT_URL_S3"],
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    s3.create_bucket(Bucket="ckpt-bucket")
    # An upload that never finished, newer than anything the job will write: must never be chosen.
    s3.put_object(Bucket="ckpt-bucket", Key="run/checkpoint-9999/model.safetensors", Body=b"partial")
    uri = "s3://ckpt-bucket/run"
    out = tmp_path / "out"
    max_steps = 80  # the notice comes 1 s in: at step 12 here, beside two other test workers
    args = demo_args(qa_demo, out, "--max_steps", str(max_steps), "--per_device_train_batch_size", "8",
                     "--checkpoint_uri", uri, "--spot_watch", "on", "--spot_poll_seconds", "0.3",
                     "--max_eval_samples", "32")
    env = mpi_env(moto_s3_server)
    with FakeImds() as quiet, FakeImds(announce_after=1.0) as imds:
        # only rank 1's metadata service announces: rank 0 must still stop, at the same step
        result = run_mpi([args, args], env, per_rank_env=[{"XEON_IMDS_ENDPOINT": quiet.url},
                                                          {"XEON_IMDS_ENDPOINT": imds.url}])
    assert result.returncode == 75, explain(result)
    assert quiet.requests, "rank 0 must poll its metadata service too"
    assert imds.requests[0][:2] == ("PUT", "/latest/api/token")
    assert all(has_token for method, _, has_token in imds.requests if method == "GET")
    first = read_summary(out)
    step = first["interruption"]["step"]
    assert first["status"] == "interrupted" and first["interruption"]["seen_by_rank"] == 1
    assert 0 < step < max_steps
    assert (out / f"checkpoint-{step}" / "xeon-checkpoint.json").exists()
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="ckpt-bucket", Prefix=f"run/checkpoint-{step}/")["Contents"]}
    assert f"run/checkpoint-{step}/xeon-checkpoint.json" in keys
    assert first["checkpoints"][-1]["uri"] == f"{uri}/checkpoint-{step}"

    # The node is gone: a fresh output directory, so the checkpoint must come from S3.
    resumed_out = tmp_path / "resumed"
    resume_args = demo_args(qa_demo, resumed_out, "--max_steps", str(max_steps), "--per_device_train_batch_size",
                            "8", "--checkpoint_uri", uri, "--resume", "--max_eval_samples", "32")
    result = run_mpi([resume_args, resume_args], mpi_env(moto_s3_server))
    assert result.returncode == 0, explain(result)
    second = read_summary(resumed_out)
    assert second["status"] == "completed"
    assert second["resumed_from"] == {"step": step, "location": f"{uri}/checkpoint-{step}"}
    assert second["start_step"] == step and second["steps"] == max_steps
    assert second["steps_this_run"] == max_steps - step
    assert second["weights_sha256_per_rank"][0] == second["weights_sha256_per_rank"][1]


def test_bad_input_stops_all_ranks_with_one_message(qa_demo, tmp_path):
    """A check that needs the world (the global batch over 2 ranks) stops both ranks, and only rank 0 prints its
    line; every other check's line is tests/training/test_bad_input.py's, in one process."""
    args = [*demo_args(qa_demo, tmp_path / "out"), "--global_batch_size", "33"]
    result = run_mpi([args, args], mpi_env())
    assert result.returncode == 2, explain(result)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, explain(result)
    assert errors[0] == ("error: --global_batch_size 33 does not divide over 2 ranks x 1 gradient accumulation "
                         "step(s); use a multiple of 2 (e.g. 32, 34) or change the number of ranks"), errors[0]
    assert "Traceback" not in result.stderr


def test_an_unwritable_checkpoint_uri_stops_every_rank_at_start(qa_demo, tmp_path, moto_s3_server):
    # rank 0 probes the URI before the data is read; rank 1 stops with it, rank 0 prints the one line
    args = demo_args(qa_demo, tmp_path / "out", "--checkpoint_uri", "s3://kept-bucket-of-an-old-stack/run")
    result = run_mpi([args, args], mpi_env(moto_s3_server))
    assert result.returncode == 2, explain(result)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, explain(result)
    assert errors[0].startswith("error: --checkpoint_uri s3://kept-bucket-of-an-old-stack/run: cannot write there")
    assert "NoSuchBucket" in errors[0] and "Traceback" not in result.stderr
    assert "training examples" not in result.stderr  # stopped before the data


def test_error_on_one_rank_only_is_reported_once_by_rank_0(qa_demo, tmp_path):
    no_answers = tmp_path / "no_answers.jsonl"
    no_answers.write_text(json.dumps({"id": "1", "question": "q ?", "context": "c ."}) + "\n")
    good = demo_args(qa_demo, tmp_path / "out")
    bad = [*good, "--train_file", str(no_answers)]  # this node's copy of the data is broken
    result = run_mpi([good, bad], mpi_env())
    assert result.returncode == 2, explain(result)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: on rank 1 ("), explain(result)
    assert "missing column(s) answers" in errors[0]


def test_missing_master_addr_is_named(qa_demo, tmp_path):
    env = mpi_env()
    del env["MASTER_ADDR"]
    args = demo_args(qa_demo, tmp_path / "out")
    result = run_mpi([args, args], env, timeout=120)
    assert result.returncode == 2, explain(result)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "MASTER_ADDR not set for a 2-rank job" in errors[0], explain(result)


def test_bf16_gradient_communication_changes_the_arithmetic_not_the_learning(qa_demo, gloo_run, tmp_path):
    """--grad_comm bf16 sends bf16 buckets: the same seeded run with --grad_comm fp32 ends with other weights (so the
    hook ran), the bf16 run's still identical on both ranks, and with a final loss within 3 % of the fp32 run's."""
    out = tmp_path / "fp32"
    args = gloo_args(qa_demo, out, "fp32")
    result = run_mpi([args, args], mpi_env())
    assert result.returncode == 0, explain(result)
    fp32, bf16 = read_summary(out), gloo_run["summary"]
    assert fp32["settings"]["grad_comm"] == "fp32"
    assert bf16["settings"]["grad_comm"] == "bf16" and bf16["settings"]["ddp_bucket_mb"] == 1
    assert len(set(bf16["weights_sha256_per_rank"])) == 1, "the two ranks' weights differ under bf16 communication"
    assert bf16["weights_sha256_per_rank"][0] != fp32["weights_sha256_per_rank"][0], "bf16 hook had no effect"
    assert abs(bf16["train_loss"] - fp32["train_loss"]) <= 0.03 * fp32["train_loss"], (bf16["train_loss"],
                                                                                        fp32["train_loss"])
