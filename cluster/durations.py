"""Durations, one reader and one writer for every layer: `26m`, `1h30m`, `45s` -> seconds, and back as
`1h 02m 03s`. A refusal names the setting, the value and the forms allowed. Standard library only.
"""

from __future__ import annotations

import re

_FORM = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?\Z")


def parse_duration(text: str, setting: str, *, bare_seconds: bool = True) -> float:
    """`26m`, `1h30m`, `45s`, `1h2m3s`, `90` (seconds; refused when not `bare_seconds`: the command line's
    durations always carry a unit) -> seconds."""
    raw = str(text).strip().lower().replace(" ", "")
    if re.fullmatch(r"\d+(?:\.\d+)?", raw):
        if not bare_seconds:
            raise ValueError(f"{setting}: {text!r} has no unit; add a unit: {raw}s, {raw}m or {raw}h "
                             "(durations are written like 90s, 30m, 2h or 1h30m)")
        seconds = float(raw)
    else:
        match = _FORM.match(raw)
        if not raw or not match or not any(match.groups()):
            raise ValueError(f"{setting}: {text!r} is not a duration; allowed: hours, minutes and seconds "
                             "written like 26m, 1h30m, 45s or 1h2m3s"
                             + (" (a bare number means seconds)" if bare_seconds else ""))
        h, m, s = (float(g) if g else 0.0 for g in match.groups())
        seconds = h * 3600 + m * 60 + s
    if seconds <= 0:
        raise ValueError(f"{setting}: {text!r} must be longer than zero")
    return seconds


def format_duration(seconds: float) -> str:
    """1h 02m 03s / 7m 30s / 45s."""
    total = int(round(seconds))
    h, rest = divmod(total, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h {m:02d}m {s:02d}s"
    if m:
        return f"{m}m {s:02d}s"
    return f"{s}s"
