"""`fab get`'s copy: walk a folder on the master over SFTP and copy its files here, resumably.

No text is parsed: the walk reads SFTP folder listings (`listdir_attr`, which stats an entry itself,
never what a link points to). Each listed name passes cluster/job/fetch_paths.py's rule before it is
used on either side; a refused name is reported and left out. Remote symbolic links are skipped
with a line saying so (so is anything that is neither a file nor a folder). Here, every folder and
file is opened relative to the destination folder's own descriptor with O_NOFOLLOW, so a symbolic
link at or under the destination is never written through, whatever it points to. A file is written
0600 and then given the master's permission bits less the umask (fetch_paths.local_mode), also when it
was already here: never wider than on the master, never setuid, setgid or sticky.

A file already here is kept or resumed only when its content is the master's: its sha256 against the
one the master computes (`remote_digest`, over SSH) of the whole file or of the prefix it holds, never
its size alone; each copy is compared with the master's digest once written (fetch_paths.digest_command).
"""

from __future__ import annotations

import errno
import hashlib
import os
import posixpath
import stat as stat_mode
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from cluster.job.fetch_paths import DIGEST, digest_command, local_mode, local_parts, parse_digest, refused_name
from cluster.job.jobplan import shown
from cluster.job.userjob import human_bytes
from cluster.names import printable

PROGRESS_FROM_BYTES = 8 * 1024 * 1024  # files at least this large report progress
CHUNK = 1024 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
# O_NONBLOCK: a FIFO put where a file goes fails instead of blocking (no effect on a regular file)
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_MODE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
WRITING_MODE = 0o600  # a file's mode while it is written, before it gets the master's


class UnsafeLocalPath(OSError):
    """A local path `fab get` will not write: a symbolic link, or not a folder where one is needed."""


@dataclass(frozen=True)
class RemoteFile:
    remote: str  # its path on the master
    parts: tuple[str, ...]  # its local path under the destination, every name checked
    size: int
    mode: int | None = None  # its st_mode on the master (None: the listing gave none)


def walk(sftp, root: str, say: Callable[[str], None] = print) -> Iterator[RemoteFile]:
    """The regular files at or under `root` on the master; `say` gets one line per entry left out,
    starting with what happened to it: `refused` (its name), `skipped` (a link, or neither file nor
    folder) or `failed` (a folder that could not be listed).

    A file `root` gives one file named after it; a folder gives its files, named relative to it: each
    folder's files by name, then its folders by name, depth first.
    """
    top = sftp.lstat(root)
    if stat_mode.S_ISLNK(top.st_mode or 0):
        say(f"skipped {shown(root)!r}: a symbolic link (fab get never follows one)")
        return
    if not stat_mode.S_ISDIR(top.st_mode or 0):
        name = posixpath.basename(root)
        reason = refused_name(name)
        if reason:
            say(f"refused {shown(root)!r}: {reason}")
        elif stat_mode.S_ISREG(top.st_mode or 0):
            yield RemoteFile(root, (name,), top.st_size or 0, top.st_mode)
        else:
            say(f"skipped {shown(root)!r}: neither a file nor a folder")
        return
    folders: list[tuple[str, tuple[str, ...]]] = [(root, ())]
    while folders:
        folder, parts = folders.pop()
        try:
            entries = sorted(sftp.listdir_attr(folder), key=lambda a: a.filename)
        except UnicodeDecodeError:
            say(f"refused {shown(folder)!r}: a name in it is not UTF-8")
            continue
        except OSError as exc:
            say(f"failed {shown(folder)!r}: cannot list it ({exc.strerror or exc})")
            continue
        subfolders = []
        for attr in entries:
            name = attr.filename
            reason = refused_name(name)
            if reason:
                say(f"refused {shown(folder)!r} entry {name!r}: {reason}")
                continue
            remote, mode = f"{folder}/{name}", attr.st_mode or 0
            if stat_mode.S_ISLNK(mode):
                say(f"skipped {shown(remote)!r}: a symbolic link (fab get never follows one)")
            elif stat_mode.S_ISDIR(mode):
                subfolders.append((remote, (*parts, name)))
            elif stat_mode.S_ISREG(mode):
                yield RemoteFile(remote, (*parts, name), attr.st_size or 0, attr.st_mode)
            else:
                say(f"skipped {shown(remote)!r}: neither a file nor a folder")
        folders.extend(reversed(subfolders))


