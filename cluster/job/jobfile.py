"""A job file (`fab train -f job.yaml`): a task's options read from a YAML mapping (pure); the command line wins,
paths are relative to the file's folder; JobFileError: one line naming the key."""

from __future__ import annotations

import difflib
import os
from typing import Any, Callable, Collection, Mapping

_KIND_WORDS = {int: "a whole number", float: "a number", bool: "true or false", str: "text"}


class JobFileError(ValueError):
    """The job file cannot be used; the message is one line for the user."""


def dashed(name: str) -> str:
    return name.replace("_", "-")


def _value(key: str, value: Any, kind: type, where: str) -> Any:
    """The file's value as the option's kind, or JobFileError naming the key, value and what is allowed."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if (kind is bool and isinstance(value, bool)) or (kind is int and number and isinstance(value, int)):
        return value
    if kind is float and number:
        return float(value)
    if kind is str and isinstance(value, bool):  # YAML reads on/off/yes/no/true/false as booleans
        return "on" if value else "off"
    # `epochs: 3` for a text option, as `--epochs 3`; a kind of the caller's own (a duration) reads the text
    if (kind is str or (kind not in _KIND_WORDS and callable(kind))) and (isinstance(value, str) or number):
        return str(value)
    if kind in _KIND_WORDS:
        raise JobFileError(f"{where}: {key}: {value!r} is not allowed; give {_KIND_WORDS[kind]}")
    raise JobFileError(f"{where}: {key}: the option's kind {kind.__name__} cannot be read from a job file")


def _relative(value: str, folder: str) -> str:
    if not value or os.path.isabs(value) or value.startswith("~"):
        return value
    return os.path.normpath(os.path.join(folder, value))


def resolve(options: Mapping[str, type], data: Any, *, given: Collection[str] = (), folder: str = ".",
            where: str = "job file", paths: Collection[str] = (), maybe_paths: Collection[str] = (),
            exists: Callable[[str], bool] = lambda path: False, refused: Collection[str] = ()) -> dict[str, Any]:
    """The option values the file sets (by name, underscores) but those `given`; `options`: name -> kind (int,
    float, bool, str or a reader of text); `refused`: options a file may not set (the file option itself)."""
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
        word = dashed(key.strip())
        name = known.get(word)
        if name is None and word in {dashed(r) for r in refused}:
            raise JobFileError(f"{where}: {key!r} is not allowed in a job file; give --{word} on the command line")
        if name is None:
            close = difflib.get_close_matches(word, list(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise JobFileError(f"{where}: unknown key {key!r}{hint} (allowed: the options of the task, "
                               f"e.g. {', '.join(sorted(known)[:4])})")
        if name in seen:
            raise JobFileError(f"{where}: {key!r} and {seen[name]!r} set the same option; keep one")
        seen[name] = key
        checked = _value(key, value, options[name], where)
        if checked and (name in paths or (name in maybe_paths and exists(_relative(checked, folder)))):
            checked = _relative(checked, folder)
        if name not in given:
            resolved[name] = checked
    return resolved
