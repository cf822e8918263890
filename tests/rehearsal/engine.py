"""`pulumi up` and `pulumi destroy` of the real program (infra/__main__.py), with only the engine and
the AWS provider replaced: Pulumi's mocks, backed by the rehearsal's moto account.

`MotoBackedAws` is the provider's stand-in. Each resource the program registers is created in the
moto account from the inputs the program gave it, and the mock returns moto's ids and attributes
as the resource's outputs; each lookup (`aws:ec2/getAmiIds`, `getAmi`, `getSecurityGroups`, `getSecurityGroup`, `getVpcs`,
`getSubnets`, `getSubnet`, `getInstanceTypeOfferings`, `getInstances`) is answered by the matching describe call. A type or lookup it does
not know stops the run with its name, so a new resource in the program cannot slip past.

| program registers | moto calls |
|---|---|
| `aws:ec2/securityGroup` | CreateSecurityGroup (tags), then RevokeSecurityGroupEgress of the default allow-all rule, as the provider does |
| `aws:vpc/securityGroupIngressRule`, `...EgressRule` | AuthorizeSecurityGroupIngress / Egress (tags on the rule); id = the rule id |
| `aws:ec2/placementGroup` | CreatePlacementGroup (PlacementGroupsDouble: moto has none) |
| `aws:ec2/keyPair` | ImportKeyPair |
| `aws:s3/bucket` and its six settings | CreateBucket + PutBucketTagging; PutPublicAccessBlock, PutBucketOwnershipControls, PutBucketEncryption, PutBucketPolicy, PutBucketVersioning, PutBucketLifecycleConfiguration |
| `aws:iam/role`, `rolePolicy`, `instanceProfile` | CreateRole, PutRolePolicy, CreateInstanceProfile + AddRoleToInstanceProfile |
| `pulumi:index:Stash` (the kept subnet and base image) | none: a stack made once keeps its first input |
| `aws:ec2/launchTemplate` | CreateLaunchTemplate with every input as the template's data (image, type, key, groups or interface, placement group, market, IMDS, root volume, profile, shutdown, instance and volume tags) and its own tags |
| `aws:autoscaling/group` | CreateAutoScalingGroup (sizes, subnet, template and version, health check, tags with propagate-at-launch); moto launches the instances within the call, the master's group's on the first local node and the workers' on the nodes after it (GroupLaunchDouble, tests/rehearsal/group_launches.py); checks the group is full and its instances running, as the provider's wait for capacity does |
| the setup step (`ProfileSetup`) | none: its pickled provider's `create()` runs for real, over SSH to the master's address |
| `aws:s3/bucketObjectv2` | PutObject (the image's install script) |
| `aws:iam/rolePolicyAttachment` | AttachRolePolicy (moto lacks AWS's Image Builder policies: then none, said so) |
| `aws:imagebuilder/component`, `imageRecipe`, `infrastructureConfiguration`, `distributionConfiguration` | none: moto has no Image Builder; kept here by ARN for the build |
| `aws:imagebuilder/image` | ImageBuildDouble: RunInstances of the build instance (its type, the recipe's parent image, the subnet, group and profile; an address no node has), CreateImage from it with the distribution's name and tags, TerminateInstances; the install itself is not run (the sitting's nodes have the profile) |
| the image's release (`ImageRelease`) | none on create; on delete its pickled provider's `delete()` runs for real against the account |
| `aws:ec2/tag` | CreateTags (a stack's use of its image) |

`destroy()` deletes what `up()` registered in reverse order of registration, as the engine would:
resources marked `retain_on_delete` (the bucket and its settings, unless `destroyBucket`) are left in the account
and dropped from the stack; the Image Builder image's delete leaves its AMI (the provider deletes Image Builder's
record only), and the release's delete removes the AMI and its snapshot unless it is kept or another stack records
its use; the group's delete
drains it as the provider's does without `force_delete` (min and desired 0, every instance
terminated), then deletes it, before the template (registered first, so deleted after).

Why this module is longer than about 400 lines (about 560): `MotoBackedAws` is one Mocks object,
and each row of the table above is a maker in it and, mostly, a branch of its `delete` over the same moto
clients; split apart, each resource type's create and delete would sit in different files.
"""

from __future__ import annotations

import base64
import json
import ipaddress
import os
import secrets
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

import pulumi
from botocore.exceptions import ClientError
from pulumi.runtime import mocks

from cluster.stack.tags import ROLE_KEY, ROLE_MASTER
from tests.infra.conftest import (BUILD_INFRA, BUILT, COMPONENT, DISTRIBUTION, GROUP, LAUNCH_TEMPLATE,
                                  PROJECT, RECIPE, RELEASE, SETUP, STASH, TAG, Harness, Registration,
                                  RecordingMonitor)
from tests.rehearsal.account import ACCOUNT, REGION, Account

SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
INGRESS_RULE = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS_RULE = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
PLACEMENT_GROUP = "aws:ec2/placementGroup:PlacementGroup"
KEY_PAIR = "aws:ec2/keyPair:KeyPair"
BUCKET = "aws:s3/bucket:Bucket"
BUCKET_OBJECT = "aws:s3/bucketObjectv2:BucketObjectv2"
POLICY_ATTACHMENT = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"
BUILDER_CONFIG = (COMPONENT, RECIPE, BUILD_INFRA, DISTRIBUTION)  # moto has no Image Builder: kept by ARN here
PUBLIC_ACCESS_BLOCK = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
OWNERSHIP = "aws:s3/bucketOwnershipControls:BucketOwnershipControls"
ENCRYPTION = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
BUCKET_POLICY = "aws:s3/bucketPolicy:BucketPolicy"
VERSIONING = "aws:s3/bucketVersioning:BucketVersioning"
LIFECYCLE = "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration"
ROLE = "aws:iam/role:Role"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
INSTANCE_PROFILE = "aws:iam/instanceProfile:InstanceProfile"
BUCKET_SETTINGS = (PUBLIC_ACCESS_BLOCK, OWNERSHIP, ENCRYPTION, BUCKET_POLICY, VERSIONING, LIFECYCLE)


@contextmanager
def environ_set(places: dict[str, str]):
    """os.environ with `places` set while the block runs, then as it was (names it did not have removed)."""
    saved = {k: os.environ.get(k) for k in places}
    os.environ.update(places)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def autoname(name: str) -> str:
    """Pulumi's auto-name: the logical name and a random suffix (done by the provider, so by the mock)."""
    return f"{name}-{secrets.token_hex(4)[:7]}"


