"""Waiting for several processes a test started at once, by one deadline, with what each printed."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest


def run_together(commands: list[list[str]], logs: Path, timeout: float, **popen) -> list[subprocess.CompletedProcess]:
    """Start every command at once and wait until all have exited, by one deadline `timeout` s away.

    Each one's stdout and stderr go to files in `logs` (no pipe to fill while another is waited on).
    At the bound every process still running is killed and the test fails with what each printed.
    """
    logs.mkdir(parents=True, exist_ok=True)
    files = [(logs / f"proc{index}.out", logs / f"proc{index}.err") for index in range(len(commands))]
    procs = []
    for command, (out, err) in zip(commands, files):
        with out.open("w") as stdout, err.open("w") as stderr:
            procs.append(subprocess.Popen(command, stdout=stdout, stderr=stderr, text=True, **popen))
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        running = [index for index, proc in enumerate(procs) if proc.poll() is None]
        for index in running:
            procs[index].kill()
            procs[index].wait()
    results = [subprocess.CompletedProcess(command, proc.returncode, out.read_text(), err.read_text())
               for command, proc, (out, err) in zip(commands, procs, files)]
    if running:
        seen = "\n".join(f"--- process {index} ({'killed' if index in running else f'exit {result.returncode}'}):\n"
                         f"{result.stdout[-3000:]}{result.stderr[-3000:]}" for index, result in enumerate(results))
        pytest.fail(f"processes {running} had not ended {timeout:.0f} s after they started; they printed:\n{seen}")
    return results
