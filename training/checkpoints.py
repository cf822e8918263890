"""Checkpoints that survive losing the node: a manifest marks a checkpoint complete, S3 keeps a
verified copy (training/checkpoint_s3.py moves them), every checkpoint belongs to one run, and
resume picks the newest complete one that every rank can read.

A checkpoint directory is complete when its manifest (written last, by rank 0, after the Trainer
finished writing) lists every file with size and SHA-256 and the files match. On S3 the manifest
is uploaded last, after every file was uploaded with a SHA-256 checksum that S3 verifies and its
size was read back; a checkpoint whose upload was cut short has no manifest and is never chosen.

The manifest names the run that wrote it (`run_id`): pruning deletes only the run's own older
checkpoints, and --resume continues one run. A manifest is data from the bucket, which every node
may write: a file name in it that is absolute, has `.`/`..` parts or would land outside the
checkpoint folder, and a local checkpoint holding symbolic links, make the checkpoint unusable
(UnsafeCheckpoint) instead of writing or reading anywhere else.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Iterable, Sequence

log = logging.getLogger(__name__)

MANIFEST = "xeon-checkpoint.json"
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)\Z")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}\Z")


class CheckpointError(RuntimeError):
    """An upload or download that could not be verified."""


class UnsafeCheckpoint(CheckpointError):
    """A manifest or checkpoint folder that would make the job read or write outside the folder."""


@dataclass(frozen=True)
class Found:
    """A complete checkpoint: its step, where it is, the run that wrote it and when."""

    step: int
    location: str  # local directory or s3:// prefix (no trailing slash)
    run_id: str | None = None
    created: str = field(default="", compare=False)

    @property
    def key(self) -> tuple[str | None, int]:
        """What makes two copies the same checkpoint: the run and the step."""
        return self.run_id, self.step


def new_run_id() -> str:
    """A run's id: when it started (UTC) and 8 random hex digits, e.g. 20260101T120000Z-1a2b3c4d."""
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(4)}"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---- what a manifest may name

def _safe_name(name: object, where: str) -> str:
    """`name` if it is a plain relative path inside the checkpoint; UnsafeCheckpoint otherwise."""
    if not isinstance(name, str) or not name or "\0" in name or "\\" in name:
        raise UnsafeCheckpoint(f"{where}: manifest names {name!r}, which is not allowed; allowed: relative file "
                               "names inside the checkpoint folder")
    parts = name.split("/")
    if name.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise UnsafeCheckpoint(f"{where}: manifest names {name!r}, which is outside the checkpoint folder or not a "
                               "plain relative name; allowed: relative file names without '.', '..' or empty parts")
    if name == MANIFEST:
        raise UnsafeCheckpoint(f"{where}: manifest names itself ({MANIFEST!r}) as a file, which is not allowed")
    return str(PurePosixPath(name))


def manifest_files(manifest: object, where: str) -> dict[str, dict]:
    """The manifest's files (name -> {size, sha256}), every name checked; UnsafeCheckpoint when one
    could leave the folder, CheckpointError when the manifest is not one."""
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        raise CheckpointError(f"{where}: {MANIFEST} has no file list")
    checked = {}
    for name, entry in files.items():
        _safe_name(name, where)
        if not (isinstance(entry, dict) and isinstance(entry.get("size"), int) and entry["size"] >= 0
                and isinstance(entry.get("sha256"), str) and _SHA256_RE.match(entry["sha256"])):
            raise CheckpointError(f"{where}: {MANIFEST} entry {name!r} has no valid size and sha256")
        checked[name] = entry
    return checked


def links_under(root: Path) -> list[str]:
    """Every symbolic link below `root` (relative names), without following any."""
    found = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            path = Path(folder, name)
            if path.is_symlink():
                found.append(path.relative_to(root).as_posix())
    return sorted(found)


# ---- a checkpoint the disk could not hold

FULL_BELOW_BYTES = 4 * 1024 * 1024  # after a failed save, a filesystem with less free than this was full
_FULL_WORDS = ("no space left on device", "(os error 28)", "disk quota exceeded")


