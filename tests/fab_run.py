"""`fab` run in the test's own process: the `xeon-cluster` program (node_setup/tasks/program.py) holds the
same tasks and the same parser wrap as `fab`, without a Python start-up per run. The working directory,
the environment, sys.stdout/stderr and the signal handlers are set for the run and put back afterwards.
Tests that prove the console commands themselves (`python -m fabric`, `xeon-cluster`) still run them as
processes, and so does a task that reaches boto3 (a price lookup, discovery): clients, credentials and
moto's patches that earlier tests left in this process would reach it."""

from __future__ import annotations

import io
import os
import signal
import sys
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest

from node_setup.tasks.program import program

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Ran:
    """What one `fab` run left: its exit code and what it printed (a subprocess.CompletedProcess's fields)."""
    returncode: int
    stdout: str
    stderr: str


def fab_in_process(*argv: str, cwd: Path | str = ROOT, env: dict | None = None) -> Ran:
    """`fab ARGV` from `cwd`, with exactly `env` as the environment when given. A leading `-r ROOT`
    (where fab finds fabfile.py) is dropped: the program holds the tasks itself."""
    if argv[:1] == ("-r",):
        argv = argv[2:]
    out, err = io.StringIO(), io.StringIO()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    with pytest.MonkeyPatch.context() as patch, redirect_stdout(out), redirect_stderr(err):
        patch.chdir(cwd)
        if env is not None:
            for name in list(os.environ):
                patch.delenv(name)
            for name, value in env.items():
                patch.setenv(name, value)
        try:
            program.run(["xeon-cluster", *argv])
            code = 0
        except SystemExit as ended:  # what the interpreter would print and return for it
            code = ended.code if isinstance(ended.code, int) else 0 if ended.code is None else 1
            if isinstance(ended.code, str):
                print(ended.code, file=sys.stderr)
        finally:  # a task that set its own signal handlers gets them undone
            for sig, handler in handlers.items():
                if handler is not None:
                    signal.signal(sig, handler)
    return Ran(code, out.getvalue(), err.getvalue())
