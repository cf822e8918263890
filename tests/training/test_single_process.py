"""One process without any launcher: the classification path end to end, and the summary maths."""

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
                             "--num_train_epochs", "2", "--per_device_train_batch_size", "16", "--logging_steps", "5",
                             "--bf16", "false", "--spot_watch", "off"],
                            env=env, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-4000:]
    data = read_summary(out)
    assert data["task"] == "classification" and data["world_size"] == 1 and data["settings"]["backend"] is None
    assert data["settings"]["bf16"] is False and data["settings"]["bf16_reason"].startswith("set with --bf16")
    assert data["metrics"]["eval_examples"] == 32
    assert 0.0 <= data["metrics"]["accuracy"] <= 1.0 and 0.0 <= data["metrics"]["f1"] <= 1.0
    assert data["steps"] == 2 * -(-300 // 16)  # two epochs of ceil(300/16) steps
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
