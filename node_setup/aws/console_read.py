"""`fab preflight`'s console-read check: may the caller read the console of the cluster's instances
(ec2:GetConsoleOutput)? `pulumi up`'s setup step reads the master's console with the caller's credentials before
its first SSH command (infra/setup_step.py: the master's host key is verified from it), and `fab` reads each new
node's (node_setup/aws/console.py); without the permission `pulumi up` launches the master, billed, and then
stops at the setup step. The instances do not exist before `pulumi up`, so IAM's policy simulator
(SimulatePrincipalPolicy) is asked, for the caller the pass-role check found (node_setup/aws/pass_role.py), about
an instance of the region carrying the cluster's tag. Called by `run_preflight` (node_setup/aws/preflight.py).
"""

from __future__ import annotations

from botocore.exceptions import ClientError

from cluster.stack.spec import ClusterSpec
from cluster.stack.tags import CLUSTER_KEY
from node_setup.aws import errors
from node_setup.aws.findings import FAIL, OK, SKIPPED, WARN, AwsClients, Report
from node_setup.aws.pass_role import arn_parts

CHECK = "console"
ACTION = "ec2:GetConsoleOutput"


def instance_arn(spec: ClusterSpec, source_arn: str) -> str:
    """Any instance of the stack's region in the caller's account (the cluster's are made by `pulumi up`)."""
    partition, _, account, _ = arn_parts(source_arn) or ("aws", "", "", "")
    return f"arn:{partition}:ec2:{spec.region}:{account}:instance/*"


def tag_context(spec: ClusterSpec) -> list[dict]:
    """The cluster's tag on the instance, as a policy that allows the read for the cluster's instances only names
    it (EC2's and the global condition key)."""
    return [{"ContextKeyName": f"{prefix}:ResourceTag/{CLUSTER_KEY}", "ContextKeyValues": [spec.cluster_name],
             "ContextKeyType": "string"} for prefix in ("ec2", "aws")]


def check_console_read(report: Report, clients: AwsClients, spec: ClusterSpec, source: str | None) -> None:
    """Would reading a cluster instance's console (ec2:GetConsoleOutput) be allowed for `source` (the caller's IAM
    user or role, as the pass-role check found it; None: not simulated)?"""
    if clients.iam is None or source is None:
        report.add(CHECK, SKIPPED, f"{ACTION} is not checked (no IAM identity to simulate, see pass-role); make sure "
                   "you may read the console of the cluster's instances: `pulumi up` verifies the master's host key "
                   "from it")
        return
    resource = instance_arn(spec, source)
    fix = (f"allow {ACTION} on {resource} (it may be limited to instances tagged {CLUSTER_KEY}={spec.cluster_name}) "
           "for your IAM identity, or lift the SCP/permission boundary that denies it")
    try:
        answer = clients.iam.simulate_principal_policy(PolicySourceArn=source, ActionNames=[ACTION],
                                                       ResourceArns=[resource], ContextEntries=tag_context(spec))
    except ClientError as exc:
        why = "access denied to iam:SimulatePrincipalPolicy" if errors.is_denied(exc) else errors.describe(exc)
        report.add(CHECK, WARN, f"could not check that {source} may read the cluster's consoles ({ACTION}): {why}",
                   f"allow iam:SimulatePrincipalPolicy on {source} for your IAM identity, or make sure you may "
                   f"read the console of instances tagged {CLUSTER_KEY}={spec.cluster_name}")
        return
    decision = answer["EvaluationResults"][0]["EvalDecision"]
    if decision == "allowed":
        report.add(CHECK, OK, f"{source} may read the console of the cluster's instances ({ACTION}), where `pulumi "
                   "up` verifies the master's host key and `fab` each new node's")
        return
    report.add(CHECK, FAIL, f"{source} may not read the console of the cluster's instances: {ACTION} on {resource} "
               f"is {decision}; `pulumi up` would launch the master and then stop at its setup step, which "
               "verifies the master's host key from its console", fix)
