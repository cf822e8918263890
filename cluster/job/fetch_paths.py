"""Which paths `fab get` may read on the master and write here: the pure rule.

`fab get` walks the job's output folder over SFTP, one folder listing at a time, so every name it
writes here was chosen by the job (or by whoever controls the master). One listed name becomes one
path component under the destination, and only when it is a plain name: not empty, not `.` or
`..`, without `/`, and without a character a terminal does not show as written (cluster/names.py's
`printable`): control characters (a newline, a tab, an escape: they fool the terminal, and text
parsing of listings) and bidirectional formatting characters (U+202E RIGHT-TO-LEFT OVERRIDE makes
`model\u202eexe.pt` show as `modeltp.exe`; the embeddings, isolates and marks likewise). A local
path is the destination joined with such names, so it never leaves the destination; `stays_under`
checks that lexically as well. Symbolic links are the edges' business (node_setup/ssh/fetch.py):
never followed on either side.

A file copied here gets the master's permission bits (`local_mode`), less the user's umask and
never a setuid, setgid or sticky bit: a 0600 checkpoint stays 0600, nothing is wider than on the
master.

Whether a file already here is the master's is decided by content, never by size: `fab get` compares
the sha256 of the local copy with the one the master computes (`digest_command`) of the whole remote
file (kept as unchanged) or of the prefix a shorter local copy holds (resumed after it); anything else
is copied from the start, and every copy is compared with the master's digest once it is written.
"""

from __future__ import annotations

import posixpath
import shlex
from typing import Sequence

from cluster.names import printable

PERMISSION_BITS = 0o777  # what of a remote file's mode a local copy keeps: no setuid, setgid or sticky bit


def unshown_characters(text: str) -> list[str]:
    """The characters of `text` a terminal does not show as written (control and bidirectional formatting
    characters: what cluster/names.py's `printable` removes), as Python escapes."""
    return sorted({repr(ch)[1:-1] for ch in text if printable(ch) != ch})


def local_mode(remote_mode: int | None, umask: int) -> int:
    """The permission bits of a local copy of a file whose mode on the master is `remote_mode` (0o600 when
    the listing gave none): its rwx bits less `umask`, never setuid, setgid or sticky."""
    bits = 0o600 if remote_mode is None else remote_mode & PERMISSION_BITS
    return bits & ~umask & PERMISSION_BITS


def refused_name(name: str) -> str | None:
    """Why `name`, one entry of a folder listing on the master, may not become a local name; None when it may."""
    if name in ("", ".", ".."):
        return f"{name!r} is not a file name"
    if "/" in name:
        return "it holds `/` (a listing entry is one name, never a path)"
    bad = unshown_characters(name)
    if bad:
        return f"it holds control or bidirectional formatting characters ({' '.join(bad)})"
    return None


def check_subpath(path: str) -> str:
    """`fab get --path`: a relative path under the job's output folder, normalised ("." for all of it).

    Raises ValueError saying what is allowed: no absolute path, no `..`, no control or bidirectional
    formatting characters.
    """
    if path.startswith("/"):
        raise ValueError("it is absolute")
    bad = unshown_characters(path)
    if bad:
        raise ValueError(f"it holds control or bidirectional formatting characters ({' '.join(bad)})")
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


DIGEST = "sha256"  # what `fab get` compares a local file with the master's by (computed on the master)
_HEX_DIGEST_LENGTH = 64


def digest_command(path: str, nbytes: int | None = None) -> str:
    """The shell command that prints the sha256 of the file at `path` on the master (of its first `nbytes`
    bytes when given: the prefix a resumed copy continues after), as `sha256sum` prints it: `<hex>  -`.

    The path is quoted; it is read through a redirection, so no name reads as an option and `sha256sum`
    never escapes it in its output.
    """
    if nbytes is not None and (isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0):
        raise ValueError(f"nbytes: {nbytes!r} is not a byte count")
    quoted = shlex.quote(path)
    if nbytes is None:
        return f"sha256sum < {quoted}"
    return f"head -c {nbytes} < {quoted} | sha256sum"


def parse_digest(text: str) -> str | None:
    """The hex digest `digest_command`'s output holds, lower case; None when it holds no such line."""
    lines = text.strip().splitlines()
    if len(lines) != 1:
        return None
    first = lines[0].split(" ", 1)[0].lower()
    if len(first) != _HEX_DIGEST_LENGTH or any(ch not in "0123456789abcdef" for ch in first):
        return None
    return first
