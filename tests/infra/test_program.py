"""The real infra/__main__.py under Pulumi mocks: what it registers for several stack configs.

Why this module is longer than about 400 lines (about 490): its tests read one program's
registrations through the same helpers (`instances`, `master_of`, `groups`, `node_role`, ...), most
of them for every stack config in `STACK_CONFIGS`; the options the engine acts on after a change
are in test_lifecycle.py, the zone lookup in test_zone.py, bad configs in test_bad_config.py.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import ipaddress
import json

import pulumi
import pytest

from cluster.node import profiles
from cluster.node.setup_script import InstallPlan, install_script
from cluster.stack import image_build
from cluster.stack.node_replacement import bake_tag
from cluster.stack.tags import (CLUSTER_KEY, MANAGED_BY_KEY, MANAGED_BY_VALUE, PROFILE_KEY, RANK_KEY, ROLE_KEY,
                          ROLE_MASTER, ROLE_WORKER, SSH_USER_KEY, STACK_KEY)
from infra.lookups import CANONICAL_OWNER, AccountLookupError
from infra.image import BUILDER_SUFFIX
from infra.node_role import MASTER_SUFFIX
from infra.setup_step import ProfileSetupProvider
from tests.infra.conftest import (ADMIN_CIDR, PUBLIC_KEY, AMI, BASE_AMI, BUILD_INFRA, BUILT, COMPONENT, DEFAULT_SUBNETS,
                                  DEFAULT_VPC, GROUP, RECIPE, SETUP, STACK, FakeAws, Harness, RecordingMonitor,
                                  fresh_run, group_instance, master_group, master_template, minimal_config,
                                  worker_group, worker_template)

SG = "aws:ec2/securityGroup:SecurityGroup"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
BUCKET = "aws:s3/bucket:Bucket"
PLACEMENT = "aws:ec2/placementGroup:PlacementGroup"
ROLE = "aws:iam/role:Role"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
INSTANCE_PROFILE = "aws:iam/instanceProfile:InstanceProfile"

STACK_CONFIGS = {
    "default": {},
    "c6i.16xlarge": {"instanceType": "c6i.16xlarge"},
    "on-demand master": {"masterSpot": False},
    "bake off": {"bake": False},
    "0 workers": {"workerCount": 0},
    "16 workers": {"workerCount": 16},
}


# ----------------------------------------------------------------------------------- helpers


def instances(monitor: RecordingMonitor):
    """Every node's launch template, the master's first: no node is a stand-alone instance."""
    assert not monitor.of_type("aws:ec2/instance:Instance")
    return [master_template(monitor), worker_template(monitor)]


def template_of(monitor):
    return worker_template(monitor)


def group_of(monitor):
    return worker_group(monitor)


def instance_tags(template) -> dict[str, str]:
    """The tags a template gives its instances."""
    return next(t["tags"] for t in template.inputs["tagSpecifications"] if t["resourceType"] == "instance")


def template_groups(template) -> list[str]:
    """The security groups a worker launches with (on the interface when it asks for a public address)."""
    interfaces = template.inputs.get("networkInterfaces") or []
    return interfaces[0]["securityGroups"] if interfaces else template.inputs["vpcSecurityGroupIds"]


def master_of(monitor):
    return master_template(monitor)


def groups(monitor):
    """(cluster group, ssh group) registrations, told apart by their ingress rules."""
    sgs = {r.id: r for r in monitor.of_type(SG) if not r.name.endswith(BUILDER_SUFFIX)}
    self_rules = [r for r in monitor.of_type(INGRESS) if r.inputs.get("referencedSecurityGroupId")]
    cluster_ids = {r.inputs["securityGroupId"] for r in self_rules}
    assert len(cluster_ids) == 1, f"expected one self-referencing group, got {cluster_ids}"
    cluster = sgs[cluster_ids.pop()]
    (ssh,) = [g for g in sgs.values() if g.id != cluster.id]
    return cluster, ssh


def taggable(type_token: str) -> bool:
    """Whether the pulumi_aws resource class behind a type token takes `tags`."""
    module, _, cls = type_token.split(":", 1)[1].partition(":")
    resource = getattr(importlib.import_module(f"pulumi_aws.{module.split('/')[0]}"), cls)
    return "tags" in inspect.signature(resource._internal_init).parameters


def run(harness: Harness, **config):
    return harness.run(minimal_config(**config))


# ----------------------------------------------------------------------- every stack config


@pytest.mark.parametrize("name", list(STACK_CONFIGS))
def test_security_groups_admit_only_members_and_admin_ssh_to_master(harness, name):
    config = STACK_CONFIGS[name]
    run(harness, **config)
    monitor = harness.monitor
    cluster, ssh = groups(monitor)
    assert cluster.inputs["vpcId"] == ssh.inputs["vpcId"] == DEFAULT_VPC

    # No inline rules and no legacy SecurityGroupRule resources anywhere.
    for sg in monitor.of_type(SG):
        assert not sg.inputs.get("ingress") and not sg.inputs.get("egress"), sg.name
    assert not monitor.of_type("aws:ec2/securityGroupRule:SecurityGroupRule")

    for rule in monitor.of_type(INGRESS):
        if rule.inputs.get("referencedSecurityGroupId"):
            # The one self rule: every protocol, from members of the cluster group to members.
            assert rule.inputs["referencedSecurityGroupId"] == rule.inputs["securityGroupId"] == cluster.id
            assert rule.inputs["ipProtocol"] == "-1"
            continue
        # Anything else admits an outside network: only the admin CIDRs, only TCP 22, only on ssh.
        source = rule.inputs.get("cidrIpv4") or rule.inputs.get("cidrIpv6")
        assert source == ADMIN_CIDR, rule.inputs
        assert not rule.inputs.get("prefixListId")
        assert rule.inputs["securityGroupId"] == ssh.id
        assert (rule.inputs["ipProtocol"], rule.inputs["fromPort"], rule.inputs["toPort"]) == ("tcp", 22, 22)

    # Egress open from the cluster group (separate rule resources).
    egress = {(r.inputs["securityGroupId"], r.inputs.get("cidrIpv4") or r.inputs.get("cidrIpv6"),
               r.inputs["ipProtocol"]) for r in monitor.of_type(EGRESS)}
    assert (cluster.id, "0.0.0.0/0", "-1") in egress

    # Only the master carries the ssh group; workers take nothing from outside the cluster group.
    assert set(template_groups(master_of(monitor))) == {cluster.id, ssh.id}
    assert template_groups(template_of(monitor)) == [cluster.id]


@pytest.mark.parametrize("name", list(STACK_CONFIGS))
def test_every_instance_is_hardened_and_placed_together(harness, name):
    config = STACK_CONFIGS[name]
    run(harness, **config)
    monitor = harness.monitor
    nodes = instances(monitor)
    workers = config.get("workerCount", 3)
    group = group_of(monitor)
    assert group.inputs["minSize"] == group.inputs["maxSize"] == group.inputs["desiredCapacity"] == workers
    master = master_group(monitor)
    assert master.inputs["minSize"] == master.inputs["maxSize"] == master.inputs["desiredCapacity"] == 1
    assert master.inputs["vpcZoneIdentifiers"] == [sorted(DEFAULT_SUBNETS)[0]]
    (placement,) = monitor.of_type(PLACEMENT)
    assert placement.inputs["strategy"] == "cluster"
    template = template_of(monitor)
    meta = template.inputs["metadataOptions"]
    assert meta["httpTokens"] == "required" and meta["httpPutResponseHopLimit"] == 1
    (root,) = template.inputs["blockDeviceMappings"]
    ebs = root["ebs"]
    assert ebs["encrypted"] == "true" and ebs["volumeSize"] == 100 and ebs["volumeType"] == "gp3"
    assert root["deviceName"] == "/dev/sda1"
    assert template.inputs["instanceType"] == config.get("instanceType", "r7iz.metal-16xl")
    assert template.inputs["placement"]["groupName"] == placement.state["name"]
    assert group.inputs["vpcZoneIdentifiers"] == [sorted(DEFAULT_SUBNETS)[0]]
    assert template.inputs["networkInterfaces"][0]["associatePublicIpAddress"] == "true"
    assert template.inputs["keyName"] == monitor.of_type("aws:ec2/keyPair:KeyPair")[0].state["keyName"]
    for node in nodes:
        meta = node.inputs["metadataOptions"]
        assert meta["httpTokens"] == "required" and meta["httpPutResponseHopLimit"] == 1, node.name
        ebs = node.inputs["blockDeviceMappings"][0]["ebs"]
        assert ebs["encrypted"] == "true" and ebs["volumeSize"] == 100 and ebs["volumeType"] == "gp3"
        assert node.inputs["instanceType"] == config.get("instanceType", "r7iz.metal-16xl")
        assert node.inputs["placement"]["groupName"] == placement.state["name"]
        # default VPC: outbound internet
        assert node.inputs["networkInterfaces"][0]["associatePublicIpAddress"] == "true"
        assert node.inputs["keyName"] == monitor.of_type("aws:ec2/keyPair:KeyPair")[0].state["keyName"]


@pytest.mark.parametrize("name", list(STACK_CONFIGS))
def test_spot_options_per_role(harness, name):
    config = STACK_CONFIGS[name]
    run(harness, **config)
    for node in instances(harness.monitor):
        role = instance_tags(node)[ROLE_KEY]
        spot = config.get("masterSpot", True) if role == ROLE_MASTER else config.get("workerSpot", True)
        market = node.inputs.get("instanceMarketOptions")
        if not spot:
            assert not market, node.name
            continue
        assert market["marketType"] == "spot"
        options = market["spotOptions"]
        assert options["spotInstanceType"] == "one-time"
        assert options["instanceInterruptionBehavior"] == "terminate"
        assert "maxPrice" not in options  # unset: at most the on-demand price
    market = template_of(harness.monitor).inputs.get("instanceMarketOptions")
    if not config.get("workerSpot", True):
        assert not market
    else:
        assert market["marketType"] == "spot" and "maxPrice" not in market["spotOptions"]
        assert (market["spotOptions"]["spotInstanceType"], market["spotOptions"]["instanceInterruptionBehavior"]) == (
            "one-time", "terminate")


@pytest.mark.parametrize("name", list(STACK_CONFIGS))
def test_the_image_is_built_apart_and_every_node_master_too_boots_it(harness, name):
    config = STACK_CONFIGS[name]
    outputs = run(harness, **config)
    monitor = harness.monitor
    master = master_of(monitor)
    # No image is ever made from an instance (one that runs jobs or any other).
    assert not monitor.of_type(AMI)
    if config.get("bake", True) is False:
        assert not monitor.of_type(SETUP) and not monitor.of_type(BUILT)
        assert all(node.inputs["imageId"] == BASE_AMI for node in instances(monitor))
        assert outputs["amiId"] == BASE_AMI
        return
    (setup,), (built,), (recipe,) = monitor.of_type(SETUP), monitor.of_type(BUILT), monitor.of_type(RECIPE)
    ami = built.state["outputResources"][0]["amis"][0]["image"]
    # Master and workers boot the same built image, made from the base by the recipe.
    assert master.inputs["imageId"] == template_of(monitor).inputs["imageId"] == outputs["amiId"] == ami
    assert recipe.inputs["parentImage"] == BASE_AMI == outputs["baseAmiId"]
    assert built.urn in master.dependencies and built.urn in template_of(monitor).dependencies
    # The build runs on its own small instance, in the stack's subnet, with a group that is no node's.
    (infra,) = monitor.of_type(BUILD_INFRA)
    assert infra.inputs["instanceTypes"] == [image_build.BUILDER_INSTANCE_TYPE]
    assert [infra.inputs["subnetId"]] == master_group(monitor).inputs["vpcZoneIdentifiers"]
    assert infra.inputs["terminateInstanceOnFailure"]
    node_groups = {g for node in instances(monitor) for g in template_groups(node)}
    assert infra.inputs["securityGroupIds"] and not set(infra.inputs["securityGroupIds"]) & node_groups
    # Its one component runs the install `fab setup` runs, from the stack's bucket.
    (component,) = monitor.of_type(COMPONENT)
    (script,) = monitor.of_type("aws:s3/bucketObjectv2:BucketObjectv2")
    assert script.inputs["content"] == install_script(InstallPlan(profiles.PROFILES[config.get("softwareProfile",
                                                                                                "stock")]))
    assert f"s3://{monitor.of_type(BUCKET)[0].state['bucket']}/{script.inputs['key']}" in component.inputs["data"]
    # What the build runs holds nothing of a cluster: no key, no name, no address (the nodes' user data does).
    for text in (script.inputs["content"], component.inputs["data"]):
        assert PUBLIC_KEY.split()[1] not in text and "xeon-dev" not in text.replace("xeon-dev-checkpoints", "")
        assert outputs["masterPrivateAddress"] not in text
    # The master is checked, never imaged: the step names the image the master booted.
    assert setup.inputs["kept_image"] == ami
    assert master_group(monitor).urn in setup.dependencies
    # The setup step knows where and how to connect (the group's instance), and what to install; never the key.
    assert setup.inputs["host"] == outputs["masterPublicAddress"]
    assert setup.inputs["instance_id"] == outputs["masterInstanceId"] == group_instance(outputs["masterGroupName"])
    assert setup.inputs["private_key_path"] == "~/.ssh/id_ed25519"
    assert setup.inputs["pip_pins"] == list(profiles.PROFILES["stock"].pip_pins)
    assert setup.inputs["fingerprint"] == profiles.PROFILES["stock"].fingerprint()
    assert bake_tag(profiles.PROFILES["stock"].fingerprint()) in recipe.inputs["name"]
    for reg in monitor.registrations:
        assert "PRIVATE KEY" not in repr(reg.inputs)


@pytest.mark.parametrize("name", list(STACK_CONFIGS))
def test_every_taggable_resource_is_tagged(harness, name):
    run(harness, **STACK_CONFIGS[name], tags=["team=ml"])
    checked = 0
    for reg in harness.monitor.aws_resources():
        if not taggable(reg.type):
            continue
        checked += 1
        tags = reg.inputs.get("tags") or {}
        if reg.type == GROUP:  # a group's tags are a list of {key, value, propagateAtLaunch}
            tags = {t["key"]: t["value"] for t in tags}
        assert tags.get(MANAGED_BY_KEY) == MANAGED_BY_VALUE, reg.name
        assert tags.get(CLUSTER_KEY) == "xeon-dev" and tags.get(STACK_KEY) == STACK, reg.name
        assert tags.get("team") == "ml", reg.name
    assert checked >= 10
    template = template_of(harness.monitor)
    specs = {t["resourceType"]: t["tags"] for t in template.inputs["tagSpecifications"]}
    assert set(specs) == {"instance", "volume"} and specs["instance"] == specs["volume"]
    group_tags = {t["key"]: t["value"] for t in group_of(harness.monitor).inputs["tags"]}
    assert all(t["propagateAtLaunch"] is True for t in group_of(harness.monitor).inputs["tags"])
    for tags in (specs["instance"], group_tags):
        assert tags[MANAGED_BY_KEY] == MANAGED_BY_VALUE and tags[CLUSTER_KEY] == "xeon-dev" and tags["team"] == "ml"
        assert tags[ROLE_KEY] == ROLE_WORKER and RANK_KEY not in tags  # one group: no per-instance rank
        assert (tags[SSH_USER_KEY], tags[PROFILE_KEY]) == ("ubuntu", "stock")
    master = {t["resourceType"]: t["tags"] for t in master_of(harness.monitor).inputs["tagSpecifications"]}
    master_group_tags = {t["key"]: t["value"] for t in master_group(harness.monitor).inputs["tags"]}
    assert master["instance"] == master["volume"] == master_group_tags
    assert master["instance"][RANK_KEY] == "0" and master["instance"][ROLE_KEY] == ROLE_MASTER  # a group of one
    assert master["volume"][CLUSTER_KEY] == "xeon-dev"
    # What discovery reads to log in and to know the software.
    assert (master["instance"][SSH_USER_KEY], master["instance"][PROFILE_KEY]) == ("ubuntu", "stock")


def node_role(monitor, master: bool = False):
    """(role, checkpoints policy, instance profile) registrations of the workers' role (of the master's
    with `master`): exactly one of each (tests/infra/test_node_roles.py checks the two roles)."""
    (role,) = [r for r in monitor.of_type(ROLE) if r.name.endswith(MASTER_SUFFIX) is master
               and not r.name.endswith(BUILDER_SUFFIX)]
    (profile,) = [p for p in monitor.of_type(INSTANCE_PROFILE) if p.inputs["role"] == role.id]
    (policy,) = [p for p in monitor.of_type(ROLE_POLICY)
                 if p.inputs["role"] == role.id and p.name.endswith("-checkpoints")]
    return role, policy, profile


def _as_list(value):
    return value if isinstance(value, list) else [value]


@pytest.mark.parametrize("name", list(STACK_CONFIGS))
def test_every_instance_launches_with_the_instance_profile_created_before_it(harness, name):
    run(harness, **STACK_CONFIGS[name])
    monitor = harness.monitor
    role, policy, profile = node_role(monitor)
    assert profile.inputs["role"] == role.id == role.state["name"]
    assert policy.inputs["role"] == role.id
    template = template_of(monitor)
    assert template.inputs["iamInstanceProfile"] == {"name": profile.state["name"]}
    assert profile.urn in template.dependencies and profile.index < template.index
    # The profile waits for the policy: no node boots with a role that lacks its permissions.
    assert policy.urn in profile.dependencies
    _, master_policy, master_profile = node_role(monitor, master=True)
    node = master_of(monitor)
    assert node.inputs.get("iamInstanceProfile") == {"name": master_profile.state["name"]}
    # Created (and so, on destroy, deleted) in dependency order: profile before every node.
    assert master_profile.urn in node.dependencies and master_profile.index < node.index
    assert master_policy.urn in master_profile.dependencies


def test_node_role_is_assumable_by_ec2_only(harness):
    run(harness)
    role, _, _ = node_role(harness.monitor)
    trust = json.loads(role.inputs["assumeRolePolicy"])
    (statement,) = trust["Statement"]
    assert statement["Effect"] == "Allow"
    assert statement["Principal"] == {"Service": "ec2.amazonaws.com"}
    assert _as_list(statement["Action"]) == ["sts:AssumeRole"]
    assert "NotPrincipal" not in statement and "NotAction" not in statement


def test_node_policy_grants_checkpoint_access_to_the_bucket_only(harness):
    run(harness)
    monitor = harness.monitor
    (bucket,) = monitor.of_type(BUCKET)
    _, policy, _ = node_role(monitor)
    arn = bucket.state["arn"]
    assert arn == f"arn:aws:s3:::{bucket.state['bucket']}"
    document = json.loads(policy.inputs["policy"])
    grants: dict[str, set[str]] = {}
    for statement in document["Statement"]:
        assert statement["Effect"] == "Allow"
        assert set(statement) <= {"Sid", "Effect", "Action", "Resource"}, statement  # no Not*, no wildcards
        for resource in _as_list(statement["Resource"]):
            grants.setdefault(resource, set()).update(_as_list(statement["Action"]))
    assert grants == {
        arn: {"s3:ListBucket"},
        f"{arn}/*": {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"},
    }
    assert all("*" not in action for actions in grants.values() for action in actions)


@pytest.mark.parametrize("config", [{}, {"destroyBucket": True}], ids=["bucket kept", "bucket destroyed"])
def test_node_role_and_profile_are_tagged_and_deleted_on_destroy(harness, config):
    run(harness, tags=["team=ml"], **config)
    for master in (False, True):
        role, _, profile = node_role(harness.monitor, master=master)
        for reg in (role, profile):
            tags = reg.inputs["tags"]
            assert tags[MANAGED_BY_KEY] == MANAGED_BY_VALUE and tags[CLUSTER_KEY] == "xeon-dev", reg.name
            assert tags[STACK_KEY] == STACK and tags["team"] == "ml", reg.name
    assert taggable(ROLE) and taggable(INSTANCE_PROFILE) and not taggable(ROLE_POLICY)
    # The bucket may be kept; the nodes' identity never is.
    assert not any(reg.retain_on_delete for typ in (ROLE, ROLE_POLICY, INSTANCE_PROFILE)
                   for reg in harness.monitor.of_type(typ))


@pytest.mark.parametrize("name", list(STACK_CONFIGS))
def test_outputs_name_both_groups_and_the_master_group_s_running_instance(harness, name):
    config = STACK_CONFIGS[name]
    outputs = run(harness, **config)
    group = master_group(harness.monitor).state["name"]
    assert outputs["masterGroupName"] == group
    # The master's instance as the group launched it, found by AWS's group-name tag (pending or running).
    (lookup,) = [a for token, a in harness.fake.calls if token == "aws:ec2/getInstances:getInstances"]
    assert lookup["instanceTags"] == {"aws:autoscaling:groupName": group}
    assert lookup["instanceStateNames"] == ["pending", "running"]
    assert outputs["masterInstanceId"] == group_instance(group)
    assert outputs["masterPrivateAddress"].startswith("10.0.") and outputs["masterPublicAddress"].startswith("198.51.")
    # The workers' addresses are the group's: fab finds them; the stack names the group and its size.
    assert outputs["workerGroupName"] == group_of(harness.monitor).state["name"]
    assert outputs["workerCount"] == config.get("workerCount", 3)
    assert outputs["clusterName"] == "xeon-dev"
    assert outputs["sshUser"] == "ubuntu"
    (bucket,) = harness.monitor.of_type(BUCKET)
    assert outputs["bucketName"] == bucket.state["bucket"]


# ------------------------------------------------------------------------ single settings


def test_base_ami_is_canonical_ubuntu_2404_amd64(harness):
    run(harness)
    (args,) = [a for token, a in harness.fake.calls
               if token == "aws:ec2/getAmiIds:getAmiIds" and a["owners"] != ["self"]]  # not the kept images'
    assert args["owners"] == [CANONICAL_OWNER] and args["sortAscending"] is False  # newest first
    filters = {f["name"]: f["values"] for f in args["filters"]}
    assert filters["name"] == ["ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*"]
    assert filters["architecture"] == ["x86_64"]


def test_given_base_ami_skips_the_lookup(harness):
    run(harness, baseAmi="ami-0mine", bake=False)
    assert "aws:ec2/getAmiIds:getAmiIds" not in [token for token, _ in harness.fake.calls]
    assert {n.inputs["imageId"] for n in instances(harness.monitor)} == {"ami-0mine"}


def test_spot_max_price_reaches_every_spot_instance(harness):
    run(harness, spotMaxPrice="2.5", masterSpot=False)
    master = master_of(harness.monitor)
    assert not master.inputs.get("instanceMarketOptions")
    assert template_of(harness.monitor).inputs["instanceMarketOptions"]["spotOptions"]["maxPrice"] == "2.5000"


def test_placement_group_off(harness):
    run(harness, placementGroup=False)
    assert not harness.monitor.of_type(PLACEMENT)
    assert all(not n.inputs.get("placement") for n in instances(harness.monitor))


def test_root_volume_size_and_type(harness):
    run(harness, rootVolumeGib=250, rootVolumeType="gp2")
    for node in instances(harness.monitor):
        ebs = node.inputs["blockDeviceMappings"][0]["ebs"]
        assert (ebs["volumeSize"], ebs["volumeType"]) == (250, "gp2")


def test_ipv6_admin_network_and_several_cidrs(harness):
    harness.run(minimal_config(adminCidrs=["2001:db8::/48", "198.51.100.0/24"]))
    rules = [r for r in harness.monitor.of_type(INGRESS) if not r.inputs.get("referencedSecurityGroupId")]
    sources = {(r.inputs.get("cidrIpv4"), r.inputs.get("cidrIpv6")) for r in rules}
    assert sources == {(None, "2001:db8::/48"), ("198.51.100.0/24", None)}
    for rule in rules:
        assert rule.inputs["fromPort"] == rule.inputs["toPort"] == 22


def test_private_subnet_leaves_public_addresses_to_the_subnet(harness):
    outputs = run(harness, subnetId="subnet-0private")
    _, ssh = groups(harness.monitor)
    assert ssh.inputs["vpcId"] == "vpc-0custom"  # the subnet's VPC
    for node in instances(harness.monitor):
        assert not node.inputs.get("networkInterfaces") and node.inputs["vpcSecurityGroupIds"]
    for group in (master_group(harness.monitor), group_of(harness.monitor)):
        assert group.inputs["vpcZoneIdentifiers"] == ["subnet-0private"]
    assert outputs["masterPublicAddress"] == ""
    # With no public address the setup step connects to the private one (user supplies a route).
    (setup,) = harness.monitor.of_type(SETUP)
    assert setup.inputs["host"] == outputs["masterPrivateAddress"]


def test_bucket_kept_private_and_encrypted_by_default(harness):
    run(harness)
    monitor = harness.monitor
    (bucket,) = monitor.of_type(BUCKET)
    assert not bucket.inputs.get("forceDestroy")
    (block,) = monitor.of_type("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")
    assert all(block.inputs[k] is True for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls",
                                                  "restrictPublicBuckets"))
    (sse,) = monitor.of_type("aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration")
    (rule,) = sse.inputs["rules"]
    assert rule["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "AES256"
    assert "bucketKeyEnabled" not in rule  # an S3 Bucket Key only applies to SSE-KMS
    # The bucket and its settings (the image's install script in it is made again by every build's stack).
    s3 = [r for r in monitor.registrations if r.type.startswith("aws:s3/") and "bucketObject" not in r.type]
    assert len(s3) == 7
    for reg in s3:
        assert reg.retain_on_delete, f"{reg.name} would be deleted on destroy while the bucket is kept"
        if reg is not bucket:
            assert reg.inputs["bucket"] == bucket.id
    assert not any(r.retain_on_delete for r in monitor.registrations if not r.type.startswith("aws:s3/"))


def test_bucket_refuses_requests_without_tls(harness):
    run(harness)
    monitor = harness.monitor
    (bucket,) = monitor.of_type(BUCKET)
    (policy,) = monitor.of_type("aws:s3/bucketPolicy:BucketPolicy")
    (block,) = monitor.of_type("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")
    arn = bucket.state["arn"]
    (statement,) = json.loads(policy.inputs["policy"])["Statement"]
    assert statement["Effect"] == "Deny" and statement["Principal"] == "*"
    assert _as_list(statement["Action"]) == ["s3:*"]
    assert sorted(_as_list(statement["Resource"])) == [arn, f"{arn}/*"]
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    # Only a deny: access comes from the node role's own policy, never from the bucket policy.
    assert block.urn in policy.dependencies  # S3 refuses concurrent changes to one bucket


def test_bucket_keeps_old_versions_for_a_while_and_aborts_stale_uploads(harness):
    from infra.bucket import ABORT_MULTIPART_DAYS, NONCURRENT_VERSION_DAYS

    run(harness)
    monitor = harness.monitor
    (versioning,) = monitor.of_type("aws:s3/bucketVersioning:BucketVersioning")
    assert versioning.inputs["versioningConfiguration"] == {"status": "Enabled"}
    (lifecycle,) = monitor.of_type("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")
    (rule,) = lifecycle.inputs["rules"]
    assert rule["status"] == "Enabled"
    # Every object, with the one attribute the provider requires (an empty filter makes it warn).
    assert rule["filter"] == {"prefix": ""} and not rule.get("prefix")
    assert rule["noncurrentVersionExpiration"] == {"noncurrentDays": NONCURRENT_VERSION_DAYS}
    assert rule["abortIncompleteMultipartUpload"] == {"daysAfterInitiation": ABORT_MULTIPART_DAYS}
    assert rule["expiration"] == {"expiredObjectDeleteMarker": True}
    assert not rule["expiration"].get("days")  # current checkpoints never expire
    assert versioning.urn in lifecycle.dependencies
    assert 0 < ABORT_MULTIPART_DAYS <= NONCURRENT_VERSION_DAYS


def test_destroy_bucket_deletes_it_with_its_objects(harness):
    run(harness, destroyBucket=True)
    (bucket,) = harness.monitor.of_type(BUCKET)
    assert bucket.inputs["forceDestroy"] is True
    assert not any(r.retain_on_delete for r in harness.monitor.registrations)


def test_cluster_name_and_region(harness):
    outputs = harness.run(minimal_config(clusterName="lab-a"), region="eu-west-1")
    assert outputs["clusterName"] == "lab-a" and outputs["region"] == "eu-west-1"
    assert all(instance_tags(n)[CLUSTER_KEY] == "lab-a" for n in instances(harness.monitor))
    assert master_of(harness.monitor).name == master_group(harness.monitor).name == "lab-a-master"


def test_intel_profile_installs_its_pins(harness):
    run(harness, softwareProfile="intel", sshUser="admin")
    assert {instance_tags(n)[PROFILE_KEY] for n in instances(harness.monitor)} == {"intel"}
    assert {instance_tags(n)[SSH_USER_KEY] for n in instances(harness.monitor)} == {"admin"}
    (setup,) = harness.monitor.of_type(SETUP)
    assert setup.inputs["profile"] == "intel"
    assert "oneccl_bind_pt==2.8.0" in setup.inputs["pip_pins"]


def _fresh_run(config) -> RecordingMonitor:
    return fresh_run(config)[0]


def test_changing_a_pin_replaces_setup_and_the_image(monkeypatch, harness):
    before = _fresh_run(minimal_config())
    stock = profiles.PROFILES["stock"]
    bumped = dataclasses.replace(stock, pip_pins=tuple(p.replace("transformers==5.23.0", "transformers==5.24.0")
                                                       for p in stock.pip_pins))
    monkeypatch.setitem(profiles.PROFILES, "stock", bumped)
    after = _fresh_run(minimal_config())

    (old_setup,), (new_setup,) = before.of_type(SETUP), after.of_type(SETUP)
    diff = ProfileSetupProvider().diff("id", old_setup.inputs, new_setup.inputs)
    assert {"pip_pins", "fingerprint"} <= set(diff.replaces)
    # The image's replacement trigger is the bake tag: a new one builds a new image (a new recipe of a new name),
    # whose new id moves the master and replaces every worker.
    (old_image,), (new_image,) = before.of_type(BUILT), after.of_type(BUILT)
    assert old_image.replacement_trigger == bake_tag(stock.fingerprint())
    assert new_image.replacement_trigger == bake_tag(bumped.fingerprint()) != old_image.replacement_trigger
    assert before.of_type(RECIPE)[0].inputs["name"] != after.of_type(RECIPE)[0].inputs["name"]
    assert master_of(before).inputs["imageId"] != master_of(after).inputs["imageId"]


def test_key_path_change_updates_setup_without_rebaking(harness):
    before = _fresh_run(minimal_config())
    after = _fresh_run(minimal_config(privateKeyPath="~/.ssh/other"))
    (old_setup,), (new_setup,) = before.of_type(SETUP), after.of_type(SETUP)
    diff = ProfileSetupProvider().diff("id", old_setup.inputs, new_setup.inputs)
    assert diff.changes and diff.replaces == []
    assert before.of_type(BUILT)[0].replacement_trigger == after.of_type(BUILT)[0].replacement_trigger


@pytest.mark.parametrize("token, message", [
    ("aws:ec2/getVpcs:getVpcs", r"vpcId: not set and region us-east-1 has no default VPC; set vpcId"),
    ("aws:ec2/getAmiIds:getAmiIds", r"baseAmi: not set and no Ubuntu 24.04 amd64 image .* set baseAmi"),
    ("aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings",
     r"instanceType: 'r7iz.metal-16xl' is not offered in any availability zone of us-east-1"),
    ("aws:ec2/getSubnets:getSubnets", r"subnetId: not set and VPC vpc-0default has no subnet"),
])
def test_failed_lookup_stops_before_anything_is_registered(token, message):
    fake = FakeAws(empty_tokens={token})
    monitor = RecordingMonitor(fake)
    pulumi.runtime.set_mocks(fake, project="xeon-cluster", stack=STACK, preview=False, monitor=monitor)
    with pytest.raises(AccountLookupError, match=message):
        Harness(fake, monitor).run(minimal_config())
    assert monitor.registrations == []


def test_admin_cidr_fixture_is_a_single_host():
    # The assertions above identify admin rules by this value; keep it a real, narrow CIDR.
    assert ipaddress.ip_network(ADMIN_CIDR).num_addresses == 1