def free_bytes(directory: str | os.PathLike) -> int | None:
    """Free bytes on the filesystem that holds `directory` (or its nearest existing parent)."""
    path = Path(directory)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        found = os.statvfs(path)
    except OSError:
        return None
    return found.f_bavail * found.f_frsize


def disk_full(exc: BaseException, directory: str | os.PathLike) -> str | None:
    """Why saving the checkpoint `directory` failed for want of space, or None (another failure, not to be
    hidden): an ENOSPC or EDQUOT in the exception's chain, a writer saying so in its own words (safetensors'
    "os error 28"), or any failure while less than FULL_BELOW_BYTES are left (torch.save's "file write
    failed" names no cause)."""
    import errno

    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    free = free_bytes(directory)
    said = any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) for e in chain) or any(
        word in str(e).lower() for e in chain for word in _FULL_WORDS)
    if not said and (free is None or free >= FULL_BELOW_BYTES):
        return None
    return f"no space left on the device of {directory}" + (f" ({free // 1024} KiB free)" if free is not None else "")


SPACE_WAIT_S = 15 * 60.0  # how long the final model and summary wait for a full disk (the ranks wait at most 30 min)
SPACE_POLL_S = 10.0


def when_space(write, directory: str | os.PathLike, what: str, *, wait_s: float = SPACE_WAIT_S,
               poll_s: float = SPACE_POLL_S, sleep=time.sleep, clock=time.monotonic):
    """`write()`, tried again every `poll_s` while it fails for want of space on `directory`'s disk
    (`disk_full`), for up to `wait_s`: a run trained to its end is not thrown away for a disk full for a
    while. Any other failure, or a disk still full by then, is raised."""
    deadline, said = clock() + wait_s, False
    while True:
        try:
            return write()
        except Exception as exc:
            why = disk_full(exc, directory)
            if why is None or clock() >= deadline:
                raise
            if not said:
                log.warning("%s waits for space: %s; tried again every %gs for up to %gs", what, why, poll_s, wait_s)
                said = True
            sleep(poll_s)


def discard(directory: str | os.PathLike) -> None:
    """Remove a checkpoint folder that was never completed (its manifest first: never complete-looking)."""
    (Path(directory) / MANIFEST).unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)


# ---- every rank's state in one folder

def rank_state_name(rank: int, world_size: int) -> str:
    """The Trainer's file of one rank's random state (python, numpy, torch) in a checkpoint."""
    return "rng_state.pth" if world_size <= 1 else f"rng_state_{rank}.pth"


RANK_STATE_MAX_BYTES = 1 << 20  # a rank's random state is about 15 KB


def read_rank_state(directory: str | os.PathLike, rank: int, world_size: int) -> bytes | None:
    """This rank's random-state file of the checkpoint, to be gathered into rank 0's folder (None: there is none)."""
    path = Path(directory) / rank_state_name(rank, world_size)
    if path.is_symlink() or not path.is_file() or path.stat().st_size > RANK_STATE_MAX_BYTES:
        return None
    return path.read_bytes()


def add_rank_states(directory: str | os.PathLike, states: Sequence[bytes | None], world_size: int) -> None:
    """Rank 0: write each rank's random state (`states[rank]`, gathered from every rank) that its own folder lacks,
    so the folder its manifest describes, and the copy on S3, hold every rank's state (the ranks of other nodes
    write theirs into their own folders)."""
    for rank, data in enumerate(states):
        path = Path(directory) / rank_state_name(rank, world_size)
        if data is None or path.exists():
            continue
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)


def rank_state_refusal(*, step: int, missing: Sequence[int], world_size: int, written_by: object) -> str | None:
    """The one line that stops a resume whose checkpoint lacks a rank's random state, or None when the resume may go
    on: nothing is missing, or the world size changed (a world of another size cannot continue the old streams, so
    the missing ranks start new ones; the caller says so). `written_by`: the manifest's world_size (None before it
    was recorded)."""
    if not missing or (isinstance(written_by, int) and written_by != world_size):
        return None
    names = ", ".join(rank_state_name(r, world_size) for r in missing[:4]) + (" ..." if len(missing) > 4 else "")
    return (f"--resume: checkpoint-{step} lacks the random state of rank(s) {', '.join(map(str, missing[:8]))} "
            f"({names}): those ranks would not continue their dropout masks and sampling, so the run would differ "
            "from the one it continues; resume from a checkpoint that holds every rank's state, or pass "
            "--resume_without_rank_state true to go on with new random streams on those ranks")


