"""Checkpoints that survive losing the node: a manifest marks a checkpoint complete, S3 keeps a
verified copy, and resume picks the newest complete one.

A checkpoint directory is complete when its manifest (written last, by rank 0, after the Trainer
finished writing) lists every file with size and SHA-256 and the files match. On S3 the manifest
is uploaded last, after every file was uploaded with a SHA-256 checksum that S3 verifies and its
size was read back; a checkpoint whose upload was cut short has no manifest and is never chosen.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from training.errors import BadInput

log = logging.getLogger(__name__)

MANIFEST = "xeon-checkpoint.json"
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


class CheckpointError(RuntimeError):
    """An upload or download that could not be verified."""


@dataclass(frozen=True)
class Found:
    step: int
    location: str  # local directory or s3:// prefix (no trailing slash)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(directory: str | os.PathLike, step: int) -> dict:
    """List every file of a finished checkpoint; the manifest is what makes it complete."""
    root = Path(directory)
    files = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST):
        files[path.relative_to(root).as_posix()] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    manifest = {"step": step, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "files": files}
    tmp = root / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.replace(tmp, root / MANIFEST)
    return manifest


def read_manifest(directory: str | os.PathLike) -> dict | None:
    try:
        return json.loads((Path(directory) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def local_complete(directory: str | os.PathLike) -> bool:
    manifest = read_manifest(directory)
    if not manifest:
        return False
    root = Path(directory)
    for name, entry in manifest["files"].items():
        path = root / name
        if not path.is_file() or path.stat().st_size != entry["size"]:
            return False
    return True


def step_of(name: str) -> int | None:
    match = CHECKPOINT_RE.match(name)
    return int(match.group(1)) if match else None


def newest_local(output_dir: str | os.PathLike) -> Found | None:
    """The complete checkpoint-N under output_dir with the highest N."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    steps = sorted(((step_of(p.name), p) for p in root.iterdir() if p.is_dir() and step_of(p.name) is not None),
                   reverse=True)
    for step, path in steps:
        if local_complete(path):
            return Found(step, str(path))
        log.warning("ignoring %s: incomplete (no or mismatching %s)", path, MANIFEST)
    return None


# ---- S3 ----

def parse_s3_uri(uri: str) -> tuple[str, str]:
    """('bucket', 'prefix') from s3://bucket/prefix (prefix without slashes at the ends)."""
    if not uri.startswith("s3://"):
        raise BadInput(f"--checkpoint_uri {uri!r} must start with s3://")
    bucket, _, prefix = uri[5:].partition("/")
    if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", bucket):
        raise BadInput(f"--checkpoint_uri {uri!r}: {bucket!r} is not a valid S3 bucket name")
    return bucket, prefix.strip("/")


def _key(prefix: str, *parts: str) -> str:
    return "/".join(p for p in (prefix, *parts) if p)


def s3_client():
    """An S3 client with adaptive retries (credentials: the instance profile on EC2)."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", config=Config(retries={"mode": "adaptive", "max_attempts": 8},
                                            connect_timeout=10, read_timeout=120))


def upload_directory(client, directory: str | os.PathLike, uri: str) -> str:
    """Upload a directory that has a manifest; verify every object; put the manifest last.

    Returns the s3:// prefix. Raises CheckpointError when S3 does not hold what was sent.
    """
    root = Path(directory)
    manifest = read_manifest(root)
    if manifest is None:
        raise CheckpointError(f"{root} has no {MANIFEST}; write it before uploading")
    bucket, prefix = parse_s3_uri(uri)
    for name, entry in manifest["files"].items():
        key = _key(prefix, name)
        client.upload_file(str(root / name), bucket, key, ExtraArgs={"ChecksumAlgorithm": "SHA256"})
        head = client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        if head["ContentLength"] != entry["size"]:
            raise CheckpointError(f"s3://{bucket}/{key}: {head['ContentLength']} bytes on S3, "
                                  f"{entry['size']} locally")
        remote_sum = head.get("ChecksumSHA256")
        if remote_sum and "-" not in remote_sum:  # composite sums of multipart uploads differ by design
            local_sum = base64.b64encode(bytes.fromhex(entry["sha256"])).decode()
            if remote_sum != local_sum:
                raise CheckpointError(f"s3://{bucket}/{key}: SHA-256 on S3 differs from the local file")
    client.put_object(Bucket=bucket, Key=_key(prefix, MANIFEST), Body=json.dumps(manifest).encode(),
                      ContentType="application/json")
    return f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"


def upload_checkpoint(client, directory: str | os.PathLike, uri: str) -> str:
    """s3://.../checkpoint-N holding the checkpoint directory (its name gives N)."""
    return upload_directory(client, directory, f"{uri.rstrip('/')}/{Path(directory).name}")


