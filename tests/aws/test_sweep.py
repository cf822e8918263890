"""fab sweep under moto: a running cluster, a cluster whose instances are gone, untagged bystanders.

moto 5.2 has no placement groups: `FakePlacementGroups` (a test double) wraps the moto EC2 client
and keeps placement groups in memory; every other call goes to moto. moto's create_image ignores
TagSpecifications, so the test tags the image afterwards as the Pulumi program's tags would be.
moto 5.2 stores instance profile tags but has no `list_instance_profile_tags`:
`FakeInstanceProfileTags` (a test double) answers it from moto's `get_instance_profile`; every
other IAM call (roles, role tags, policies, profiles, their deletion checks) goes to moto.
`fab sweep` itself (the task function) runs end to end with its boto3 clients replaced by the same
moto clients and doubles. Refused listings come from moto's IAM enforcement: an IAM user whose
policy denies one API.

Why this module is longer than about 400 lines (about 530): every test, from the listing to the
refused APIs and the `fab sweep` task end to end, runs on the one `account` fixture (the alive,
gone and other-region clusters, a stray and bystanders, made by `make_cluster` over the two
doubles) and checks its resources by the ids that fixture returns.
"""

import json

import boto3
import pytest
from botocore.exceptions import ClientError

pytest.importorskip("moto")
from moto.core import set_initial_no_auth_action_count  # noqa: E402

from cluster.stack.tags import ROLE_MASTER, ROLE_WORKER, cluster_tags, node_tags  # noqa: E402
from node_setup.aws import sweep, sweep_delete  # noqa: E402

IMAGE = "ami-1e749f67"  # a Canonical image moto ships


class FakePlacementGroups:
    """Test double: placement groups in memory (moto lacks them), all else delegated to moto."""

    def __init__(self, ec2):
        self._ec2 = ec2
        self.groups = {}

    def __getattr__(self, name):
        return getattr(self._ec2, name)

    def can_paginate(self, operation):
        return operation != "describe_placement_groups" and self._ec2.can_paginate(operation)

    def create_placement_group(self, GroupName, Strategy, TagSpecifications=()):
        tags = [t for spec in TagSpecifications for t in spec["Tags"]]
        self.groups[GroupName] = {"GroupName": GroupName, "Strategy": Strategy, "State": "available", "Tags": tags}

    def describe_placement_groups(self, Filters=()):
        def match(group):
            tags = {t["Key"]: t["Value"] for t in group["Tags"]}
            return all(tags.get(f["Name"][4:]) in f["Values"] for f in Filters if f["Name"].startswith("tag:"))
        return {"PlacementGroups": [dict(g) for g in self.groups.values() if match(g)]}

    def delete_placement_group(self, GroupName):
        if GroupName not in self.groups:
            raise self._ec2.exceptions.ClientError(
                {"Error": {"Code": "InvalidPlacementGroup.Unknown", "Message": GroupName}}, "DeletePlacementGroup")
        del self.groups[GroupName]


class FakeInstanceProfileTags:
    """Test double: `list_instance_profile_tags` from moto's stored tags (moto lacks the call), all else moto."""

    def __init__(self, iam):
        self._iam = iam

    def __getattr__(self, name):
        return getattr(self._iam, name)

    def can_paginate(self, operation):
        return operation != "list_instance_profile_tags" and self._iam.can_paginate(operation)

    def list_instance_profile_tags(self, InstanceProfileName):
        profile = self._iam.get_instance_profile(InstanceProfileName=InstanceProfileName)["InstanceProfile"]
        return {"Tags": profile.get("Tags", []), "IsTruncated": False}


OTHER_REGION = "eu-west-1"


