"""What the nodes may do in AWS: read and write checkpoints in the cluster's bucket, nothing else.

The training job uploads checkpoints to `s3://<bucket>/...` and reads them back on `--resume` with
the instance's credentials from IMDS (boto3's default chain). This component makes the IAM role
those credentials belong to, assumable by EC2 only, and the instance profile every node launches
with. It is its own component, not part of `CheckpointBucket`: the bucket's children are kept on
`pulumi destroy` by default (`retain_on_delete`), while the role and profile must always go with
the cluster, and they belong to the nodes, not to the bucket.

The policy is inline (`aws.iam.RolePolicy`): it exists for this role only and is deleted with it.
It grants `s3:ListBucket` on the bucket (finding checkpoints to resume from and prune) and object
read, write, delete and multipart abort on the bucket's objects; no `*` resource, no other action.
`DeleteObjects` (batch delete, used by pruning) is authorised per key by `s3:DeleteObject`, and
multipart upload (create, part, complete) by `s3:PutObject`.
The profile depends on the policy, and the instances take the profile's name as an input, so a
node never boots with a role that lacks its permissions, and destroy removes the nodes first.

One more inline policy, `group_capacity_policy`, lets the nodes change exactly one thing outside
the bucket: `autoscaling:UpdateAutoScalingGroup` on the cluster's own worker group (its ARN, no
wildcard), which the master's idle auto-stop uses to set the group's minimum and desired capacity
to 0 before the workers power off, so that the group does not launch them again. It is made after
the group (it names the group's ARN, and the group's template names the profile).

A third, `supervisor_read_policy`, is read-only: what the run supervisor on the master
(node_setup/backends/aws.py, `AwsGroup`) reads to follow its workers: the group's instances
(`autoscaling:DescribeAutoScalingGroups`), their states and addresses (`ec2:DescribeInstances`) and a
new worker's console, whose host key fingerprints it verifies (`ec2:GetConsoleOutput`). The console is
limited to instances carrying the cluster's tag; the two Describe calls take no resource-level
permission or tag condition in IAM, so they are `*` (docs/security.md says what that lets a node read).
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from cluster.stack.spec import ClusterSpec
from cluster.stack.tags import CLUSTER_KEY

EC2_SERVICE = "ec2.amazonaws.com"
BUCKET_ACTIONS = ("s3:ListBucket",)
OBJECT_ACTIONS = ("s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload")


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


GROUP_ACTIONS = ("autoscaling:UpdateAutoScalingGroup",)


def group_capacity_policy(group_arn: str) -> str:
    """The auto-stop's one permission: change the size of the cluster's own worker group, nothing else."""
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Sid": "StopOwnWorkerGroup", "Effect": "Allow", "Action": list(GROUP_ACTIONS),
                       "Resource": group_arn}],
    })


DESCRIBE_ACTIONS = ("autoscaling:DescribeAutoScalingGroups", "ec2:DescribeInstances")
CONSOLE_ACTIONS = ("ec2:GetConsoleOutput",)


def supervisor_read_policy(cluster: str, region: str) -> str:
    """The supervisor's reads: the Describe calls (no resource-level permissions exist for them) and the
    console of the cluster's own instances only (by its tag)."""
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "SupervisorDescribeWorkers", "Effect": "Allow", "Action": list(DESCRIBE_ACTIONS), "Resource": "*"},
            {"Sid": "SupervisorReadOwnConsoles", "Effect": "Allow", "Action": list(CONSOLE_ACTIONS),
             "Resource": f"arn:aws:ec2:{region}:*:instance/*",
             "Condition": {"StringEquals": {f"ec2:ResourceTag/{CLUSTER_KEY}": cluster}}},
        ],
    })


class NodeRole(pulumi.ComponentResource):
    def __init__(self, name: str, spec: ClusterSpec, *, bucket_arn: pulumi.Input[str], tags: dict[str, str],
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("xeon-cluster:infra:NodeRole", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        self.role = aws.iam.Role(
            name,
            assume_role_policy=assume_role_policy(),
            description=f"xeon-cluster {spec.cluster_name}: nodes read and write checkpoints in the cluster bucket",
            tags={**tags, "Name": name},
            opts=child)
        # RolePolicy takes no tags (not taggable in IAM: inline policies are part of the role).
        self.policy = aws.iam.RolePolicy(
            f"{name}-checkpoints",
            role=self.role.id,  # an IAM role's id is its name
            policy=pulumi.Output.from_input(bucket_arn).apply(checkpoint_policy),
            opts=child)
        self.supervisor_policy = aws.iam.RolePolicy(
            f"{name}-supervisor-read",
            role=self.role.id,
            policy=supervisor_read_policy(spec.cluster_name, spec.region),
            opts=child)
        self.profile = aws.iam.InstanceProfile(
            name,
            role=self.role.id,
            tags={**tags, "Name": name},
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.policy, self.supervisor_policy]))
        self.profile_name = self.profile.name
        self._name = name
        self.register_outputs({"roleArn": self.role.arn, "instanceProfileName": self.profile.name})

    def allow_group_capacity(self, group_arn: pulumi.Input[str]) -> aws.iam.RolePolicy:
        """The inline policy that lets the nodes resize their own worker group (the auto-stop), and no other."""
        self.group_policy = aws.iam.RolePolicy(
            f"{self._name}-worker-group",
            role=self.role.id,
            policy=pulumi.Output.from_input(group_arn).apply(group_capacity_policy),
            opts=pulumi.ResourceOptions(parent=self))
        return self.group_policy
