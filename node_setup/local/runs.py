"""The local cluster's run folder: where its jobs write (cluster/job/jobplan.py LOCAL_OUTPUT_ROOT/<cluster>).

`/var/tmp` is writable by every local user, so the folder's path can be taken first: a user who
makes `/var/tmp/xeon-cluster-runs` (or a symlink of that name pointing elsewhere) would get to
read the checkpoints root's jobs write there, or to make them write where the link points.
`ensure_run_folder` makes both levels root-owned and 0700 without following a symlink (each level
opened with O_NOFOLLOW relative to the one above), and refuses, with one line naming the path,
one that is a symlink, is not owned by root, or is writable by its group or by others.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cluster.job.jobplan import LOCAL_OUTPUT_ROOT
from node_setup.local.state import LocalClusterError, validate_name

FOLDER_MODE = 0o700


def ensure_run_folder(name: str, root: str = LOCAL_OUTPUT_ROOT, *, owner: int = 0) -> Path:
    """`root/name`, each level made (0700) or checked, owned by `owner` (root); the path.

    Raises LocalClusterError for a level that is a symlink or not a directory, is owned by someone
    else, or is group- or world-writable. A safe level with looser read bits (made by an older
    version) is tightened to 0700.
    """
    validate_name(name)
    top = Path(root)
    if not top.is_absolute() or len(top.parts) < 2:
        raise LocalClusterError(f"run folder: {root!r} is not allowed; allowed: an absolute path below /")
    fd = os.open(str(top.parent), os.O_RDONLY | os.O_DIRECTORY)
    try:
        for level, path in ((top.name, top), (name, top / name)):
            child = _open_level(fd, level, path, owner)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)
    return top / name


def _open_level(parent_fd: int, level: str, path: Path, owner: int) -> int:
    try:
        os.mkdir(level, FOLDER_MODE, dir_fd=parent_fd)
    except FileExistsError:
        pass
    try:
        fd = os.open(level, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
    except OSError as exc:  # ELOOP: a symlink; ENOTDIR: a file
        what = "a symlink" if os.path.islink(path) else f"not a directory ({exc.strerror})"
        raise LocalClusterError(_refusal(path, what)) from None
    info = os.fstat(fd)
    problem = None
    if info.st_uid != owner:
        problem = f"owned by uid {info.st_uid}, not {owner}"
    elif info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problem = f"writable by its group or others (mode {stat.S_IMODE(info.st_mode):04o})"
    if problem:
        os.close(fd)
        raise LocalClusterError(_refusal(path, problem))
    if stat.S_IMODE(info.st_mode) != FOLDER_MODE:
        os.fchmod(fd, FOLDER_MODE)
    return fd


def _refusal(path: Path, problem: str) -> str:
    return (f"run folder {path}: {problem}; allowed: a directory owned by root, mode 0700, that is not a symlink "
            "(someone else may have made it: look at it, remove it, and run fab local-up again)")
