"""What every `fab` task shares: one way to define a task, exit codes, help texts, option parsing.

    @task(help={...})      invoke's task with explicit flags only: `-c` for --cluster, `-n` for
                           --nodes, `-o` for --output and `-f` for --file on every task that has them; a whole-number
                           or decimal option given a value it cannot be ("--nodes four") stops with one line naming
                           the option and exit code 2, before the task body runs
    inventory(cluster, region)   the nodes `--cluster` names, or exit 2 with the reason
    connect(inventory)           a Connection per node, host keys pinned (node_setup/ssh/connections.py)
    fail(message, code)          stop the task: `error: <message>` on stderr and the exit code

Exit codes of the tasks (cluster/exit_codes.py; `fab train` passes the job's own code through):
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
from cluster import exit_codes

OK = exit_codes.OK
FAILED = exit_codes.FAILED
BAD_INPUT = exit_codes.BAD_INPUT
UNREACHABLE = exit_codes.UNREACHABLE
INTERRUPTED_BY_RECLAIM = exit_codes.INTERRUPTED
CTRL_C = exit_codes.CTRL_C
STOPPED = exit_codes.STOPPED

CLUSTER_HELP = ("AWS cluster name, `local` (or local:NAME) for the cluster of `fab local-up`, or the path of an "
                "inventory YAML file; default: the only xeon-cluster cluster running in the region")
REGION_HELP = "AWS region to look for the cluster in (default: AWS_REGION / your AWS config)"
JOB_HELP = "job id, or a name given with `fab train --name` (its newest job) (default: the newest job)"

SHORT_FLAGS = {"cluster": "c", "nodes": "n", "output": "o", "file": "f"}
# Counts are 1 or more; these also take 0, which means something (no CCL workers, no restarts, report and stop).
ZERO_ALLOWED = frozenset({"ccl-workers", "max-restarts", "max-recoveries"})


class Unset:
    """The default of an option whose absence means something (`--nodes` left out: all nodes; `--epochs`
    left out: the job's own default): falsy, never a valid value, and it carries the option's kind, so an
    int option stays an int option (invoke takes a kind from its default and has none for None).
    `given(value)` tells a value from it."""

    def __init__(self, kind: Any, default: str = "") -> None:
        self.kind = kind
        self.default = default  # what leaving the option out means, for the refusal line of a 0

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "<not given>"


def given(value: Any) -> bool:
    """Whether an option's value was given (on the command line or in a job file), not its Unset default."""
    return not isinstance(value, Unset)


class _DurationKind:
    """An option's kind for durations: `90s`, `30m`, `2h`, `1h30m` -> seconds (cluster/durations.py's one
    parser); a bare number is refused with a line that says to add a unit. `off`: also `off` or 0 -> 0.0."""

    def __init__(self, name: str, off: bool, zero: str = "off") -> None:
        self.__name__ = name
        self.off = off
        self.zero = zero  # what the error offers for none: `off`, or `0` where off means nothing (a notice)

    def __call__(self, text: Any, setting: str = "duration") -> float:
        from cluster.durations import parse_duration

        raw = str(text).strip().lower()
        if self.off and raw in ("off", "0", "0s", "0m", "0h"):
            return 0.0
        try:
            return parse_duration(raw, setting, bare_seconds=False)
        except ValueError as exc:
            raise ValueError(f"{exc}{f' (or {self.zero})' if self.off else ''}") from None

    def __repr__(self) -> str:
        return self.__name__

    def __copy__(self) -> "_DurationKind":
        return self  # one of two kinds, compared by identity (invoke deep-copies its parser contexts)

    def __deepcopy__(self, memo: dict) -> "_DurationKind":
        return self


duration = _DurationKind("duration", off=False)
duration_or_off = _DurationKind("duration_or_off", off=True)
duration_or_zero = _DurationKind("duration_or_zero", off=True, zero="0 for none")  # 0 allowed, `off` says nothing
DURATION_KINDS = (duration, duration_or_off, duration_or_zero)
NUMBER_WORDS = {int: "a whole number", float: "a number"}


def fail(message: str, code: int = BAD_INPUT) -> Exit:
    """The exception that ends a task with `error: <message>` and `code` (raise it)."""
    return Exit(f"error: {message}", code=code)


class CheckedArgument(Argument):
    """An int, float or duration option whose bad value ends the run with one line and exit 2 (not a
    traceback); a count (int) is 1 or more (0 too for ZERO_ALLOWED)."""

    def set_value(self, value: Any, cast: bool = True) -> None:
        option = self.names[0]
        if cast and self.kind in DURATION_KINDS:
            try:
                value = self.kind(value, f"--{option}")
            except ValueError as exc:
                raise fail(str(exc)) from None
            cast = False
        try:
            super().set_value(value, cast)
        except (TypeError, ValueError):
            raise fail(f"--{option}: {value!r} is not {NUMBER_WORDS[self.kind]}") from None
        if self.kind is int and cast:
            least = 0 if option in ZERO_ALLOWED else 1
            if self.value < least:
                unset = self.default.default if isinstance(self.default, Unset) and self.default.default else ""
                tail = f" (leave --{option} out for the default: {unset})" if unset and self.value == 0 else ""
                raise fail(f"--{option}: {self.value} is not allowed; give {least} or more{tail}")


class XcTask(Task):
    """invoke's Task with the project's flags: explicit short flags, checked numbers."""

    kinds: dict[str, Any] = {}  # option -> its kind where that is not its default's type (`task(kinds=...)`)

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:
        opts = super().arg_opts(name, default, taken_names)
        if isinstance(default, Unset):
            opts["kind"] = default.kind
        elif name in self.kinds:
            opts["kind"] = self.kinds[name]
        short = SHORT_FLAGS.get(name)
        if short and short not in taken_names:
            opts["names"] = [*opts["names"], short]
        return opts

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        saved = dict(self.help)  # invoke pops each help text as it uses it: a second call would have none
        try:
            arguments = super().get_arguments(ignore_unknown_help)
        finally:
            self.help = saved
        return [CheckedArgument(names=a.names, kind=a.kind, default=a.default, help=a.help, positional=a.positional,
                                 optional=a.optional, incrementable=a.incrementable, attr_name=a.attr_name)
                if a.kind in NUMBER_WORDS or a.kind in DURATION_KINDS else a
                for a in arguments]


def task(*, help: dict[str, str], kinds: dict[str, Any] | None = None,  # noqa: A002 - invoke's
         iterable: tuple[str, ...] = ()) -> Callable:
    """Define a `fab` task: `@task(help={"option": "what it does", ...})`; `kinds` names the options whose
    kind is not their default's type (`kinds={"idle": duration}` with `idle=1800.0`: seconds); `iterable` those
    given more than once (`--job a --job b`: a list)."""
    make = invoke_task(klass=XcTask, auto_shortflags=False, help=help, iterable=list(iterable))

    def define(body: Callable) -> XcTask:
        made = make(body)
        made.kinds = {name.replace("-", "_"): kind for name, kind in (kinds or {}).items()}
        return made

    return define


def inventory(cluster: str | None, region: str | None) -> Inventory:
    """The nodes `--cluster` names (node_setup/discovery.py), or exit 2 with what to do; its notes (whose
    cluster it is, which nodes are down and what brings them back) go to stderr, one line each."""
    import sys

    from node_setup.discovery import resolve_cluster  # boto3 only when an AWS cluster is asked for

    try:
        found = resolve_cluster(cluster or None, region or None)
    except ValueError as exc:  # ClusterSelectionError, InventoryError
        raise fail(str(exc)) from None
    except Exception as exc:  # AWS credential / region problems carry their own advice
        raise fail(f"cannot find the cluster: {exc}") from None
    for note in found.notes:
        print(f"note: {note}", file=sys.stderr, flush=True)
    return found


def connect(inventory: Inventory) -> dict:
    """One Fabric Connection per node (name -> Connection), master first, host keys pinned; none open yet."""
    from node_setup.ssh.connections import connections_for

    return connections_for(inventory)
