"""Command-line mistakes as one line with a suggestion and exit code 2, for `fab` and `xeon-cluster`.

invoke's parser says "No idea what 'trian' is!" for a misspelt task or option and
"Flag <_CheckedArgument: epochs [float]> needed value and was not given one!" for an option
given without its value, both with exit code 1. `install()` (called when the tasks are loaded)
wraps the parser's one error path so that the same mistakes read::

    error: no task or option 'trian'; did you mean 'train'? (fab --list shows the tasks)
    error: --epochs needs a value (a number)

and end with the project's bad-input code. `fab` itself is Fabric's program, so the wrap is on
invoke's parse machine, not on a Program subclass; the rest of the parser is untouched.
"""

from __future__ import annotations

import difflib
import re

from invoke.exceptions import ParseError
from invoke.parser import parser as invoke_parser
from invoke.program import Program

from node_setup.tasks.common import fail

_UNKNOWN = re.compile(r"No idea what '(?P<token>.*)' is!\Z", re.S)
_KIND_WORDS = {int: "a whole number", float: "a number", str: "a value", list: "a value"}


def suggestion(token: str, candidates: list[str]) -> str:
    """'; did you mean X?' for the closest candidate, or '' when none is close."""
    close = difflib.get_close_matches(token, candidates, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def unknown_message(token: str, tasks: list[str], flags: list[str], task: str | None) -> str:
    """The line for a word the parser does not know: a task name or an option of `task`."""
    if token.startswith("-"):
        where = f" of `{task}`" if task else ""
        hint = f" (fab --help {task} shows its options)" if task else " (fab --help shows the core options)"
        return f"no option {token!r}{where}{suggestion(token, flags)}{hint}"
    return f"no task or option {token!r}{suggestion(token, tasks)} (fab --list shows the tasks)"


def _error(machine: invoke_parser.ParseMachine, msg: str) -> None:
    unknown = _UNKNOWN.match(msg)
    if unknown:
        context = machine.context
        flags = sorted(context.flags) if context is not None else []
        raise fail(unknown_message(unknown.group("token"), sorted(machine.contexts), flags,
                                   context.name if context is not None else None))
    flag = machine.flag
    if flag is not None and "needed value" in msg:
        raise fail(f"--{flag.name.replace('_', '-')} needs a value ({_KIND_WORDS.get(flag.kind, 'a value')})")
    raise fail(msg)


_parse_cleanup = Program.parse_cleanup


def _cleanup(program: Program) -> None:
    """`fab --help trian`: the same line as a misspelt task (invoke raises this one itself)."""
    try:
        _parse_cleanup(program)
    except ParseError as exc:
        unknown = _UNKNOWN.match(str(exc))
        if not unknown:
            raise
        raise fail(unknown_message(unknown.group("token"), sorted(program.parser.contexts), [], None)) from None


def install() -> None:
    """Route every parse error through `_error`, and `--help <unknown task>` too (idempotent)."""
    invoke_parser.ParseMachine.error = _error
    Program.parse_cleanup = _cleanup
