"""Preflight's EBS key check: may the Auto Scaling service role use the key that encrypts the workers' volumes?

The workers' launch template asks for an encrypted root volume without naming a key (infra/node_group.py), so
EBS encrypts it with the account's default EBS key of the region (GetEbsDefaultKmsKeyId); the master's
volume and the image baked from it too. The workers are launched by the group's service-linked role,
AWSServiceRoleForAutoScaling, not with the caller's credentials: its permissions cover the AWS managed key
(aws/ebs) and no customer managed key, which it may use only where the key's policy or a grant names it
(Amazon EC2 Auto Scaling User Guide, "Required AWS KMS key policy for use with encrypted volumes"). Without
that every worker launch fails, while preflight's dry run, made with the caller's credentials, passes.

So: the default key (alias/aws/ebs, or a key whose KeyManager is AWS) passes; a customer managed key passes
when an Allow statement of its policy for the role (by ARN; conditions are not evaluated) or a grant to the
role covers ROLE_NEEDS, and is a warning naming the fix otherwise.
"""

from __future__ import annotations

import json
from fnmatch import fnmatchcase

from botocore.exceptions import ClientError

from cluster.stack.spec import ClusterSpec
from node_setup.aws import errors
from node_setup.aws.findings import OK, SKIPPED, WARN, AwsClients, Report

CHECK = "ebs-key"
AWS_MANAGED_KEY = "alias/aws/ebs"  # what GetEbsDefaultKmsKeyId answers where no customer managed key was set
SERVICE_ROLE = "aws-service-role/autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling"
# What the role does with the key to launch an instance with an encrypted volume (key policy actions, and the
# grant operations that stand for them).
ROLE_NEEDS = ("kms:CreateGrant", "kms:Decrypt", "kms:GenerateDataKeyWithoutPlaintext")
GRANT_NEEDS = tuple(action.split(":", 1)[1] for action in ROLE_NEEDS)


def service_role_arn(key_arn: str, account: str) -> str:
    """The Auto Scaling service-linked role of `account`, in the key's partition."""
    partition = key_arn.split(":")[1] if key_arn.startswith("arn:") else "aws"
    return f"arn:{partition}:iam::{account}:role/{SERVICE_ROLE}"


def _listed(value) -> list[str]:
    return [value] if isinstance(value, str) else [str(v) for v in value or []]


def policy_allows(policy_text: str, role: str) -> bool:
    """Whether the key policy's Allow statements for `role` (or for any principal) cover ROLE_NEEDS."""
    try:
        statements = json.loads(policy_text).get("Statement") or []
    except (ValueError, AttributeError):
        return False
    covered: set[str] = set()
    for statement in [statements] if isinstance(statements, dict) else statements:
        principal = statement.get("Principal")
        names = _listed(principal.get("AWS") if isinstance(principal, dict) else principal)
        if statement.get("Effect") != "Allow" or not (role in names or "*" in names):
            continue
        actions = [a.lower() for a in _listed(statement.get("Action"))]
        covered |= {need for need in ROLE_NEEDS if any(fnmatchcase(need.lower(), a) for a in actions)}
    return covered == set(ROLE_NEEDS)


def grants_allow(grants: list[dict], role: str) -> bool:
    """Whether the key's grants to `role` cover GRANT_NEEDS."""
    operations = {op for g in grants if g.get("GranteePrincipal") == role for op in g.get("Operations") or []}
    return set(GRANT_NEEDS) <= operations


def _fix(role: str, key: str, region: str) -> str:
    return (f"let the role use the key: a statement in the key's policy allowing {role} kms:Encrypt, kms:Decrypt, "
            "kms:ReEncrypt*, kms:GenerateDataKey*, kms:DescribeKey and kms:CreateGrant (with the condition "
            "kms:GrantIsForAWSResource true), as the Auto Scaling user guide's \"Required AWS KMS key policy for "
            f"use with encrypted volumes\" shows, or `aws kms create-grant --key-id {key} --grantee-principal {role} "
            "--operations Encrypt Decrypt ReEncryptFrom ReEncryptTo GenerateDataKey GenerateDataKeyWithoutPlaintext "
            "DescribeKey CreateGrant`; or encrypt with the AWS managed key by default again: "
            f"`aws ec2 reset-ebs-default-kms-key-id --region {region}`")


def check_ebs_key(report: Report, clients: AwsClients, spec: ClusterSpec) -> None:
    """The finding for the account's default EBS key (none without a KMS client: nothing to ask)."""
    if clients.kms is None:
        return
    if not spec.worker_count:
        report.add(CHECK, SKIPPED, "no workers: the group launches no instance with the default EBS key")
        return
    try:
        key = clients.ec2.get_ebs_default_kms_key_id().get("KmsKeyId") or AWS_MANAGED_KEY
    except ClientError as exc:
        report.add(CHECK, WARN, f"could not read the account's default EBS key ({errors.describe(exc)})",
                   "allow ec2:GetEbsDefaultKmsKeyId, or check that the Auto Scaling service role may use it")
        return
    managed = "the AWS managed key aws/ebs, which the Auto Scaling service role may use"
    if key == AWS_MANAGED_KEY or key.endswith(":" + AWS_MANAGED_KEY):
        report.add(CHECK, OK, f"the workers' volumes are encrypted with the account's default EBS key, {managed}")
        return
    try:
        meta = clients.kms.describe_key(KeyId=key)["KeyMetadata"]
        if meta.get("KeyManager") == "AWS":
            report.add(CHECK, OK, f"the account's default EBS key {key} is {managed}")
            return
        role = service_role_arn(meta["Arn"], clients.sts.get_caller_identity()["Account"])
        allowed = policy_allows(clients.kms.get_key_policy(KeyId=meta["KeyId"], PolicyName="default")["Policy"], role)
        grants = [] if allowed else [g for page in clients.kms.get_paginator("list_grants").paginate(
            KeyId=meta["KeyId"]) for g in page.get("Grants", [])]
    except ClientError as exc:
        report.add(CHECK, WARN, f"could not check whether the Auto Scaling service role may use the account's "
                   f"default EBS key {key} ({errors.describe(exc)})",
                   "allow kms:DescribeKey, kms:GetKeyPolicy and kms:ListGrants on it, or check its policy by hand")
        return
    if allowed or grants_allow(grants, role):
        report.add(CHECK, OK, f"the account's default EBS key {key} is a customer managed key whose "
                   f"{'policy' if allowed else 'grant'} lets the Auto Scaling service role use it")
        return
    report.add(CHECK, WARN, f"the account's default EBS key {key} is a customer managed key that the Auto Scaling "
               f"service role ({role}) may not use: every worker's launch would fail, though the dry run (with your "
               "credentials) passes", _fix(role, meta["KeyId"], spec.region))
