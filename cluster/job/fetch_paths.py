"""Which paths `fab get` may read on the master and write here: the pure rule.

`fab get` walks the job's output folder over SFTP, one folder listing at a time, so every name it
writes here was chosen by the job (or by whoever controls the master). One listed name becomes one
path component under the destination, and only when it is a plain name: not empty, not `.` or
`..`, without `/`, and without control characters (a newline, a tab, an escape: they fool the
terminal, and text parsing of listings). A local path is the destination joined with such names, so
it never leaves the destination; `stays_under` checks that lexically as well. Symbolic links are
the edges' business (node_setup/ssh/fetch.py): never followed on either side.
"""

from __future__ import annotations

import posixpath
import unicodedata
from typing import Sequence


def control_characters(text: str) -> list[str]:
    """The control characters (Unicode category Cc: C0, DEL, C1) in `text`, as Python escapes."""
    return sorted({repr(ch)[1:-1] for ch in text if unicodedata.category(ch) == "Cc"})


def refused_name(name: str) -> str | None:
    """Why `name`, one entry of a folder listing on the master, may not become a local name; None when it may."""
    if name in ("", ".", ".."):
        return f"{name!r} is not a file name"
    if "/" in name:
        return "it holds `/` (a listing entry is one name, never a path)"
    bad = control_characters(name)
    if bad:
        return f"it holds control characters ({' '.join(bad)})"
    return None


def check_subpath(path: str) -> str:
    """`fab get --path`: a relative path under the job's output folder, normalised ("." for all of it).

    Raises ValueError saying what is allowed: no absolute path, no `..`, no control characters.
    """
    if path.startswith("/"):
        raise ValueError("it is absolute")
    bad = control_characters(path)
    if bad:
        raise ValueError(f"it holds control characters ({' '.join(bad)})")
    if ".." in path.split("/"):
        raise ValueError("it holds `..`")
    return posixpath.normpath(path or ".")


def stays_under(dest: str, parts: Sequence[str]) -> bool:
    """Whether `dest` joined with `parts` is, lexically, `dest` itself or a path below it."""
    base = posixpath.normpath(dest)
    joined = posixpath.normpath(posixpath.join(base, *parts))
    return joined == base or joined.startswith(base.rstrip("/") + "/")


def local_parts(parts: Sequence[str], dest: str) -> tuple[str, ...]:
    """`parts` (names from the master's listings) checked for a path under `dest`; ValueError naming the first
    refused."""
    for name in parts:
        reason = refused_name(name)
        if reason:
            raise ValueError(f"{name!r}: {reason}")
    if not parts or not stays_under(dest, parts):
        raise ValueError(f"{'/'.join(parts)!r} does not stay under {dest!r}")
    return tuple(parts)
