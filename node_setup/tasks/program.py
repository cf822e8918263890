"""The `xeon-cluster` command: the same tasks as `fab`, from any directory, with the project's version.

`fab` finds the tasks through fabfile.py and so works only from the repository root (or with
`fab -r PATH`); `xeon-cluster train --nodes 4` works anywhere the project is installed, and
`xeon-cluster --version` prints this project's version. Arguments after `--` go to the training
program as with `fab` (node_setup/tasks/executor.py).

Both end quietly when whoever reads their output stops reading (`fab jobs | head`), as `ls` does: no
BrokenPipeError traceback (`quiet_closed_pipe`, which fabfile.py calls for `fab`).
"""

from __future__ import annotations

import atexit
import os
import sys

from fabric import Config
from fabric.main import Fab

from node_setup.controller import project_version
from node_setup.tasks import ns
from node_setup.tasks.executor import Executor

CLOSED_PIPE = 141  # what a shell reports of a command that a closed pipe ended (128 + SIGPIPE)

program = Fab(name="xeon-cluster", binary="xeon-cluster", binary_names=["xeon-cluster"], version=project_version(),
              namespace=ns, executor_class=Executor, config_class=Config)


def _drop_stdout() -> None:
    """Point stdout at /dev/null: what is still buffered for the closed pipe is dropped, not raised again."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, sys.stdout.fileno())
    os.close(null)


def _flush_at_exit() -> None:
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _drop_stdout()
        os._exit(CLOSED_PIPE)


def quiet_closed_pipe() -> None:
    """A closed pipe on stdout ends the process with CLOSED_PIPE and nothing on stderr: raised while a task
    prints (sys.excepthook) or while the last output is flushed at exit (atexit)."""
    previous = sys.excepthook

    def hook(kind, value, traceback) -> None:
        if issubclass(kind, BrokenPipeError):
            _drop_stdout()
            os._exit(CLOSED_PIPE)
        previous(kind, value, traceback)

    sys.excepthook = hook
    atexit.register(_flush_at_exit)


def main() -> None:
    quiet_closed_pipe()
    program.run()