def first_link(sftp, base: str, rel: str) -> str | None:
    """The first folder of `rel` (a path under `base` on the master) that is a symbolic link, or None."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    for i in range(1, len(parts)):
        path = "/".join([base.rstrip("/"), *parts[:i]])
        if stat_mode.S_ISLNK(sftp.lstat(path).st_mode or 0):
            return path
    return None


class LocalTree:
    """The destination folder, written only through folders opened without following links."""

    def __init__(self, dest: Path):
        """Make `dest` (its parents as the user has them); UnsafeLocalPath when `dest` itself is a symbolic link."""
        self.dest = Path(dest)
        if self.dest.is_symlink():
            raise UnsafeLocalPath(f"{str(self.dest)!r} is a symbolic link; give a real folder")
        self.dest.mkdir(parents=True, exist_ok=True)
        try:
            self._fd = os.open(self.dest, _DIR_FLAGS)
        except OSError as exc:  # replaced by a link or a file since the check above
            raise UnsafeLocalPath(f"{str(self.dest)!r} is not a folder to write into ({exc.strerror})") from None
        self.umask = os.umask(0o077)  # read (there is no other way), then put back at once
        os.umask(self.umask)

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> "LocalTree":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _folder(self, parts: tuple[str, ...], make: bool) -> int | None:
        """A descriptor of the folder `parts` under the destination (made when `make`), None when missing."""
        fd = os.dup(self._fd)
        try:
            for name in parts:
                if make:
                    try:
                        os.mkdir(name, dir_fd=fd)
                    except FileExistsError:
                        pass
                try:
                    inner = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if make:
                        raise
                    os.close(fd)
                    return None
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                        raise UnsafeLocalPath(f"{name!r} here is a symbolic link or not a folder") from None
                    raise
                os.close(fd)
                fd = inner
            return fd
        except BaseException:
            os.close(fd)
            raise

    def size(self, parts: tuple[str, ...]) -> int:
        """Bytes already here at `parts` (0 when nothing is); UnsafeLocalPath for a link or a non-file."""
        parts = local_parts(parts, str(self.dest))
        fd = self._folder(parts[:-1], make=False)
        if fd is None:
            return 0
        try:
            st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return 0
        finally:
            os.close(fd)
        if not stat_mode.S_ISREG(st.st_mode):
            raise UnsafeLocalPath(f"{parts[-1]!r} here is a symbolic link or not a file")
        return st.st_size

    def _open_here(self, parts: tuple[str, ...]) -> int:
        """A descriptor of the file here at (checked) `parts`, opened without following a link (_MODE_FLAGS)."""
        fd = self._folder(parts[:-1], make=False)
        if fd is None:
            raise FileNotFoundError(errno.ENOENT, "not here", "/".join(parts))
        try:
            return os.open(parts[-1], _MODE_FLAGS, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK):
                raise UnsafeLocalPath(f"{parts[-1]!r} here is a symbolic link") from None
            raise
        finally:
            os.close(fd)

    def hashed(self, parts: tuple[str, ...]):
        """The sha256 state (hashlib) of the file here at `parts`, read without following a link."""
        parts = local_parts(parts, str(self.dest))
        src = self._open_here(parts)
        state = hashlib.new(DIGEST)
        with os.fdopen(src, "rb") as f:
            if not stat_mode.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise UnsafeLocalPath(f"{parts[-1]!r} here is not a file")
            while block := f.read(CHUNK):
                state.update(block)
        return state

    def open(self, parts: tuple[str, ...], append: bool):
        """`parts` for writing (appended to, or emptied first), never through a link."""
        parts = local_parts(parts, str(self.dest))
        fd = self._folder(parts[:-1], make=True)
        assert fd is not None  # made, so never missing
        try:
            flags = _FILE_FLAGS | (os.O_APPEND if append else os.O_TRUNC)
            try:
                out = os.open(parts[-1], flags, WRITING_MODE, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.EISDIR, errno.EMLINK):
                    raise UnsafeLocalPath(f"{parts[-1]!r} here is a symbolic link or not a file") from None
                raise
        finally:
            os.close(fd)
        os.fchmod(out, WRITING_MODE)  # also a file already here, wider than that, while it is written
        return os.fdopen(out, "ab" if append else "wb")

    def set_mode(self, parts: tuple[str, ...], remote_mode: int | None) -> None:
        """Give the file at `parts` the master's permission bits less the umask (never through a link)."""
        parts = local_parts(parts, str(self.dest))
        target = self._open_here(parts)
        try:
            if not stat_mode.S_ISREG(os.fstat(target).st_mode):
                raise UnsafeLocalPath(f"{parts[-1]!r} here is not a file")
            os.fchmod(target, local_mode(remote_mode, self.umask))
        finally:
            os.close(target)


