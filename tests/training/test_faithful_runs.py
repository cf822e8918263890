"""What a run hands back, compared with an independent reference: the loss at 3 ranks with 1 rank's at the same
global batch, and a resumed run with the undisturbed one, step by step (exact equality of every logged loss and of
the final weights).

The resume tests stand in for a kill between checkpoints by what a kill leaves: the run's checkpoints up to the
resume point and nothing newer (the undisturbed run's later checkpoint removed from the folders and the bucket).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.training.conftest import (REPO, free_port, mpi_env, rank_command, read_summary, requires_mpi, run_mpi,
                                     warm_env)

pytestmark = [pytest.mark.mpi, pytest.mark.slow, requires_mpi]

STEPS, SAVE_AT = 16, 8


def demo_args(demo: dict, output_dir, *extra: str) -> list[str]:
    return [*demo["args"], "--output_dir", str(output_dir), "--checkpoint_minutes", "0", "--logging_steps", "1",
            "--seed", "7", "--spot_watch", "off", "--max_eval_samples", "0", "--bf16", "false", *extra]


def explain(result) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-6000:]}"


def losses(checkpoint: Path) -> dict[int, float]:
    """step -> the loss the Trainer logged, from a checkpoint's log history (full precision, not the printed text)."""
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    return {entry["step"]: entry["loss"] for entry in history if "loss" in entry}


def as_nodes(args_by_rank: list[list[str]], env: dict, timeout: float = 240) -> list[subprocess.CompletedProcess]:
    """One plain process per rank, each alone on its "node" (LOCAL_RANK 0 of 1, its own output folder), meeting at
    MASTER_ADDR:MASTER_PORT: the AWS layout, where every node has a disk of its own."""
    port = str(free_port())
    procs = []
    for rank, args in enumerate(args_by_rank):
        rank_env = {**env, "RANK": str(rank), "WORLD_SIZE": str(len(args_by_rank)), "LOCAL_RANK": "0",
                    "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        procs.append(subprocess.Popen([*rank_command(), *args], env=warm_env(rank_env), cwd=REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            out, err = proc.communicate()
            pytest.fail(f"a rank did not end within {timeout} s:\n{out[-2000:]}\n{err[-4000:]}")
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return results


@pytest.fixture(scope="module")
def dropout_demo(tmp_path_factory) -> dict:
    """The classification demo with a model whose dropout is 0.1 (as DistilBERT's): random state that matters."""
    from training.synthetic import write_demo

    demo = write_demo(tmp_path_factory.mktemp("dropout-demo"), task="classification", examples=200, seed=0)
    config_path = Path(demo["model"]) / "config.json"
    config = json.loads(config_path.read_text())
    config.update(dropout=0.1, attention_dropout=0.1, seq_classif_dropout=0.1)
    config_path.write_text(json.dumps(config))
    return demo


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory, classification_demo) -> dict:
    """An undisturbed 3-rank run (16 per rank, global batch 48) with a checkpoint at SAVE_AT and at STEPS."""
    out = tmp_path_factory.mktemp("three-ranks") / "out"
    args = demo_args(classification_demo, out, "--per_device_train_batch_size", "16", "--max_steps", str(STEPS),
                     "--save_strategy", "steps", "--save_steps", str(SAVE_AT))
    result = run_mpi([args] * 3, mpi_env())
    assert result.returncode == 0, explain(result)
    return {"out": out, "args": args, "summary": read_summary(out)}


def test_three_ranks_report_the_loss_one_rank_reports_at_the_same_global_batch(three_ranks, classification_demo,
                                                                              tmp_path):
    """The Trainer multiplies a loss by the number of ranks when it takes the model to divide by the label count of
    every rank; the demo's DistilBERT head does not, so without the job's setting 3 ranks logged 3 x ln 2."""
    out = tmp_path / "one"
    args = demo_args(classification_demo, out, "--per_device_train_batch_size", "48", "--max_steps", "1")
    result = run_mpi([args], mpi_env())
    assert result.returncode == 0, explain(result)
    one, three = read_summary(out)["first_logged_loss"], three_ranks["summary"]["first_logged_loss"]
    assert three_ranks["summary"]["global_batch_size"] == 48
    assert abs(three - one) <= 0.02 * one, f"first logged loss: 1 rank {one}, 3 ranks {three}"


