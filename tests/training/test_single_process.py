"""One process without any launcher: the classification path end to end, the summary and the tasks."""

import json
import subprocess
import sys

import pytest

from tests.training.conftest import REPO, mpi_env, read_summary
from training import summary


@pytest.mark.slow
def test_classification_single_process(classification_demo, tmp_path):
    env = {k: v for k, v in mpi_env().items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "training", *classification_demo["args"], "--output_dir", str(out),
                             "--num_train_epochs", "3", "--per_device_train_batch_size", "16", "--logging_steps", "5",
                             "--bf16", "false", "--spot_watch", "off"],
                            env=env, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-4000:]
    data = read_summary(out)
    assert data["task"] == "classification" and data["world_size"] == 1 and data["settings"]["backend"] is None
    assert data["settings"]["bf16"] is False and data["settings"]["bf16_reason"].startswith("set with --bf16")
    assert data["metrics"]["eval_examples"] == 32
    assert data["metrics"]["accuracy"] >= 0.8, data["metrics"]  # the demo is learnt: chance is 0.5
    assert data["last_logged_loss"] < 0.5 * data["first_logged_loss"]
    assert data["steps"] == 3 * -(-300 // 16)  # three epochs of ceil(300/16) steps
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "0", "1": "1"}


def test_percentiles_and_throughput():
    assert summary.percentile([5, 1, 3, 2, 4], 50) == 3
    assert summary.percentile([1, 2, 3, 4], 90) == 4
    assert summary.percentile([], 50) is None
    stats = summary.step_time_stats([9.0, 1.0, 2.0, 3.0])
    assert stats["first"] == 9.0 and stats["p50"] == 2.0 and stats["max"] == 3.0 and stats["count"] == 4
    rates = summary.throughput(steps=10, global_batch=64, seconds=4.0, tokens_per_sample=100, world_size=2)
    assert rates["samples_per_second"] == 160 and rates["samples_per_second_per_rank"] == 80
    assert rates["tokens_per_second"] == 16000 and rates["tokens_per_second_per_rank"] == 8000


def test_build_summary_reports_an_interruption_and_every_key():
    from types import SimpleNamespace as NS

    from cluster import exit_codes

    parsed = NS(training=NS(per_device_train_batch_size=4, gradient_accumulation_steps=2),
                job=NS(checkpoint_minutes=5.0, checkpoint_uri="s3://bucket/run", grad_comm="bf16", ddp_bucket_mb=None,
                       peft="none"),
                data=NS(task="qa", max_seq_length=64), model=NS(model_name_or_path="tiny"))
    prepared = NS(source={"train": "t.json"}, train_examples=10, train_features=[0] * 12, tokens_per_sample=33.333,
                  parameters=1000, trainable_parameters=40)
    timer = NS(step_seconds=[2.0, 1.0, 1.0], train_begin=100.0, first_step_end=102.0, last_step_end=104.0,
               start_step=5)
    spot = NS(interrupted_at=8, notice_rank=1, watcher=object(), saved=[
        {"step": 4, "path": "out/checkpoint-4", "uri": None, "upload_error": "ClientError: AccessDenied"},
        {"step": 8, "path": "out/checkpoint-8", "uri": "s3://bucket/run/checkpoint-8", "upload_error": None}])
    state = NS(global_step=8, max_steps=20, epoch=0.4, log_history=[{"loss": 2.5}, {"eval": 1}, {"loss": 1.5}])
    data = summary.build_summary(
        parsed=parsed, prepared=prepared, world_size=2, hosts=["a", "a"], state=state, timer=timer, spot=spot,
        train_loss=2.123456, eval_metrics=None, resumed=NS(step=5, location="local"), final_model=None,
        digests=["x", "x"], settings={"backend": "gloo"}, versions={"python": "3"}, started=90.0, now=110.0,
        run_id="20260101T000000Z-abcd")
    assert list(data) == [
        "status", "exit_code", "run_id", "task", "model", "data", "parameters", "trainable_parameters", "world_size",
        "nodes", "hosts", "per_rank_batch_size",
        "gradient_accumulation_steps", "global_batch_size", "train_examples", "train_features",
        "tokens_per_sample", "max_seq_length", "start_step", "steps", "max_steps", "steps_this_run", "epoch",
        "train_seconds", "samples", "samples_per_second", "samples_per_second_per_rank", "tokens_per_second",
        "tokens_per_second_per_rank", "step_time_seconds", "time_to_first_step_seconds", "wall_seconds",
        "train_loss", "first_logged_loss", "last_logged_loss", "metrics", "resumed_from", "interruption",
        "checkpoints", "checkpoint_upload_errors", "final_model", "weights_sha256_per_rank", "settings"]
    assert data["status"] == "interrupted" and data["exit_code"] == exit_codes.INTERRUPTED
    assert data["global_batch_size"] == 16 and data["nodes"] == 1 and data["train_features"] == 12
    assert data["train_seconds"] == 4.0 and data["samples"] == 48 and data["wall_seconds"] == 20.0
    assert data["time_to_first_step_seconds"] == 12.0 and data["train_loss"] == 2.12346
    assert (data["first_logged_loss"], data["last_logged_loss"]) == (2.5, 1.5)
    assert data["resumed_from"] == {"step": 5, "location": "local"}
    assert data["interruption"] == {"step": 8, "seen_by_rank": 1}
    assert data["run_id"] == "20260101T000000Z-abcd"
    assert data["checkpoint_upload_errors"] == [{"step": 4, "error": "ClientError: AccessDenied"}]
    assert data["settings"] == {"backend": "gloo", "checkpoint_minutes": 5.0, "checkpoint_uri": "s3://bucket/run",
                                "spot_watch": True, "grad_comm": "bf16", "ddp_bucket_mb": None, "peft": None,
                                "versions": {"python": "3"}}
    assert (data["parameters"], data["trainable_parameters"]) == (1000, 40)


def test_write_summary_replaces_the_file_whole(tmp_path):
    path = summary.write_summary({"status": "completed"}, str(tmp_path / "out"))
    assert json.loads(open(path).read()) == {"status": "completed"}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["summary.json"]


def test_every_task_name_has_a_task_object():
    from cluster.job.job_args import TASKS
    from training import tasks

    assert sorted(tasks.TASKS) == sorted(TASKS)
    for name in TASKS:
        task = tasks.for_name(name)
        assert all(callable(getattr(task, m)) for m in ("prepare", "collator", "predict_inputs", "scores"))
