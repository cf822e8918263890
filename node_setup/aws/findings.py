"""Checks as findings: what each check found, and the AWS clients the checks use.

A check adds `Finding`s to a `Report` (ok, warn, FAIL, skipped, each with what to change);
`run_checks` runs checks in order so that a denied or failing AWS call becomes a finding of that
check and the next check still runs. Shared by the checks before `pulumi up`
(node_setup/aws/preflight.py) and before `fab train` (node_setup/aws/train_checks.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError

from node_setup.aws import clients as aws
from node_setup.aws import errors

OK, WARN, FAIL, SKIPPED = "ok", "warn", "FAIL", "skipped"


@dataclass(frozen=True)
class Finding:
    check: str
    status: str  # ok, warn, FAIL, skipped
    message: str
    fix: str = ""


@dataclass
class Report:
    region: str
    findings: list[Finding] = field(default_factory=list)

    def add(self, check: str, status: str, message: str, fix: str = "") -> Finding:
        finding = Finding(check, status, message, fix)
        self.findings.append(finding)
        return finding

    @property
    def failures(self) -> list[Finding]:
        return [f for f in self.findings if f.status == FAIL]

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def status_of(self, check: str) -> str | None:
        found = [f.status for f in self.findings if f.check == check]
        for status in (FAIL, WARN, OK, SKIPPED):
            if status in found:
                return status
        return None

    def render(self) -> str:
        lines = []
        for f in self.findings:
            lines.append(f"[{f.status:>7}] {f.check:<10} {f.message}")
            if f.fix:
                lines.append(f"{'':>10} {'':<10} -> {f.fix}")
        verdict = "launch should succeed" if self.ok else f"launch would fail ({len(self.failures)} problem(s))"
        lines.append(f"preflight ({self.region}): {verdict}")
        return "\n".join(lines)


@dataclass
class AwsClients:
    """The clients preflight uses; tests hand in moto clients or named test doubles."""
    sts: aws.Client
    ec2: aws.Client
    quotas: aws.Client
    iam: aws.Client | None = None  # preflight's iam:PassRole check (SimulatePrincipalPolicy); None: not checked
    kms: aws.Client | None = None  # preflight's EBS key check (node_setup/aws/ebs_key.py); None: not checked

    @classmethod
    def for_region(cls, region: str) -> "AwsClients":
        return cls(sts=aws.client("sts", region), ec2=aws.client("ec2", region),
                   quotas=aws.client("service-quotas", region), iam=aws.client("iam", region),
                   kms=aws.client("kms", region))


def denied(report: Report, check: str, action: str, exc: Exception) -> None:
    report.add(check, WARN, f"could not check: access denied to {action}",
               f"allow {action} for your IAM identity, or check this by hand")


def check_credentials(report: Report, clients: AwsClients) -> bool:
    try:
        ident = clients.sts.get_caller_identity()
    except (ClientError, NoCredentialsError, PartialCredentialsError) as exc:
        if errors.is_bad_credentials(exc):
            report.add("credentials", FAIL, "no usable AWS credentials", errors.credentials_hint(exc) or "")
            return False
        report.add("credentials", WARN, f"could not ask STS who we are ({errors.describe(exc)})")
        return True
    except BotoCoreError as exc:
        report.add("credentials", FAIL, f"cannot reach AWS ({exc})", "check the network and aws:region")
        return False
    report.add("credentials", OK, f"account {ident.get('Account')} as {ident.get('Arn')}")
    return True


def check_region(report: Report, region: str) -> bool:
    try:
        aws.resolve_region(region)
    except aws.AwsSetupError as exc:
        report.add("region", FAIL, str(exc), "`pulumi config set aws:region <region>` with a region listed above")
        return False
    report.add("region", OK, region)
    return True


def run_checks(report: Report, checks, service: str = "") -> None:
    """Run `(name, check)` in order; each check gets the results of the earlier ones by name.

    A denied or failing AWS call becomes a finding of that check and the next check still runs.
    """
    done: dict[str, Any] = {}
    for name, check in checks:
        try:
            done[name] = check(done)
        except ClientError as exc:
            if errors.is_denied(exc):
                denied(report, name, service + _operation_of(exc), exc)
            else:
                report.add(name, WARN, f"could not check: {errors.describe(exc)}")
        except BotoCoreError as exc:
            report.add(name, WARN, f"could not check: {exc}")


def _operation_of(exc: ClientError) -> str:
    match = re.search(r"calling the (\w+) operation", str(exc))
    return match.group(1) if match else "an AWS API"