def checkpoint_policy(bucket):
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": f"arn:aws:s3:::{bucket}"},
        {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"], "Resource": f"arn:aws:s3:::{bucket}/*"}]})


def make_node_role(iam, name, bucket):
    """What infra/node_role.py makes: a tagged role, its inline policy, a tagged profile holding the role."""
    base = cluster_tags(name, "dev")
    role = f"{name}-node-1a2b3c4"  # Pulumi's auto-name
    iam.create_role(RoleName=role, AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
                                                "Action": "sts:AssumeRole"}]}), Tags=_spec({**base, "Name": role}))
    iam.put_role_policy(RoleName=role, PolicyName=f"{name}-node-checkpoints-5d6e7f8",
                        PolicyDocument=checkpoint_policy(bucket))
    iam.create_instance_profile(InstanceProfileName=f"{name}-node-9a8b7c6", Tags=_spec({**base, "Name": role}))
    iam.add_role_to_instance_profile(InstanceProfileName=f"{name}-node-9a8b7c6", RoleName=role)
    return {"role": role, "profile": f"{name}-node-9a8b7c6", "policy": f"{name}-node-checkpoints-5d6e7f8"}


def _spec(tags):
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def make_cluster(ec2, s3, name, *, alive, iam=None):
    base = cluster_tags(name, "dev")
    made = {}
    cluster_sg = ec2.create_security_group(GroupName=f"{name}-cluster", Description="cluster", TagSpecifications=[
        {"ResourceType": "security-group", "Tags": _spec(base)}])["GroupId"]
    ssh_sg = ec2.create_security_group(GroupName=f"{name}-ssh", Description="ssh", TagSpecifications=[
        {"ResourceType": "security-group", "Tags": _spec(base)}])["GroupId"]
    # the two groups admit each other, as the self/master rules do; deletion must revoke first
    for group, other in ((cluster_sg, ssh_sg), (ssh_sg, cluster_sg)):
        ec2.authorize_security_group_ingress(GroupId=group, IpPermissions=[
            {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": other}]}])
    made["groups"] = {cluster_sg, ssh_sg}
    ec2.create_key_pair(KeyName=f"{name}-key", TagSpecifications=[{"ResourceType": "key-pair", "Tags": _spec(base)}])
    ec2.create_placement_group(GroupName=f"{name}-pg", Strategy="cluster", TagSpecifications=[
        {"ResourceType": "placement-group", "Tags": _spec(base)}])
    ids = []
    for rank, role in enumerate((ROLE_MASTER, ROLE_WORKER)):
        tags = node_tags(base, role, rank, f"{name}-{role}")
        launched = ec2.run_instances(ImageId=IMAGE, InstanceType="c6i.16xlarge", MinCount=1, MaxCount=1,
                                     SecurityGroupIds=[cluster_sg],
                                     TagSpecifications=[{"ResourceType": "instance", "Tags": _spec(tags)}])
        ids.append(launched["Instances"][0]["InstanceId"])
    made["instances"] = set(ids)
    image = ec2.create_image(InstanceId=ids[0], Name=f"{name}-baked")["ImageId"]
    ec2.create_tags(Resources=[image], Tags=_spec(base))
    made["image"] = image
    made["volume"] = ec2.create_volume(AvailabilityZone="us-east-1a", Size=100, TagSpecifications=[
        {"ResourceType": "volume", "Tags": _spec(base)}])["VolumeId"]
    s3.create_bucket(Bucket=f"{name}-checkpoints-1a2b")
    s3.put_bucket_tagging(Bucket=f"{name}-checkpoints-1a2b", Tagging={"TagSet": _spec(base)})
    s3.put_object(Bucket=f"{name}-checkpoints-1a2b", Key="step-100/model.safetensors", Body=b"weights")
    if iam is not None:
        made.update(make_node_role(iam, name, f"{name}-checkpoints-1a2b"))
    if not alive:
        # a spot request left open after its cluster went (tagged as the program tags its requests)
        made["spot"] = ec2.request_spot_instances(
            LaunchSpecification={"ImageId": IMAGE, "InstanceType": "c6i.16xlarge"}, TagSpecifications=[
                {"ResourceType": "spot-instances-request", "Tags": _spec(base)}])[
            "SpotInstanceRequests"][0]["SpotInstanceRequestId"]
        ec2.terminate_instances(InstanceIds=ids)  # the cluster's instances are gone, the rest leaked
    return made


@pytest.fixture
def account(mocked_aws):
    ec2 = FakePlacementGroups(boto3.client("ec2", region_name=mocked_aws))
    s3 = boto3.client("s3", region_name=mocked_aws)
    iam = FakeInstanceProfileTags(boto3.client("iam", region_name=mocked_aws))
    alive = make_cluster(ec2, s3, "alive", alive=True, iam=iam)
    gone = make_cluster(ec2, s3, "gone", alive=False, iam=iam)
    # the gone role also has a managed policy attached (detached on delete; the policy itself stays)
    managed = iam.create_policy(PolicyName="shared-readonly", PolicyDocument=checkpoint_policy("shared"))
    iam.attach_role_policy(RoleName=gone["role"], PolicyArn=managed["Policy"]["Arn"])
    gone["managed"] = managed["Policy"]["Arn"]
    # a cluster that runs in another region: IAM is global, its role and profile are in use there
    remote_ec2 = boto3.client("ec2", region_name=OTHER_REGION)
    remote = make_node_role(iam, "remote", "remote-checkpoints-1a2b")
    remote_ec2.run_instances(ImageId=IMAGE, InstanceType="c6i.16xlarge",
                             MinCount=1, MaxCount=1, TagSpecifications=[{"ResourceType": "instance", "Tags": _spec(
                                 node_tags(cluster_tags("remote", "dev"), ROLE_MASTER, 0, "remote-master"))}])
    # named like ours, but untagged: not ours (tags decide, never the name)
    iam.create_role(RoleName="gone-node-7777777", AssumeRolePolicyDocument="{}")
    stray = ec2.create_security_group(GroupName="stray", Description="leaked, no cluster tag", TagSpecifications=[
        {"ResourceType": "security-group", "Tags": _spec({"xeon-cluster:managed-by": "xeon-cluster"})}])["GroupId"]
    bystander = ec2.create_security_group(GroupName="not-ours", Description="someone else's")["GroupId"]
    s3.create_bucket(Bucket="someone-elses-bucket")
    return dict(ec2=ec2, s3=s3, iam=iam, region=mocked_aws, alive=alive, gone=gone, remote=remote, stray=stray,
                bystander=bystander)


def regional_ec2(region):
    return boto3.client("ec2", region_name=region)


def collect_all(account):
    """The sweep as `fab sweep` runs it: EC2, S3, IAM, and other regions checked for IAM's sake."""
    return sweep.collect(account["ec2"], account["s3"], account["region"], account["iam"], regional_ec2=regional_ec2)


def _status(listing):
    return {(r.cluster, r.kind, r.id): listing.status(r) for r in listing.resources}


def test_listing_groups_by_cluster_and_marks_up_leaked_and_kept(account):
    listing = sweep.collect(account["ec2"], account["s3"], account["region"])
    status = _status(listing)
    assert listing.up_clusters == {"alive"}
    alive = {k: v for k, v in status.items() if k[0] == "alive"}
    assert set(alive.values()) == {sweep.UP}
    assert {k[1] for k in alive} == {"instance", "image", "snapshot", "volume", "security-group", "key-pair",
                                     "placement-group", "bucket"}
    gone = {k: v for k, v in status.items() if k[0] == "gone"}
    assert not any(kind == "instance" for _, kind, _ in gone)  # terminated ones are not listed
    assert gone.pop(("gone", "bucket", "gone-checkpoints-1a2b")) == sweep.KEPT
    assert set(gone.values()) == {sweep.LEAKED}
    assert {k[1] for k in gone} == {"image", "snapshot", "volume", "security-group", "key-pair", "placement-group",
                                    "spot-request"}
    assert status[(sweep.NO_CLUSTER, "security-group", account["stray"])] == sweep.LEAKED
    assert not any(account["bystander"] == k[2] or k[2] == "someone-elses-bucket" for k in status)
    text = listing.render()
    assert "cluster alive: up (master running)" in text and "cluster gone: down" in text
    assert "kept (checkpoint buckets; delete with --delete-buckets)" in text


def test_delete_removes_leaked_only_and_a_rerun_finds_nothing(account):
    ec2, s3, region = account["ec2"], account["s3"], account["region"]
    before = sweep.collect(ec2, s3, region)
    outcomes = sweep_delete.delete(before, ec2, s3, waiter_delay=1)
    removed = {(r.kind, r.id) for r, outcome in outcomes if outcome == "removed"}
    assert ("image", account["gone"]["image"]) in removed
    assert ("spot-request", account["gone"]["spot"]) in removed
    assert ("placement-group", "gone-pg") in removed and ("key-pair", "gone-key") in removed
    assert {("security-group", g) for g in account["gone"]["groups"]} <= removed
    assert not [o for _, o in outcomes if o.startswith("FAILED")]

    after = sweep.collect(ec2, s3, region)
    assert sweep.LEAKED not in {after.status(r) for r in after.resources}
    # nothing of the running cluster touched
    assert _status(after) == {k: v for k, v in _status(before).items() if k[0] == "alive" or v == sweep.KEPT}
    running = ec2.describe_instances(InstanceIds=sorted(account["alive"]["instances"]))["Reservations"]
    assert {i["State"]["Name"] for r in running for i in r["Instances"]} == {"running"}
    assert ec2.describe_security_groups(GroupIds=[account["bystander"]])["SecurityGroups"]
    # the kept bucket still holds its checkpoint
    assert s3.list_objects_v2(Bucket="gone-checkpoints-1a2b")["KeyCount"] == 1

    assert sweep_delete.delete(after, ec2, s3, waiter_delay=1) == []
    assert sweep_delete.render_outcomes([]) == "nothing leaked: nothing removed"


def test_buckets_go_only_with_the_explicit_flag(account):
    ec2, s3, region = account["ec2"], account["s3"], account["region"]
    sweep_delete.delete(sweep.collect(ec2, s3, region), ec2, s3, waiter_delay=1)
    outcomes = sweep_delete.delete(sweep.collect(ec2, s3, region), ec2, s3, include_buckets=True, waiter_delay=1)
    assert [(r.id, o) for r, o in outcomes] == [("gone-checkpoints-1a2b", "removed")]
    names = {b["Name"] for b in s3.list_buckets()["Buckets"]}
    assert "gone-checkpoints-1a2b" not in names and {"alive-checkpoints-1a2b", "someone-elses-bucket"} <= names


def test_a_resource_deleted_meanwhile_counts_as_already_gone(account):
    ec2, s3, region = account["ec2"], account["s3"], account["region"]
    listing = sweep.collect(ec2, s3, region)
    ec2.delete_key_pair(KeyName="gone-key")
    ec2.delete_placement_group(GroupName="gone-pg")
    outcomes = dict(((r.kind, r.id), o) for r, o in sweep_delete.delete(listing, ec2, s3, waiter_delay=1))
    assert outcomes[("placement-group", "gone-pg")] == "already gone"
    # moto deletes a missing key pair without an error, as AWS does
    assert outcomes[("key-pair", "gone-key")] in ("removed", "already gone")


def test_a_stopped_master_keeps_its_cluster_up(account):
    ec2, s3, region = account["ec2"], account["s3"], account["region"]
    ec2.stop_instances(InstanceIds=sorted(account["alive"]["instances"]))
    listing = sweep.collect(ec2, s3, region)
    assert "alive" in listing.up_clusters
    instances = [r for r in listing.resources if r.cluster == "alive" and r.kind == "instance"]
    assert {r.state for r in instances} == {"stopped"} and {listing.status(r) for r in instances} == {sweep.UP}
    assert "cluster alive: up but stopped (master stopped: start it again, or `pulumi destroy`" in listing.render()
    assert not [o for r, o in sweep_delete.delete(listing, ec2, s3, waiter_delay=1) if r.cluster == "alive"]


def test_a_cluster_that_comes_back_between_listing_and_deleting_keeps_everything(account):
    """The master of a down cluster is started while the user reads the list: nothing of it is deleted."""
    ec2, s3, region = account["ec2"], account["s3"], account["region"]
    ec2.terminate_instances(InstanceIds=sorted(account["alive"]["instances"]))  # down: listed as leaked
    listing = sweep.collect(ec2, s3, region)
    leaked_before = {r.id for r in listing.leaked() if r.cluster == "alive"}
    assert account["alive"]["groups"] <= leaked_before
    # `pulumi up --refresh` brings a new master while the user reads the list
    master = ec2.run_instances(ImageId=IMAGE, InstanceType="c6i.16xlarge", MinCount=1, MaxCount=1, TagSpecifications=[
        {"ResourceType": "instance", "Tags": _spec(node_tags(cluster_tags("alive", "dev"), ROLE_MASTER, 0, "m"))}],
    )["Instances"][0]["InstanceId"]
    outcomes = {r.id: o for r, o in sweep_delete.delete(listing, ec2, s3, waiter_delay=1) if r.cluster == "alive"}
    assert set(outcomes) == leaked_before
    assert set(outcomes.values()) == {"kept: cluster alive is up again since the listing"}
    state = ec2.describe_instances(InstanceIds=[master])["Reservations"][0]["Instances"][0]["State"]["Name"]
    assert state == "running"
    assert len(ec2.describe_security_groups(GroupIds=sorted(account["alive"]["groups"]))["SecurityGroups"]) == 2


def test_deleted_resources_name_the_stack_that_made_them(account):
    ec2, s3, region = account["ec2"], account["s3"], account["region"]
    listing = sweep.collect(ec2, s3, region)
    assert {r.stack for r in listing.resources if r.cluster == "gone"} == {"dev"}
    text = sweep_delete.render_outcomes(sweep_delete.delete(listing, ec2, s3, waiter_delay=1))
    assert "(cluster gone, stack dev)" in text


# ------------------------------------------------------------------ IAM roles and instance profiles (global)


@pytest.mark.slow  # 6-11 s of CPU (moto): outside the inner loop, docs/testing.md
def test_iam_roles_and_profiles_are_ours_by_their_tags_and_grouped_by_cluster(account):
    listing = collect_all(account)
    iam = {k: v for k, v in _status(listing).items() if k[1] in sweep.IAM_KINDS}
    gone, alive, remote = account["gone"], account["alive"], account["remote"]
    assert iam == {
        ("gone", "iam-role", gone["role"]): sweep.LEAKED, ("gone", "instance-profile", gone["profile"]): sweep.LEAKED,
        ("alive", "iam-role", alive["role"]): sweep.UP, ("alive", "instance-profile", alive["profile"]): sweep.UP,
        ("remote", "iam-role", remote["role"]): sweep.IN_USE,
        ("remote", "instance-profile", remote["profile"]): sweep.IN_USE}
    assert listing.elsewhere == {"remote": {OTHER_REGION}} and not listing.elsewhere_error
    assert listing.other_regions_checked > 10  # every enabled region but the swept one
    role = next(r for r in listing.resources if r.id == gone["role"])
    assert gone["policy"] in role.detail and "shared-readonly" in role.detail
    text = listing.render()
    assert f"cluster remote: down; has instances in {OTHER_REGION} (its IAM role is in use there)" in text
    assert "IAM is global" in text and "no instance in any region" in text


@pytest.mark.slow  # 6-11 s of CPU (moto): outside the inner loop, docs/testing.md
def test_delete_removes_a_leaked_clusters_role_profile_and_policies_and_keeps_the_others(account):
    ec2, s3, iam = account["ec2"], account["s3"], account["iam"]
    gone = account["gone"]
    outcomes = sweep_delete.delete(collect_all(account), ec2, s3, iam, waiter_delay=1)
    done = [(r.kind, r.id, o) for r, o in outcomes]
    assert ("instance-profile", gone["profile"], "removed") in done and ("iam-role", gone["role"], "removed") in done
    assert not [o for _, _, o in done if o.startswith("FAILED")]
    # the profile (its role removed first) goes before the role (its policies first), both after the EC2 kinds
    kinds = [k for k, _, _ in done]
    assert kinds.index("security-group") < kinds.index("instance-profile") < kinds.index("iam-role")
    for call, kwargs in ((iam.get_role, {"RoleName": gone["role"]}),
                         (iam.get_instance_profile, {"InstanceProfileName": gone["profile"]}),
                         (iam.get_role_policy, {"RoleName": gone["role"], "PolicyName": gone["policy"]})):
        with pytest.raises(iam.exceptions.NoSuchEntityException):
            call(**kwargs)
    assert iam.get_policy(PolicyArn=gone["managed"])["Policy"]["AttachmentCount"] == 0  # detached, not deleted
    for kept in (account["alive"], account["remote"]):  # up here, and up in another region
        assert iam.get_role_policy(RoleName=kept["role"], PolicyName=kept["policy"])["PolicyDocument"]
        roles = iam.get_instance_profile(InstanceProfileName=kept["profile"])["InstanceProfile"]["Roles"]
        assert [r["RoleName"] for r in roles] == [kept["role"]]
    iam.get_role(RoleName="gone-node-7777777")  # named like ours, not tagged: untouched

    after = collect_all(account)
    assert not [r for r in after.resources if after.status(r) == sweep.LEAKED]
    assert sweep_delete.delete(after, ec2, s3, iam, waiter_delay=1) == []


def test_without_other_regions_no_role_or_profile_counts_as_leaked(account):
    listing = sweep.collect(account["ec2"], account["s3"], account["region"], account["iam"])
    iam = {r.id: listing.status(r) for r in listing.resources if r.kind in sweep.IAM_KINDS}
    assert iam[account["gone"]["role"]] == iam[account["remote"]["role"]] == sweep.UNKNOWN
    assert iam[account["alive"]["role"]] == sweep.UP  # up here: known without other regions
    assert not {r.kind for r in listing.leaked()} & set(sweep.IAM_KINDS)
    assert "none of them counts as leaked" in listing.render()


class RefusedRegion:
    """Test double: an EC2 client of a region the caller may not use (an SCP denying the region)."""

    def can_paginate(self, operation):
        return False

    def describe_instances(self, **kwargs):
        raise ClientError({"Error": {"Code": "UnauthorizedOperation", "Message": "denied"}}, "DescribeInstances")


@pytest.mark.slow  # 6-11 s of CPU (moto): outside the inner loop, docs/testing.md
def test_a_region_that_cannot_be_checked_leaves_roles_and_profiles_alone(account):
    listing = sweep.collect(account["ec2"], account["s3"], account["region"], account["iam"],
                            regional_ec2=lambda r: RefusedRegion() if r == "ap-south-1" else regional_ec2(r))
    assert "ap-south-1 (UnauthorizedOperation)" in listing.elsewhere_error
    gone_iam = [r for r in listing.resources if r.cluster == "gone" and r.kind in sweep.IAM_KINDS]
    assert len(gone_iam) == 2 and {listing.status(r) for r in gone_iam} == {sweep.UNKNOWN}
    assert ("security-group", "gone") in {(r.kind, r.cluster) for r in listing.leaked()}  # the rest still leaked


# ------------------------------------------------------------------ a listing API that is refused


def _restricted_session(region, deny):
    """An IAM user of the moto account that may do everything except `deny` (moto enforces IAM)."""
    iam = boto3.client("iam", region_name=region)
    iam.create_user(UserName="sweeper")
    iam.put_user_policy(UserName="sweeper", PolicyName="p", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": "*", "Resource": "*"},
            {"Effect": "Deny", "Action": deny, "Resource": "*"}]}))
    key = iam.create_access_key(UserName="sweeper")["AccessKey"]
    return boto3.Session(aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"],
                         region_name=region)


@set_initial_no_auth_action_count(3)  # the three IAM calls above; every later call is checked
def _as_restricted_user(account, deny, action):
    session = _restricted_session(account["region"], deny)
    ec2 = FakePlacementGroups(session.client("ec2", region_name=account["region"]))
    ec2.groups = account["ec2"].groups  # the same (in-memory) placement groups
    iam = FakeInstanceProfileTags(session.client("iam"))
    return action(ec2, session.client("s3", region_name=account["region"]), iam, session)


def test_a_refused_listing_is_reported_and_the_other_kinds_are_still_listed(account):
    listing = _as_restricted_user(account, ["ec2:DescribeVolumes"],
                                  lambda ec2, s3, *_: sweep.collect(ec2, s3, account["region"]))
    assert set(listing.errors) == {"volume"}
    assert "ec2:DescribeVolumes" in listing.errors["volume"]
    assert "not authorized" in listing.errors["volume"]  # AWS's own message is kept
    status = _status(listing)
    assert not any(kind == "volume" for _, kind, _ in status)
    assert {k[1] for k, v in status.items() if v == sweep.LEAKED} == {
        "image", "snapshot", "security-group", "key-pair", "placement-group", "spot-request"}
    assert listing.up_clusters == {"alive"}
    assert "could not list volumes: " in listing.render()


def test_without_the_instance_listing_nothing_counts_as_leaked(account):
    listing = _as_restricted_user(account, ["ec2:DescribeInstances"],
                                  lambda ec2, s3, *_: sweep.collect(ec2, s3, account["region"]))
    assert set(listing.errors) == {"instance"} and not listing.clusters_known
    assert listing.resources and {listing.status(r) for r in listing.resources} == {sweep.UNKNOWN}
    assert listing.leaked(include_buckets=True) == []
    assert "cluster alive: unknown (instances could not be listed)" in listing.render()


@pytest.mark.slow  # 6-11 s of CPU (moto): outside the inner loop, docs/testing.md
def test_a_refused_iam_listing_is_reported_and_the_rest_still_listed(account):
    listing = _as_restricted_user(account, ["iam:ListRoleTags"], lambda ec2, s3, iam, session: sweep.collect(
        ec2, s3, account["region"], iam, regional_ec2=lambda r: session.client("ec2", region_name=r)))
    assert set(listing.errors) == {"iam-role"} and "iam:ListRoleTags" in listing.errors["iam-role"]
    kinds = {(r.cluster, r.kind) for r in listing.leaked()}
    assert ("gone", "instance-profile") in kinds and ("gone", "security-group") in kinds
    assert not any(kind == "iam-role" for _, kind in kinds)
    assert "could not list iam-roles: " in listing.render()


# ------------------------------------------------------------------ `fab sweep`, the task, end to end


def run_sweep_task(monkeypatch, ec2, s3, iam, session=boto3, **options):
    """The `fab sweep` task function with its boto3 clients replaced by these (moto + the test doubles);
    other regions' EC2 clients come from `session` (moto)."""
    from invoke import Context

    from node_setup.aws import clients as aws
    from node_setup.tasks import costs as cost_tasks

    def client(service, region=None):
        if service == "ec2" and region != options["region"]:
            return session.client("ec2", region_name=region)
        if service == "autoscaling":
            return session.client("autoscaling", region_name=region)
        return {"ec2": ec2, "s3": s3, "iam": iam}[service]

    monkeypatch.setattr(aws, "client", client)
    return cost_tasks.sweep(Context(), **options)


def printed_listing(text):
    """`fab sweep`'s printed listing as {(cluster header, status, kind, id)} (the grouping as shown)."""
    rows, cluster = set(), None
    for line in text.splitlines():
        if line.startswith("cluster "):
            cluster = line[len("cluster "):]
        elif line.startswith("  ") and cluster:
            status, kind, ident = line.split()[:3]
            rows.add((cluster, status, kind, ident))
    return rows


def printed_outcomes(text):
    """`fab sweep --delete`'s outcome lines as {(outcome, kind, id)}."""
    return {tuple(line.split()[:3]) for line in text.splitlines()
            if line.startswith("  ") and line.rstrip().endswith(")")}


@pytest.mark.slow  # 6-11 s of CPU (moto): outside the inner loop, docs/testing.md
def test_fab_sweep_lists_deletes_and_a_rerun_finds_nothing(account, monkeypatch, capsys):
    ec2, s3, iam, region = account["ec2"], account["s3"], account["iam"], account["region"]
    alive, gone = account["alive"], account["gone"]
    run_sweep_task(monkeypatch, ec2, s3, iam, region=region)
    listed = capsys.readouterr().out
    rows = printed_listing(listed)
    up = "alive: up (master running)"
    assert {(up, "up", "instance", i) for i in alive["instances"]} <= rows
    assert {(up, "up", "placement-group", "alive-pg"), (up, "up", "image", alive["image"]),
            (up, "up", "bucket", "alive-checkpoints-1a2b")} <= rows
    down = "gone: down"
    assert {(down, "leaked", "placement-group", "gone-pg"), (down, "leaked", "key-pair", "gone-key"),
            (down, "leaked", "image", gone["image"]), (down, "leaked", "spot-request", gone["spot"]),
            (down, "kept", "bucket", "gone-checkpoints-1a2b")} <= rows
    assert {(down, "leaked", "security-group", g) for g in gone["groups"]} <= rows
    assert {(down, "leaked", "iam-role", gone["role"]), (down, "leaked", "instance-profile", gone["profile"]),
            (up, "up", "iam-role", alive["role"]), (up, "up", "instance-profile", alive["profile"])} <= rows
    remote = f"remote: down; has instances in {OTHER_REGION} (its IAM role is in use there)"
    assert {(remote, "in-use", "iam-role", account["remote"]["role"]),
            (remote, "in-use", "instance-profile", account["remote"]["profile"])} == {
        r for r in rows if r[0].startswith("remote")}
    assert not any(r[3] == "gone-node-7777777" for r in rows)
    assert "IAM is global" in listed
    assert (f"{sweep.NO_CLUSTER}: down", "leaked", "security-group", account["stray"]) in rows
    assert not any(r[2] == account["bystander"] or r[2] == "someone-elses-bucket" for r in rows)
    assert "run `fab sweep --delete`" in listed

    run_sweep_task(monkeypatch, ec2, s3, iam, region=region, delete=True, yes=True)
    removed = capsys.readouterr().out
    leaked_before = {(kind, ident) for _, status, kind, ident in rows if status == "leaked"}
    assert printed_outcomes(removed) == {("removed", kind, ident) for kind, ident in leaked_before}
    assert "removed 11, left 0" in removed  # 9 EC2 resources, the role and the profile
    assert iam.list_instance_profiles_for_role(RoleName=alive["role"])["InstanceProfiles"]  # alive: untouched

    run_sweep_task(monkeypatch, ec2, s3, iam, region=region, delete=True, yes=True)
    rerun = capsys.readouterr().out
    assert "nothing leaked: nothing to remove" in rerun
    after = printed_listing(rerun)
    assert not any(status == "leaked" for _, status, _, _ in after)
    # the running clusters (here and in another region) and the kept bucket are listed exactly as before
    assert after == {r for r in rows if r[0] in (up, remote) or r[1] == "kept"}
    running = ec2.describe_instances(InstanceIds=sorted(alive["instances"]))["Reservations"]
    assert {i["State"]["Name"] for r in running for i in r["Instances"]} == {"running"}
    assert "alive-pg" in ec2.groups and ec2.describe_images(ImageIds=[alive["image"]])["Images"]


@pytest.mark.slow  # 6-11 s of CPU (moto): outside the inner loop, docs/testing.md
def test_fab_sweep_exits_non_zero_when_a_listing_is_refused(account, monkeypatch, capsys):
    from invoke.exceptions import Exit

    def sweep_task(ec2, s3, iam, session):
        with pytest.raises(Exit) as stopped:
            run_sweep_task(monkeypatch, ec2, s3, iam, session, region=account["region"], delete=True, yes=True)
        return stopped.value

    stopped = _as_restricted_user(account, ["ec2:DescribeKeyPairs"], sweep_task)
    assert stopped.code == 1 and "could not list: key-pair" in stopped.message
    out = capsys.readouterr().out
    assert "could not list key-pairs: " in out and "ec2:DescribeKeyPairs" in out
    assert ("removed", "placement-group", "gone-pg") in printed_outcomes(out)  # other kinds still removed
    assert ec2_key_names(account) >= {"gone-key", "alive-key"}  # unlisted: untouched


def ec2_key_names(account):
    return {k["KeyName"] for k in account["ec2"].describe_key_pairs()["KeyPairs"]}
