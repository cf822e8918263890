"""What an AWS error means, in one place: refused credentials, a denied permission, a resource
already gone, or something else; and a short text for messages.

Discovery, preflight, pricing and the sweep all branch on these classes rather than on codes.
"""

from __future__ import annotations

from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError

# The caller may not do this (IAM policy, SCP, permission boundary).
ACCESS_DENIED_CODES = frozenset({"AccessDenied", "AccessDeniedException", "UnauthorizedOperation",
                                 "UnauthorizedAccess", "AuthFailure"})
# AWS rejects the credentials themselves: every call would fail the same way.
CREDENTIAL_CODES = frozenset({"InvalidClientTokenId", "ExpiredToken", "ExpiredTokenException",
                              "SignatureDoesNotMatch", "UnrecognizedClientException", "InvalidAccessKeyId"})
# The resource no longer exists (deleting it again counts as done).
GONE_CODES = frozenset({"InvalidInstanceID.NotFound", "InvalidSpotInstanceRequestID.NotFound",
                        "InvalidAMIID.NotFound", "InvalidAMIID.Unavailable", "InvalidSnapshot.NotFound",
                        "InvalidVolume.NotFound", "InvalidPlacementGroup.Unknown", "InvalidKeyPair.NotFound",
                        "InvalidGroup.NotFound", "NoSuchBucket", "InvalidPermission.NotFound", "NoSuchEntity"})


def code(exc: BaseException) -> str:
    """The AWS error code of a ClientError ("AccessDenied" for a bare HTTP 403), else ""."""
    if not isinstance(exc, ClientError):
        return ""
    found = exc.response.get("Error", {}).get("Code", "")
    if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 403 and found in ("", "403"):
        return "AccessDenied"
    return found


def is_denied(exc: BaseException) -> bool:
    return isinstance(exc, ClientError) and (code(exc) in ACCESS_DENIED_CODES or "not authorized" in str(exc))


def is_bad_credentials(exc: BaseException) -> bool:
    return isinstance(exc, (NoCredentialsError, PartialCredentialsError)) or code(exc) in CREDENTIAL_CODES


def is_gone(exc: BaseException) -> bool:
    return code(exc) in GONE_CODES


def describe(exc: BaseException, limit: int = 200) -> str:
    """`Code: message` for a ClientError, the text of anything else; at most `limit` characters."""
    if isinstance(exc, ClientError):
        message = exc.response.get("Error", {}).get("Message", "")
        return f"{code(exc)}: {message}".rstrip(": ")[:limit]
    return str(exc)[:limit]


def credentials_hint(exc: BaseException) -> str | None:
    """What to do about missing or rejected credentials; None for other errors."""
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return ("no AWS credentials found: run `aws configure` or `aws sso login`, "
                "or set AWS_PROFILE / AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    if code(exc) in CREDENTIAL_CODES:
        return (f"AWS rejected the credentials ({describe(exc)}): refresh them (`aws sso login`, or new access "
                "keys) and check AWS_PROFILE")
    return None


AWS_ERRORS = (ClientError, BotoCoreError)
