"""`fab preflight`'s EBS key check (node_setup/aws/ebs_key.py): the account's default EBS key encrypts the
workers' volumes, and the group's service-linked role, not the caller, launches them. moto is the account
(its KMS keys, key policies and grants); GetEbsDefaultKmsKeyId, which moto lacks, is tests/aws/ebs_default_key.py's
test double (the key ModifyEbsDefaultKmsKeyId set, else alias/aws/ebs)."""

from __future__ import annotations

import json

import boto3
import pytest

from cluster.stack.spec import ClusterSpec
from node_setup.aws import ebs_key
from node_setup.aws.findings import OK, SKIPPED, WARN, AwsClients, Report
from tests.aws import ebs_default_key
from tests.conftest import AWS_TEST_REGION as REGION
from tests.infra.conftest import minimal_config

ACCOUNT = "123456789012"  # moto's
ROLE = f"arn:aws:iam::{ACCOUNT}:role/aws-service-role/autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling"
ROOT_ONLY = {"Version": "2012-10-17", "Statement": [{  # the policy KMS gives a new key: the account's IAM decides
    "Sid": "Enable IAM User Permissions", "Effect": "Allow", "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"},
    "Action": "kms:*", "Resource": "*"}]}
FOR_THE_ROLE = {"Sid": "Allow service-linked role use of the customer managed key", "Effect": "Allow",
                "Principal": {"AWS": [ROLE]}, "Resource": "*",
                "Action": ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:DescribeKey"]}
ITS_GRANTS = {"Sid": "Allow attachment of persistent resources", "Effect": "Allow", "Principal": {"AWS": [ROLE]},
              "Action": ["kms:CreateGrant"], "Resource": "*",
              "Condition": {"Bool": {"kms:GrantIsForAWSResource": True}}}


@pytest.fixture
def account(mocked_aws, monkeypatch):
    ebs_default_key.install(monkeypatch)
    return AwsClients(sts=boto3.client("sts", region_name=REGION), ec2=boto3.client("ec2", region_name=REGION),
                      quotas=None, kms=boto3.client("kms", region_name=REGION))


def _finding(clients: AwsClients, **config):
    report = Report(region=REGION)
    ebs_key.check_ebs_key(report, clients, ClusterSpec.from_config(minimal_config(**config), stack="dev",
                                                                   region=REGION))
    (finding,) = report.findings
    assert finding.check == "ebs-key"
    return finding


def _default_key(clients: AwsClients, policy: dict) -> str:
    key = clients.kms.create_key(Policy=json.dumps(policy))["KeyMetadata"]["KeyId"]
    clients.ec2.modify_ebs_default_kms_key_id(KmsKeyId=key)
    return key


def test_the_aws_managed_default_key_passes(account):
    finding = _finding(account)
    assert finding.status == OK and "AWS managed key aws/ebs" in finding.message


def test_a_customer_managed_default_key_the_service_role_may_not_use_is_a_warning_naming_the_fix(account):
    key = _default_key(account, ROOT_ONLY)
    finding = _finding(account)
    assert finding.status == WARN and key in finding.message and ROLE in finding.message
    assert "every worker's launch would fail" in finding.message
    assert f"--grantee-principal {ROLE}" in finding.fix
    assert "reset-ebs-default-kms-key-id --region us-east-1" in finding.fix
    assert "kms:GrantIsForAWSResource" in finding.fix


def test_a_key_whose_policy_or_a_grant_names_the_service_role_passes(account):
    _default_key(account, {**ROOT_ONLY, "Statement": ROOT_ONLY["Statement"] + [FOR_THE_ROLE, ITS_GRANTS]})
    finding = _finding(account)
    assert finding.status == OK and "policy lets the Auto Scaling service role use it" in finding.message
    key = _default_key(account, ROOT_ONLY)
    account.kms.create_grant(KeyId=key, GranteePrincipal=ROLE, Operations=[
        "Encrypt", "Decrypt", "ReEncryptFrom", "ReEncryptTo", "GenerateDataKey", "GenerateDataKeyWithoutPlaintext",
        "DescribeKey", "CreateGrant"])
    finding = _finding(account)
    assert finding.status == OK and "grant lets the Auto Scaling service role use it" in finding.message


def test_a_policy_for_the_role_without_creategrant_is_not_enough():
    assert not ebs_key.policy_allows(json.dumps({"Statement": [FOR_THE_ROLE]}), ROLE)
    assert ebs_key.policy_allows(json.dumps({"Statement": [FOR_THE_ROLE, ITS_GRANTS]}), ROLE)
    other = {**FOR_THE_ROLE, "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:role/someone-else"}}
    assert not ebs_key.policy_allows(json.dumps({"Statement": [other, ITS_GRANTS]}), ROLE)
    assert not ebs_key.policy_allows("not json", ROLE)


def test_no_workers_nothing_to_check_and_preflight_runs_it_after_pass_role(account, monkeypatch):
    assert _finding(account, workerCount=0).status == SKIPPED
    from node_setup.aws import preflight
    from node_setup.aws.preflight import run_preflight

    monkeypatch.setattr(preflight, "check_quotas", lambda report, clients, spec: None)  # Service Quotas: not here

    report = run_preflight(ClusterSpec.from_config(minimal_config(), stack="dev", region=REGION),
                           clients=account, public_ip=None)
    checks = [f.check for f in report.findings]
    assert checks.index("ebs-key") == checks.index("console") + 1 == checks.index("pass-role") + 2
