"""Checkpoints on S3: the URI checked and probed at start, verified uploads with the manifest last,
the run's pruning, and downloads that write only inside the checkpoint folder.

The rules of what a complete, safe checkpoint is (its manifest, its run) are in
training/checkpoints.py; this module moves checkpoints to and from a bucket by those rules.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Iterable

from cluster.job.job_args import JobArgsError
from cluster.job.job_args import parse_s3_uri as parse_checkpoint_uri
from training.checkpoints import (
    MANIFEST,
    CheckpointError,
    Found,
    UnsafeCheckpoint,
    links_under,
    manifest_files,
    read_manifest,
    sha256_of,
    step_of,
    to_prune,
)
from training.errors import BadInput

log = logging.getLogger(__name__)

PROBE_NAME = ".xeon-write-probe"


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """('bucket', 'prefix') from s3://bucket/prefix: the controller's rule (cluster/job/job_args.py)."""
    try:
        return parse_checkpoint_uri(uri, "--checkpoint_uri")
    except JobArgsError as exc:
        raise BadInput(str(exc)) from None


def _key(prefix: str, *parts: str) -> str:
    return "/".join(p for p in (prefix, *parts) if p)


def s3_client(max_attempts: int = 8):
    """An S3 client with adaptive retries (credentials: the instance profile on EC2)."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", config=Config(retries={"mode": "adaptive", "max_attempts": max_attempts},
                                            connect_timeout=10, read_timeout=120))


def _error_text(exc: Exception) -> str:
    """'NoSuchBucket: The specified bucket does not exist' for an AWS error, else 'Type: message'."""
    response = getattr(exc, "response", None)
    error = response.get("Error", {}) if isinstance(response, dict) else {}
    if error.get("Code"):
        return f"{error['Code']}: {error.get('Message') or exc}"
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def probe_uri(client, uri: str) -> None:
    """Write, read back and delete a small object under the prefix; BadInput naming the URI and the
    error when any step fails (a bucket kept from an old stack, no permission, a wrong endpoint)."""
    bucket, prefix = parse_s3_uri(uri)
    key = _key(prefix, f"{PROBE_NAME}-{secrets.token_hex(4)}")
    body = f"xeon-cluster write probe {time.time()}".encode()
    step = "write"
    try:
        client.put_object(Bucket=bucket, Key=key, Body=body)
        step = "read back"
        if client.get_object(Bucket=bucket, Key=key)["Body"].read() != body:
            raise CheckpointError("the object read back differs from the one written")
        step = "delete"
        client.delete_object(Bucket=bucket, Key=key)
        step = "list"
        client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/" if prefix else "", MaxKeys=1)
    except Exception as exc:  # noqa: BLE001 - any failure is the user's bucket, credentials or endpoint
        what = {"write": "cannot write there", "read back": "cannot read back what it wrote",
                "delete": "cannot delete there", "list": "cannot list there"}[step]
        raise BadInput(f"--checkpoint_uri {uri}: {what} ({_error_text(exc)}); allowed: a bucket and prefix these "
                       "credentials may list, get, put and delete objects in (on AWS: the stack's checkpoint bucket, "
                       "`pulumi stack output bucketName`)") from None


def _remote_manifest(client, bucket: str, prefix: str) -> dict | None:
    from botocore.exceptions import ClientError

    try:
        body = client.get_object(Bucket=bucket, Key=_key(prefix, MANIFEST))["Body"].read()
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
            return None
        raise
    try:
        manifest = json.loads(body)
    except ValueError:
        return None
    return manifest if isinstance(manifest, dict) else None


def _remote_sizes(client, bucket: str, prefix: str) -> dict[str, int]:
    sizes = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for item in page.get("Contents", []):
            sizes[item["Key"][len(prefix) + 1:]] = item["Size"]
    return sizes


def _s3_checkpoint_steps(client, bucket: str, prefix: str) -> list[int]:
    """N of every checkpoint-N "directory" directly under `prefix`, complete or not."""
    list_prefix = prefix + "/" if prefix else ""
    found = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=list_prefix, Delimiter="/"):
        for common in page.get("CommonPrefixes", []):
            step = step_of(common["Prefix"][len(list_prefix):].rstrip("/"))
            if step is not None:
                found.append(step)
    return sorted(found)


def _inspect_s3(client, bucket: str, checkpoint_prefix: str, step: int) -> tuple[Found | None, str | None, dict | None]:
    """(the checkpoint or None, why not, its manifest when there is one)."""
    where = f"s3://{bucket}/{checkpoint_prefix}"
    manifest = _remote_manifest(client, bucket, checkpoint_prefix)
    if manifest is None:
        return None, f"upload never finished (no {MANIFEST})", None
    try:
        files = manifest_files(manifest, where)
    except CheckpointError as exc:
        return None, str(exc), manifest
    if manifest.get("step") != step:
        return None, f"{MANIFEST} is for step {manifest.get('step')!r}", manifest
    sizes = _remote_sizes(client, bucket, checkpoint_prefix)
    if not all(sizes.get(name) == entry["size"] for name, entry in files.items()):
        return None, "objects do not match its manifest", manifest
    return Found(step, where, manifest.get("run_id"), str(manifest.get("created", ""))), None, manifest


def s3_checkpoints(client, uri: str, *, quiet: bool = False) -> list[Found]:
    """Every complete, safe checkpoint under `uri`, by step; the others are logged and left out."""
    bucket, prefix = parse_s3_uri(uri)
    found = []
    for step in _s3_checkpoint_steps(client, bucket, prefix):
        checkpoint, why, _ = _inspect_s3(client, bucket, _key(prefix, f"checkpoint-{step}"), step)
        if checkpoint is not None:
            found.append(checkpoint)
        elif not quiet:
            log.warning("ignoring s3://%s/%s: %s", bucket, _key(prefix, f"checkpoint-{step}"), why)
    return found


def newest_s3(client, uri: str) -> Found | None:
    """The highest-step checkpoint under `uri` whose manifest exists and whose files all match it."""
    return max(s3_checkpoints(client, uri), key=lambda f: f.step, default=None)


def upload_directory(client, directory: str | os.PathLike, uri: str) -> str:
    """Upload a directory that has a manifest; verify every object; put the manifest last.

    Returns the s3:// prefix. Raises CheckpointError when S3 does not hold what was sent.
    """
    root = Path(directory)
    manifest = read_manifest(root)
    if manifest is None:
        raise CheckpointError(f"{root} has no {MANIFEST}; write it before uploading")
    files = manifest_files(manifest, str(root))
    if links_under(root):
        raise UnsafeCheckpoint(f"{root}: holds symbolic links; a checkpoint holds files only")
    bucket, prefix = parse_s3_uri(uri)
    for name, entry in files.items():
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


def prune_s3(client, uri: str, keep: int, run_id: str | None, protect: Iterable[int] = ()) -> list[int]:
    """Delete the run's S3 checkpoints beyond its `keep` newest; returns the steps deleted.

    Other runs' checkpoints stay. Unfinished uploads (no manifest) older than every kept checkpoint
    go too; newer ones are left alone (one may be in flight).
    """
    bucket, prefix = parse_s3_uri(uri)
    steps = _s3_checkpoint_steps(client, bucket, prefix)
    complete, with_manifest = [], set()
    for step in steps:
        checkpoint, _why, manifest = _inspect_s3(client, bucket, _key(prefix, f"checkpoint-{step}"), step)
        if checkpoint is not None:
            complete.append(checkpoint)
        if manifest is not None:
            with_manifest.add(step)
    older, unfinished = to_prune(complete, [s for s in steps if s not in with_manifest - {f.step for f in complete}],
                                  keep, run_id, protect)
    deleted = []
    for step in sorted({f.step for f in older} | set(unfinished)):
        checkpoint_prefix = _key(prefix, f"checkpoint-{step}")
        # the manifest goes first, so a half-deleted checkpoint never looks complete
        client.delete_object(Bucket=bucket, Key=_key(checkpoint_prefix, MANIFEST))
        keys = list(_remote_sizes(client, bucket, checkpoint_prefix))
        for start in range(0, len(keys), 1000):
            client.delete_objects(Bucket=bucket, Delete={"Objects": [
                {"Key": _key(checkpoint_prefix, k)} for k in keys[start:start + 1000]], "Quiet": True})
        deleted.append(step)
    return deleted


def _clear(path: Path) -> None:
    """Remove whatever is at `path` (a link is removed, never followed)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def download_checkpoint(client, location: str, destination: str | os.PathLike) -> str:
    """Fetch a complete S3 checkpoint into `destination` (verified, manifest last, atomic rename).

    Every name in the manifest is checked before anything is written: UnsafeCheckpoint for one that
    would land outside the checkpoint folder.
    """
    bucket, prefix = parse_s3_uri(location)
    manifest = _remote_manifest(client, bucket, prefix)
    if manifest is None:
        raise CheckpointError(f"{location} has no {MANIFEST}; it is not a complete checkpoint")
    files = manifest_files(manifest, location)
    target = Path(destination)
    partial = target.with_name(target.name + ".download")
    _clear(partial)
    partial.mkdir(parents=True)
    for name, entry in files.items():
        path = partial / name
        path.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(bucket, _key(prefix, name), str(path))
        if sha256_of(path) != entry["sha256"]:
            raise CheckpointError(f"{location}/{name}: downloaded bytes do not match the manifest's SHA-256")
    (partial / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    _clear(target)
    os.replace(partial, target)
    return str(target)
