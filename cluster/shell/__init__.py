"""The shell that runs on the nodes: static `.sh` files in this package, filled in one way.

`render(name, values)` returns the file with a header of variable assignments inserted after its
first line (the shebang). Every value goes through `shlex.quote`, so whatever comes from Python
reaches the shell as one literal word and is never evaluated there: no `$(...)`, backtick or
`$VAR` inside a value runs or expands. A sequence becomes a bash array (`NAME=('a' 'b')`) in a
bash script, or the positional parameters (`set -- 'a' 'b'`) in a POSIX sh script, which can
hold one. Names listed in `exported` are assigned with `export`. `preamble(name)` is a script's
shebang and first commands (install.sh's, for an install section run as a script of its own).

Each file says at its top which variables its header sets; the files are package data
(pyproject.toml), so they travel in the project's wheel. tests/unit/test_shell_scripts.py runs
shellcheck on every file and on rendered examples.
"""

from __future__ import annotations

import re
import shlex
from importlib import resources
from typing import Collection, Mapping, Sequence

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
HEADER_START = "# ---- values filled in by cluster.shell.render"
HEADER_END = "# ---- end of values"
_LITERAL = "# shellcheck disable=SC2016  # a literal value: single quotes keep its $ and backticks unexpanded"

Values = Mapping[str, str | Sequence[str]]


def names() -> list[str]:
    """Every shell file shipped in this package."""
    return sorted(p.name for p in resources.files(__package__).iterdir() if p.name.endswith(".sh"))


def source(name: str) -> str:
    """The static text of one shell file."""
    if name not in names():
        raise ValueError(f"shell script {name!r} is not in cluster/shell; known: {', '.join(names())}")
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def is_bash(text: str) -> bool:
    first = text.partition("\n")[0]
    return first.startswith("#!") and first.rstrip().endswith("bash")


def header(values: Values, *, bash: bool, exported: Collection[str] = ()) -> list[str]:
    """The assignment lines for `values` (bash arrays, or one `set --` for POSIX sh)."""
    unknown = set(exported) - set(values)
    if unknown:
        raise ValueError(f"exported: {sorted(unknown)} have no value")
    lines, positional = [], []
    for key, value in values.items():
        if not _NAME.match(key):
            raise ValueError(f"{key!r} is not a shell variable name")
        if isinstance(value, str):
            words = [value]
            line = ("export " if key in exported else "") + f"{key}={shlex.quote(value)}"
        elif isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
            if key in exported:
                raise ValueError(f"{key}: a sequence cannot be exported")
            words = list(value)
            quoted = " ".join(shlex.quote(v) for v in value)
            if not bash:
                positional.append(key)
            line = f"{key}=({quoted})" if bash else f"set -- {quoted}".rstrip()
        else:
            raise TypeError(f"{key}: a value is a str or a sequence of str, not {value!r}")
        if any("$" in w or "`" in w for w in words):
            # shellcheck would take the single quotes for a mistake. (Before the header's first
            # command the directive covers the whole file; the bodies are checked on their own.)
            lines.append(_LITERAL)
        lines.append(line)
    if len(positional) > 1:
        raise ValueError(f"{', '.join(positional)}: a POSIX sh script holds one sequence (its positional parameters)")
    return lines


def preamble(name: str) -> str:
    """A script's start: its shebang and its first commands, up to the first blank line (the comment
    under the shebang left out). install.sh's defines what its sections use (strict mode, `xc`,
    CHANGED, SUDO), so a section run as a script of its own starts with it."""
    shebang, *lines = source(name).splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    end = lines.index("\n", start)
    return "".join([shebang, *lines[start:end]])


def render(name: str, values: Values | None = None, *, exported: Collection[str] = ()) -> str:
    """The shell file `name` with `values` assigned (shell-quoted) right after its shebang."""
    text = source(name)
    shebang, _, body = text.partition("\n")
    if not shebang.startswith("#!"):
        raise ValueError(f"{name}: the first line must be a shebang (#!/bin/sh or #!/bin/bash)")
    lines = header(values or {}, bash=is_bash(text), exported=exported)
    if not lines:
        return text
    return "\n".join([shebang, HEADER_START, *lines, HEADER_END, body])
