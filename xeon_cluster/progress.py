"""A job's progress record: what `fab status` shows of a running job (step out of total, samples per
second, time left, cost so far). Standard library only.

Rank 0 writes `<output dir>/progress.json` (atomically: a reader never sees half a file) at most every
few seconds; the built-in job writes it from its step timer (training/callbacks.py), your own program
with one call per step, or with a Hugging Face Trainer through xeon_cluster.callbacks.ProgressCallback:

    from xeon_cluster.progress import ProgressRecorder
    progress = ProgressRecorder(total_steps=1000, samples_per_step=global_batch)
    for step in range(1, 1001):
        ...                          # one optimizer step
        progress.step(step)          # on every rank: only rank 0 writes

The record: {"format": 1, "step", "total" (null: unknown), "samples_per_second" and "steps_per_second"
(over this process's steps so far, the first left out: it carries the warm-up; null until two steps),
"updated" (epoch seconds)}. fab reads it with cluster/job/jobprogress.py, which checks every field.
"""

from __future__ import annotations

import json
import os
import time

FILE = "progress.json"
FORMAT = 1
EVERY_SECONDS = 5.0  # the shortest time between two writes (the last step is always written by `finish`)


class ProgressRecorder:
    """Records steps on rank 0 (RANK unset or "0"); `directory`: where progress.json goes (default the job's
    output folder, XEON_CLUSTER_OUTPUT_DIR, else the current folder)."""

    def __init__(self, total_steps: int | None = None, samples_per_step: float | None = None,
                 directory: str | None = None, clock=time.time):
        self.total = total_steps
        self.samples_per_step = samples_per_step
        self.path = os.path.join(directory or os.environ.get("XEON_CLUSTER_OUTPUT_DIR") or ".", FILE)
        self.clock = clock
        self.writer = os.environ.get("RANK", "0") == "0"
        self._first: tuple[int, float] | None = None  # (step, time) of the first step seen: after its warm-up
        self._last: tuple[int, float] | None = None
        self._written = 0.0

    def step(self, step: int, total_steps: int | None = None) -> None:
        """Step `step` is done (counted from 1, or from where a resumed run starts)."""
        now = self.clock()
        if total_steps is not None:
            self.total = total_steps
        if self._first is None:
            self._first = (step, now)
        self._last = (step, now)
        if self.writer and now - self._written >= EVERY_SECONDS:
            self.write()

    def finish(self) -> None:
        """Write the last step seen (at the end of training)."""
        if self.writer and self._last is not None:
            self.write()

    def record(self) -> dict:
        step, now = self._last or (0, self.clock())
        steps_per_second = None
        if self._first is not None and step > self._first[0] and now > self._first[1]:
            steps_per_second = (step - self._first[0]) / (now - self._first[1])
        samples = steps_per_second * self.samples_per_step if steps_per_second and self.samples_per_step else None
        return {"format": FORMAT, "step": step, "total": self.total,
                "steps_per_second": round(steps_per_second, 6) if steps_per_second else None,
                "samples_per_second": round(samples, 3) if samples else None, "updated": round(now, 3)}

    def write(self) -> None:
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            partial = f"{self.path}.{os.getpid()}.tmp"
            with open(partial, "w", encoding="utf-8") as handle:
                json.dump(self.record(), handle)
            os.replace(partial, self.path)
            self._written = self.clock()
        except OSError:
            pass  # progress is for people watching; training goes on without it
