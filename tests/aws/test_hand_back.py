"""The supervisor's AWS group hands a replacement it cannot admit back to the workers' Auto Scaling group
(node_setup/backends/aws.py, `AwsGroup.hand_back`): terminated through the group without lowering its
desired capacity, so that the group launches another into the slot; a member carries its instance type, the
boot the supervisor waits for. moto is the account (it launches the group's replacement at once)."""

from __future__ import annotations

import boto3
import pytest
from botocore.stub import Stubber

from cluster.run.supervision import Member
from node_setup.backends.aws import AwsGroup
from tests.aws.test_worker_group import REGION, _as_the_program_makes_it


@pytest.mark.slow  # 3-7 s of moto (a group, its launches and a replacement): outside the inner loop
def test_a_handed_back_replacement_is_terminated_through_the_group_and_another_fills_its_slot(mocked_aws):
    name, _ = _as_the_program_makes_it(count=2)
    asg, ec2 = boto3.client("autoscaling", REGION), boto3.client("ec2", REGION)
    ids = sorted(i["InstanceId"] for i in asg.describe_auto_scaling_groups(
        AutoScalingGroupNames=[name])["AutoScalingGroups"][0]["Instances"])
    lost, kept = ids
    group = AwsGroup(REGION, name, [Member("node1", "10.0.0.11", lost), Member("node2", "10.0.0.12", kept)])
    ec2.terminate_instances(InstanceIds=[lost])  # a reclaim: the group launches a replacement
    arrived = group.members()["node1"]
    assert arrived.instance_id not in ids and arrived.instance_type == "c6i.large"

    said = group.hand_back(arrived)

    assert said == f"handed back: terminated through the group {name}, which launches another"
    state = ec2.describe_instances(InstanceIds=[arrived.instance_id])["Reservations"][0]["Instances"][0]["State"]
    assert state["Name"] in ("shutting-down", "terminated")
    described = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
    assert described["DesiredCapacity"] == 2  # not lowered: the group launches another
    another = group.members()["node1"]
    assert another.instance_id not in (lost, kept, arrived.instance_id)


def test_a_hand_back_aws_refuses_is_said_with_the_command_that_stops_the_billing():
    """AWS's refusal (botocore's Stubber over a real client: a test double of the Auto Scaling API)."""
    client = boto3.client("autoscaling", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    stub.add_client_error("terminate_instance_in_auto_scaling_group", service_error_code="AccessDenied",
                          service_message="not authorized", http_status_code=403,
                          expected_params={"InstanceId": "i-0123456789abcdef0",
                                           "ShouldDecrementDesiredCapacity": False})
    stub.activate()
    group = AwsGroup(REGION, "xeon-dev-worker-5a6b7c", [])
    group._clients["autoscaling"] = client
    said = group.hand_back(Member("node1", "10.0.0.11", "i-0123456789abcdef0"))
    stub.assert_no_pending_responses()
    assert said.startswith("could not hand it back to the group xeon-dev-worker-5a6b7c (") and "AccessDenied" in said
    assert said.endswith("until it is terminated (`aws ec2 terminate-instances --instance-ids i-0123456789abcdef0`)")