def _remote_manifest(client, bucket: str, prefix: str) -> dict | None:
    from botocore.exceptions import ClientError

    try:
        body = client.get_object(Bucket=bucket, Key=_key(prefix, MANIFEST))["Body"].read()
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
            return None
        raise
    try:
        return json.loads(body)
    except ValueError:
        return None


def _remote_sizes(client, bucket: str, prefix: str) -> dict[str, int]:
    sizes = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for item in page.get("Contents", []):
            sizes[item["Key"][len(prefix) + 1:]] = item["Size"]
    return sizes


def _s3_checkpoints(client, bucket: str, prefix: str) -> list[tuple[int, str]]:
    """(N, name) of every checkpoint-N "directory" directly under `prefix`, complete or not."""
    list_prefix = prefix + "/" if prefix else ""
    found = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=list_prefix, Delimiter="/"):
        for common in page.get("CommonPrefixes", []):
            name = common["Prefix"][len(list_prefix):].rstrip("/")
            step = step_of(name)
            if step is not None:
                found.append((step, name))
    return found


def newest_s3(client, uri: str) -> Found | None:
    """The highest-step checkpoint under `uri` whose manifest exists and whose files all match it."""
    bucket, prefix = parse_s3_uri(uri)
    for step, name in sorted(_s3_checkpoints(client, bucket, prefix), reverse=True):
        checkpoint_prefix = _key(prefix, name)
        manifest = _remote_manifest(client, bucket, checkpoint_prefix)
        if manifest is None:
            log.warning("ignoring s3://%s/%s: upload never finished (no %s)", bucket, checkpoint_prefix, MANIFEST)
            continue
        sizes = _remote_sizes(client, bucket, checkpoint_prefix)
        if all(sizes.get(name) == entry["size"] for name, entry in manifest["files"].items()):
            return Found(step, f"s3://{bucket}/{checkpoint_prefix}")
        log.warning("ignoring s3://%s/%s: objects do not match its manifest", bucket, checkpoint_prefix)
    return None


def prune_s3(client, uri: str, keep: int) -> list[int]:
    """Delete S3 checkpoints older than the `keep` newest complete ones; returns the steps deleted.

    Unfinished uploads newer than the oldest kept checkpoint are left alone (one may be in flight).
    """
    if keep < 1:
        return []
    bucket, prefix = parse_s3_uri(uri)
    steps = [step for step, _ in _s3_checkpoints(client, bucket, prefix)]
    complete = [s for s in sorted(steps, reverse=True)
                if _remote_manifest(client, bucket, _key(prefix, f"checkpoint-{s}")) is not None]
    if len(complete) <= keep:
        return []
    oldest_kept = complete[keep - 1]
    deleted = []
    for step in sorted(s for s in steps if s < oldest_kept):
        checkpoint_prefix = _key(prefix, f"checkpoint-{step}")
        # the manifest goes first, so a half-deleted checkpoint never looks complete
        client.delete_object(Bucket=bucket, Key=_key(checkpoint_prefix, MANIFEST))
        keys = list(_remote_sizes(client, bucket, checkpoint_prefix))
        for start in range(0, len(keys), 1000):
            client.delete_objects(Bucket=bucket, Delete={"Objects": [
                {"Key": _key(checkpoint_prefix, k)} for k in keys[start:start + 1000]], "Quiet": True})
        deleted.append(step)
    return deleted


def download_checkpoint(client, location: str, destination: str | os.PathLike) -> str:
    """Fetch a complete S3 checkpoint into `destination` (verified, manifest last, atomic rename)."""
    bucket, prefix = parse_s3_uri(location)
    manifest = _remote_manifest(client, bucket, prefix)
    if manifest is None:
        raise CheckpointError(f"{location} has no {MANIFEST}; it is not a complete checkpoint")
    target = Path(destination)
    partial = target.with_name(target.name + ".download")
    shutil.rmtree(partial, ignore_errors=True)
    for name, entry in manifest["files"].items():
        path = partial / name
        path.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(bucket, _key(prefix, name), str(path))
        if _sha256(path) != entry["sha256"]:
            raise CheckpointError(f"{location}/{name}: downloaded bytes do not match the manifest's SHA-256")
    (partial / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    shutil.rmtree(target, ignore_errors=True)
    os.replace(partial, target)
    return str(target)


def choose_resume(output_dir: str, uri: str | None, client=None) -> Found | None:
    """The newest complete checkpoint among output_dir and the S3 copy (local wins a tie)."""
    local = newest_local(output_dir)
    remote = newest_s3(client, uri) if uri and client is not None else None
    if remote and (local is None or remote.step > local.step):
        return remote
    return local
