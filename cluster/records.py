"""One reader for every record read back from a node (pure): job.json, progress.json, summary.json, the
supervisor's state.json, the ranks' world records, the idle auto-stop's status (its `unstopped` file),
and a supervised run's spec (from the bucket every node may write, cluster/run/runspec.py).

A node is not trusted to write what this project wrote there: a record may be huge, a link to
/dev/zero, nested 60,000 deep, hold 1e400 or 1e-320, or text with terminal escapes. Whatever it holds,
reading it gives a value or one line naming the node and the file (RecordError), never a traceback,
never a hang:

- on the node, `read_command(path)`: the file is read with a bounded `head -c` (MAX_BYTES and one byte
  more, so that a larger file is seen as larger), and only when it is a regular file that is not a
  link (REFUSED is printed instead, which `load`/`text` turn into one line);
- here, `load(text, where)`: at most MAX_BYTES, nesting at most MAX_DEPTH deep (counted before the
  parser runs, so no RecursionError), numbers finite and bounded (|x| <= MAX_MAGNITUDE, no
  subnormal or smaller than MIN_MAGNITUDE but 0; NaN and Infinity refused), whole numbers at most
  MAX_DIGITS digits;
- `text(text, where)` the same for a plain-text record (size; every line made printable: cluster/names.py
  printable, no escape sequence reaches the terminal), `number(value)` a bounded number or None and
  `whole(value)` a whole number of ASCII digits or None (for values that come as text, e.g. the
  auto-stop's `key=value` lines, an exit code), `is_printable(value)` for a record's text fields.

The typed fields of each record are its own module's (cluster/job/joblist.py, jobprogress.py,
jobsummary.py, worldcheck.py, cluster/run/supervision.py, cluster/node/autostop.py, runspec.py), each
keeping a text field only when it is printable or showing it through printable; they all start here.
tests/unit/test_node_records.py proves it with hypothesis over every record type.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from typing import Any

from cluster.names import printable

MAX_BYTES = 1 << 20  # a record larger than 1 MiB is not read
MAX_DEPTH = 32  # objects and arrays inside each other
MAX_MAGNITUDE = 1e15
MIN_MAGNITUDE = 1e-200  # (0 aside) smaller ones (1e-320, subnormal) are refused: MAX_MAGNITUDE / x stays finite
MAX_DIGITS = 18  # a whole number's digits (below 2**63)
REFUSED = "\x01xeon-cluster: not a regular file\x01"  # what read_command prints for a link, a device, a FIFO
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BRACKET = re.compile(r"[\[\]{}]")


class RecordError(ValueError):
    """A record that cannot be read: one line naming where it comes from (`where`) and what is wrong (`why`)."""

    def __init__(self, where: str, why: str):
        super().__init__(f"{where}: {why}")
        self.where, self.why = where, why


def read_command(path: str, limit: int = MAX_BYTES) -> str:
    """The shell on the node that prints `path` (relative to the home, or absolute) for `load`: at most
    `limit` + 1 bytes, only from a regular file that is not a link (REFUSED otherwise); exit 3 when
    there is no file."""
    q = shlex.quote(path)
    return (f"cd && if [ -L {q} ] || {{ [ -e {q} ] && [ ! -f {q} ]; }}; then printf '%s' {shlex.quote(REFUSED)}; "
            f"elif [ -f {q} ]; then head -c {int(limit) + 1} -- {q}; else exit 3; fi")


def _checked_size(text: str | bytes, where: str, limit: int) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if text == REFUSED:
        raise RecordError(where, "not a regular file (a link, a device or a pipe)")
    if len(text.encode("utf-8", errors="replace")) > limit:
        raise RecordError(where, f"larger than {limit} bytes")
    return text


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or abs(value) > MAX_MAGNITUDE or (value != 0 and abs(value) < MIN_MAGNITUDE):
        raise ValueError(f"the number {text[:24]} is out of range (allowed: 0, or {MIN_MAGNITUDE:g} to "
                         f"{MAX_MAGNITUDE:g} either side of 0)")
    return value


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise ValueError(f"the whole number {text[:24]}... has more than {MAX_DIGITS} digits")
    return int(text)


def _depth(text: str) -> int:
    deepest = depth = 0
    for mark in _BRACKET.findall(_STRING.sub('""', text)):
        depth += 1 if mark in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def is_printable(value: object) -> bool:
    """Whether `value` is text a terminal shows as written (cluster/names.py printable leaves it whole)."""
    return isinstance(value, str) and printable(value) == value


def load(text: str | bytes | None, where: str, *, limit: int = MAX_BYTES) -> Any:
    """The JSON value of a record (None for no text or blank text), checked as the module's docstring says;
    RecordError (one line naming `where`) when it is not one."""
    if text is None:
        return None
    text = _checked_size(text, where, limit)
    if not text.strip():
        return None
    if _depth(text) > MAX_DEPTH:
        raise RecordError(where, f"not JSON (nested more than {MAX_DEPTH} deep)")
    try:
        value = json.loads(text, parse_float=_float, parse_int=_int, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise RecordError(where, f"not JSON ({printable(first)[:120]})") from None
    return value


def load_object(text: str | bytes | None, where: str, *, limit: int = MAX_BYTES) -> dict | None:
    """`load`, and the value must be a JSON object (None for no text)."""
    value = load(text, where, limit=limit)
    if value is not None and not isinstance(value, dict):
        raise RecordError(where, "not a JSON object")
    return value


def text(found: str | bytes | None, where: str, *, limit: int = MAX_BYTES) -> str | None:
    """A plain-text record (None for none): at most `limit` bytes, every line made printable."""
    if found is None:
        return None
    return "\n".join(printable(line) for line in _checked_size(found, where, limit).splitlines())


def number(value: object) -> float | None:
    """`value` (a number or its text) as a bounded float (see `_float`), or None when it is not one."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        return _float(value.strip()) if isinstance(value, str) else _float(repr(float(value)))  # type: ignore[arg-type]
    except (ValueError, TypeError, OverflowError):
        return None


def whole(value: object, low: int = 0, high: int = 2 ** 63 - 1) -> int | None:
    """`value` as a whole number from `low` to `high` (an int, or text of ASCII digits only: not '²'), or None."""
    if isinstance(value, str):
        value = value.strip()
        if not re.fullmatch(r"-?[0-9]{1,18}", value):
            return None
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        return None
    return value
