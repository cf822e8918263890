"""A supervised run's spec beside its checkpoints in S3 (cluster/run/runspec.py says what it holds and where):
written by `fab train --managed` at the hand-off, read by `fab train --managed --resume`."""

from __future__ import annotations

from cluster.job.job_args import parse_s3_uri
from node_setup.aws import clients, errors


def put(uri: str, text: str, s3=None, region: str | None = None) -> str | None:
    """Write `text` at `uri`; None when written, else why not (one line)."""
    try:
        bucket, key = parse_s3_uri(uri, "--checkpoint-uri")
        (s3 or clients.client("s3", region)).put_object(Bucket=bucket, Key=key, Body=text.encode(),
                                                        ContentType="application/json")
    except (clients.AwsSetupError, *errors.AWS_ERRORS) as exc:
        return errors.describe(exc)
    return None


def get(uri: str, s3=None, region: str | None = None) -> tuple[str | None, str]:
    """(the text at `uri`, "") or (None, why not: one line)."""
    try:
        bucket, key = parse_s3_uri(uri, "--checkpoint-uri")
        body = (s3 or clients.client("s3", region)).get_object(Bucket=bucket, Key=key)["Body"].read()
    except (clients.AwsSetupError, *errors.AWS_ERRORS) as exc:
        return None, ("not found" if errors.code(exc) in ("NoSuchKey", "404") else errors.describe(exc))
    return body.decode(errors="replace"), ""
