"""The checks every setting of a run request goes through (pure): a whole number, a number, a line of text, a
choice, a flag, a folder on the nodes; each failure a RequestError naming the setting, the value and what is allowed."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Callable, Iterable, TypeVar

T = TypeVar("T")
R = TypeVar("R")

LINE_RE = re.compile(r"^[^\x00-\x1f\x7f]{0,4000}\Z")  # one line of text
_NODE_PATH_RE = re.compile(r"^[A-Za-z0-9_./+@-]{1,4000}\Z")  # a folder on the nodes (it reaches shells quoted)


class RequestError(ValueError):
    """A setting of the run that cannot be used; the message is one line naming it, the value and what is allowed."""


def refuse(setting: str, value: object, allowed: str) -> RequestError:
    return RequestError(f"{setting}: {value!r} is not allowed; allowed: {allowed}")


def whole(setting: str, value: object, low: int, high: int, *, optional: bool = True) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise refuse(setting, value, f"a whole number from {low} to {high}")


def number(setting: str, value: object, low: float, high: float, *, above: bool = False) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high or (above and value == low):
        raise refuse(setting, value, f"a number {'above' if above else 'from'} {low:g}" + f" to {high:g}")


def line(setting: str, value: object, *, optional: bool = True, pattern: re.Pattern = LINE_RE,
         allowed: str = "one line of text") -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not pattern.match(value):
        raise refuse(setting, value, allowed)


def choice(setting: str, value: object, choices: Iterable[object], *, optional: bool = True) -> None:
    choices = tuple(choices)
    if (value is None and optional) or value in choices:
        return
    raise RequestError(f"{setting}: {value!r} is not allowed; choose {' or '.join(str(c) for c in choices)}")


def flag(setting: str, value: object, *, optional: bool = False) -> None:
    if not isinstance(value, bool) and not (value is None and optional):
        raise refuse(setting, value, "true or false")


def rule(check: Callable[..., None], setting: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """A dataclass field's metadata: its value is checked by `check(setting, value, *args, **kwargs)` (`fields`)."""
    return {"check": lambda value: check(setting, value, *args, **kwargs)}


def checked(default: Any, check: Callable[..., None], setting: str, *args: Any, **kwargs: Any) -> Any:
    """A dataclass field with its default and its `rule`."""
    return dataclasses.field(default=default, metadata=rule(check, setting, *args, **kwargs))


def fields(value: Any) -> None:
    """Each field of the dataclass `value` through its check (`checked`), in their order."""
    for f in dataclasses.fields(value):
        if "check" in f.metadata:
            f.metadata["check"](getattr(value, f.name))


def passes(check: Callable[[T], R], value: T, error: type[Exception] | tuple[type[Exception], ...]) -> R:
    """`check(value)`, its `error` (one line naming the setting) raised as a RequestError."""
    try:
        return check(value)
    except error as exc:
        raise RequestError(str(exc)) from None


def check_node_path(setting: str, value: object) -> None:
    """A folder on the nodes: letters, digits and _./+@- (it reaches shells quoted), no '..'."""
    line(setting, value, pattern=_NODE_PATH_RE, allowed="letters, digits and _./+@-")
    if isinstance(value, str) and ".." in value.split("/"):
        raise refuse(setting, value, "a path without '..'")
