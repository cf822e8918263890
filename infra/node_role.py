"""What the nodes may do in AWS: two roles, each what its nodes' work needs and nothing else.

- The workers' role (the node role, `<cluster>-node-*`): read and write checkpoints in the cluster's
  bucket, nothing else. The training job uploads checkpoints to `s3://<bucket>/...` and reads them
  back on `--resume` with the instance's credentials from IMDS (boto3's default chain):
  `s3:ListBucket` on the bucket (finding checkpoints to resume from and prune) and object read, write,
  delete and multipart abort on its objects; no `*` resource, no other action. `DeleteObjects` (batch
  delete, used by pruning) is authorised per key by `s3:DeleteObject`, and multipart upload (create,
  part, complete) by `s3:PutObject`. Any rank's code runs with it: it can touch no instance, group or
  console.
- The master's role (`<cluster>-node-master-*`): the same bucket access (rank 0 writes checkpoints
  too), and what only the master does:
  - `group_capacity_policy`: the idle auto-stop sets the cluster's own worker group, then the master's
    group (their two ARNs, no wildcard) to 0 before the nodes power off, so that neither group launches
    them again.
    `autoscaling:UpdateAutoScalingGroup` is allowed only when the request sets the group's minimum
    AND maximum size to 0 (`autoscaling:MinSize`, `autoscaling:MaxSize`: the sizes in the request;
    a key the request lacks fails `NumericEquals`). Auto Scaling has no condition key for the desired
    capacity, but AWS keeps it between the two, so it is 0 as well: the master can stop its workers
    and never start or add one. The other fields of the same call cannot all be conditioned; with a
    maximum of 0 the group launches nothing whatever they are, a new launch template needs
    `ec2:RunInstances` (not granted), and `fab up` (`pulumi up --refresh`) sets the program's values back.
    And `autoscaling:TerminateInstanceInAutoScalingGroup` on the worker group alone: the run supervisor hands
    back a replacement it cannot admit (no host key its console lists in time, another key), so that the
    group launches another instead of keeping it, billed and idle. The call cannot lower the group's
    size: AWS refuses to decrement a desired capacity that equals the minimum, as the program sets it.
  - `supervisor_read_policy`: what the run supervisor (node_setup/backends/aws.py, `AwsGroup`) reads to
    follow its workers: the group's instances (`autoscaling:DescribeAutoScalingGroups`), their states
    and addresses (`ec2:DescribeInstances`), both only in the stack's region (`aws:RequestedRegion`:
    the two Describe calls take no resource-level permission or tag condition in IAM, so they are `*`),
    and a new worker's console, whose host key fingerprints it verifies (`ec2:GetConsoleOutput`),
    limited to instances carrying the cluster's tag.
  - `run_store_policy`: what a new master's boot step reads to continue a supervised run
    (node_setup/supervisor/boot.py): the cluster's own SSM parameters under `/xeon-cluster/<cluster>`
    (the cluster key and each run's secrets: `ssm:GetParameter`, `ssm:GetParametersByPath`, and
    `ssm:DeleteParameter` of a run's record once it ended), decrypted with `kms:Decrypt` only through SSM
    (`kms:ViaService`). The workers' role reads no parameter.

Each role is assumable by EC2 only, with its instance profile; the master instance launches with the
master's, the workers' launch template names the workers'. The policies are inline
(`aws.iam.RolePolicy`): they exist for their role only and are deleted with it. It is its own
component, not part of `CheckpointBucket`: the bucket's children are kept on `pulumi destroy` by
default (`retain_on_delete`), while the roles and profiles must always go with the cluster. A profile
depends on its role's policies, and the instances take the profile's name as an input, so a node never
boots with a role that lacks its permissions, and destroy removes the nodes first. The group policy is
made after the group (it names the group's ARN, and the group's template names the workers' profile).
docs/security.md lists what each role allows; tests/infra/test_node_roles.py checks that list against
these policies.
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from cluster.run.runspec import STORE_ROOT
from cluster.stack.spec import ClusterSpec
from cluster.stack.tags import CLUSTER_KEY

EC2_SERVICE = "ec2.amazonaws.com"
BUCKET_ACTIONS = ("s3:ListBucket",)
OBJECT_ACTIONS = ("s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload")
GROUP_ACTIONS = ("autoscaling:UpdateAutoScalingGroup",)
HAND_BACK_ACTIONS = ("autoscaling:TerminateInstanceInAutoScalingGroup",)
# The sizes the auto-stop's call must set (cluster/shell/autostop-stop-group.sh sets all three to 0); IAM's
# condition values are strings, also for the numeric operators.
STOPPED_SIZES = {"autoscaling:MinSize": "0", "autoscaling:MaxSize": "0"}
DESCRIBE_ACTIONS = ("autoscaling:DescribeAutoScalingGroups", "ec2:DescribeInstances")
CONSOLE_ACTIONS = ("ec2:GetConsoleOutput",)
RUN_STORE_ACTIONS = ("ssm:GetParameter", "ssm:GetParametersByPath", "ssm:DeleteParameter")
DECRYPT_ACTIONS = ("kms:Decrypt",)
MASTER_SUFFIX = "-master"  # the master's role and profile: the node role's name and this


def assume_role_policy() -> str:
    """Trust policy: only the EC2 service may assume the role (for instances launched with it)."""
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [{
            "Effect": "Allow",
            "Principal": {"Service": EC2_SERVICE},
            "Action": "sts:AssumeRole",
        }],
    })


def checkpoint_policy(bucket_arn: str) -> str:
    """Least privilege on one bucket: list it, and read/write/delete/abort uploads of its objects."""
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "ListCheckpoints", "Effect": "Allow", "Action": list(BUCKET_ACTIONS),
             "Resource": bucket_arn},
            {"Sid": "ReadWriteCheckpoints", "Effect": "Allow", "Action": list(OBJECT_ACTIONS),
             "Resource": f"{bucket_arn}/*"},
        ],
    })


def group_capacity_policy(group_arn: str, master_group_arn: str) -> str:
    """The master's permissions on the cluster's own groups: set the workers' and then its own to 0 (the
    auto-stop) and hand back one of the workers (the supervisor), nothing else."""
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Sid": "StopOwnWorkerGroup", "Effect": "Allow", "Action": list(GROUP_ACTIONS),
                       "Resource": group_arn, "Condition": {"NumericEquals": dict(STOPPED_SIZES)}},
                      {"Sid": "StopOwnMasterGroup", "Effect": "Allow", "Action": list(GROUP_ACTIONS),
                       "Resource": master_group_arn, "Condition": {"NumericEquals": dict(STOPPED_SIZES)}},
                      {"Sid": "HandBackOwnWorker", "Effect": "Allow", "Action": list(HAND_BACK_ACTIONS),
                       "Resource": group_arn}],
    })


def supervisor_read_policy(cluster: str, region: str) -> str:
    """The supervisor's reads: the Describe calls in the stack's region (no resource-level permissions
    exist for them) and the console of the cluster's own instances only (by its tag)."""
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "SupervisorDescribeWorkers", "Effect": "Allow", "Action": list(DESCRIBE_ACTIONS), "Resource": "*",
             "Condition": {"StringEquals": {"aws:RequestedRegion": region}}},
            {"Sid": "SupervisorReadOwnConsoles", "Effect": "Allow", "Action": list(CONSOLE_ACTIONS),
             "Resource": f"arn:aws:ec2:{region}:*:instance/*",
             "Condition": {"StringEquals": {f"ec2:ResourceTag/{CLUSTER_KEY}": cluster}}},
        ],
    })


