"""The run summary that rank 0 writes to <output_dir>/summary.json and prints: its figures (pure
functions of plain values) and the write itself (atomic: a reader never sees half a file)."""

from __future__ import annotations

import json
import math
import os
import platform
from importlib import metadata
from typing import Sequence

from cluster.job.jobreport import interruption_record
from cluster import exit_codes

VERSIONED_PACKAGES = ("torch", "transformers", "accelerate", "datasets", "intel-extension-for-pytorch",
                      "oneccl-bind-pt", "impi-rt")


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of `values`; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, math.ceil(q / 100.0 * len(ordered)) - 1))
    return ordered[index]


def step_time_stats(step_seconds: Sequence[float]) -> dict:
    """Percentiles over steps after the first (the first one carries warm-up), plus the first."""
    steady = list(step_seconds[1:]) or list(step_seconds)
    return {
        "count": len(step_seconds),
        "first": round(step_seconds[0], 4) if step_seconds else None,
        "mean": round(sum(steady) / len(steady), 4) if steady else None,
        **{f"p{q}": (round(percentile(steady, q), 4) if steady else None) for q in (50, 90, 99)},
        "max": round(max(steady), 4) if steady else None,
    }


def throughput(steps: int, global_batch: int, seconds: float, tokens_per_sample: float, world_size: int) -> dict:
    samples = steps * global_batch
    rate = samples / seconds if seconds > 0 else 0.0
    return {
        "samples": samples,
        "samples_per_second": round(rate, 3),
        "samples_per_second_per_rank": round(rate / world_size, 3),
        "tokens_per_second": round(rate * tokens_per_sample, 1),
        "tokens_per_second_per_rank": round(rate * tokens_per_sample / world_size, 1),
    }


def logged_losses(log_history: Sequence[dict]) -> list[float]:
    return [entry["loss"] for entry in log_history if "loss" in entry]


def upload_errors(saved: Sequence[dict]) -> list[dict]:
    """`{"step", "error"}` of every checkpoint whose upload failed (it exists on rank 0's disk only)."""
    return [{"step": r["step"], "error": r["upload_error"]} for r in saved if r.get("upload_error")]


def interruption_checkpoint(summary: dict) -> str:
    """What an interrupted run's summary says of the checkpoint taken at the notice: saved where,
    uploaded or not."""
    step, record, uri = interruption_record(summary)
    if record is None:
        return f"no checkpoint was saved at step {step}"
    if record.get("save_error"):
        return f"checkpoint-{step} could not be saved ({record['save_error']})"
    if record.get("upload_error"):
        return (f"checkpoint-{step} saved in {record['path']} on this node only: its upload to {uri} failed "
                f"({record['upload_error']})")
    if record.get("uri"):
        return f"checkpoint-{step} saved in {record['path']} and uploaded to {record['uri']}"
    return f"checkpoint-{step} saved in {record['path']} on this node only (no --checkpoint_uri)"