def test_a_three_rank_resume_reduces_gradients_as_the_undisturbed_run(three_ranks, tmp_path):
    """DDP rebuilds its buckets after a job's first step; a resumed job's first steps then summed each gradient at
    another place in the buffer than the run it continues (gloo's sum depends on it at 3+ ranks). The job keeps one
    layout from the first step on, so the resumed steps equal the undisturbed ones exactly."""
    out = tmp_path / "out"
    shutil.copytree(three_ranks["out"] / f"checkpoint-{SAVE_AT}", out / f"checkpoint-{SAVE_AT}")
    args = [a if a != str(three_ranks["out"]) else str(out) for a in three_ranks["args"]]
    result = run_mpi([[*args, "--resume"]] * 3, mpi_env())
    assert result.returncode == 0, explain(result)
    undisturbed = losses(three_ranks["out"] / f"checkpoint-{STEPS}")
    resumed = losses(out / f"checkpoint-{STEPS}")
    after = range(SAVE_AT + 1, STEPS + 1)
    assert [resumed[s] for s in after] == [undisturbed[s] for s in after], (
        f"losses after the resume at step {SAVE_AT}: {[resumed[s] for s in after]} against "
        f"{[undisturbed[s] for s in after]}")
    assert read_summary(out)["weights_sha256_per_rank"] == three_ranks["summary"]["weights_sha256_per_rank"]


def test_a_resume_on_separate_node_disks_restores_every_ranks_random_state(dropout_demo, tmp_path, moto_s3_server):
    """Two "nodes" with disks of their own and a bucket: each rank's random state reaches the bucket through rank
    0's checkpoint, and a replaced node (a new, empty folder) gets it back: with dropout every loss after the
    resume equals the undisturbed run's. Without it the replaced rank replayed its dropout masks from the seed."""
    import boto3

    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=moto_s3_server["AWS_ENDPOINT_URL_S3"],
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    s3.create_bucket(Bucket="ckpt")
    env = mpi_env(moto_s3_server)

    def run(folders: list[Path], uri: str, *extra: str):
        args = [demo_args(dropout_demo, folder, "--per_device_train_batch_size", "8", "--max_steps", str(STEPS),
                          "--save_strategy", "steps", "--save_steps", str(SAVE_AT), "--checkpoint_uri", uri, *extra)
                for folder in folders]
        results = as_nodes(args, env)
        for result in results:
            assert result.returncode == 0, explain(result)

    first = [tmp_path / "node0", tmp_path / "node1"]
    run(first, "s3://ckpt/undisturbed")
    listed = s3.list_objects_v2(Bucket="ckpt", Prefix=f"undisturbed/checkpoint-{SAVE_AT}/")["Contents"]
    keys = {o["Key"] for o in listed}
    assert {f"undisturbed/checkpoint-{SAVE_AT}/rng_state_{rank}.pth" for rank in (0, 1)} <= keys
    manifest = json.loads((first[0] / f"checkpoint-{SAVE_AT}" / "xeon-checkpoint.json").read_text())
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(manifest["files"]) and manifest["world_size"] == 2

    # What a kill between the two checkpoints leaves: checkpoint-SAVE_AT on node 0's disk and in the bucket; node 1
    # replaced by a new machine with an empty disk.
    resumed = [tmp_path / "resumed0", tmp_path / "resumed1"]
    shutil.copytree(first[0] / f"checkpoint-{SAVE_AT}", resumed[0] / f"checkpoint-{SAVE_AT}")
    for obj in s3.list_objects_v2(Bucket="ckpt", Prefix="undisturbed/")["Contents"]:
        if f"/checkpoint-{SAVE_AT}/" in obj["Key"]:
            s3.copy_object(Bucket="ckpt", Key=obj["Key"].replace("undisturbed/", "resumed/", 1),
                           CopySource={"Bucket": "ckpt", "Key": obj["Key"]})
    run(resumed, "s3://ckpt/resumed", "--resume")
    undisturbed, again = losses(first[0] / f"checkpoint-{STEPS}"), losses(resumed[0] / f"checkpoint-{STEPS}")
    after = range(SAVE_AT + 1, STEPS + 1)
    assert [again[s] for s in after] == [undisturbed[s] for s in after]
    assert read_summary(resumed[0])["weights_sha256_per_rank"] == read_summary(first[0])["weights_sha256_per_rank"]


