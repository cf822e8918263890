"""`fab report`: which curves and facts a job's report shows, from the job's own records (pure).

A job leaves in its output folder summary.json (the built-in job's, training/summary.py, with the cost
`fab train` adds: cluster/cost/spend.py's COST_KEY), progress.json (xeon_cluster/progress.py) and the
Hugging Face Trainer's trainer_state.json (the built-in job writes it at its end; every checkpoint
holds one), whose `log_history` has one entry per logging step: `loss`, `learning_rate`, `step`, and
from the built-in job's step timer (training/callbacks.py) STEP_SECONDS and SAMPLES_PER_SECOND over the
steps since the last entry, and one RESUMED entry at the step a run resumed from (a recovery). Nothing
read from a node is trusted: an entry's values are kept only when they are finite numbers.

`job_report(label, texts)` makes one job's `JobReport`; `SERIES` says which curves a report draws
(node_setup/report_plot.py draws them, every job's on the same axes); `facts(report)` is the table beside
them: what the summary measured and what the plan said.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from cluster.cost.spend import COST_KEY

# The keys the built-in job's step timer adds to a log entry of trainer_state.json's log_history.
STEP_SECONDS = "step_seconds"  # mean wall time of the steps since the last entry
SAMPLES_PER_SECOND = "samples_per_second"  # the global batch over STEP_SECONDS
RESUMED = "xeon_cluster_resumed"  # an entry of its own: the run resumed at its step (a recovery)

FILES = ("summary.json", "progress.json", "trainer_state.json")  # what a report reads of a job's output folder

# (the log entry's key, the axis label): the curves of a report, each against the step.
SERIES: tuple[tuple[str, str], ...] = (
    ("loss", "training loss"),
    ("learning_rate", "learning rate"),
    (SAMPLES_PER_SECOND, "samples per second"),
    (STEP_SECONDS, "step time (s)"),
)
# What the facts table shows of the summary (the key, its label), in order.
SUMMARY_FACTS: tuple[tuple[str, str], ...] = (
    ("status", "status"), ("exit_code", "exit code"), ("world_size", "ranks"), ("nodes", "nodes"),
    ("global_batch_size", "global batch"), ("steps", "steps"), ("train_loss", "final training loss"),
    ("samples_per_second", "samples per second"), ("wall_seconds", "wall time (s)"), ("mfu", "MFU"),
)


@dataclass(frozen=True)
class JobReport:
    label: str  # the job's name or id, as the report names it
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # key -> [(step, value)], by step
    recoveries: tuple[int, ...] = ()  # the steps a run resumed from
    summary: dict = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    def empty(self) -> bool:
        return not any(self.curves.values())


def _finite(value) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _step(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


STATE_MAX_BYTES = 64 << 20  # a long run's log history: about 150 bytes a logged step


def _json(text: str | None, where: str, problems: list[str]):
    """The record's JSON (read on the node at most STATE_MAX_BYTES, never through a link: node_setup/ssh/job.py);
    a Trainer's own NaN loss stays a value here, for `_finite` to leave out, so not cluster/records.py's load."""
    if text is None or not text.strip():
        return None
    if len(text) > STATE_MAX_BYTES:
        problems.append(f"{where}: larger than {STATE_MAX_BYTES} bytes; left out")
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        problems.append(f"{where}: not JSON; left out")
        return None


def job_report(label: str, texts: dict[str, str | None]) -> JobReport:
    """One job's report from its records' texts (FILES -> text or None), each checked."""
    problems: list[str] = []
    state = _json(texts.get("trainer_state.json"), f"{label}: trainer_state.json", problems)
    history = state.get("log_history") if isinstance(state, dict) else None
    if state is not None and not isinstance(history, list):
        problems.append(f"{label}: trainer_state.json has no log_history list; no curves")
        history = None
    curves: dict[str, dict[int, float]] = {key: {} for key, _ in SERIES}
    recoveries: set[int] = set()
    for entry in history or []:
        step = _step(entry.get("step")) if isinstance(entry, dict) else None
        if step is None:
            continue
        if entry.get(RESUMED) is True:
            recoveries.add(step)
            continue
        for key, _ in SERIES:
            value = _finite(entry.get(key))
            if value is not None:
                curves[key][step] = value  # a step logged twice (a resumed run's repeat): the later entry
    summary = _json(texts.get("summary.json"), f"{label}: summary.json", problems)
    summary = summary if isinstance(summary, dict) else {}
    resumed = summary.get("resumed_from")
    if isinstance(resumed, dict) and _step(resumed.get("step")):
        recoveries.add(resumed["step"])
    if not any(curves.values()):
        progress = _json(texts.get("progress.json"), f"{label}: progress.json", problems)
        speed = _finite(progress.get("samples_per_second")) if isinstance(progress, dict) else None
        step = _step(progress.get("step")) if isinstance(progress, dict) else None
        if speed is not None and step is not None:  # a program without a Trainer: its last speed, one point
            curves[SAMPLES_PER_SECOND][step] = speed
    return JobReport(label, {key: sorted(points.items()) for key, points in curves.items()},
                     tuple(sorted(recoveries)), summary, tuple(problems))


def _shown(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "-" if value is None else str(value)


def facts(report: JobReport) -> list[tuple[str, str]]:
    """(label, value) rows beside the plots: what the summary says, then the plan beside what it cost."""
    summary = report.summary
    rows = [(label, _shown(summary.get(key))) for key, label in SUMMARY_FACTS if key in summary]
    if isinstance(summary.get("mfu"), (int, float)):
        rows = [(label, f"{summary['mfu'] * 100:.2f}%" if label == "MFU" else value) for label, value in rows]
    cost = summary.get(COST_KEY)
    if isinstance(cost, dict):
        for key, label in (("planned_seconds", "planned time (s)"), ("actual_seconds", "actual time (s)"),
                           ("planned_usd", "planned cost (USD)"), ("actual_usd", "actual cost (USD)")):
            if key in cost:
                rows.append((label, _shown(_finite(cost[key]))))
    rows.append(("recoveries", ", ".join(f"step {s}" for s in report.recoveries) or "none"))
    return rows