def software_versions() -> dict:
    """Python's version and that of every package in VERSIONED_PACKAGES (None: not installed)."""
    def version(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    return {"python": platform.python_version(), **{p: version(p) for p in VERSIONED_PACKAGES}}


def build_summary(*, parsed, prepared, world_size: int, hosts: list[str], state, timer, spot,
                  train_loss: float | None, eval_metrics: dict | None, resumed, final_model: str | None,
                  digests: list[str], settings: dict, versions: dict, started: float, now: float,
                  run_id: str | None = None, model_flops=None) -> dict:
    """The summary of one run.

    `parsed`: the job's arguments (training.args.ParsedArguments); `prepared`: its data
    (training.tasks.Prepared); `state`: the Trainer's state after training; `timer` and `spot`:
    its StepTimer and SpotCheckpointCallback; `train_loss`: Trainer.train's training_loss;
    `resumed`: the checkpoint resumed from (step, location) or None; `digests`: every rank's
    weights digest; `settings`: the job's settings (backend, bf16, threads, ...); `versions`:
    software_versions(); `started`/`now`: process start and the time of writing (time.time());
    `run_id`: the run this job belongs to (kept by --resume); `model_flops`: training.mfu.ModelFlops
    (the summary's `mfu`, model FLOP/s per node over the node's peak, and its inputs; None: left out).
    """
    training_args, job_args = parsed.training, parsed.job
    interrupted = spot.interrupted_at is not None
    global_batch = (training_args.per_device_train_batch_size * world_size
                    * training_args.gradient_accumulation_steps)
    steps_run = len(timer.step_seconds)
    train_seconds = (timer.last_step_end - timer.train_begin) if timer.last_step_end else 0.0
    losses = logged_losses(state.log_history)
    return {
        "status": "interrupted" if interrupted else "completed",
        "exit_code": exit_codes.INTERRUPTED if interrupted else exit_codes.OK,
        "run_id": run_id,
        "task": parsed.data.task,
        "model": parsed.model.model_name_or_path,
        "data": prepared.source,
        "parameters": prepared.parameters,
        "trainable_parameters": prepared.trainable_parameters,
        "world_size": world_size,
        "nodes": len(set(hosts)),
        "hosts": hosts,
        "per_rank_batch_size": training_args.per_device_train_batch_size,
        "gradient_accumulation_steps": training_args.gradient_accumulation_steps,
        "global_batch_size": global_batch,
        "train_examples": prepared.train_examples,
        "train_features": len(prepared.train_features),
        "tokens_per_sample": round(prepared.tokens_per_sample, 2),
        "max_seq_length": parsed.data.max_seq_length,
        "start_step": timer.start_step,
        "steps": state.global_step,
        "max_steps": state.max_steps,
        "steps_this_run": steps_run,
        "epoch": round(state.epoch or 0.0, 4),
        "train_seconds": round(train_seconds, 3),
        **throughput(steps_run, global_batch, train_seconds, prepared.tokens_per_sample, world_size),
        "step_time_seconds": step_time_stats(timer.step_seconds),
        "time_to_first_step_seconds": (round(timer.first_step_end - started, 3) if timer.first_step_end else None),
        "wall_seconds": round(now - started, 3),
        **(model_flops.summary(step_time_stats(timer.step_seconds)["mean"]) if model_flops else {}),
        "train_loss": round(train_loss, 5) if steps_run else None,
        "first_logged_loss": losses[0] if losses else None,
        "last_logged_loss": losses[-1] if losses else None,
        "metrics": eval_metrics,
        "resumed_from": ({"step": resumed.step, "location": resumed.location} if resumed else None),
        "interruption": ({"step": spot.interrupted_at, "seen_by_rank": spot.notice_rank} if interrupted else None),
        "checkpoints": spot.saved,
        "checkpoint_upload_errors": upload_errors(spot.saved),
        "final_model": final_model,
        "weights_sha256_per_rank": digests,
        "settings": {
            **settings,
            "checkpoint_minutes": job_args.checkpoint_minutes,
            "checkpoint_uri": job_args.checkpoint_uri,
            "spot_watch": spot.watcher is not None,
            "grad_comm": job_args.grad_comm,
            "ddp_bucket_mb": job_args.ddp_bucket_mb,
            "peft": ({"method": "lora", "r": job_args.lora_r, "alpha": job_args.lora_alpha,
                      "dropout": job_args.lora_dropout, "target_modules": job_args.lora_target_modules}
                     if job_args.peft == "lora" else None),
            "versions": versions,
        },
    }


def write_summary(summary: dict, output_dir: str) -> str:
    """Write `summary` to <output_dir>/summary.json atomically (temporary file, then rename); its path."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "summary.json")
    with open(path + ".tmp", "w") as handle:
        json.dump(summary, handle, indent=2)
    os.replace(path + ".tmp", path)
    return path
