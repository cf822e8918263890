"""`fab preflight`'s console check (node_setup/aws/console_read.py): may the caller read the console of the
cluster's instances (ec2:GetConsoleOutput), where `pulumi up`'s setup step verifies the master's host key? moto
has no IAM policy simulator, so SimulatePrincipalPolicy (and GetRole) are answered by `stubbed_iam`
(tests/aws/test_preflight.py), a test double on botocore's Stubber that checks each request; the callers are moto's.
"""

import pytest

moto = pytest.importorskip("moto")

from node_setup.aws.console_read import check_console_read  # noqa: E402
from node_setup.aws.findings import FAIL, OK, SKIPPED, WARN, Report  # noqa: E402
from node_setup.aws.preflight import run_preflight  # noqa: E402
from node_setup.aws.quotas import SPOT_QUOTA_CODE  # noqa: E402
from tests.aws.test_preflight import (  # noqa: E402
    assumed_role_session,
    CLUSTER_INSTANCE,
    MOTO_CALLER,
    MY_ADDRESS,
    canonical_image,
    clients,
    spec_for,
    stubbed_iam,
    stubbed_service_quotas,
)


def _preflight(*iam_answers):
    quotas, _ = stubbed_service_quotas(**{SPOT_QUOTA_CODE: 512})
    iam, stub = stubbed_iam(*iam_answers)
    report = run_preflight(spec_for(baseAmi=canonical_image()), clients=clients(quotas=quotas, iam=iam),
                           public_ip=lambda: MY_ADDRESS)
    stub.assert_no_pending_responses()  # every simulation asked, each as expected
    return report


@pytest.mark.parametrize("decision", ["implicitDeny", "explicitDeny"])
def test_a_caller_who_may_not_read_the_consoles_fails_preflight_before_anything_is_launched(mocked_aws, decision):
    report = _preflight(("simulate", MOTO_CALLER, "allowed"), ("console", MOTO_CALLER, decision))
    assert report.exit_code == 1
    (bad,) = report.failures
    assert bad.check == "console" and f"ec2:GetConsoleOutput on {CLUSTER_INSTANCE} is {decision}" in bad.message
    assert "`pulumi up` would launch the master and then stop at its setup step" in bad.message
    assert bad.fix.startswith(f"allow ec2:GetConsoleOutput on {CLUSTER_INSTANCE} (it may be limited to instances "
                              "tagged xeon-cluster:cluster=xeon-dev) for your IAM identity")
    assert "\n" not in bad.message and report.status_of("admin-cidr") == OK  # the rest ran


def test_an_allowed_console_read_is_ok_and_asked_of_the_role_the_pass_role_check_found(mocked_aws):
    """An assumed-role session: GetRole once (the pass-role check's), then both simulations for that role."""
    role = "arn:aws:iam::123456789012:role/ops/deployer"
    session = assumed_role_session(role, "ci")
    quotas, _ = stubbed_service_quotas(session=session, **{SPOT_QUOTA_CODE: 512})
    iam, stub = stubbed_iam(("role", "deployer", role), ("simulate", role, "allowed"), ("console", role, "allowed"))
    report = run_preflight(spec_for(baseAmi=canonical_image()), clients=clients(session=session, quotas=quotas,
                                                                                iam=iam),
                           public_ip=lambda: MY_ADDRESS)
    stub.assert_no_pending_responses()
    (finding,) = [f for f in report.findings if f.check == "console"]
    assert finding.status == OK and role in finding.message and "ec2:GetConsoleOutput" in finding.message


def test_a_refused_simulation_is_a_warning_that_the_console_read_was_not_checked(mocked_aws):
    report = _preflight(("simulate", MOTO_CALLER, "allowed"), ("console-error", MOTO_CALLER, "AccessDenied"))
    (finding,) = [f for f in report.findings if f.check == "console"]
    assert finding.status == WARN and "access denied to iam:SimulatePrincipalPolicy" in finding.message
    assert "ec2:GetConsoleOutput" in finding.message and report.exit_code == 0


def test_without_an_identity_to_simulate_the_console_read_is_skipped_and_said():
    report = Report(region="us-east-1")
    check_console_read(report, clients(iam=None), spec_for(), None)
    (finding,) = report.findings
    assert finding.status == SKIPPED and "ec2:GetConsoleOutput is not checked" in finding.message
    assert FAIL not in [f.status for f in report.findings]