# ---- local checkpoints

def write_manifest(directory: str | os.PathLike, step: int, run_id: str | None = None,
                   world_size: int | None = None, samples_seen: int | None = None) -> dict:
    """List every file of a finished checkpoint; the manifest is what makes it complete."""
    root = Path(directory)
    links = links_under(root)
    if links:
        raise UnsafeCheckpoint(f"{root}: holds symbolic link(s) {', '.join(links[:3])}; a checkpoint holds files only")
    files = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name not in (MANIFEST, MANIFEST + ".tmp")):
        files[path.relative_to(root).as_posix()] = {"size": path.stat().st_size, "sha256": sha256_of(path)}
    manifest = {"step": step, "run_id": run_id, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "world_size": world_size, "samples_seen": samples_seen, "files": files}
    tmp = root / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.replace(tmp, root / MANIFEST)
    return manifest


def read_manifest(directory: str | os.PathLike) -> dict | None:
    try:
        manifest = json.loads((Path(directory) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def step_of(name: str) -> int | None:
    match = CHECKPOINT_RE.match(name)
    return int(match.group(1)) if match else None


def inspect_local(directory: str | os.PathLike) -> tuple[Found | None, str | None]:
    """(the checkpoint, None) when `directory` is complete and safe to load, else (None, why not)."""
    root = Path(directory)
    if root.is_symlink():
        return None, "it is a symbolic link"
    manifest = read_manifest(root)
    if manifest is None:
        return None, f"no {MANIFEST} (incomplete)"
    try:
        files = manifest_files(manifest, str(root))
    except CheckpointError as exc:
        return None, str(exc)
    links = links_under(root)
    if links:
        return None, f"holds symbolic link(s) {', '.join(links[:3])}, which a checkpoint never does"
    for name, entry in files.items():
        path = root / name
        if not path.is_file() or path.stat().st_size != entry["size"]:
            return None, f"{name} is missing or its size differs from {MANIFEST}"
    step = step_of(root.name)
    if step is not None and manifest.get("step") != step:
        return None, f"{MANIFEST} is for step {manifest.get('step')!r}"
    return Found(step if step is not None else int(manifest.get("step") or 0), str(root), manifest.get("run_id"),
                 str(manifest.get("created", ""))), None


def local_complete(directory: str | os.PathLike) -> bool:
    return inspect_local(directory)[0] is not None


def _checkpoint_dirs(output_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    root = Path(output_dir)
    if not root.is_dir():
        return []
    return sorted((step_of(p.name), p) for p in root.iterdir() if step_of(p.name) is not None
                  and (p.is_dir() or p.is_symlink()))


def local_checkpoints(output_dir: str | os.PathLike, *, quiet: bool = False) -> list[Found]:
    """Every complete, safe checkpoint-N under output_dir, by step; the others are logged and left out."""
    found = []
    for _step, path in _checkpoint_dirs(output_dir):
        checkpoint, why = inspect_local(path)
        if checkpoint is not None:
            found.append(checkpoint)
        elif not quiet:
            log.warning("ignoring %s: %s", path, why)
    return found


def newest_local(output_dir: str | os.PathLike) -> Found | None:
    """The complete checkpoint-N under output_dir with the highest N."""
    return max(local_checkpoints(output_dir), key=lambda f: f.step, default=None)


def _newest_first(found: Iterable[Found]) -> list[Found]:
    """Newest written first: by creation time, then step (a resumed run's steps can repeat an old branch's)."""
    return sorted(found, key=lambda f: (f.created, f.step), reverse=True)


def to_prune(found: list[Found], all_steps: Iterable[int], keep: int, run_id: str | None,
              protect: Iterable[int] = ()) -> tuple[list[Found], list[int]]:
    """(the run's complete checkpoints to delete, steps of unfinished ones older than every kept one)."""
    ours = _newest_first(f for f in found if f.run_id == run_id)
    if keep < 1 or len(ours) <= keep:
        return [], []
    kept, older = ours[:keep], [f for f in ours[keep:] if f.step not in set(protect)]
    oldest_kept = min(f.step for f in kept)
    complete_steps = {f.step for f in found}
    unfinished = sorted(s for s in set(all_steps) - complete_steps if s < oldest_kept)
    return older, unfinished


def prune_local(output_dir: str | os.PathLike, keep: int, run_id: str | None, protect: Iterable[int] = ()) -> list[int]:
    """Delete the run's local checkpoints beyond the `keep` newest (and unfinished ones older than those).

    Other runs' checkpoints, `protect`ed steps (the best model) and anything that is not a complete,
    safe checkpoint newer than the kept ones stay. Returns the steps deleted.
    """
    dirs = _checkpoint_dirs(output_dir)
    complete = local_checkpoints(output_dir, quiet=True)
    unsafe = {s for s, p in dirs if read_manifest(p) is not None} - {f.step for f in complete}
    older, unfinished = to_prune(complete, [s for s, _ in dirs if s not in unsafe], keep, run_id, protect)
    deleted = []
    for step in sorted({f.step for f in older} | set(unfinished)):
        path = Path(output_dir) / f"checkpoint-{step}"
        if path.is_symlink():
            path.unlink()
        else:
            (path / MANIFEST).unlink(missing_ok=True)  # never half-deleted yet complete-looking
            shutil.rmtree(path, ignore_errors=True)
        deleted.append(step)
    return deleted


# ---- which checkpoint --resume continues, and whether a fresh start may use the folder

def choose_resume(local_by_rank: Sequence[Iterable[Found]], remote: Iterable[Found]) -> Found | None:
    """The checkpoint --resume continues: one every rank can read (in its own output_dir, or on S3).

    Of those, the run written last is continued, from its highest step. The location is rank 0's
    local copy when it has one, else the S3 copy. None when no checkpoint is readable by all ranks.
    """
    remote_by_key = {f.key: f for f in remote}
    rank0 = {f.key: f for f in (local_by_rank[0] if local_by_rank else ())}
    common: set | None = None
    for local in local_by_rank:
        readable = {f.key for f in local} | set(remote_by_key)
        common = readable if common is None else common & readable
    if not common:
        return None
    candidates = [rank0.get(key) or remote_by_key[key] for key in common]
    run = _newest_first(candidates)[0].run_id
    return max((f for f in candidates if f.run_id == run), key=lambda f: f.step)


def describe_readable(local_by_rank: Sequence[Iterable[Found]], remote: Iterable[Found], hosts: Sequence[str]) -> str:
    """Which steps every rank can read, for the message when no checkpoint is common to all."""
    remote_steps = sorted({f.step for f in remote})
    parts = [f"rank {rank} ({hosts[rank] if rank < len(hosts) else '?'}): "
             + (", ".join(str(s) for s in sorted({f.step for f in local})) or "none")
             for rank, local in enumerate(local_by_rank)]
    return f"{'; '.join(parts)}; on S3: {', '.join(map(str, remote_steps)) or 'none'}"


def fresh_start_conflict(output_dir: str, uri: str | None, local: Sequence[Found],
                         remote: Sequence[Found]) -> str | None:
    """The message that stops a fresh start into a folder or prefix holding another run's complete
    checkpoints (its pruning and a later --resume would mix the two runs), or None."""
    places = [(f"--checkpoint_uri {uri}", remote, "--checkpoint_uri prefix"), (f"--output_dir {output_dir}", local,
                                                                              "--output_dir")]
    for where, found, other in places:
        if found:
            newest = _newest_first(found)[0]
            runs = sorted({str(f.run_id) for f in found})
            return (f"{where} already holds checkpoints of run {', '.join(runs)} (newest: checkpoint-{newest.step}); "
                    f"a new run there would mix with it: pass --resume to continue that run, or choose another {other}")
    return None
