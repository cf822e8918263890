"""boto3 clients for the fab tasks: one place for region, retries and readable credential errors."""

from __future__ import annotations

import os
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import NoRegionError

# Throttling is retried with exponential backoff and a client-side rate limiter.
RETRY_CONFIG = Config(retries={"mode": "adaptive", "max_attempts": 8}, connect_timeout=10, read_timeout=60)


# A boto3 client: botocore makes its methods at run time, so to mypy it is Any (no stubs are installed).
Client = Any


class AwsSetupError(RuntimeError):
    """Credentials or region missing; the message says how to fix it."""


def resolve_region(region: str | None = None) -> str:
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    region = region or boto3.session.Session().region_name
    if not region:
        raise AwsSetupError("no AWS region: pass --region, set AWS_REGION, or `aws configure set region us-east-1`")
    known = boto3.session.Session().get_available_regions("ec2")
    if known and region not in known:
        raise AwsSetupError(f"region: {region!r} is not an EC2 region; allowed: {', '.join(sorted(known))}")
    return region


def client(service: str, region: str | None = None) -> Client:
    """A boto3 client with adaptive retries; raises AwsSetupError when no region can be found."""
    try:
        return boto3.client(service, region_name=resolve_region(region), config=RETRY_CONFIG)
    except NoRegionError as exc:  # pragma: no cover - resolve_region catches this first
        raise AwsSetupError(str(exc)) from exc
