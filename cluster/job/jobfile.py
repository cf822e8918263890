"""A job file (`fab train -f job.yaml`): a task's options read from a YAML mapping (pure).

`resolve` takes the parsed mapping, the task's options (kind and default), the names given on the command line
(which win) and the file's folder (path options are relative to it); JobFileError: one line naming the key.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from typing import Any, Callable, Collection, Mapping

_KIND_WORDS = {int: "a whole number", float: "a number", bool: "true or false", str: "text"}


class JobFileError(ValueError):
    """The job file cannot be used; the message is one line for the user."""


@dataclass(frozen=True)
class Option:
    """One option of the task: its kind (int, float, bool or str) and default."""

    kind: type
    default: Any = None


def dashed(name: str) -> str:
    return name.replace("_", "-")


def _value(key: str, value: Any, kind: type, where: str) -> Any:
    """The file's value as the option's kind, or JobFileError naming the key, value and what is allowed."""
    allowed = _KIND_WORDS.get(kind, kind.__name__)
    wrong = JobFileError(f"{where}: {key}: {value!r} is not allowed; give {allowed}")
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise wrong
    if kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise wrong
    if kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise wrong
    if kind is str:
        if isinstance(value, str):
            return value
        if isinstance(value, bool):  # YAML reads on/off/yes/no/true/false as booleans
            return "on" if value else "off"
        if isinstance(value, (int, float)):  # `epochs: 3` for a text option, as `--epochs 3` would be
            return str(value)
        raise wrong
    if callable(kind) and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)  # a kind of the caller's own (a duration): it reads the text, as from the command line
    raise JobFileError(f"{where}: {key}: the option's kind {allowed} cannot be read from a job file")


def _relative(value: str, folder: str) -> str:
    if not value or os.path.isabs(value) or value.startswith("~"):
        return value
    return os.path.normpath(os.path.join(folder, value))


def resolve(options: Mapping[str, Option], data: Any, *, given: Collection[str] = (), folder: str = ".",
            where: str = "job file", paths: Collection[str] = (), maybe_paths: Collection[str] = (),
            exists: Callable[[str], bool] = lambda path: False, refused: Collection[str] = ()) -> dict[str, Any]:
    """The option values the file sets (by option name, underscores), less those `given` on the command line.

    `options` and the names in `given`, `paths`, `maybe_paths` and `refused` (options a file may not
    set, e.g. the file option itself) use the options' own names (underscores).
    """
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise JobFileError(f"{where}: holds {type(data).__name__}; allowed: a mapping of option names to values "
                           "(e.g. `nodes: 4`)")
    known = {dashed(name): name for name in options if name not in refused}
    resolved: dict[str, Any] = {}
    seen: dict[str, str] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise JobFileError(f"{where}: key {key!r} is not allowed; keys are option names such as "
                               f"{', '.join(sorted(known)[:3])}")
        name = known.get(dashed(key.strip()))
        if name is None and dashed(key.strip()) in {dashed(r) for r in refused}:
            raise JobFileError(f"{where}: {key!r} is not allowed in a job file; give --{dashed(key.strip())} on "
                               "the command line")
        if name is None:
            close = difflib.get_close_matches(dashed(key.strip()), list(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise JobFileError(f"{where}: unknown key {key!r}{hint} (allowed: the options of the task, "
                               f"e.g. {', '.join(sorted(known)[:4])})")
        if name in seen:
            raise JobFileError(f"{where}: {key!r} and {seen[name]!r} set the same option; keep one")
        seen[name] = key
        option = options[name]
        checked = _value(key, value, option.kind, where)
        if name in paths and checked:
            checked = _relative(checked, folder)
        elif name in maybe_paths and checked:
            candidate = _relative(checked, folder)
            if candidate != checked and exists(candidate):
                checked = candidate
        if name not in given:
            resolved[name] = checked
    return resolved
