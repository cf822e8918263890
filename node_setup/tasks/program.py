"""The `xeon-cluster` command: the same tasks as `fab`, from any directory, with the project's version.

`fab` finds the tasks through fabfile.py and so works only from the repository root (or with
`fab -r PATH`); `xeon-cluster train --nodes 4` works anywhere the project is installed, and
`xeon-cluster --version` prints this project's version. Arguments after `--` go to the training
program as with `fab` (node_setup/tasks/executor.py).
"""

from __future__ import annotations

from fabric import Config
from fabric.main import Fab

from node_setup.controller import project_version
from node_setup.tasks import ns
from node_setup.tasks.executor import Executor

program = Fab(name="xeon-cluster", binary="xeon-cluster", binary_names=["xeon-cluster"], version=project_version(),
              namespace=ns, executor_class=Executor, config_class=Config)


def main() -> None:
    program.run()