def tag_spec(kind: str, tags: dict[str, str] | None) -> list[dict]:
    return [{"ResourceType": kind, "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}] if tags else []


def market_options(market: dict) -> dict:
    """The provider's instanceMarketOptions (an instance's or a launch template's) as EC2's API takes them."""
    spot = market.get("spotOptions") or {}
    options = {"SpotInstanceType": spot["spotInstanceType"],
               "InstanceInterruptionBehavior": spot["instanceInterruptionBehavior"]}
    if spot.get("maxPrice"):
        options["MaxPrice"] = spot["maxPrice"]
    return {"MarketType": market["marketType"], "SpotOptions": options}


def provider_bool(value) -> bool | None:
    """The provider's string booleans of a launch template ("true", "false", unset)."""
    return None if value in (None, "") else str(value).lower() == "true"


def aws_filters(items) -> list[dict]:
    return [{"Name": f["name"], "Values": list(f["values"])} for f in items or []]


@dataclass
class Created:
    type: str
    name: str
    id: str


class MotoBackedAws(mocks.Mocks):
    """The AWS provider's stand-in: lookups and resources go to the moto account (module docstring)."""

    def __init__(self, account: Account, node_addresses: list[str],
                 setup: Callable[[dict[str, Any]], tuple[str, dict[str, Any]]]):
        self.ec2, self.s3, self.iam = account.client("ec2"), account.client("s3"), account.client("iam")
        self.autoscaling = account.client("autoscaling")
        self.group_launches = account.group_launches
        self.node_addresses = node_addresses  # by rank: the local node each instance stands for
        self.setup = setup
        self.created: list[Created] = []
        self.lookups: list[str] = []
        self.setup_inputs: dict[str, Any] = {}
        self.setup_outputs: dict[str, Any] = {}
        self.builder: dict[str, dict[str, Any]] = {}  # Image Builder's resources by ARN (ImageBuildDouble)
        self.build_instances: list[str] = []  # the instances the image builds ran on
        self.account = account
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------ lookups

    def call(self, args: mocks.MockCallArgs):
        token, a = args.token, dict(args.args)
        with self._lock:
            self.lookups.append(token)
        if token == "aws:ec2/getAmiIds:getAmiIds":
            images = self.ec2.describe_images(Owners=list(a.get("owners") or []),
                                              Filters=aws_filters(a.get("filters")))["Images"]
            images.sort(key=lambda i: i.get("CreationDate", ""), reverse=not a.get("sortAscending"))
            return {"ids": [i["ImageId"] for i in images], "id": REGION}
        if token == "aws:ec2/getAmi:getAmi":
            (image,) = self.ec2.describe_images(Owners=list(a.get("owners") or []),
                                                Filters=aws_filters(a.get("filters")))["Images"]
            return {"id": image["ImageId"], "imageId": image["ImageId"], "name": image.get("Name", ""),
                    "state": image.get("State", ""), "architecture": image.get("Architecture", ""),
                    "creationDate": image.get("CreationDate", ""), "rootDeviceName": image.get("RootDeviceName", ""),
                    "tags": {t["Key"]: t["Value"] for t in image.get("Tags", [])},
                    "blockDeviceMappings": [{"deviceName": m["DeviceName"], "ebs": {
                        "snapshot_id": m["Ebs"]["SnapshotId"], "volume_size": str(m["Ebs"].get("VolumeSize", ""))}}
                        for m in image.get("BlockDeviceMappings", []) if m.get("Ebs")]}
        if token == "aws:ec2/getSecurityGroups:getSecurityGroups":
            groups = self.ec2.describe_security_groups(Filters=aws_filters(a.get("filters")))["SecurityGroups"]
            return {"ids": [g["GroupId"] for g in groups], "id": REGION}
        if token == "aws:ec2/getSecurityGroup:getSecurityGroup":
            group = self.ec2.describe_security_groups(GroupIds=[a["id"]])["SecurityGroups"][0]
            return {"id": group["GroupId"], "tags": {t["Key"]: t["Value"] for t in group.get("Tags", [])}}
        if token == "aws:ec2/getVpcs:getVpcs":
            return {"ids": [v["VpcId"] for v in self.ec2.describe_vpcs(Filters=aws_filters(a.get("filters")))["Vpcs"]],
                    "id": REGION}
        if token == "aws:ec2/getSubnets:getSubnets":
            subnets = self.ec2.describe_subnets(Filters=aws_filters(a.get("filters")))["Subnets"]
            return {"ids": [s["SubnetId"] for s in subnets], "id": REGION}
        if token == "aws:ec2/getSubnet:getSubnet":
            s = self.ec2.describe_subnets(SubnetIds=[a["id"]])["Subnets"][0]
            return {"id": s["SubnetId"], "vpcId": s["VpcId"], "availabilityZone": s["AvailabilityZone"],
                    "cidrBlock": s["CidrBlock"], "mapPublicIpOnLaunch": s["MapPublicIpOnLaunch"],
                    "defaultForAz": s["DefaultForAz"]}
        if token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
            offers = self.ec2.describe_instance_type_offerings(
                LocationType=a.get("locationType", "region"), Filters=aws_filters(a.get("filters")))
            found = offers["InstanceTypeOfferings"]
            return {"locations": [o["Location"] for o in found], "locationTypes": [o["LocationType"] for o in found],
                    "instanceTypes": [o["InstanceType"] for o in found], "id": REGION}
        if token == "aws:ec2/getInstances:getInstances":
            filters = [{"Name": f"tag:{k}", "Values": [v]} for k, v in (a.get("instanceTags") or {}).items()]
            filters.append({"Name": "instance-state-name", "Values": list(a.get("instanceStateNames") or [])})
            found = [x for r in self.ec2.describe_instances(Filters=filters)["Reservations"] for x in r["Instances"]]
            return {"ids": [x["InstanceId"] for x in found], "privateIps": [x["PrivateIpAddress"] for x in found],
                    "publicIps": [x.get("PublicIpAddress") or "" for x in found], "id": REGION}
        raise NotImplementedError(f"the rehearsal's AWS stand-in does not answer the lookup {token}; map it to moto "
                                  "in tests/rehearsal/engine.py")

    # ---------------------------------------------------------------------------- resources

    def new_resource(self, args: mocks.MockResourceArgs):
        if not args.custom:  # a ComponentResource: nothing in AWS
            return "", {}
        make = self._makers().get(args.typ)
        if make is None:
            raise NotImplementedError(f"the rehearsal's AWS stand-in cannot create {args.typ} ({args.name}); "
                                      "map it to moto in tests/rehearsal/engine.py")
        rid, outputs = make(args.name, dict(args.inputs))
        with self._lock:
            self.created.append(Created(args.typ, args.name, rid))
        return rid, {**args.inputs, **outputs}

    def _makers(self) -> dict[str, Callable[[str, dict], tuple[str, dict]]]:
        return {SECURITY_GROUP: self._security_group,
                INGRESS_RULE: lambda name, i: self._rule(name, i, egress=False),
                EGRESS_RULE: lambda name, i: self._rule(name, i, egress=True),
                PLACEMENT_GROUP: self._placement_group, KEY_PAIR: self._key_pair, BUCKET: self._bucket,
                **{t: self._bucket_setting for t in BUCKET_SETTINGS},
                ROLE: self._role, ROLE_POLICY: self._role_policy, INSTANCE_PROFILE: self._instance_profile,
                STASH: self._stash, SETUP: self._setup_step, TAG: self._tag,
                LAUNCH_TEMPLATE: self._launch_template, GROUP: self._group, BUCKET_OBJECT: self._bucket_object,
                POLICY_ATTACHMENT: self._policy_attachment, **{t: self._builder_config for t in BUILDER_CONFIG},
                BUILT: self._build, RELEASE: lambda name, i: (f"release-{i['image_id']}", {})}

    def _security_group(self, name: str, i: dict) -> tuple[str, dict]:
        group_name = i.get("name") or autoname(name)
        gid = self.ec2.create_security_group(
            GroupName=group_name, Description=i.get("description") or "Managed by Pulumi", VpcId=i["vpcId"],
            TagSpecifications=tag_spec("security-group", i.get("tags")))["GroupId"]
        # As the provider does: a new group's default allow-all egress goes (the rules are resources of their own).
        default = self.ec2.describe_security_groups(GroupIds=[gid])["SecurityGroups"][0]["IpPermissionsEgress"]
        if default:
            self.ec2.revoke_security_group_egress(GroupId=gid, IpPermissions=default)
        return gid, {"name": group_name, "arn": f"arn:aws:ec2:{REGION}:{ACCOUNT}:security-group/{gid}",
                     "ownerId": ACCOUNT}

    def _rule(self, name: str, i: dict, *, egress: bool) -> tuple[str, dict]:
        permission: dict[str, Any] = {"IpProtocol": i["ipProtocol"]}
        if i.get("fromPort") is not None:
            permission.update(FromPort=int(i["fromPort"]), ToPort=int(i["toPort"]))
        described = {"Description": i["description"]} if i.get("description") else {}
        if i.get("cidrIpv4"):
            permission["IpRanges"] = [{"CidrIp": i["cidrIpv4"], **described}]
        elif i.get("cidrIpv6"):
            permission["Ipv6Ranges"] = [{"CidrIpv6": i["cidrIpv6"], **described}]
        elif i.get("referencedSecurityGroupId"):
            permission["UserIdGroupPairs"] = [{"GroupId": i["referencedSecurityGroupId"], **described}]
        authorize = self.ec2.authorize_security_group_egress if egress else self.ec2.authorize_security_group_ingress
        rule = authorize(GroupId=i["securityGroupId"], IpPermissions=[permission],
                         TagSpecifications=tag_spec("security-group-rule", i.get("tags")))["SecurityGroupRules"][0]
        rid = rule["SecurityGroupRuleId"]
        return rid, {"securityGroupRuleId": rid, "arn": f"arn:aws:ec2:{REGION}:{ACCOUNT}:security-group-rule/{rid}"}

    def _placement_group(self, name: str, i: dict) -> tuple[str, dict]:
        group_name = i.get("name") or autoname(name)
        self.ec2.create_placement_group(GroupName=group_name, Strategy=i["strategy"],
                                        TagSpecifications=tag_spec("placement-group", i.get("tags")))
        group = self.ec2.describe_placement_groups(GroupNames=[group_name])["PlacementGroups"][0]
        return group_name, {"name": group_name, "placementGroupId": group["GroupId"]}

    def _key_pair(self, name: str, i: dict) -> tuple[str, dict]:
        key_name = i.get("keyName") or autoname(name)
        made = self.ec2.import_key_pair(KeyName=key_name, PublicKeyMaterial=i["publicKey"].encode(),
                                        TagSpecifications=tag_spec("key-pair", i.get("tags")))
        return key_name, {"keyName": key_name, "keyPairId": made.get("KeyPairId", ""),
                          "fingerprint": made.get("KeyFingerprint", "")}

    def _bucket(self, name: str, i: dict) -> tuple[str, dict]:
        bucket = i.get("bucket") or autoname(name).lower()
        self.s3.create_bucket(Bucket=bucket)  # us-east-1: no location constraint
        if i.get("tags"):
            self.s3.put_bucket_tagging(Bucket=bucket, Tagging={"TagSet": tag_spec("bucket", i["tags"])[0]["Tags"]})
        return bucket, {"bucket": bucket, "arn": f"arn:aws:s3:::{bucket}", "region": REGION}

    def _bucket_setting(self, name: str, i: dict) -> tuple[str, dict]:
        bucket = i["bucket"]
        if "blockPublicAcls" in i:
            self.s3.put_public_access_block(Bucket=bucket, PublicAccessBlockConfiguration={
                "BlockPublicAcls": i["blockPublicAcls"], "BlockPublicPolicy": i["blockPublicPolicy"],
                "IgnorePublicAcls": i["ignorePublicAcls"], "RestrictPublicBuckets": i["restrictPublicBuckets"]})
        elif "rule" in i:
            self.s3.put_bucket_ownership_controls(Bucket=bucket, OwnershipControls={
                "Rules": [{"ObjectOwnership": i["rule"]["objectOwnership"]}]})
        elif "policy" in i:
            with self._lock:  # not while an object's put has lifted the TLS-only statements (_bucket_object)
                self.s3.put_bucket_policy(Bucket=bucket, Policy=i["policy"])
        elif "versioningConfiguration" in i:
            self.s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={
                "Status": i["versioningConfiguration"]["status"]})
        elif "rules" in i and "applyServerSideEncryptionByDefault" in i["rules"][0]:
            self.s3.put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration={"Rules": [
                {"ApplyServerSideEncryptionByDefault": {
                    "SSEAlgorithm": r["applyServerSideEncryptionByDefault"]["sseAlgorithm"]}} for r in i["rules"]]})
        elif "rules" in i:
            self.s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={
                "Rules": [_lifecycle_rule(r) for r in i["rules"]]})
        else:
            raise NotImplementedError(f"bucket setting {name} with inputs {sorted(i)}")
        return bucket, {}

    def _role(self, name: str, i: dict) -> tuple[str, dict]:
        role = i.get("name") or autoname(name)
        made = self.iam.create_role(RoleName=role, AssumeRolePolicyDocument=i["assumeRolePolicy"],
                                    Description=i.get("description", ""),
                                    Tags=tag_spec("role", i.get("tags"))[0]["Tags"] if i.get("tags") else [])["Role"]
        return role, {"name": role, "arn": made["Arn"], "uniqueId": made["RoleId"]}

    def _role_policy(self, name: str, i: dict) -> tuple[str, dict]:
        policy = i.get("name") or autoname(name)
        self.iam.put_role_policy(RoleName=i["role"], PolicyName=policy, PolicyDocument=i["policy"])
        return f"{i['role']}:{policy}", {"name": policy}

    def _instance_profile(self, name: str, i: dict) -> tuple[str, dict]:
        profile = i.get("name") or autoname(name)
        made = self.iam.create_instance_profile(
            InstanceProfileName=profile, Tags=tag_spec("p", i.get("tags"))[0]["Tags"] if i.get("tags") else [])
        self.iam.add_role_to_instance_profile(InstanceProfileName=profile, RoleName=i["role"])
        return profile, {"name": profile, "arn": made["InstanceProfile"]["Arn"]}

    def _stash(self, name: str, i: dict) -> tuple[str, dict]:
        return f"stash-{name}", {"output": i.get("input")}

    def _launch_template(self, name: str, i: dict) -> tuple[str, dict]:
        template_name = i.get("name") or autoname(name)
        data: dict[str, Any] = {"ImageId": i["imageId"], "InstanceType": i["instanceType"], "KeyName": i["keyName"]}
        if i.get("vpcSecurityGroupIds"):
            data["SecurityGroupIds"] = list(i["vpcSecurityGroupIds"])
        if i.get("networkInterfaces"):
            data["NetworkInterfaces"] = [{k: v for k, v in {
                "DeviceIndex": int(n.get("deviceIndex") or 0), "Groups": list(n.get("securityGroups") or []),
                "AssociatePublicIpAddress": provider_bool(n.get("associatePublicIpAddress")),
                "DeleteOnTermination": provider_bool(n.get("deleteOnTermination"))}.items() if v is not None}
                for n in i["networkInterfaces"]]
        if (i.get("placement") or {}).get("groupName"):
            data["Placement"] = {"GroupName": i["placement"]["groupName"]}
        if i.get("instanceMarketOptions"):
            data["InstanceMarketOptions"] = market_options(i["instanceMarketOptions"])
        if i.get("instanceInitiatedShutdownBehavior"):
            data["InstanceInitiatedShutdownBehavior"] = i["instanceInitiatedShutdownBehavior"]
        if (i.get("iamInstanceProfile") or {}).get("name"):
            data["IamInstanceProfile"] = {"Name": i["iamInstanceProfile"]["name"]}
        if i.get("metadataOptions"):
            m = i["metadataOptions"]
            data["MetadataOptions"] = {"HttpEndpoint": m["httpEndpoint"], "HttpTokens": m["httpTokens"],
                                       "HttpPutResponseHopLimit": int(m["httpPutResponseHopLimit"])}
        data["BlockDeviceMappings"] = [{"DeviceName": d["deviceName"], "Ebs": {k: v for k, v in {
            "VolumeSize": int(d["ebs"]["volumeSize"]), "VolumeType": d["ebs"]["volumeType"],
            "Encrypted": provider_bool(d["ebs"].get("encrypted")),
            "DeleteOnTermination": provider_bool(d["ebs"].get("deleteOnTermination"))}.items() if v is not None}}
            for d in i.get("blockDeviceMappings") or []]
        data["TagSpecifications"] = [spec for t in i.get("tagSpecifications") or []
                                     for spec in tag_spec(t["resourceType"], t.get("tags"))]
        made = self.ec2.create_launch_template(
            LaunchTemplateName=template_name, LaunchTemplateData=data,
            TagSpecifications=tag_spec("launch-template", i.get("tags")))["LaunchTemplate"]
        tid = made["LaunchTemplateId"]
        return tid, {"name": template_name, "arn": f"arn:aws:ec2:{REGION}:{ACCOUNT}:launch-template/{tid}",
                     "latestVersion": made["LatestVersionNumber"], "defaultVersion": made["DefaultVersionNumber"]}

    def _group(self, name: str, i: dict) -> tuple[str, dict]:
        group_name = i.get("name") or autoname(name)
        subnets = list(i["vpcZoneIdentifiers"])
        desired = int(i["desiredCapacity"])
        # The master's group's instance stands for the first local node, the workers' for the nodes after it.
        master = any(t["key"] == ROLE_KEY and t["value"] == ROLE_MASTER for t in i.get("tags") or [])
        self.group_launches.addresses[group_name] = list(self.node_addresses[:1] if master else self.node_addresses[1:])
        template = i["launchTemplate"]
        self.autoscaling.create_auto_scaling_group(
            AutoScalingGroupName=group_name, MinSize=int(i["minSize"]), MaxSize=int(i["maxSize"]),
            DesiredCapacity=desired, VPCZoneIdentifier=",".join(subnets),
            LaunchTemplate={"LaunchTemplateId": template["id"], "Version": str(template["version"])},
            HealthCheckType=i.get("healthCheckType") or "EC2", CapacityRebalance=bool(i.get("capacityRebalance")),
            Tags=[{"Key": t["key"], "Value": t["value"], "PropagateAtLaunch": bool(t.get("propagateAtLaunch")),
                   "ResourceId": group_name, "ResourceType": "auto-scaling-group"} for t in i.get("tags") or []])
        # The provider's wait for capacity: moto fills the group within the call, so it is full or it failed.
        group = self.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[group_name])["AutoScalingGroups"][0]
        ids = [x["InstanceId"] for x in group["Instances"] if x["LifecycleState"] == "InService"]
        if len(ids) != desired:
            raise RuntimeError(f"{name}: {len(ids)} of {desired} instance(s) in service after CreateAutoScalingGroup")
        if ids:
            self.ec2.get_waiter("instance_running").wait(InstanceIds=ids, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
        return group_name, {"name": group_name, "arn": group["AutoScalingGroupARN"],
                            "availabilityZones": group["AvailabilityZones"]}

    def _setup_step(self, name: str, i: dict) -> tuple[str, dict]:
        props = {k: v for k, v in i.items() if k != "__provider"}
        with self._lock:
            self.setup_inputs = dict(props)
        rid, outs = self.setup(i)
        with self._lock:
            self.setup_outputs = dict(outs)
        return rid, outs

    def _bucket_object(self, name: str, i: dict) -> tuple[str, dict]:
        """The object put as the provider puts it, over TLS: moto's server is plain HTTP, so where the bucket's
        TLS-only policy is already in place (the engine creates resources in no fixed order) its statements
        that deny a request without TLS are lifted for this one put, then the policy is put back."""
        with self._lock:
            try:
                policy = self.s3.get_bucket_policy(Bucket=i["bucket"])["Policy"]
            except self.s3.exceptions.ClientError:
                policy = None
            tls = [st for st in json.loads(policy)["Statement"] if "aws:SecureTransport" in json.dumps(st)] \
                if policy else []
            if tls:
                rest = [st for st in json.loads(policy)["Statement"] if st not in tls]
                if rest:
                    self.s3.put_bucket_policy(Bucket=i["bucket"], Policy=json.dumps({**json.loads(policy),
                                                                                      "Statement": rest}))
                else:
                    self.s3.delete_bucket_policy(Bucket=i["bucket"])
            try:
                self.s3.put_object(Bucket=i["bucket"], Key=i["key"], Body=i.get("content", "").encode())
            finally:
                if tls:
                    self.s3.put_bucket_policy(Bucket=i["bucket"], Policy=policy)
        return i["key"], {"key": i["key"]}

    def _policy_attachment(self, name: str, i: dict) -> tuple[str, dict]:
        try:
            self.iam.attach_role_policy(RoleName=i["role"], PolicyArn=i["policyArn"])
        except ClientError as exc:  # moto ships a list of AWS's managed policies that may lack Image Builder's
            if "NoSuchEntity" not in str(exc):
                raise
        return f"{i['role']}-{i['policyArn'].rsplit('/', 1)[-1]}", {}

    def _builder_config(self, name: str, i: dict) -> tuple[str, dict]:
        kind = "component" if "platform" in i else "image-recipe" if "parentImage" in i else (
            "infrastructure-configuration" if "instanceTypes" in i else "distribution-configuration")
        arn = f"arn:aws:imagebuilder:{REGION}:{ACCOUNT}:{kind}/{i.get('name') or name}/1.0.0"
        with self._lock:
            self.builder[arn] = i
        return arn, {"arn": arn}

    def _build(self, name: str, i: dict) -> tuple[str, dict]:
        """ImageBuildDouble: what Image Builder does with the recipe, on moto's EC2 (the install is not run)."""
        recipe, infra = self.builder[i["imageRecipeArn"]], self.builder[i["infrastructureConfigurationArn"]]
        (where,) = self.builder[i["distributionConfigurationArn"]]["distributions"]
        ami = where["amiDistributionConfiguration"]
        cidr = self.ec2.describe_subnets(SubnetIds=[infra["subnetId"]])["Subnets"][0]["CidrBlock"]
        builder = self.ec2.run_instances(
            ImageId=recipe["parentImage"], InstanceType=infra["instanceTypes"][0], MinCount=1, MaxCount=1,
            SubnetId=infra["subnetId"], SecurityGroupIds=list(infra["securityGroupIds"]),
            PrivateIpAddress=str(ipaddress.ip_network(cidr)[-2]),  # no node's: a terminated one's stays taken
            IamInstanceProfile={"Name": infra["instanceProfileName"]},
            TagSpecifications=tag_spec("instance", infra.get("resourceTags")))["Instances"][0]["InstanceId"]
        with self._lock:
            self.build_instances.append(builder)
        made = self.ec2.create_image(InstanceId=builder, Description=ami.get("description", ""),
                                     Name=ami["name"].replace("{{ imagebuilder:buildDate }}", secrets.token_hex(4)),
                                     TagSpecifications=tag_spec("image", ami.get("amiTags")))
        image_id = made["ImageId"]
        self.ec2.get_waiter("image_available").wait(ImageIds=[image_id], WaiterConfig={"Delay": 1, "MaxAttempts": 30})
        self.ec2.terminate_instances(InstanceIds=[builder])  # Image Builder's own end of a build
        arn = f"{i['imageRecipeArn'].replace('image-recipe', 'image')}/1"
        return arn, {"arn": arn, "outputResources": [{"amis": [{"image": image_id, "region": REGION,
                                                                "accountId": ACCOUNT}]}]}

    def _tag(self, name: str, i: dict) -> tuple[str, dict]:
        self.ec2.create_tags(Resources=[i["resourceId"]], Tags=[{"Key": i["key"], "Value": i["value"]}])
        return f"{i['resourceId']},{i['key']}", {}

    # ------------------------------------------------------------------------------- delete

    def account_env(self):
        """The provider's boto3 reaches the rehearsal's account, as the caller's credentials would."""
        return environ_set({k: v for k, v in self.account.fab_env({}).items() if k.startswith("AWS_")})

    def delete(self, reg: Registration) -> str:
        """Delete one registered resource from the account; returns what was done."""
        i, rid = reg.inputs, reg.id
        if reg.type == GROUP:
            # The provider's delete without force_delete: min and desired 0, wait until every instance is
            # terminated (the drain), then delete the group.
            group = self.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[rid])["AutoScalingGroups"][0]
            ids = [x["InstanceId"] for x in group["Instances"]]
            self.autoscaling.update_auto_scaling_group(AutoScalingGroupName=rid, MinSize=0, DesiredCapacity=0)
            if ids:
                self.ec2.get_waiter("instance_terminated").wait(InstanceIds=ids,
                                                                WaiterConfig={"Delay": 1, "MaxAttempts": 30})
            left = self.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[rid])["AutoScalingGroups"]
            if left and left[0]["Instances"]:
                raise RuntimeError(f"{reg.name}: the drained group still has {left[0]['Instances']}")
            self.autoscaling.delete_auto_scaling_group(AutoScalingGroupName=rid)
            return f"drained ({len(ids)} terminated), deleted"
        if reg.type == LAUNCH_TEMPLATE:
            self.ec2.delete_launch_template(LaunchTemplateId=rid)
            return "deleted"
        if reg.type in BUILDER_CONFIG:
            return "nothing in AWS (moto has no Image Builder)"
        if reg.type == BUILT:
            return "the AMI stays (the provider deletes Image Builder's record of the build only)"
        if reg.type == RELEASE:
            with self.account_env():
                run_dynamic_provider(i, "delete", rid)
            left = self.ec2.describe_images(Filters=[{"Name": "image-id", "Values": [i["image_id"]]}])["Images"]
            return "released: the image kept" if left else "released: the image and its snapshots removed"
        if reg.type == BUCKET_OBJECT:
            try:
                self.s3.delete_object(Bucket=i["bucket"], Key=rid)
            except ClientError as exc:  # the bucket's TLS-only policy: moto's endpoint here is plain HTTP
                if "Forbidden" not in str(exc) and "AccessDenied" not in str(exc):
                    raise
                return "left in the bucket (its TLS-only policy refuses moto's plain-HTTP endpoint)"
        elif reg.type == POLICY_ATTACHMENT:
            try:
                self.iam.detach_role_policy(RoleName=i["role"], PolicyArn=i["policyArn"])
            except ClientError as exc:
                if "NoSuchEntity" not in str(exc):
                    raise
        elif reg.type == TAG:
            self.ec2.delete_tags(Resources=[i["resourceId"]], Tags=[{"Key": i["key"]}])
        elif reg.type in (INGRESS_RULE, EGRESS_RULE):
            revoke = (self.ec2.revoke_security_group_egress if reg.type == EGRESS_RULE
                      else self.ec2.revoke_security_group_ingress)
            revoke(GroupId=i["securityGroupId"], SecurityGroupRuleIds=[rid])
        elif reg.type == SECURITY_GROUP:
            self.ec2.delete_security_group(GroupId=rid)
        elif reg.type == PLACEMENT_GROUP:
            self.ec2.delete_placement_group(GroupName=rid)
        elif reg.type == KEY_PAIR:
            self.ec2.delete_key_pair(KeyName=rid)
        elif reg.type == ROLE_POLICY:
            self.iam.delete_role_policy(RoleName=i["role"], PolicyName=reg.state["name"])
        elif reg.type == INSTANCE_PROFILE:
            self.iam.remove_role_from_instance_profile(InstanceProfileName=rid, RoleName=i["role"])
            self.iam.delete_instance_profile(InstanceProfileName=rid)
        elif reg.type == ROLE:
            self.iam.delete_role(RoleName=rid)
        elif reg.type in BUCKET_SETTINGS:
            return "dropped with the bucket"
        elif reg.type == BUCKET:
            if not i.get("forceDestroy"):
                self.s3.delete_bucket(Bucket=rid)  # refused by S3 when it holds objects, as with the provider
                return "deleted"
            for page in self.s3.get_paginator("list_object_versions").paginate(Bucket=rid):
                objects = [{"Key": o["Key"], "VersionId": o["VersionId"]}
                           for o in page.get("Versions", []) + page.get("DeleteMarkers", [])]
                if objects:
                    self.s3.delete_objects(Bucket=rid, Delete={"Objects": objects, "Quiet": True})
            self.s3.delete_bucket(Bucket=rid)
        else:
            raise NotImplementedError(f"the rehearsal's AWS stand-in cannot delete {reg.type} ({reg.name})")
        return "deleted"


