"""A workers' group of several instance types (a mixed instances policy, as infra/node_group.py makes it) read on
moto: `fab status`/`fab up` name the group's types, which of them its workers are, and on a capacity failure
of the first type the group's own reason and the type it goes on with.

moto 5 keeps the policy and launches the group's instances, all of the launch template's type (it models no
capacity and no allocation strategy, so never the next type), and records no failed scaling activity:
`FailedActivities` (a test double over moto's client) answers DescribeScalingActivities as AWS does after a
spot launch of the first type found no capacity."""

from __future__ import annotations

import boto3
import pytest

from cluster.stack import worker_group as rules
from cluster.stack.tags import CLUSTER_KEY, MANAGED_BY_KEY, MANAGED_BY_VALUE, ROLE_KEY, ROLE_WORKER
from node_setup.aws import worker_group

pytest.importorskip("moto")

TYPES = ["m7i.48xlarge", "c7i.48xlarge", "r7i.48xlarge"]
REASON = ("Could not launch Spot Instances. InsufficientInstanceCapacity - There is no Spot capacity available "
          "that matches your request for m7i.48xlarge in us-east-1a. Launching EC2 instance failed.")


class FailedActivities:
    """Test double: moto's Auto Scaling client, with the group's newest scaling activity failed for `reason`."""

    def __init__(self, autoscaling, reason: str):
        self._asg, self.reason = autoscaling, reason

    def __getattr__(self, name):
        return getattr(self._asg, name)

    def describe_scaling_activities(self, **kwargs):
        return {"Activities": [{"ActivityId": "a-1", "AutoScalingGroupName": kwargs["AutoScalingGroupName"],
                                "StatusCode": "Failed", "StatusMessage": self.reason}]}


def _mixed_group(count: int) -> str:
    ec2, asg = boto3.client("ec2", "us-east-1"), boto3.client("autoscaling", "us-east-1")
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    template = ec2.create_launch_template(LaunchTemplateName="xeon-dev-worker", LaunchTemplateData={
        "ImageId": ec2.describe_images()["Images"][0]["ImageId"], "InstanceType": TYPES[0]}
    )["LaunchTemplate"]["LaunchTemplateId"]
    asg.create_auto_scaling_group(
        AutoScalingGroupName="xeon-dev-worker-1a2b", MinSize=count, MaxSize=count, DesiredCapacity=count,
        VPCZoneIdentifier=subnet, MixedInstancesPolicy={
            "LaunchTemplate": {"LaunchTemplateSpecification": {"LaunchTemplateId": template, "Version": "1"},
                               "Overrides": [{"InstanceType": t} for t in TYPES]},
            "InstancesDistribution": {"OnDemandBaseCapacity": 0, "OnDemandPercentageAboveBaseCapacity": 0,
                                      "SpotAllocationStrategy": rules.SPOT_ALLOCATION}},
        Tags=[{"Key": k, "Value": v, "PropagateAtLaunch": True}
              for k, v in ((CLUSTER_KEY, "xeon-dev"), (MANAGED_BY_KEY, MANAGED_BY_VALUE), (ROLE_KEY, ROLE_WORKER))])
    return template


def test_the_group_s_types_and_its_workers_types_are_shown(mocked_aws):
    template = _mixed_group(2)
    group = worker_group.worker_group("xeon-dev", "us-east-1")
    assert group.types == tuple(TYPES) and group.launch_template == template
    assert group.summary() == ("worker group xeon-dev-worker-1a2b: 2 of 2 worker(s) in service "
                               "(2 m7i.48xlarge), from m7i.48xlarge, c7i.48xlarge, r7i.48xlarge")


def test_a_capacity_failure_of_the_first_type_names_the_reason_and_the_type_the_group_goes_on_with(mocked_aws):
    # moto launches a group's missing workers whenever it is read (and drops the policy on an update), so the
    # group is read with 2 in service and `fab up`'s line made for the 3 a stack wants.
    _mixed_group(2)
    asg = FailedActivities(boto3.client("autoscaling", "us-east-1"), REASON)
    group = worker_group.worker_group("xeon-dev", "us-east-1", autoscaling=asg)
    assert group.failure == REASON and group.types == tuple(TYPES)
    line = rules.capacity_line(group.name, 3, len(group.in_service), group.failure, "40m", group.types)
    assert line.startswith("2 of 3 worker(s) in service after 40m; ")
    assert f"AWS could not launch the 3 worker(s) of the group: {REASON}" in line
    assert ("the group goes on with its other type(s), c7i.48xlarge, r7i.48xlarge (next: c7i.48xlarge; with spot, "
            "AWS picks the pool by price-capacity-optimized)") in line
    # one type: the advice to change a setting, as before
    assert "change one of workerSpot: false" in rules.failure_line(group.name, 3, REASON)


@pytest.mark.parametrize("wanted, in_service, base, reason, expected", [
    (3, 1, 0, REASON, 2), (3, 2, 1, REASON, 2), (3, 3, 0, REASON, None), (3, 1, 0, None, None),
    (3, 1, 0, "VcpuLimitExceeded: You have requested more vCPU capacity", None), (3, 0, 2, REASON, 3)])
def test_the_fallback_s_base_fills_only_what_spot_capacity_left_missing(wanted, in_service, base, reason, expected):
    assert rules.fallback_base(wanted, in_service, base, reason) == expected