def test_a_resume_that_misses_a_ranks_random_state_stops_with_one_line(dropout_demo, tmp_path):
    """A checkpoint without rank 1's random state (written before every rank's state was kept) stops the resume on
    every rank with one line naming the rank and how to go on; --resume_without_rank_state true goes on."""
    out = tmp_path / "out"

    def args(steps: int, *extra: str) -> list[str]:
        return demo_args(dropout_demo, out, "--per_device_train_batch_size", "8", "--max_steps", str(steps),
                         "--save_strategy", "steps", "--save_steps", "2", *extra)

    first = run_mpi([args(4)] * 2, mpi_env())
    assert first.returncode == 0, explain(first)
    folder = out / "checkpoint-4"
    shutil.rmtree(out / "checkpoint-2", ignore_errors=True)
    (folder / "rng_state_1.pth").unlink()
    manifest_path = folder / "xeon-checkpoint.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["files"]["rng_state_1.pth"]
    manifest_path.write_text(json.dumps(manifest))
    refused = run_mpi([args(6, "--resume")] * 2, mpi_env())
    assert refused.returncode == 2, explain(refused)
    lines = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "rank(s) 1" in lines[0] and "--resume_without_rank_state true" in lines[0], lines
    went_on = run_mpi([args(6, "--resume", "--resume_without_rank_state", "true")] * 2, mpi_env())
    assert went_on.returncode == 0, explain(went_on)
    assert "start new random streams" in went_on.stderr
    assert os.path.isfile(out / "checkpoint-6" / "rng_state_1.pth")


def epochs(checkpoint: Path) -> dict[int, float]:
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    return {entry["step"]: entry["epoch"] for entry in history if "loss" in entry}


def test_a_smaller_world_whose_batch_cannot_be_kept_continues_at_the_same_place_in_the_data(three_ranks, tmp_path):
    """The undisturbed 3-rank run's checkpoint-8 (3 ranks of 16: 48 per step, 384 samples, epoch 8/7) resumed on 2
    ranks of 16 (32 per step; 48 needs 1.5 accumulation steps there): the Trainer places a resumed job by steps, so
    step 8 went back to epoch 0.8 and replayed part of an epoch; the job continues at the step of the new batch that
    has seen as many samples."""
    at_checkpoint = epochs(three_ranks["out"] / f"checkpoint-{SAVE_AT}")[SAVE_AT]
    resumed = tmp_path / "two"
    shutil.copytree(three_ranks["out"] / f"checkpoint-{SAVE_AT}", resumed / f"checkpoint-{SAVE_AT}")
    args = [a if a != str(three_ranks["out"]) else str(resumed) for a in three_ranks["args"]]
    two = run_mpi([[*args, "--resume"]] * 2, mpi_env())
    assert two.returncode == 0, explain(two)
    per_epoch = -(-(300 // 2) // 16)  # steps per epoch on 2 ranks: ceil(150 / 16)
    logged = epochs(resumed / f"checkpoint-{STEPS}")
    first = min(step for step in logged if step > SAVE_AT)
    position = logged[first] - 1 / per_epoch  # where the first resumed step started
    assert abs(position - at_checkpoint) <= 1 / per_epoch, (
        f"checkpoint-{SAVE_AT} was at epoch {at_checkpoint}; the resumed job started at epoch {position:.3f} "
        f"(step {first})")
    assert first == 12 + 1  # 384 samples seen = 12 steps of 32
    # the learning-rate schedule continues at the same fraction of the run: step 13 of 16 trains at the demo's
    # linear decay after 5 warm-up steps from step 12 (the rate logged with a step is the one it trained at)
    history = json.loads((resumed / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())["log_history"]
    rate = next(entry["learning_rate"] for entry in history if entry.get("step") == first and "loss" in entry)
    assert rate == pytest.approx(0.005 * (STEPS - (first - 1)) / (STEPS - 5), rel=1e-6)
    assert "continues as step 12 of this batch" in two.stderr
    assert read_summary(resumed)["steps"] == STEPS