VERIFIED = ("copied", "resumed", "unchanged")  # copy()'s outcomes (its first word): each matched the master's digest
Digest = Callable[[str, "int | None"], str]  # sha256 hex of a remote file's first n bytes (None: all of it)


class ChangedWhileCopied(OSError):
    """A file whose copy did not match the master's digest, twice: it kept changing while it was copied."""


def remote_digest(conn) -> Digest:
    """The master's own sha256 of a file there (or of its first n bytes), over `conn` (a Fabric connection)."""

    def digest(path: str, nbytes: int | None = None) -> str:
        result = conn.run(digest_command(path, nbytes), hide=True, warn=True, in_stream=False)
        found = parse_digest(result.stdout) if result.ok else None
        if found is None:
            detail = printable(result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "no digest")
            raise OSError(f"cannot compute its {DIGEST} on the master (exit {result.exited}: {detail[:200]})")
        return found

    return digest


def _pull(sftp, remote: str, dst, have: int, size: int, state, label: str) -> str:
    """The master's `remote` from byte `have` to its end, appended to `dst` and to the digest `state`
    (which holds the bytes before `have`); returns the local copy's hex digest."""
    shown_at = -1
    with sftp.open(remote, "rb") as src:
        src.seek(have)
        done = have
        while True:
            block = src.read(CHUNK)
            if not block:
                break
            dst.write(block)
            state.update(block)
            done += len(block)
            if size >= PROGRESS_FROM_BYTES and min(done, size) * 10 // size != shown_at:
                shown_at = min(done, size) * 10 // size
                print(f"  {label}: {human_bytes(done)} of {human_bytes(size)} ({100 * min(done, size) // size}%)",
                      flush=True)
    return state.hexdigest()


def copy(sftp, remote: str, tree: LocalTree, parts: tuple[str, ...], size: int, mode: int | None = None, *,
         digest: Digest) -> str:
    """One file, then given the master's mode `mode` (its st_mode there: fetch_paths.local_mode); returns what
    happened. A local copy is kept ("unchanged") only when its sha256 is the master's `digest` of the whole
    file, and resumed only when it is the digest of the prefix it holds; otherwise the file is copied from the
    start. Every copy is compared with the master's digest of the whole file once written: a mismatch (the
    file changed while it was read) copies it again from the start, once; ChangedWhileCopied after that."""
    have = tree.size(parts)
    state = hashlib.new(DIGEST)
    if have and have <= size:
        state = tree.hashed(parts)
        if digest(remote, None if have == size else have) == state.hexdigest():
            if have == size:
                tree.set_mode(parts, mode)
                return "unchanged"
        else:
            have, state = 0, hashlib.new(DIGEST)
    else:
        have = 0
    resumed_at, start = have, time.monotonic()
    for attempt in range(2):
        with tree.open(parts, append=bool(have)) as dst:
            local = _pull(sftp, remote, dst, have, size, state, parts[-1])
        if local == digest(remote, None):
            tree.set_mode(parts, mode)
            again = " (copied again: it changed while it was read)" if attempt else ""
            return ((f"resumed at {human_bytes(resumed_at)}" if resumed_at and not attempt else "copied")
                    + f" in {time.monotonic() - start:.1f} s{again}")
        have, state = 0, hashlib.new(DIGEST)
        size = sftp.lstat(remote).st_size or 0
    tree.set_mode(parts, mode)
    raise ChangedWhileCopied("it changed on the master while it was copied, twice: the copy here is not the "
                             "master's file (run fab get again once the job stops writing it)")
