"""`fab train --managed`: what to do when a supervised job ends interrupted (pure decisions).

- `parse_wait(text)`: a duration (cluster/durations.py's forms: 90, 45s, 10m, 1h30m) or 0 (do not
  wait for replacements at all).
- `next_step(...)`: after the wait, go on with the full cluster, on the survivors, or stop.
- `batch_for(...)`: the per-rank batch and gradient accumulation that keep the global batch
  (per-rank batch x ranks x accumulation) exact on a new number of ranks, or the nearest one and
  one line saying what changed; a relaunch applies it as a typed override when its command line is
  made (cluster/job/jobplan.py's Restart).
- `work_lost_seconds(...)`, `recovery_record(...)`: what summary.json's "recoveries" list holds.

The run supervisor on the master (node_setup/supervisor/) runs the loop; fab's --managed options are
checked here by node_setup/tasks/managed.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from cluster.durations import parse_duration

DEFAULT_MAX_RECOVERIES = 3
DEFAULT_WAIT_FOR_CAPACITY = "15m"  # a `pulumi up --refresh` that replaces a spot node takes a few minutes
RECOVERIES_KEY = "recoveries"  # summary.json's list of recoveries
RECOVERIES_FILE = "recoveries.json"  # in the run's output directory on the master, kept across relaunches

# What the loop does after the wait for replacements.
FULL, SURVIVORS, TOO_FEW = "full", "survivors", "too-few"


class RecoveryError(ValueError):
    """A --managed setting that cannot be used; the message names it, the value and what is allowed."""


def parse_wait(text: str, setting: str = "--wait-for-capacity") -> float:
    """Seconds to wait for replacement nodes: 0, or a duration such as 90, 45s, 10m or 1h30m."""
    raw = str(text).strip()
    try:
        if raw and float(raw.rstrip("hmsHMS") or "x") == 0:  # 0, 0s, 0m: no wait
            return 0.0
    except ValueError:
        pass
    try:
        return parse_duration(raw, setting)
    except ValueError as exc:
        raise RecoveryError(f"{exc} (or 0: do not wait, resume on the survivors)") from None


def next_step(wanted: int, available: int, min_nodes: int) -> str:
    """FULL when `available` nodes make up the `wanted`, SURVIVORS when at least `min_nodes` are
    left, TOO_FEW otherwise."""
    if available >= wanted:
        return FULL
    return SURVIVORS if available >= min_nodes else TOO_FEW


@dataclass(frozen=True)
class BatchPlan:
    per_rank: int
    accumulation: int
    ranks: int
    global_batch: int  # what the plan gives
    wanted: int  # the global batch before

    @property
    def exact(self) -> bool:
        return self.global_batch == self.wanted

    def describe(self, per_rank_before: int, accumulation_before: int) -> str:
        how = (f"per-rank batch {per_rank_before} -> {self.per_rank}, gradient accumulation "
               f"{accumulation_before} -> {self.accumulation} on {self.ranks} rank(s)")
        if self.exact:
            return f"global batch {self.wanted} kept: {how}"
        return (f"global batch {self.wanted} cannot be kept exactly on {self.ranks} rank(s): {how} gives "
                f"{self.global_batch} ({self.global_batch - self.wanted:+d} samples per step); the job keeps its place "
                "in the data (samples seen), so its step count changes")


def batch_for(*, per_rank: int, accumulation: int, ranks_before: int, ranks: int) -> BatchPlan:
    """The batch on `ranks` ranks that keeps per_rank x ranks_before x accumulation.

    First accumulation alone (the per-rank batch stays); else the largest per-rank batch no larger
    than before (so no rank needs more memory) with an integer accumulation; else the nearest
    global batch with the same per-rank batch.
    """
    for name, value in (("per_rank", per_rank), ("accumulation", accumulation), ("ranks_before", ranks_before),
                        ("ranks", ranks)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"batch_for: {name} must be a positive whole number, not {value!r}")
    wanted = per_rank * ranks_before * accumulation
    if wanted % (per_rank * ranks) == 0:
        return BatchPlan(per_rank, wanted // (per_rank * ranks), ranks, wanted, wanted)
    if wanted % ranks == 0:
        share = wanted // ranks  # samples per rank per optimizer step
        for b in range(min(per_rank, share), 0, -1):
            if share % b == 0:
                return BatchPlan(b, share // b, ranks, wanted, wanted)
    steps = max(1, round(wanted / (per_rank * ranks)))
    return BatchPlan(per_rank, steps, ranks, per_rank * ranks * steps, wanted)


def work_lost_seconds(stopped_step: int | None, checkpoint_step: int | None,
                      mean_step_seconds: float | None) -> float | None:
    """Training time between the checkpoint resumed from and where the job stopped (None: unknown)."""
    if stopped_step is None or mean_step_seconds is None:
        return None
    return round(max(0, stopped_step - (checkpoint_step or 0)) * mean_step_seconds, 3)


def recovery_record(*, number: int, at: float, cause: str, step: int | None, exit_code: int | None,
                    nodes_lost: list[str], nodes_after: list[str], seconds_lost: float | None,
                    seconds_waiting: float, batch: str | None = None) -> dict:
    """One entry of summary.json's "recoveries"."""
    return {
        "number": number,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at)),
        "cause": cause,
        "step": step,
        "exit_code": exit_code,
        "nodes_lost": list(nodes_lost),
        "nodes_after": list(nodes_after),
        "seconds_lost": seconds_lost,
        "seconds_waiting": round(seconds_waiting, 1),
        "batch": batch,
    }


def merge_recoveries(summary: dict, records: list[dict]) -> dict:
    """`summary` with "recoveries" holding `records` (the job's summary never has its own)."""
    return {**summary, RECOVERIES_KEY: list(records)}
