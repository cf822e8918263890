"""The run summary that rank 0 writes to <output_dir>/summary.json and prints (pure)."""

from __future__ import annotations

import math
from typing import Sequence


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
