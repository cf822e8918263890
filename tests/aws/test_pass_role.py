"""`fab preflight`'s pass-role check (node_setup/aws/pass_role.py): may the caller pass the node role
to EC2 (iam:PassRole)? moto has no IAM policy simulator, so SimulatePrincipalPolicy and GetRole
are answered by `stubbed_iam` (tests/aws/test_preflight.py), a test double on botocore's Stubber
that checks each request; the callers (an IAM user, assumed-role sessions) are moto's.
"""

import boto3
import pytest
from botocore.stub import Stubber

moto = pytest.importorskip("moto")

from node_setup.aws.findings import OK, SKIPPED, WARN, AwsClients, Report  # noqa: E402
from node_setup.aws.pass_role import check_pass_role, role_arn_of_session  # noqa: E402
from node_setup.aws.preflight import run_preflight  # noqa: E402
from node_setup.aws.quotas import SPOT_QUOTA_CODE  # noqa: E402
from tests.aws.test_preflight import (  # noqa: E402
    assumed_role_session,
    MOTO_CALLER,
    MY_ADDRESS,
    NODE_ROLE,
    canonical_image,
    clients,
    spec_for,
    stubbed_iam,
    stubbed_service_quotas,
)


@pytest.mark.parametrize("caller, role", [
    ("arn:aws:sts::123456789012:assumed-role/deployer/alice", "arn:aws:iam::123456789012:role/deployer"),
    ("arn:aws-us-gov:sts::123456789012:assumed-role/AWSReservedSSO_Admin_0123456789abcdef/bob@example.com",
     "arn:aws-us-gov:iam::123456789012:role/AWSReservedSSO_Admin_0123456789abcdef"),
    ("arn:aws:iam::123456789012:user/deployer", None),
    ("arn:aws:iam::123456789012:root", None),
    ("arn:aws:sts::123456789012:federated-user/carol", None),
    ("not-an-arn", None),
])
def test_an_assumed_role_session_is_simulated_as_its_role_not_as_the_session(caller, role):
    assert role_arn_of_session(caller) == role


def test_pass_role_allowed_for_an_iam_user(mocked_aws):
    iam, stub = stubbed_iam(("simulate", MOTO_CALLER, "allowed"))
    report = Report(region="us-east-1")
    check_pass_role(report, clients(iam=iam), spec_for())
    stub.assert_no_pending_responses()
    (finding,) = report.findings
    assert finding.status == OK and NODE_ROLE in finding.message and "ec2.amazonaws.com" in finding.message


def test_pass_role_of_an_assumed_role_asks_about_the_role_with_its_path(mocked_aws):
    """An IAM Identity Center session: the simulation needs the role's ARN, which has a path."""
    sso_role = "arn:aws:iam::123456789012:role/aws-reserved/sso.amazonaws.com/AWSReservedSSO_Admin_0123456789abcdef"
    session = assumed_role_session(sso_role, "alice")
    iam, stub = stubbed_iam(("role", "AWSReservedSSO_Admin_0123456789abcdef", sso_role),
                            ("simulate", sso_role, "allowed"))
    report = Report(region="us-east-1")
    check_pass_role(report, clients(session=session, iam=iam), spec_for())
    stub.assert_no_pending_responses()  # get_role, then the simulation with the role's full ARN
    assert report.findings[0].status == OK and sso_role in report.findings[0].message


def test_pass_role_of_an_assumed_role_without_get_role_uses_the_role_arn_without_a_path(mocked_aws):
    session = assumed_role_session("arn:aws:iam::123456789012:role/deployer", "ci")
    iam, stub = stubbed_iam(("role-error", "deployer", "AccessDenied"),
                            ("simulate", "arn:aws:iam::123456789012:role/deployer", "allowed"))
    report = Report(region="us-east-1")
    check_pass_role(report, clients(session=session, iam=iam), spec_for())
    stub.assert_no_pending_responses()
    assert report.findings[0].status == OK


@pytest.mark.parametrize("decision", ["implicitDeny", "explicitDeny"])
def test_pass_role_denied_fails_with_what_to_allow(mocked_aws, decision):
    iam, _ = stubbed_iam(("simulate", MOTO_CALLER, decision))
    report = Report(region="us-east-1")
    check_pass_role(report, clients(iam=iam), spec_for())
    (bad,) = report.failures
    assert bad.check == "pass-role" and decision in bad.message and NODE_ROLE in bad.message
    assert "iam:PassRole" in bad.fix and "xeon-dev-node-*" in bad.fix and "ec2.amazonaws.com" in bad.fix


def test_a_denied_policy_simulation_is_a_warning_that_the_check_was_not_made(mocked_aws):
    iam, stub = stubbed_iam(("simulate-error", MOTO_CALLER, "AccessDenied"),
                            ("console-error", MOTO_CALLER, "AccessDenied"))
    quotas, _ = stubbed_service_quotas(**{SPOT_QUOTA_CODE: 512})
    report = run_preflight(spec_for(baseAmi=canonical_image()), clients=clients(quotas=quotas, iam=iam),
                           public_ip=lambda: MY_ADDRESS)
    stub.assert_no_pending_responses()
    finding = next(f for f in report.findings if f.check == "pass-role")
    assert finding.status == WARN and "could not check" in finding.message
    assert "iam:PassRole" in finding.message and "access denied to iam:SimulatePrincipalPolicy" in finding.message
    assert "iam:SimulatePrincipalPolicy" in finding.fix
    assert report.exit_code == 0 and report.status_of("admin-cidr") == OK  # a warning, and the rest ran


def test_the_root_user_is_not_simulated(mocked_aws):
    sts = boto3.client("sts", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    sts_stub = Stubber(sts)
    sts_stub.add_response("get_caller_identity", {"UserId": "123456789012", "Account": "123456789012",
                                                  "Arn": "arn:aws:iam::123456789012:root"})
    sts_stub.activate()
    iam, iam_stub = stubbed_iam()  # no IAM call expected: the stub refuses any
    report = Report(region="us-east-1")
    check_pass_role(report, AwsClients(sts=sts, ec2=None, quotas=None, iam=iam), spec_for())
    iam_stub.assert_no_pending_responses()
    (finding,) = report.findings
    assert finding.status == SKIPPED and "iam:PassRole" in finding.message
