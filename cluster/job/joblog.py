"""Who made a job fail, from its whole log (pure).

`failure_report` names the node and rank behind a failed job: the rank wrapper's own line first
(cluster/shell/rank-wrapper.sh: the program's exit code or signal), Hydra's report otherwise. The log is
read with every rank's pieces joined into whole lines first (cluster/job/logstream.py `whole_lines`:
Intel MPI forwards a rank's output in pieces, another rank's between them). What a person sees of the
log is cluster/job/logstream.py's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from cluster.job.logstream import whole_lines

_BAD_TERMINATION = re.compile(
    r"RANK (\d+) PID (\d+) RUNNING AT (\S+)\s*\n=\s*(KILLED BY SIGNAL: .*?|EXIT STATUS: .*?)\s*\n", re.S)


# The rank wrapper's line when its program failed (cluster/shell/rank-wrapper.sh), wherever the
# launcher's label put it: "rank R on host H (pid P): ..." (mpirun) or "rank R on node N (...)" (torchrun).
RANK_FAILED = re.compile(r"\[xeon-cluster\] rank (\d+) on (host|node) (\S+) \(pid (\d+)\): "
                         r"(exited with code (\d+)|killed by signal (\d+))\s*$", re.M)


@dataclass(frozen=True)
class RankFailure:
    """One rank's program that failed, as its wrapper reported it."""

    rank: int
    node: str
    host: str | None  # None under torchrun (the wrapper names the node itself)
    pid: int
    exit_code: int | None  # the program's own code, or None when a signal ended it
    signal: int | None

    @property
    def code(self) -> int:
        """The program's exit code, or 128 + the signal (as a shell reports it)."""
        return self.exit_code if self.exit_code is not None else 128 + (self.signal or 0)

    def describe(self) -> str:
        where = f"host {self.host}, pid {self.pid}" if self.host else f"pid {self.pid}"
        how = f"exit code {self.exit_code}" if self.exit_code is not None else f"killed by signal: {self.signal}"
        return f"rank {self.rank} on node {self.node} ({where}): {how}"


def rank_failures(log: str, rank_hosts: Sequence[str]) -> list[RankFailure]:
    """Every failed rank the wrapper reported, once each, in log order (pure)."""
    found: dict[int, RankFailure] = {}
    for match in RANK_FAILED.finditer(whole_lines(log, rank_hosts)):
        rank, kind, name, pid = int(match.group(1)), match.group(2), match.group(3), int(match.group(4))
        code = int(match.group(6)) if match.group(6) is not None else None
        sig = int(match.group(7)) if match.group(7) is not None else None
        if kind == "node":
            failure = RankFailure(rank, name, None, pid, code, sig)
        else:
            failure = RankFailure(rank, rank_hosts[rank] if rank < len(rank_hosts) else "?", name, pid, code, sig)
        found.setdefault(rank, failure)
    return list(found.values())


def first_failure(log: str, rank_hosts: Sequence[str]) -> RankFailure | None:
    """The rank that failed first on its own: the first that exited with a code, else the first
    ended by a signal (the launcher ends the others with one after the first fails)."""
    failures = rank_failures(log, rank_hosts)
    exited = [f for f in failures if f.exit_code is not None]
    return (exited or failures)[0] if failures else None


def failure_report(log: str, rank_hosts: Sequence[str], exit_code: int | None) -> list[str]:
    """Which node and rank made the job fail, from the job's log (pure): the rank wrapper's lines
    (the first failure first), then Hydra's reports of ranks the wrapper did not name."""
    log = whole_lines(log, rank_hosts)
    failures = rank_failures(log, rank_hosts)
    first = first_failure(log, rank_hosts)
    found = [f.describe() for f in sorted(failures, key=lambda f: f is not first)]
    named = {f.rank for f in failures}
    for rank, pid, host, how in _BAD_TERMINATION.findall(log):
        rank = int(rank)
        if rank in named:
            continue
        node = rank_hosts[rank] if rank < len(rank_hosts) else "?"
        found.append(f"rank {rank} on node {node} (host {host}, pid {pid}): {how.strip().lower()}")
    unique = list(dict.fromkeys(found))  # first occurrence of each, in order
    if unique or exit_code in (None, 0):
        return unique
    # no hydra report: name the ranks that printed a traceback or an error line last
    ranks = sorted({int(m.group(1)) for m in re.finditer(r"^\[(\d+)\] (?:Traceback|.*Error\b|error:)", log, re.M)})
    return [f"rank {r} on node {rank_hosts[r] if r < len(rank_hosts) else '?'} reported an error (see its lines above)"
            for r in ranks]
