"""The rehearsal's engine with the master's and the workers' Auto Scaling groups, without the local cluster (no
root, no SSH): the real program's `pulumi up` into the rehearsal's moto account (the setup step stubbed), the
groups' instances on the addresses the engine was given (GroupLaunchDouble), a terminated worker and a terminated
master each replaced by its group on its own address, and `pulumi destroy` leaving no instance, group or
template.

The addresses are chosen away from the subnet's first ones, which moto would hand out by itself.
"""

import pytest

from cluster.stack.tags import CLUSTER_KEY, ROLE_KEY, ROLE_MASTER, ROLE_WORKER
from tests.infra.conftest import PUBLIC_KEY
from tests.rehearsal.account import UBUNTU_IMAGE_ID, Account
from tests.rehearsal.engine import Stack
from tests.rehearsal.group_launches import GROUP_NAME_TAG

CIDR = "10.77.0.0/24"
ADDRESSES = ["10.77.0.40", "10.77.0.41", "10.77.0.42"]  # master, then the two workers' nodes
CLUSTER = "rehearsal-group"


def stub_setup(inputs: dict) -> tuple[str, dict]:
    """Test double for the setup step (it runs over SSH in the sitting): what its create() returns."""
    return "setup-0", {k: v for k, v in inputs.items() if k != "__provider"}


@pytest.fixture
def account(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # the program makes the cluster key there
    account = Account().start()
    try:
        yield account
    finally:
        account.stop()


def instances(account: Account, states: list[str]) -> dict[str, dict]:
    found = account.client("ec2").describe_instances(Filters=[
        {"Name": f"tag:{CLUSTER_KEY}", "Values": [CLUSTER]}, {"Name": "instance-state-name", "Values": states}])
    return {i["InstanceId"]: i for r in found["Reservations"] for i in r["Instances"]}


@pytest.mark.timeout(300)
def test_the_group_launches_on_the_given_nodes_replaces_a_terminated_worker_there_and_destroy_drains_it(account):
    vpc, subnet = account.make_network(CIDR, CLUSTER)
    stack = Stack("rehearsal-group", account, ADDRESSES, setup=stub_setup)
    outputs = stack.up({"publicKey": PUBLIC_KEY, "adminCidrs": ["10.77.0.1/32"], "clusterName": CLUSTER,
                        "instanceType": "r7iz.metal-16xl", "workerCount": 2, "workerSpot": True, "bake": True,
                        "vpcId": vpc, "subnetId": subnet, "sshUser": "root", "placementGroup": True,
                        "rootVolumeGib": 100})
    assert outputs["masterPrivateAddress"] == ADDRESSES[0] and outputs["workerCount"] == 2

    ec2, autoscaling = account.client("ec2"), account.client("autoscaling")
    workers = {i["PrivateIpAddress"]: i for i in instances(account, ["running"]).values()
               if {t["Key"]: t["Value"] for t in i["Tags"]}.get(ROLE_KEY) == ROLE_WORKER}
    assert sorted(workers) == ADDRESSES[1:]
    for worker in workers.values():
        tags = {t["Key"]: t["Value"] for t in worker["Tags"]}
        assert tags[GROUP_NAME_TAG] == outputs["workerGroupName"] and worker["ImageId"] == outputs["amiId"]
        assert worker["ImageId"] != UBUNTU_IMAGE_ID and worker["SubnetId"] == subnet
        # What AWS applies from the template and moto's group alone would not.
        assert worker["InstanceLifecycle"] == "spot" and worker["MetadataOptions"]["HttpTokens"] == "required"
        assert worker["IamInstanceProfile"]["Arn"].split("/")[-1].startswith(f"{CLUSTER}-node")
        (root,) = worker["BlockDeviceMappings"]
        volume = ec2.describe_volumes(VolumeIds=[root["Ebs"]["VolumeId"]])["Volumes"][0]
        assert (volume["Size"], volume["Encrypted"]) == (100, True)
        assert {t["Key"]: t["Value"] for t in volume["Tags"]}[ROLE_KEY] == ROLE_WORKER

    lost = workers[ADDRESSES[1]]["InstanceId"]
    ec2.terminate_instances(InstanceIds=[lost])
    running = {i["PrivateIpAddress"]: i["InstanceId"] for i in instances(account, ["running"]).values()}
    group = autoscaling.describe_auto_scaling_groups(
        AutoScalingGroupNames=[outputs["workerGroupName"]])["AutoScalingGroups"][0]
    assert sorted(running) == ADDRESSES and running[ADDRESSES[1]] != lost
    assert running[ADDRESSES[2]] == workers[ADDRESSES[2]]["InstanceId"]
    assert sorted(x["InstanceId"] for x in group["Instances"]) == sorted([running[ADDRESSES[1]],
                                                                         running[ADDRESSES[2]]])

    # The master is its group's one instance, from its own template of the workers' image; a lost one is
    # launched again by the group, on the master's node, with no `pulumi up`.
    master = running[ADDRESSES[0]]
    assert outputs["masterInstanceId"] == master
    (found,) = [i for i in instances(account, ["running"]).values() if i["InstanceId"] == master]
    tags = {t["Key"]: t["Value"] for t in found["Tags"]}
    assert (tags[ROLE_KEY], tags[GROUP_NAME_TAG]) == (ROLE_MASTER, outputs["masterGroupName"])
    assert found["ImageId"] == outputs["amiId"] and found["SubnetId"] == subnet
    assert found["InstanceLifecycle"] == "spot" and found["MetadataOptions"]["HttpTokens"] == "required"
    assert found["IamInstanceProfile"]["Arn"].split("/")[-1].startswith(f"{CLUSTER}-node-master")
    ec2.terminate_instances(InstanceIds=[master])
    running = {i["PrivateIpAddress"]: i["InstanceId"] for i in instances(account, ["running"]).values()}
    assert sorted(running) == ADDRESSES and running[ADDRESSES[0]] != master
    (own,) = autoscaling.describe_auto_scaling_groups(
        AutoScalingGroupNames=[outputs["masterGroupName"]])["AutoScalingGroups"]
    assert [x["InstanceId"] for x in own["Instances"]] == [running[ADDRESSES[0]]]

    deleted = [(d.reg.type.split(":")[-1], d.reg.name, d.outcome) for d in stack.destroy()]
    # Both groups: each drained, then deleted; then their templates.
    assert sorted((n, o) for t, n, o in deleted if t == "Group") == [
        (f"{CLUSTER}-master", "drained (1 terminated), deleted"),
        (f"{CLUSTER}-worker", "drained (2 terminated), deleted")]
    assert [o for t, _, o in deleted if t == "LaunchTemplate"] == ["deleted", "deleted"]
    done = {t: o for t, _, o in deleted}
    # The image was built on an instance of its own (terminated since), and the destroy of a stack that does not
    # keep it, with no other stack's use recorded, removes it.
    (built_on,) = stack.aws.build_instances
    assert built_on not in {w["InstanceId"] for w in workers.values()}
    assert done["ImageRelease"] == "released: the image and its snapshots removed"
    assert not ec2.describe_images(Filters=[{"Name": "image-id", "Values": [outputs["amiId"]]}])["Images"]
    assert not instances(account, ["pending", "running", "stopping", "stopped"])
    assert not autoscaling.describe_auto_scaling_groups()["AutoScalingGroups"]
    assert not ec2.describe_launch_templates()["LaunchTemplates"]
