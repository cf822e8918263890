"""`fab preflight`'s pass-role check: may the caller pass the node role to EC2 (iam:PassRole, which
launching with the node role's instance profile needs)? The role does not exist before `pulumi up`,
so IAM's policy simulator (SimulatePrincipalPolicy) is asked, for the caller's IAM user or the role
behind its assumed-role session, about a role named like the one `pulumi up` makes. Called by
`run_preflight` (node_setup/aws/preflight.py).
"""

from __future__ import annotations

from botocore.exceptions import ClientError

from cluster.stack.spec import ClusterSpec
from node_setup.aws import errors
from node_setup.aws.findings import FAIL, OK, SKIPPED, WARN, AwsClients, Report

# The service the node role is passed to (infra/node_role.py EC2_SERVICE), and the role's name as
# `pulumi up` makes it: Pulumi names the role `<cluster>-node-` plus 7 random hex characters.
EC2_SERVICE = "ec2.amazonaws.com"
NODE_ROLE_NAME_SUFFIX = "-node-0000000"


def arn_parts(arn: str) -> tuple[str, str, str, str] | None:
    """(partition, service, account, resource) of an ARN, None if it is not one."""
    parts = arn.split(":", 5)
    if len(parts) != 6 or parts[0] != "arn":
        return None
    return parts[1], parts[2], parts[4], parts[5]


def role_arn_of_session(caller_arn: str) -> str | None:
    """The IAM role ARN behind an assumed-role session ARN, without the role's path (the session ARN
    does not carry it): arn:aws:sts::<account>:assumed-role/<role>/<session> ->
    arn:aws:iam::<account>:role/<role>. None for any other ARN."""
    parts = arn_parts(caller_arn)
    if not parts or parts[1] != "sts" or not parts[3].startswith("assumed-role/"):
        return None
    partition, _, account, resource = parts
    return f"arn:{partition}:iam::{account}:role/{resource.split('/')[1]}"


def policy_source_arn(iam, caller_arn: str) -> str | None:
    """The ARN SimulatePrincipalPolicy takes for the caller: an IAM user's ARN as it is, the role of an
    assumed-role session (with its path, from iam:GetRole when allowed: IAM Identity Center roles live
    under /aws-reserved/...), None for the root user and federated users (not simulated)."""
    parts = arn_parts(caller_arn)
    if not parts:
        return None
    partition, _, account, resource = parts
    if resource.startswith("user/"):
        return f"arn:{partition}:iam::{account}:{resource}"
    role = role_arn_of_session(caller_arn)
    if role is None:
        return None
    try:
        return iam.get_role(RoleName=role.rsplit("/", 1)[1])["Role"]["Arn"]
    except ClientError:
        return role  # right for a role without a path; otherwise the simulation says NoSuchEntity


def node_role_arn(spec: ClusterSpec, source_arn: str) -> str:
    """An ARN like the node role's that `pulumi up` makes (infra/node_role.py), in the caller's account."""
    parts = arn_parts(source_arn)
    if parts is None:
        raise ValueError(f"not an ARN: {source_arn!r}")
    partition, _, account, _ = parts
    return f"arn:{partition}:iam::{account}:role/{spec.cluster_name}{NODE_ROLE_NAME_SUFFIX}"


def check_pass_role(report: Report, clients: AwsClients, spec: ClusterSpec) -> str | None:
    """Would launching with the node role's instance profile pass iam:PassRole? Asked of IAM's policy
    simulator for the caller's identity policies (with SCPs and permission boundaries, not an
    assumed role's session policy), since the role itself does not exist before `pulumi up`. Returns
    the ARN it simulated (the console-read check asks about the same one), None when there is none."""
    if clients.iam is None:
        report.add("pass-role", SKIPPED, "iam:PassRole of the node role is not checked (no IAM client)")
        return None
    caller = clients.sts.get_caller_identity()["Arn"]
    source = policy_source_arn(clients.iam, caller)
    if source is None:
        report.add("pass-role", SKIPPED, f"{caller} is not an IAM user or role session, which IAM's policy "
                   "simulator needs; make sure it may pass the node role to EC2 (iam:PassRole)")
        return None
    role = node_role_arn(spec, source)
    try:
        answer = clients.iam.simulate_principal_policy(
            PolicySourceArn=source, ActionNames=["iam:PassRole"], ResourceArns=[role],
            ContextEntries=[{"ContextKeyName": "iam:PassedToService", "ContextKeyValues": [EC2_SERVICE],
                             "ContextKeyType": "string"}])
    except ClientError as exc:
        why = "access denied to iam:SimulatePrincipalPolicy" if errors.is_denied(exc) else errors.describe(exc)
        report.add("pass-role", WARN, f"could not check that {source} may pass the node role to EC2 "
                   f"(iam:PassRole): {why}",
                   f"allow iam:SimulatePrincipalPolicy on {source} for your IAM identity, or make sure it may "
                   f"pass roles named {spec.cluster_name}-node-* to {EC2_SERVICE}")
        return source
    decision = answer["EvaluationResults"][0]["EvalDecision"]
    if decision == "allowed":
        report.add("pass-role", OK, f"{source} may pass the node role ({role}) to {EC2_SERVICE}")
        return source
    report.add("pass-role", FAIL, f"{source} may not pass the node role to EC2: iam:PassRole on {role} is "
               f"{decision}; launching the nodes with its instance profile would fail",
               f"allow iam:PassRole on arn:...:role/{spec.cluster_name}-node-* (condition iam:PassedToService "
               f"{EC2_SERVICE}) for your IAM identity, or lift the SCP/permission boundary that denies it")
    return source
