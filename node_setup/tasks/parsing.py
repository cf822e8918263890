"""Command-line mistakes as one line with a suggestion and exit 2, and `fab --help TASK` in option groups:
`install()` replaces four methods of invoke's parser and Program in place (docs/design.md, the command line)."""

from __future__ import annotations

import difflib
import inspect
import re

from invoke.exceptions import ParseError
from invoke.parser import parser as invoke_parser
from invoke.parser.context import to_flag
from invoke.program import Program

from node_setup.tasks.common import DURATION_KINDS, NUMBER_WORDS, fail

_UNKNOWN = re.compile(r"No idea what '(?P<token>.*)' is!\Z", re.S)


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


def _error(machine: invoke_parser.ParseMachine, msg: str) -> None:  # ParseMachine.error
    unknown = _UNKNOWN.match(msg)
    if unknown:
        context = machine.context
        flags = sorted(context.flags) if context is not None else []
        raise fail(unknown_message(unknown.group("token"), sorted(machine.contexts), flags,
                                   context.name if context is not None else None))
    flag = machine.flag
    if flag is not None and "needed value" in msg:
        word = "a duration such as 30m" if flag.kind in DURATION_KINDS else NUMBER_WORDS.get(flag.kind, "a value")
        raise fail(f"--{flag.name.replace('_', '-')} needs a value ({word})")
    raise fail(msg)


_see_value, _parse_cleanup = invoke_parser.ParseMachine.see_value, Program.parse_cleanup


def _value(machine: invoke_parser.ParseMachine, value) -> None:
    """A value its kind refuses (Fabric's own `--connect-timeout 3s`; the project's own: common.CheckedArgument)."""
    try:
        _see_value(machine, value)
    except (TypeError, ValueError):  # raised by the flag's value setter: the flag is the one being read
        flag, context = machine.flag, machine.context
        assert flag is not None
        core = context is None or context.name is None or flag not in set(context.flags.values())
        raise fail(f"--{max(flag.names, key=len).replace('_', '-')}: {value!r} is not "
                   f"{NUMBER_WORDS.get(flag.kind, 'a value')}" + (" (an option of fab itself, given before the task: "
                                                                  "`fab --help` lists them)" if core else "")) from None


def _cleanup(program: Program) -> None:
    """`fab --help trian`: the same line as a misspelt task."""
    try:
        _parse_cleanup(program)
    except ParseError as exc:
        unknown = _UNKNOWN.match(str(exc))
        if not unknown:
            raise
        raise fail(unknown_message(unknown.group("token"), sorted(program.parser.contexts), [], None)) from None


_VALUE_WORDS = {str: "STRING", int: "INT", float: "FLOAT"}


def flag_spec(context, arg) -> str:
    """`-n INT, --nodes=INT` (STRING, INT, FLOAT or DURATION) for an option with a value; invoke's for a switch."""
    word = "DURATION" if arg.kind in DURATION_KINDS else _VALUE_WORDS.get(arg.kind, "")
    flag = to_flag(arg.name)
    if not word:
        return context.help_for(flag)[0]
    names = sorted(context.names_for(flag), key=len)
    return ", ".join(f"{n} {word}" if len(n.strip("-")) == 1 else f"{n}={word}" for n in names)


def grouped_options(context, groups: dict[str, tuple[str, ...]] | None) -> list[tuple[str, list[tuple[str, str]]]]:
    """(title, [(flag spec, help)]) per group of `option_groups` in order, each sorted (the rest last, or alone)."""
    arguments = {arg.name.replace("_", "-"): arg for arg in set(context.flags.values())}
    placed = {name: title for title, names in reversed((groups or {}).items()) for name in names}  # first wins
    titles = [*(groups or {}), "other options" if groups else "options"]
    members = {title: sorted(n for n in arguments if placed.get(n, titles[-1]) == title) for title in titles}
    return [(title, [(flag_spec(context, arguments[n]), arguments[n].help or "") for n in names])
            for title, names in members.items() if names]


def _print_task_help(program: Program, name: str) -> None:
    """`fab --help TASK`: invoke's usage line and docstring, then the options in the task's groups."""
    context = program.parser.contexts[name]
    task = program.collection[name]
    print(f"Usage: {program.binary} [--core-opts] {name} {'[--options] ' if context.flags else ''}"
          "[other tasks here ...]\n")
    print("Docstring:")
    for line in (inspect.getdoc(task) or "none").splitlines():
        print(program.leading_indent + line if line.strip() else "")
    print("")
    groups = grouped_options(context, getattr(task, "option_groups", None))
    if not groups:
        print("Options:\n" + program.leading_indent + "none\n")
    width = max((len(spec) for _, rows in groups for spec, _ in rows), default=0)
    for title, rows in groups:
        print(f"{title[0].upper()}{title[1:]}:")
        program.print_columns([(spec.ljust(width), text) for spec, text in rows])  # one column across groups


def install() -> None:
    """The four replacements (idempotent); mypy's objection to assigning to a method is silenced for them only."""
    invoke_parser.ParseMachine.error = _error  # type: ignore[method-assign, assignment]
    invoke_parser.ParseMachine.see_value = _value  # type: ignore[method-assign, assignment]
    Program.parse_cleanup = _cleanup  # type: ignore[method-assign, assignment]
    Program.print_task_help = _print_task_help  # type: ignore[method-assign, assignment]
