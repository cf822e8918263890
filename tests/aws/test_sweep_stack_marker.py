"""fab sweep under moto: a cluster whose stack still exists is never leaked, whatever its nodes did.

The stack marker is the `xeon-cluster:stack-marker` tag the Pulumi program puts on the cluster
security group (infra/network.py; tests/infra/test_stack_marker.py checks the program writes it).
Here the clusters are built in moto as in tests/aws/test_sweep.py (`make_cluster`, with its test
doubles for placement groups and instance profile tags), then: one auto-stopped by its idle
timer (every instance terminated), one reclaimed (its master terminated, its worker running),
both with the marker; one whose marker is gone (a destroy that stopped half-way); one whose stack
exists in another region (its global IAM role must stay).
"""

import boto3
import pytest

pytest.importorskip("moto")

from cluster.stack.tags import ROLE_KEY, ROLE_MASTER, STACK_MARKER_KEY, cluster_tags  # noqa: E402
from node_setup.aws import sweep, sweep_delete  # noqa: E402
from tests.aws.test_sweep import (OTHER_REGION, FakeInstanceProfileTags, FakePlacementGroups,  # noqa: E402
                                  _as_restricted_user, _spec, make_cluster, make_node_role, printed_listing,
                                  printed_outcomes, regional_ec2, run_sweep_task)

STOPPED = "stopped, stack exists"


def mark_stack(ec2, made, name):
    """What `pulumi up` writes: the marker on the cluster group (the group named `<name>-cluster`)."""
    (group,) = [g for g in ec2.describe_security_groups(GroupIds=sorted(made["groups"]))["SecurityGroups"]
                if g["GroupName"] == f"{name}-cluster"]
    ec2.create_tags(Resources=[group["GroupId"]], Tags=[{"Key": STACK_MARKER_KEY, "Value": "dev"}])
    return group["GroupId"]


def instances_of(ec2, made, role=None):
    found = ec2.describe_instances(InstanceIds=sorted(made["instances"]))["Reservations"]
    return {i["InstanceId"]: i["State"]["Name"] for r in found for i in r["Instances"]
            if role is None or {t["Key"]: t["Value"] for t in i["Tags"]}[ROLE_KEY] == role}


@pytest.fixture
def stacks(mocked_aws):
    ec2 = FakePlacementGroups(boto3.client("ec2", region_name=mocked_aws))
    s3 = boto3.client("s3", region_name=mocked_aws)
    iam = FakeInstanceProfileTags(boto3.client("iam", region_name=mocked_aws))
    made = {}
    for name in ("idle", "reclaimed", "halfway"):
        made[name] = make_cluster(ec2, s3, name, alive=True, iam=iam)
        made[name]["marker"] = mark_stack(ec2, made[name], name)
    # the idle timer powered off every node (shutdown behaviour: terminate)
    ec2.terminate_instances(InstanceIds=sorted(made["idle"]["instances"]))
    # a spot reclaim took the master; the worker still runs
    ec2.terminate_instances(InstanceIds=sorted(instances_of(ec2, made["reclaimed"], ROLE_MASTER)))
    # the stack was destroyed up to its cluster group: the marker went, leftovers remain
    ec2.terminate_instances(InstanceIds=sorted(made["halfway"]["instances"]))
    ec2.delete_tags(Resources=[made["halfway"]["marker"]], Tags=[{"Key": STACK_MARKER_KEY}])
    # both buckets hold versions: an overwritten checkpoint (noncurrent version) and a deleted one
    for name in ("idle", "halfway"):
        bucket = f"{name}-checkpoints-1a2b"
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        s3.put_object(Bucket=bucket, Key="step-100/model.safetensors", Body=b"weights, again")
        s3.put_object(Bucket=bucket, Key="step-200/model.safetensors", Body=b"later")
        s3.delete_object(Bucket=bucket, Key="step-200/model.safetensors")
    # a cluster stopped in another region: its marker is there, its role (global) here
    remote_ec2 = boto3.client("ec2", region_name=OTHER_REGION)
    made["remote"] = make_node_role(iam, "remote", "remote-checkpoints-1a2b")
    remote_ec2.create_security_group(GroupName="remote-cluster", Description="cluster", TagSpecifications=[
        {"ResourceType": "security-group", "Tags": _spec({**cluster_tags("remote", "dev"), STACK_MARKER_KEY: "dev"})}])
    return dict(ec2=ec2, s3=s3, iam=iam, region=mocked_aws, **made)


def listed(stacks):
    return sweep.collect(stacks["ec2"], stacks["s3"], stacks["region"], stacks["iam"], regional_ec2=regional_ec2)


def statuses(listing, cluster):
    return {(r.kind, r.id): listing.status(r) for r in listing.resources if r.cluster == cluster}