def _lifecycle_rule(rule: dict) -> dict:
    out: dict[str, Any] = {"ID": rule["id"], "Status": rule["status"], "Filter": {}}
    if rule.get("noncurrentVersionExpiration"):
        days = int(rule["noncurrentVersionExpiration"]["noncurrentDays"])
        out["NoncurrentVersionExpiration"] = {"NoncurrentDays": days}
    if rule.get("expiration"):
        out["Expiration"] = {"ExpiredObjectDeleteMarker": rule["expiration"]["expiredObjectDeleteMarker"]}
    if rule.get("abortIncompleteMultipartUpload"):
        out["AbortIncompleteMultipartUpload"] = {
            "DaysAfterInitiation": int(rule["abortIncompleteMultipartUpload"]["daysAfterInitiation"])}
    return out


def run_dynamic_provider(inputs: dict[str, Any], method: str, rid: str = ""):
    """What the engine does with a dynamic resource: load its pickled provider (`__provider`, as Pulumi's dynamic
    provider process does) and call `create()` (or `delete()`) with the inputs the program registered."""
    import dill

    serialized = inputs["__provider"]
    if isinstance(serialized, dict):  # a secret, as the mocks see it: {<secret signature>: ..., "value": ...}
        serialized = serialized["value"]
    provider = dill.loads(base64.b64decode(serialized))
    props = {k: v for k, v in inputs.items() if k != "__provider"}
    return provider.create(props) if method == "create" else provider.delete(rid, props)


