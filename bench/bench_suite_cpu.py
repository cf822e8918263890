"""What a command (README's test command, by default) costs in wall time and in CPU-seconds, from the kernel's
counters: the whole machine's busy time in /proc/stat over the run (every process: also those that no parent of
the command waited for, such as the ranks a local node's sshd started), and the command's own and its waited-for
children's CPU (what `/usr/bin/time` reports). The machine-wide figure is the command's only on an otherwise idle
machine; the busy share says how much of the machine it kept working.

    python bench/bench_suite_cpu.py [-- COMMAND ...]      (default: .venv/bin/python -m pytest)

Prints the command's output as it comes, then one line of figures. Exits with the command's exit code.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT = [str(REPO / ".venv" / "bin" / "python"), "-m", "pytest"]


def machine_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of every CPU since boot: /proc/stat's first line (idle and iowait are not busy)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])  # guest times are already counted in user and nice
    return total - idle, total


def main(argv: list[str]) -> int:
    if argv and argv[0] != "--":
        print(f"error: {argv[0]!r}: give the command after --: bench_suite_cpu.py [-- COMMAND ...]", file=sys.stderr)
        return 2
    command = argv[1:] if argv else DEFAULT
    if not command:
        print("error: -- names no command: give one after it, or leave -- out for README's test command",
              file=sys.stderr)
        return 2
    hz = os.sysconf("SC_CLK_TCK")
    busy0, total0 = machine_ticks()
    start = time.monotonic()
    try:
        code = subprocess.call(command, cwd=REPO)
    except OSError as error:
        print(f"error: {command[0]!r}: {error.strerror}", file=sys.stderr)
        return 2
    wall = time.monotonic() - start
    busy1, total1 = machine_ticks()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy = (busy1 - busy0) / hz
    share = (busy1 - busy0) / max(1, total1 - total0)
    print(f"wall {wall:.1f} s; machine busy {busy:.1f} CPU-s ({share:.0%} of {os.cpu_count()} CPUs); the command "
          f"and its waited-for children {children.ru_utime:.1f} s user + {children.ru_stime:.1f} s system; "
          f"exit {code}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
