"""A supervised run's whole log, in order (pure): what `fab logs` shows of a `fab train --managed` run.

A supervised run is a sequence of jobs under one supervisor (node_setup/supervisor/), each restart a
new job. The supervisor's log on the master (cluster/run/supervision.py's LOG_FILE) holds its own lines
(lost node, awaiting the replacement, host key verified, resuming from checkpoint N) and one
`started_line` per job it launched. The whole run reads: the supervisor's lines up to and including a
job's start line, then that job's log, then the supervisor's lines after it, and so on, until the run
ends (its state file says completed, failed, stopped or master-lost).

- `started_line` / `started_job`: the one format of "job J started", written by the loop and read here.
- `RunFollower.take(text)`: the supervisor's log so far cut into `Piece`s not yet shown (complete lines
  only: a line the supervisor is still writing waits for the next read).
- `RunFollower.verdict(...)`: after the pieces of one read were shown, whether the run goes on (read
  again), has ended (its final status) or lost its supervisor (it is gone without a final state).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

from cluster.run import supervision as sv

_STARTED = re.compile(r"(?:^|\] )job ([0-9]{8}-[0-9]{6}-[0-9a-f]{4}) started on [0-9]+ node\(s\): ")

GOING, ENDED, SUPERVISOR_GONE = "going", "ended", "supervisor gone"


def started_line(job_id: str, nodes: Sequence[str]) -> str:
    """The supervisor's line once it has started a job (what `started_job` finds again)."""
    return f"job {job_id} started on {len(nodes)} node(s): {', '.join(nodes)}"


def started_job(line: str) -> str | None:
    """The job id of a supervisor's log line that started a job, else None."""
    found = _STARTED.search(line)
    return found.group(1) if found else None


@dataclass(frozen=True)
class Piece:
    """A step of the run's log: the supervisor's `lines`, then the log of `job` (None: no job follows)."""

    lines: tuple[str, ...]
    job: str | None = None


@dataclass
class RunFollower:
    """Where a reader of one supervised run's log is: what it has shown, which jobs it has followed."""

    consumed: int = 0  # characters of the supervisor's log already cut into pieces
    jobs: list[str] = field(default_factory=list)  # the run's jobs met so far, in order

    def take(self, text: str) -> list[Piece]:
        """The pieces of `text` (the whole supervisor log so far, which only grows) not yet taken."""
        if len(text) < self.consumed:  # not the file read before (rewritten): start over
            self.consumed = 0
        new = text[self.consumed:]
        complete = new[:new.rfind("\n") + 1]
        self.consumed += len(complete)
        pieces: list[Piece] = []
        lines: list[str] = []
        for line in complete.splitlines():
            lines.append(line)
            job = started_job(line)
            if job is not None and job not in self.jobs:
                self.jobs.append(job)
                pieces.append(Piece(tuple(lines), job))
                lines = []
        if lines:
            pieces.append(Piece(tuple(lines)))
        return pieces

    def rest(self, text: str) -> str:
        """The last line of `text` when the supervisor has not finished it (shown once the run has ended)."""
        return text[self.consumed:] if len(text) >= self.consumed else ""

    @staticmethod
    def verdict(state: dict | None, *, took: bool, supervisor_alive: bool) -> str:
        """After one read (state read BEFORE the log: the supervisor says its last line, then writes the
        final state, so a final state read first means the log read after it is whole): GOING (read
        again; `took`: that read had new pieces), ENDED (the state's status is final) or SUPERVISOR_GONE
        (no final state and the supervisor's process is not running)."""
        if took:
            return GOING
        if state and state.get("status") in sv.FINAL:
            return ENDED
        if not supervisor_alive:
            return SUPERVISOR_GONE
        return GOING


def end_line(run_id: str, state: dict | None, verdict: str) -> str:
    """The line after the whole run's log."""
    if verdict == SUPERVISOR_GONE:
        return (f"run {run_id}: its supervisor on the master is gone without a final state (last: "
                f"{(state or {}).get('status') or 'none'}); `fab train --managed --resume` continues the run")
    return f"run {run_id}: {(state or {}).get('status')}"
