"""A running job's progress as `fab status` shows it (pure): from the job's own progress record
(xeon_cluster/progress.py writes `<output dir>/progress.json` on rank 0), checked as anything read from a
node: step out of total, samples per second, time left, and what the job's nodes have cost since it
started.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cluster import records
from xeon_cluster import progress as record_format

FILE = record_format.FILE


@dataclass(frozen=True)
class Progress:
    step: int
    total: int | None
    steps_per_second: float | None
    samples_per_second: float | None
    updated: float


def _number(value) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    return float(value) if ok else None


def parse(text: str | None, where: str) -> tuple[Progress | None, str | None]:
    """(the record, None), (None, None) when there is none yet, or (None, one line naming `where`)."""
    try:
        value = records.load(text, where)  # bounded: size, nesting, numbers
    except records.RecordError as exc:
        return None, str(exc)
    if value is None:
        return None, None
    if not isinstance(value, dict) or value.get("format") != record_format.FORMAT:
        return None, f"{where}: not a progress record of this version"
    step, total, updated = value.get("step"), value.get("total"), _number(value.get("updated"))
    if not isinstance(step, int) or isinstance(step, bool) or step < 0 or updated is None:
        return None, f"{where}: no step and time"
    if total is not None and (not isinstance(total, int) or isinstance(total, bool) or total < 1):
        total = None
    return Progress(step, total, _number(value.get("steps_per_second")), _number(value.get("samples_per_second")),
                    updated), None


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def seconds_left(progress: Progress) -> float | None:
    if progress.total is None or not progress.steps_per_second:
        return None
    return max(0, progress.total - progress.step) / progress.steps_per_second


def line(progress: Progress, *, now: float, running_s: float | None, usd_per_hour: float | None) -> str:
    """`step 120 of 400 (30%), 52.1 samples/s, about 4m10s left, $0.41 so far (record 3s old)`."""
    parts = [f"step {progress.step}" + (f" of {progress.total} ({100 * progress.step // progress.total}%)"
                                        if progress.total else "")]
    parts.append(f"{progress.samples_per_second:g} samples/s" if progress.samples_per_second is not None
                 else "samples/s not measured yet")
    left = seconds_left(progress)
    if left is not None:
        parts.append(f"about {_duration(left)} left")
    if running_s is not None and usd_per_hour is not None:
        parts.append(f"${usd_per_hour * running_s / 3600:.2f} so far")
    elif running_s is not None:
        parts.append("cost so far unknown (no price for these nodes)")
    return ", ".join(parts) + f" (record {_duration(max(0.0, now - progress.updated))} old)"


def as_json(progress: Progress, *, running_s: float | None, usd_per_hour: float | None) -> dict:
    left = seconds_left(progress)
    return {"step": progress.step, "total": progress.total, "samples_per_second": progress.samples_per_second,
            "seconds_left": round(left) if left is not None else None,
            "cost_so_far_usd": (round(usd_per_hour * running_s / 3600, 4)
                                if running_s is not None and usd_per_hour is not None else None)}
