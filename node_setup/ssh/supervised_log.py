"""A supervised run's whole log read from the master (`fab logs` and an attached `fab train --managed`).

What comes next and whether the run has ended are cluster/run/runlog.py's decisions; here are the reads:
the run's state file (read first), its supervisor log, each job's log (node_setup/ssh/job.py's
`follow`, with node/rank labels), and whether the supervisor's process still runs.
"""

from __future__ import annotations

import io
import shlex
import sys
import time
from typing import TextIO

from cluster.names import printable
from cluster.run import runlog
from cluster.run import supervision as sv
from cluster.job.launch import DEFAULT_LAUNCHER
from node_setup.ssh import job as jobs
from node_setup.ssh.recovery import supervised_state

POLL_SECONDS = 1.0  # between reads of the supervisor's log while nothing new came


class _LastLines(io.StringIO):
    """Holds what the run printed before the reader caught up, to show only its last lines."""

    def emit(self, out: TextIO, lines: int) -> None:
        text = self.getvalue().splitlines()
        if text[-lines:]:
            out.write("\n".join(text[-lines:]) + "\n")
        out.flush()


def _log_path(run_id: str) -> str:
    return f"{sv.RUN_ROOT}/{sv.check_run_id(run_id)}/{sv.LOG_FILE}"


def supervisor_alive(master, run_id: str, state: dict | None) -> bool:
    """Whether the run's supervisor process (the state's pid, running this run) is still there, or what starts
    it again after it was killed (the state's keeper pid running this run: node_setup/supervisor/respawn.py; on
    AWS its unit waiting to restart it), so that a follow goes on through a restart."""
    pids = [p for p in ((state or {}).get("pid"), (state or {}).get("keeper"))
            if isinstance(p, int) and not isinstance(p, bool) and p > 0]
    run = shlex.quote(sv.check_run_id(run_id))
    unit = shlex.quote(f"{sv.SYSTEMD_UNIT_PREFIX}{run_id}")
    checks = [f"grep -qF {run} /proc/{pid}/cmdline" for pid in pids]
    checks.append(f'[ "$(systemctl show -p SubState --value {unit} 2>/dev/null)" = auto-restart ]')
    return master.run(" || ".join(checks), hide=True, warn=True, in_stream=False).ok


def _job_log(master, job_id: str, out: TextIO, *, follow: bool, all_ranks: bool) -> None:
    try:
        meta = jobs.read_metadata(master, job_id)
    except jobs.JobError as exc:
        out.write(f"job {job_id}: no log on the master ({exc})\n")
        return
    jobs.follow(master, job_id, meta.get("rank_hosts", []), out, follow_=follow,
                launcher=meta.get("launcher", DEFAULT_LAUNCHER), all_ranks=all_ranks)


def show_run(master, run_id: str, *, follow: bool, last_lines: int | None = None, out: TextIO = sys.stdout,
             poll_s: float = POLL_SECONDS, sleep=time.sleep, all_ranks: bool = False) -> tuple[str, dict | None]:
    """Print the run's log so far in order (cluster/run/runlog.py), and with `follow` on until the run ends.
    Returns (runlog's verdict, the run's last state). `last_lines`: only the last N lines of what was
    there before the reader caught up. Each job's log is cluster/job/logstream.py's (`all_ranks`: every
    rank's metrics), the supervisor's lines as a terminal may show them. KeyboardInterrupt propagates (the
    caller detaches)."""
    reader = runlog.RunFollower()
    held = _LastLines() if last_lines else None
    sink: TextIO = held if held is not None else out

    def live() -> None:  # caught up: what is held is shown, and from here on everything as it comes
        nonlocal sink, held
        if held is not None:
            held.emit(out, int(last_lines or 0))
            held, sink = None, out

    while True:
        state = supervised_state(master, run_id)  # first: a final state read here means the log below is whole
        text = jobs.read_remote_file(master, _log_path(run_id)) or ""
        pieces = reader.take(text)
        for piece in pieces:
            for line in piece.lines:
                sink.write(printable(line) + "\n")
            sink.flush()
            if piece.job is None:
                continue
            running = follow and jobs.job_state(master, piece.job)[0] == "running"
            if running:
                live()
            _job_log(master, piece.job, sink, follow=running, all_ranks=all_ranks)
        if not follow:
            verdict = runlog.ENDED if state and state.get("status") in sv.FINAL else runlog.GOING
            break
        alive = bool(pieces) or (state or {}).get("status") in sv.FINAL or supervisor_alive(master, run_id, state)
        verdict = runlog.RunFollower.verdict(state, took=bool(pieces), supervisor_alive=alive)
        if verdict != runlog.GOING:
            break
        if not pieces:
            live()
            sleep(poll_s)
    if verdict != runlog.GOING:
        rest = reader.rest(text)
        if rest:
            sink.write(printable(rest) + "\n")
    if held is not None:
        held.emit(out, int(last_lines or 0))
    out.flush()
    return verdict, state
