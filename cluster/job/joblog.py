"""Who made a job fail, from its whole log (pure).

`failure_report` names the node and rank behind a failed job: the rank wrapper's own line first
(cluster/shell/rank-wrapper.sh: the program's exit code or signal), Hydra's report otherwise, then a hint
for the causes any program's log shows the same way (`hints`: a full disk, a rank killed by SIGKILL). The log is
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


SIGKILL = 9
# What a program, or a library under it, writes when a disk is full: the errno's words, and the C++
# stream error torch.save gives when its write fails (it names no cause).
_DISK_FULL = re.compile(r"No space left on device|basic_ios::clear: iostream error|\[Errno 28\]|os error 28")
_KILLED_9 = re.compile(r"exitcode\s*:\s*-9\b|Signal 9 \(SIGKILL\)")  # torchrun's error summary of a worker


def hints(log: str, rank_hosts: Sequence[str]) -> list[str]:
    """One line per cause of a failure the log shows the same way whatever the program (pure; `log` in
    whole lines): a full disk, a rank killed by SIGKILL (the kernel's out-of-memory killer's signal)."""
    found = []
    if _DISK_FULL.search(log):
        found.append("hint: a disk was full (\"No space left on device\" or torch's \"basic_ios::clear: iostream "
                     "error\" in the log): free space in the output folder's file system (`df -h` on the node), "
                     "or save less often (fewer checkpoints kept)")
    killed = [f"rank {f.rank} on node {f.node}" for f in rank_failures(log, rank_hosts)
              if f.signal == SIGKILL or f.exit_code == 128 + SIGKILL]
    killed += [f"rank {rank} on node {rank_hosts[int(rank)] if int(rank) < len(rank_hosts) else '?'}"
               for rank, _, _, how in _BAD_TERMINATION.findall(log) if re.match(r"KILLED BY SIGNAL: 9\b", how)]
    if killed or _KILLED_9.search(log):
        which = f"{killed[0]} was" if killed else "a rank was"
        found.append(f"hint: {which} killed by SIGKILL (signal 9, exit 137): out of memory? the kernel's OOM killer "
                     "sends it (`dmesg` on that node says so); fewer ranks per node, a smaller batch or a node with "
                     "more memory")
    return found


def failure_report(log: str, rank_hosts: Sequence[str], exit_code: int | None) -> list[str]:
    """Which node and rank made the job fail, from the job's log (pure): the rank wrapper's lines
    (the first failure first), then Hydra's reports of ranks the wrapper did not name, then the hints."""
    log = whole_lines(log, rank_hosts)
    found = _who_failed(log, rank_hosts, exit_code)
    return found + hints(log, rank_hosts) if found or exit_code != 0 else []


def _who_failed(log: str, rank_hosts: Sequence[str], exit_code: int | None) -> list[str]:
    """The failed ranks, each once, as the wrapper and Hydra named them (`log`: in whole lines)."""
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