def run_store_policy(cluster: str, region: str) -> str:
    """What a new master's boot step reads of the run store (node_setup/aws/run_secrets.py): the cluster's own
    SecureString parameters, decrypted through SSM with the account's key, and the run's record deleted once the
    run ended; no other parameter, and the workers' role gets none of it."""
    parameters = f"arn:aws:ssm:{region}:*:parameter{STORE_ROOT}/{cluster}"
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "MasterReadsOwnRunStore", "Effect": "Allow", "Action": list(RUN_STORE_ACTIONS),
             "Resource": f"{parameters}/*"},
            {"Sid": "MasterDecryptsThroughSsm", "Effect": "Allow", "Action": list(DECRYPT_ACTIONS), "Resource": "*",
             "Condition": {"StringEquals": {"kms:ViaService": f"ssm.{region}.amazonaws.com"}}},
        ],
    })


class NodeRole(pulumi.ComponentResource):
    """The workers' role and profile (`worker_profile_name`) and the master's (`master_profile_name`)."""

    def __init__(self, name: str, spec: ClusterSpec, *, bucket_arn: pulumi.Input[str], tags: dict[str, str],
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("xeon-cluster:infra:NodeRole", name, None, opts)
        self._name, self._tags = name, tags
        checkpoints = pulumi.Output.from_input(bucket_arn).apply(checkpoint_policy)
        # The workers' role keeps the names one role for every node had, so a stack made before keeps
        # its workers' profile (the launch template names it: a new name would replace the group).
        self.role, self.profile = self._role(
            name, f"xeon-cluster {spec.cluster_name}: workers read and write checkpoints in the cluster bucket",
            {"checkpoints": checkpoints})
        self.master_role, self.master_profile = self._role(
            name + MASTER_SUFFIX, f"xeon-cluster {spec.cluster_name}: the master: checkpoints, its worker group's "
                                  "stop, the supervisor's reads",
            {"checkpoints": checkpoints,
             "supervisor-read": supervisor_read_policy(spec.cluster_name, spec.region),
             "run-store": run_store_policy(spec.cluster_name, spec.region)})
        self.worker_profile_name = self.profile.name
        self.master_profile_name = self.master_profile.name
        self.register_outputs({"roleArn": self.role.arn, "instanceProfileName": self.profile.name,
                               "masterRoleArn": self.master_role.arn,
                               "masterInstanceProfileName": self.master_profile.name})

    def _role(self, name: str, description: str,
              policies: dict[str, pulumi.Input[str]]) -> tuple[aws.iam.Role, aws.iam.InstanceProfile]:
        child = pulumi.ResourceOptions(parent=self)
        role = aws.iam.Role(name, assume_role_policy=assume_role_policy(), description=description,
                            tags={**self._tags, "Name": name}, opts=child)
        # RolePolicy takes no tags (not taggable in IAM: inline policies are part of the role).
        made = [aws.iam.RolePolicy(f"{name}-{what}", role=role.id, policy=policy, opts=child)  # a role's id: its name
                for what, policy in policies.items()]
        profile = aws.iam.InstanceProfile(name, role=role.id, tags={**self._tags, "Name": name},
                                          opts=pulumi.ResourceOptions(parent=self, depends_on=made))
        return role, profile

    def allow_group_capacity(self, group_arn: pulumi.Input[str],
                             master_group_arn: pulumi.Input[str]) -> aws.iam.RolePolicy:
        """The master's inline policy on the cluster's two groups (the auto-stop's stop, the supervisor's
        hand-back of a worker)."""
        self.group_policy = aws.iam.RolePolicy(
            f"{self._name}{MASTER_SUFFIX}-worker-group",
            role=self.master_role.id,
            policy=pulumi.Output.all(group_arn, master_group_arn).apply(lambda arns: group_capacity_policy(*arns)),
            opts=pulumi.ResourceOptions(parent=self))
        return self.group_policy
