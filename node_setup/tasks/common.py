"""What every `fab` task shares: one way to define a task, exit codes, help texts, option parsing.

    @task(help={...})      invoke's task with explicit flags only: `-c` for --cluster, `-n` for
                           --nodes, `-o` for --output and `-f` for --file on every task that has them; a whole-number or decimal option
                           given a value it cannot be ("--nodes four") stops with one line naming
                           the option and exit code 2, before the task body runs
    inventory(cluster, region)   the nodes `--cluster` names, or exit 2 with the reason
    connect(inventory)           a Connection per node, host keys pinned (node_setup/ssh/connections.py)
    fail(message, code)          stop the task: `error: <message>` on stderr and the exit code

Exit codes of the tasks (`fab train` passes the job's own code through, training/exit_codes.py):
0 ok; 1 a node failed or something could not be done; 2 bad input, nothing touched; 3 a node
could not be reached; 75 the job was interrupted by a spot reclaim; 130 interrupted with Ctrl-C.
"""

from __future__ import annotations

from typing import Any, Callable

from invoke import Exit
from invoke import task as invoke_task
from invoke.parser import Argument
from invoke.tasks import Task

from cluster.inventory import Inventory
from training import exit_codes

OK = exit_codes.OK
FAILED = exit_codes.FAILED
BAD_INPUT = exit_codes.BAD_INPUT
UNREACHABLE = 3
INTERRUPTED_BY_RECLAIM = exit_codes.INTERRUPTED
CTRL_C = 130
STOPPED = 143  # 128 + SIGTERM: the job was ended by `fab stop`

CLUSTER_HELP = ("AWS cluster name, `local` (or local:NAME) for the cluster of `fab local-up`, or the path of an "
                "inventory YAML file; default: the only xeon-cluster cluster running in the region")
REGION_HELP = "AWS region to look for the cluster in (default: AWS_REGION / your AWS config)"
JOB_HELP = "job id (default: the newest job)"

SHORT_FLAGS = {"cluster": "c", "nodes": "n", "output": "o", "file": "f"}
_NUMBER_WORDS = {int: "a whole number", float: "a number"}


def fail(message: str, code: int = BAD_INPUT) -> Exit:
    """The exception that ends a task with `error: <message>` and `code` (raise it)."""
    return Exit(f"error: {message}", code=code)


class _CheckedArgument(Argument):
    """An int or float option whose bad value ends the run with one line and exit 2 (not a traceback)."""

    def set_value(self, value: Any, cast: bool = True) -> None:
        try:
            super().set_value(value, cast)
        except (TypeError, ValueError):
            raise fail(f"--{self.names[0]}: {value!r} is not {_NUMBER_WORDS[self.kind]}") from None


class XcTask(Task):
    """invoke's Task with the project's flags: explicit short flags, checked numbers."""

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:
        opts = super().arg_opts(name, default, taken_names)
        short = SHORT_FLAGS.get(name)
        if short and short not in taken_names:
            opts["names"] = [*opts["names"], short]
        return opts

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        return [_CheckedArgument(names=a.names, kind=a.kind, default=a.default, help=a.help, positional=a.positional,
                                 optional=a.optional, incrementable=a.incrementable, attr_name=a.attr_name)
                if a.kind in _NUMBER_WORDS else a
                for a in super().get_arguments(ignore_unknown_help)]


def task(*, help: dict[str, str]) -> Callable:  # noqa: A002 - invoke's own keyword
    """Define a `fab` task: `@task(help={"option": "what it does", ...})`."""
    return invoke_task(klass=XcTask, auto_shortflags=False, help=help)


def whole_number(option: str, value: Any, *, minimum: int | None = None, unset: Any = ("", None)) -> int | None:
    """A string option read as a whole number (None when unset), or exit 2 naming the option."""
    if value in unset:
        return None
    try:
        number = int(str(value).strip())
    except ValueError:
        raise fail(f"--{option}: {value!r} is not a whole number") from None
    if minimum is not None and number < minimum:
        raise fail(f"--{option}: {number} is not allowed; give {minimum} or more")
    return number


def inventory(cluster: str | None, region: str | None) -> Inventory:
    """The nodes `--cluster` names (node_setup/discovery.py), or exit 2 with what to do."""
    from node_setup.discovery import resolve_cluster  # boto3 only when an AWS cluster is asked for

    try:
        return resolve_cluster(cluster or None, region or None)
    except ValueError as exc:  # ClusterSelectionError, InventoryError
        raise fail(str(exc)) from None
    except Exception as exc:  # AWS credential / region problems carry their own advice
        raise fail(f"cannot find the cluster: {exc}") from None


def connect(inventory: Inventory) -> dict:
    """One Fabric Connection per node (name -> Connection), master first, host keys pinned; none open yet."""
    from node_setup.ssh.connections import connections_for

    return connections_for(inventory)