@pytest.mark.slow  # 6-11 s of CPU (moto): outside the inner loop, docs/testing.md
def test_an_auto_stopped_and_a_reclaimed_cluster_are_stopped_with_their_stack_not_leaked(stacks):
    listing = listed(stacks)
    for name in ("idle", "reclaimed"):
        mine = statuses(listing, name)
        assert set(mine.values()) == {sweep.STACK}, name
        assert {kind for kind, _ in mine} >= {"image", "snapshot", "volume", "security-group", "key-pair",
                                              "placement-group", "bucket", "iam-role", "instance-profile"}
        assert listing.stack_markers[name] == stacks[name]["marker"]
    worker = [r for r in listing.resources if r.cluster == "reclaimed" and r.kind == "instance"]
    assert [listing.status(r) for r in worker] == [sweep.STACK]  # the reclaimed cluster's running worker
    assert not [r for r in listing.leaked(include_buckets=True) if r.cluster in ("idle", "reclaimed")]
    text = listing.render()
    assert f"cluster idle: {STOPPED} (no master; security group {stacks['idle']['marker']} carries" in text
    assert f"cluster reclaimed: {STOPPED}" in text
    assert "of stopped clusters whose stack exists (not deleted)" in text
    # the marker is gone: leaked as before, its bucket kept
    halfway = statuses(listing, "halfway")
    assert halfway.pop(("bucket", "halfway-checkpoints-1a2b")) == sweep.KEPT
    assert set(halfway.values()) == {sweep.LEAKED} and "cluster halfway: down" in text
    # IAM is global: the role of a cluster stopped in another region is in use there
    remote = statuses(listing, "remote")
    assert set(remote.values()) == {sweep.IN_USE} and len(remote) == 2
    assert f"cluster remote: down; its stack exists in {OTHER_REGION} (its IAM role is in use there)" in text


@pytest.mark.slow  # 6-11 s of CPU (moto): outside the inner loop, docs/testing.md
def test_fab_sweep_delete_buckets_leaves_the_stopped_stacks_and_removes_the_one_without_marker(
        stacks, monkeypatch, capsys):
    ec2, s3, iam, region = stacks["ec2"], stacks["s3"], stacks["iam"], stacks["region"]
    run_sweep_task(monkeypatch, ec2, s3, iam, region=region, delete=True, yes=True, delete_buckets=True)
    out = capsys.readouterr().out
    rows = printed_listing(out)
    assert {(c, s) for c, s, _, _ in rows if c.startswith(("idle", "reclaimed"))} == {
        (c, "stack") for c, _, _, _ in rows if c.startswith(("idle", "reclaimed"))}
    removed = printed_outcomes(out)
    assert removed and {outcome for outcome, _, _ in removed} == {"removed"}
    assert ("removed", "bucket", "halfway-checkpoints-1a2b") in removed
    assert ("removed", "security-group", stacks["halfway"]["marker"]) in removed
    assert ("removed", "iam-role", stacks["halfway"]["role"]) in removed
    touched = {ident for _, _, ident in removed}
    for name in ("idle", "reclaimed"):
        made = stacks[name]
        assert not touched & ({made["image"], made["volume"], made["role"], made["profile"],
                               f"{name}-key", f"{name}-pg", f"{name}-checkpoints-1a2b"} | made["groups"])
        assert ec2.describe_images(ImageIds=[made["image"]])["Images"]
        assert len(ec2.describe_security_groups(GroupIds=sorted(made["groups"]))["SecurityGroups"]) == 2
        assert {k["KeyName"] for k in ec2.describe_key_pairs()["KeyPairs"]} >= {f"{name}-key"}
        assert f"{name}-pg" in ec2.groups
        assert iam.get_role(RoleName=made["role"]) and iam.get_instance_profile(InstanceProfileName=made["profile"])
    assert set(instances_of(ec2, stacks["reclaimed"]).values()) == {"terminated", "running"}
    # every version of the idle stack's checkpoints is still there (two of step-100, step-200 and its delete marker)
    versions = s3.list_object_versions(Bucket="idle-checkpoints-1a2b")
    assert (len(versions["Versions"]), len(versions.get("DeleteMarkers", []))) == (3, 1)
    assert iam.get_role(RoleName=stacks["remote"]["role"])  # its stack is in another region
    assert "halfway-checkpoints-1a2b" not in {b["Name"] for b in s3.list_buckets()["Buckets"]}

    run_sweep_task(monkeypatch, ec2, s3, iam, region=region, delete=True, yes=True, delete_buckets=True)
    assert "nothing leaked: nothing to remove" in capsys.readouterr().out


@pytest.mark.slow  # 6-11 s of CPU (moto): outside the inner loop, docs/testing.md
def test_a_stack_brought_up_again_between_listing_and_deleting_keeps_everything(stacks):
    ec2, s3, iam = stacks["ec2"], stacks["s3"], stacks["iam"]
    listing = listed(stacks)
    leaked = {r.id for r in listing.leaked() if r.cluster == "halfway"}
    assert stacks["halfway"]["marker"] in leaked
    mark_stack(ec2, stacks["halfway"], "halfway")  # `pulumi up` while the user reads the list
    outcomes = {r.id: o for r, o in sweep_delete.delete(listing, ec2, s3, iam, waiter_delay=1)
                if r.cluster == "halfway"}
    assert set(outcomes) == leaked
    assert set(outcomes.values()) == {"kept: cluster halfway has its stack again since the listing"}
    assert ec2.describe_images(ImageIds=[stacks["halfway"]["image"]])["Images"]


def test_without_the_security_group_listing_no_cluster_counts_as_leaked(stacks):
    listing = _as_restricted_user(stacks, ["ec2:DescribeSecurityGroups"],
                                  lambda ec2, s3, *_: sweep.collect(ec2, s3, stacks["region"]))
    assert set(listing.errors) == {"security-group"} and not listing.clusters_known
    assert listing.resources and {listing.status(r) for r in listing.resources} == {sweep.UNKNOWN}
    assert listing.leaked(include_buckets=True) == []
    assert "cluster halfway: unknown (security groups could not be listed)" in listing.render()