def run_setup_provider(inputs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The setup step's create(), as the engine runs it."""
    result = run_dynamic_provider(inputs, "create")
    return result.id, {**result.outs, "__provider": inputs["__provider"]}


@dataclass
class Deleted:
    reg: Registration
    outcome: str


@dataclass
class Stack:
    """One Pulumi stack of the program, deployed into the moto account by the mocks."""

    name: str
    account: Account
    node_addresses: list[str]
    setup: Callable[[dict[str, Any]], tuple[str, dict[str, Any]]] = run_setup_provider
    aws: MotoBackedAws | None = None
    monitor: RecordingMonitor | None = None
    outputs: dict[str, Any] = field(default_factory=dict)

    def up(self, config: dict[str, Any]) -> dict[str, Any]:
        """`pulumi up`: evaluate infra/__main__.py with `config` (camelCase keys); the stack outputs."""
        self.aws = MotoBackedAws(self.account, self.node_addresses, self.setup)
        self.monitor = RecordingMonitor(self.aws)
        pulumi.runtime.set_mocks(self.aws, project=PROJECT, stack=self.name, preview=False, monitor=self.monitor)
        try:
            self.outputs = Harness(self.aws, self.monitor).run(config, region=REGION)
        finally:
            pulumi.runtime.set_all_config({})
        return self.outputs

    def destroy(self, forget: tuple[str, ...] = ()) -> list[Deleted]:
        """`pulumi destroy`, in reverse order of registration; `forget`: types a faulty destroy leaves."""
        assert self.monitor is not None and self.aws is not None, "destroy() before up()"
        custom = [r for r in self.monitor.registrations if r.type.startswith("aws:") or r.type in (SETUP, RELEASE)]
        deleting = {r.urn for r in custom if not r.retain_on_delete and r.type not in forget}
        done = []
        for reg in reversed(custom):
            if reg.retain_on_delete:
                outcome = "kept (retain_on_delete): dropped from the stack only"
            elif reg.type in forget:
                outcome = "LEFT BEHIND (this destroy forgets it)"
            elif reg.deleted_with and reg.deleted_with in deleting:
                outcome = "skipped: deleted with " + self.monitor.by_urn(reg.deleted_with).name
            elif reg.type == SETUP:
                outcome = "nothing in AWS"
            else:
                outcome = self.aws.delete(reg)
            done.append(Deleted(reg, outcome))
        return done
