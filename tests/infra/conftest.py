"""Run the real Pulumi program (infra/__main__.py) under Pulumi's mocks and record what it registers.

No CLI, no AWS account, no network. `FakeAws` answers the lookups (AMI, VPC, subnets, offerings)
and gives created resources ids and computed addresses; `RecordingMonitor` keeps, per resource,
its type, name, parent, inputs, the URNs it depends on (`depends_on` is not part of the inputs a
Mocks object sees), the lifecycle options the engine acts on (what a real `pulumi up` would do with
them is the engine's part, not testable here) and the order of registration.
"""

from __future__ import annotations

import hashlib
import json
import runpy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pytest
from google.protobuf import json_format
from pulumi.runtime import mocks, rpc
from pulumi.runtime.sync_await import _sync_await

ROOT = Path(__file__).resolve().parents[2]
MAIN = ROOT / "infra" / "__main__.py"
PROJECT = "xeon-cluster"
STACK = "dev"
REGION = "us-east-1"

# A real OpenSSH ed25519 public key line (made with ssh-keygen for these tests; no private half kept).
PUBLIC_KEY = ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICECnqlEndt9BEuNRtVWwmWQcvgQq/FYgx/iofqx4Int "
              "test@xeon-cluster")
ADMIN_CIDR = "203.0.113.7/32"
BASE_AMI = "ami-0ubuntu2404base"
DEFAULT_VPC = "vpc-0default"
OFFERED_ZONES = ["us-east-1c", "us-east-1a"]
DEFAULT_SUBNETS = ["subnet-0ccc", "subnet-0aaa"]
ACCOUNT = "123456789012"
SUBNET_CIDR = "172.31.16.0/20"  # every looked-up subnet's

# Type tokens of what the program registers, as the monitor sees them.
STASH = "pulumi:index:Stash"  # the kept subnet and base image (infra/placement.py)
INSTANCES = "aws:ec2/getInstances:getInstances"
AMI = "aws:ec2/amiFromInstance:AmiFromInstance"
BUILT = "aws:imagebuilder/image:Image"  # the image Image Builder builds (infra/image.py)
RECIPE = "aws:imagebuilder/imageRecipe:ImageRecipe"
COMPONENT = "aws:imagebuilder/component:Component"
BUILD_INFRA = "aws:imagebuilder/infrastructureConfiguration:InfrastructureConfiguration"
DISTRIBUTION = "aws:imagebuilder/distributionConfiguration:DistributionConfiguration"
RELEASE = "pulumi-python:dynamic/xeon-cluster:ImageRelease"
TAG = "aws:ec2/tag:Tag"
SETUP = "pulumi-python:dynamic/xeon-cluster:ProfileSetup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
GROUP = "aws:autoscaling/group:Group"


def minimal_config(**overrides: Any) -> dict[str, Any]:
    """The smallest valid stack config; overrides use the camelCase Pulumi keys."""
    config: dict[str, Any] = {"publicKey": PUBLIC_KEY, "adminCidrs": [ADMIN_CIDR]}
    config.update(overrides)
    return config


def _address(name: str) -> tuple[str, str]:
    """A private and a public address derived from the name (not from registration order)."""
    digest = hashlib.sha256(name.encode()).digest()
    return f"10.0.{digest[0]}.{digest[1] or 1}", f"198.51.{digest[2]}.{digest[3] or 1}"


_TEMPLATE_VERSIONS: dict[str, int] = {}  # a launch template's content -> its version number


def kept_image(image_id: str, tags: dict[str, str], *, gib: int = 100, state: str = "available") -> dict:
    """An image of this account as the provider's getAmi lookup describes it (camelCase; `ebs` a map)."""
    return {"imageId": image_id, "id": image_id, "name": f"{image_id}-name", "state": state,
            "architecture": "x86_64", "creationDate": "2026-05-01T12:30:00.000Z", "rootDeviceName": "/dev/sda1",
            "blockDeviceMappings": [{"deviceName": "/dev/sda1",
                                     "ebs": {"snapshot_id": f"snap-{image_id}", "volume_size": str(gib)}}],
            "tags": dict(tags)}


def _matches(tags: dict[str, str], filters) -> bool:
    """Whether `tags` pass DescribeImages/DescribeSecurityGroups' `tag:<key>` filters (other filters pass)."""
    return all(tags.get(f["name"][4:]) in f["values"] for f in filters or [] if f["name"].startswith("tag:"))


def group_instance(group: str) -> str:
    """The id of the one instance the fake account's Auto Scaling group `group` runs (its master)."""
    return f"i-{group}"


class FakeAws(mocks.Mocks):
    """Test double for the AWS provider and the engine's record of the stack: answers invokes and "creates"
    resources. `kept`: the account's own images (kept_image's shape) its getAmiIds/getAmi lookups of owner `self`
    find; `groups`: security groups by id -> their tags (the stack marker's group of a stack that exists);
    `subnets`: the default subnets getSubnets finds. `stashes`: the engine's part for `pulumi.Stash`, by name ->
    (replacement trigger, kept output): a stash keeps its first input as its output until its trigger changes,
    so one FakeAws (or one `stashes`) passed to two runs stands for one stack's two `pulumi up`. Each Auto
    Scaling group runs one instance (`group_instance`) that getInstances finds by the group's name tag, with a
    public address when its template asks for one."""

    def __init__(self, empty_tokens: set[str] | None = None, kept: list[dict] | None = None,
                 groups: dict[str, dict[str, str]] | None = None, subnets: list[str] | None = None,
                 stashes: dict[str, tuple[Any, Any]] | None = None):
        self.calls: list[tuple[str, dict]] = []
        self.empty_tokens = empty_tokens or set()  # list lookups that find nothing
        self.kept = kept or []
        self.groups = groups or {}
        self.subnets = list(subnets or DEFAULT_SUBNETS)
        self.stashes = {} if stashes is None else stashes
        self.next_trigger: Any = None  # the replacement trigger of the resource being registered (the monitor's)
        self.templates: dict[str, dict] = {}  # launch template id -> its inputs
        self.asgs: dict[str, dict] = {}  # group name -> its template's inputs

    def call(self, args: mocks.MockCallArgs):
        self.calls.append((args.token, dict(args.args)))
        if args.token in self.empty_tokens:
            return {"ids": [], "locations": [], "id": REGION}
        if args.token == "aws:ec2/getAmiIds:getAmiIds" and args.args.get("owners") == ["self"]:
            return {"ids": [i["imageId"] for i in self.kept if _matches(i["tags"], args.args.get("filters"))],
                    "id": REGION}
        if args.token == "aws:ec2/getAmi:getAmi":
            wanted = {v for f in args.args.get("filters") or [] if f["name"] == "image-id" for v in f["values"]}
            found = [i for i in self.kept if i["imageId"] in wanted]
            if not found:
                raise LookupError(f"getAmi: no image of this account is {sorted(wanted)}")
            return found[0]
        if args.token == "aws:ec2/getSecurityGroups:getSecurityGroups":
            return {"ids": [g for g, tags in self.groups.items() if _matches(tags, args.args.get("filters"))],
                    "id": REGION}
        if args.token == "aws:ec2/getSecurityGroup:getSecurityGroup":
            return {"id": args.args["id"], "tags": self.groups[args.args["id"]]}
        if args.token == "aws:ec2/getAmiIds:getAmiIds":
            return {"ids": [BASE_AMI, "ami-0older"], "id": REGION}
        if args.token == "aws:ec2/getVpcs:getVpcs":
            return {"ids": [DEFAULT_VPC], "id": REGION}
        if args.token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
            return {"locations": OFFERED_ZONES, "locationTypes": ["availability-zone"] * len(OFFERED_ZONES),
                    "instanceTypes": ["x"] * len(OFFERED_ZONES), "id": REGION}
        if args.token == "aws:ec2/getSubnets:getSubnets":
            return {"ids": self.subnets, "id": REGION}
        if args.token == INSTANCES:
            group = (args.args.get("instanceTags") or {}).get("aws:autoscaling:groupName")
            if group not in self.asgs:
                return {"ids": [], "privateIps": [], "publicIps": [], "id": REGION}
            private, public = _address(group)
            interfaces = self.asgs[group].get("networkInterfaces") or [{}]
            return {"ids": [group_instance(group)], "privateIps": [private], "id": REGION,
                    "publicIps": [public if interfaces[0].get("associatePublicIpAddress") == "true" else ""]}
        if args.token == "aws:ec2/getSubnet:getSubnet":
            return {"id": args.args["id"], "vpcId": "vpc-0custom", "availabilityZone": "us-east-1a",
                    "cidrBlock": SUBNET_CIDR}
        return {}

    def new_resource(self, args: mocks.MockResourceArgs):
        state = dict(args.inputs)
        typ, name = args.typ, args.name
        rid = f"{name}-id"
        if typ == STASH:
            kept = self.stashes.get(name)
            if kept is None or kept[0] != self.next_trigger:  # created, or replaced: its input is kept now
                kept = self.stashes[name] = (self.next_trigger, state.get("input"))
            state["output"] = kept[1]
        elif typ.startswith("aws:imagebuilder/") and typ != BUILT:
            kind = typ.rsplit(":", 1)[1]
            # Its name and version; a recipe's or component's with a digest of its inputs but tags (the mock's mark
            # of a new one: the provider replaces them for any other change; the others are updated in place).
            held = {k: v for k, v in state.items() if k != "tags"} if kind in ("ImageRecipe", "Component") else {}
            digest = hashlib.sha256(json.dumps(held, sort_keys=True, default=str).encode()).hexdigest()[:8]
            state["arn"] = rid = (f"arn:aws:imagebuilder:{REGION}:{ACCOUNT}:{kind.lower()}/{args.inputs.get('name')}"
                                  f"/1.0.0" + (f"/{digest}" if held else ""))
        elif typ == BUILT:
            # A new AMI per recipe (its name carries the bake tag), as a build after a software change makes one.
            recipe = str(args.inputs.get("imageRecipeArn"))
            state["arn"] = rid = f"{recipe}/1"
            ami = f"ami-{name}-{hashlib.sha256(recipe.encode()).hexdigest()[:8]}"
            state["outputResources"] = [{"amis": [{"image": ami, "region": REGION, "accountId": ACCOUNT}]}]
        elif typ == SETUP:  # what the step's create() returns
            state["installed"] = "from kept image: nothing to install"
        elif typ == LAUNCH_TEMPLATE:
            rid = f"lt-{name}"
            # AWS numbers a template's versions; here a changed template (any input) gets another number
            # (distinct contents, distinct numbers, in the order this process first sees them).
            content = json.dumps(state, sort_keys=True, default=str)
            version = _TEMPLATE_VERSIONS.setdefault(content, len(_TEMPLATE_VERSIONS) + 1)
            state.update(latestVersion=version, defaultVersion=version,
                         arn=f"arn:aws:ec2:{REGION}:{ACCOUNT}:launch-template/{rid}")
            self.templates[rid] = state
        elif typ == GROUP:
            state["name"] = rid = f"{name}-5a6b7c"  # auto-named by the provider
            state["arn"] = (f"arn:aws:autoscaling:{REGION}:{ACCOUNT}:autoScalingGroup:0f1e2d3c:"
                            f"autoScalingGroupName/{rid}")
            launch = state.get("launchTemplate") or (
                ((state.get("mixedInstancesPolicy") or {}).get("launchTemplate") or {}).get(
                    "launchTemplateSpecification", {}))
            self.asgs[rid] = self.templates.get(launch.get("id") or launch.get("launchTemplateId"), {})
        elif typ == "aws:ec2/securityGroup:SecurityGroup":
            rid = f"sg-{name}"
        elif typ == "aws:ec2/keyPair:KeyPair":
            state["keyName"] = name
        elif typ == "aws:ec2/placementGroup:PlacementGroup":
            state["name"] = name
        elif typ == "aws:s3/bucket:Bucket":
            state["bucket"] = f"{name}-0a1b2c3"
            rid = state["bucket"]
            state["arn"] = f"arn:aws:s3:::{state['bucket']}"
        elif typ in ("aws:iam/role:Role", "aws:iam/instanceProfile:InstanceProfile"):
            # IAM autonames like the provider (logical name + suffix); a role's id is its name.
            kind = "role" if typ.endswith(":Role") else "instance-profile"
            state["name"] = rid = f"{name}-{kind[:4]}9f8e7d"
            state["arn"] = f"arn:aws:iam::{ACCOUNT}:{kind}/{state['name']}"
        return rid, state


@dataclass
class Registration:
    urn: str
    type: str
    name: str
    parent: str
    inputs: dict
    dependencies: list[str]
    retain_on_delete: bool
    id: str = ""
    index: int = 0
    state: dict = field(default_factory=dict)
    # Lifecycle options as the engine receives them.
    delete_before_replace: bool = False
    ignore_changes: list[str] = field(default_factory=list)
    replace_on_changes: list[str] = field(default_factory=list)
    replacement_trigger: Any = None
    deleted_with: str = ""
    custom_timeouts: dict = field(default_factory=dict)
    error_hooks: list[str] = field(default_factory=list)


class RecordingMonitor(mocks.MockMonitor):
    """MockMonitor that also keeps dependencies, parents, options and registration order."""

    def __init__(self, fake: FakeAws):
        super().__init__(fake)
        self.registrations: list[Registration] = []

    def RegisterResource(self, request):
        self.mocks.next_trigger = (json_format.MessageToDict(request.replacement_trigger)
                                   if request.HasField("replacement_trigger") else None)
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            inputs = _sync_await(_deserialize(request.object))
            reg = self.resources.get(response.urn)
            self.registrations.append(Registration(
                urn=response.urn, type=request.type, name=request.name, parent=request.parent,
                inputs=inputs, dependencies=list(request.dependencies),
                retain_on_delete=bool(getattr(request, "retainOnDelete", False)),
                id=reg.id if reg else "", index=len(self.registrations),
                state=dict(reg.state) if reg else {},
                delete_before_replace=bool(request.deleteBeforeReplace),
                ignore_changes=list(request.ignoreChanges), replace_on_changes=list(request.replaceOnChanges),
                replacement_trigger=(json_format.MessageToDict(request.replacement_trigger)
                                     if request.HasField("replacement_trigger") else None),
                deleted_with=request.deletedWith,
                custom_timeouts={k: v for k, v in json_format.MessageToDict(request.customTimeouts).items() if v},
                error_hooks=list(request.hooks.on_error) if request.HasField("hooks") else []))
        return response

    # helpers for assertions -------------------------------------------------------------------
    def of_type(self, typ: str) -> list[Registration]:
        return [r for r in self.registrations if r.type == typ]

    def by_urn(self, urn: str) -> Registration:
        return next(r for r in self.registrations if r.urn == urn)

    def aws_resources(self) -> list[Registration]:
        return [r for r in self.registrations if r.type.startswith("aws:")]


async def _deserialize(struct):
    return rpc.deserialize_properties(struct)


@dataclass
class Harness:
    fake: FakeAws
    monitor: RecordingMonitor

    def run(self, config: dict[str, Any], region: str | None = REGION) -> dict[str, Any]:
        """Evaluate infra/__main__.py with this stack config; return the resolved stack outputs."""
        import json

        values = {f"{PROJECT}:{k}": (json.dumps(v) if isinstance(v, (list, dict)) else
                                     str(v).lower() if isinstance(v, bool) else str(v))
                  for k, v in config.items()}
        if region:
            values["aws:region"] = region
        pulumi.runtime.set_all_config(values)
        resolved: dict[str, Any] = {}

        @pulumi.runtime.test
        def program():
            namespace = runpy.run_path(str(MAIN), run_name="__main__")
            return pulumi.Output.from_input(namespace["outputs"]).apply(resolved.update)

        program()
        return resolved


@pytest.fixture(autouse=True)
def controller_config(tmp_path, monkeypatch) -> Path:
    """The controller's config directory, where the program finds (or makes) the cluster key pair: the
    test's own, never the user's."""
    path = tmp_path / "controller-config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(path))
    return path


@pytest.fixture
def harness() -> Harness:
    fake = FakeAws()
    monitor = RecordingMonitor(fake)
    pulumi.runtime.set_mocks(fake, project=PROJECT, stack=STACK, preview=False, monitor=monitor)
    yield Harness(fake, monitor)
    pulumi.runtime.set_all_config({})


def fresh_run(config: dict[str, Any], fake: FakeAws | None = None) -> tuple[RecordingMonitor, dict[str, Any]]:
    """Run the program with its own mocks (to compare two configs; `fake`: an account of one's own);
    (monitor, outputs)."""
    fake = fake or FakeAws()
    monitor = RecordingMonitor(fake)
    pulumi.runtime.set_mocks(fake, project=PROJECT, stack=STACK, preview=False, monitor=monitor)
    return monitor, Harness(fake, monitor).run(config)


def exported_state(monitor: RecordingMonitor, outputs: dict[str, Any]) -> dict:
    """The stack after this run as `pulumi stack export` (version 3) shows it: every registered resource with
    its URN, type, id, parent and the URNs it depends on (the graph the engine's `--target-dependents`
    follows), and the stack resource with the program's outputs."""
    stack_urn = f"urn:pulumi:{STACK}::{PROJECT}::pulumi:pulumi:Stack::{PROJECT}-{STACK}"
    resources: list[dict] = [{"urn": stack_urn, "type": "pulumi:pulumi:Stack", "outputs": outputs}]
    for reg in monitor.registrations:
        resources.append({"urn": reg.urn, "type": reg.type, "id": reg.id, "parent": reg.parent or stack_urn,
                          "dependencies": list(reg.dependencies)})
    return {"version": 3, "deployment": {"resources": resources}}


def stack_file_text(config: dict[str, Any], region: str = REGION) -> str:
    """`Pulumi.<stack>.yaml` holding this config, as `pulumi config set` writes it."""
    import yaml

    values = {f"{PROJECT}:{k}": v for k, v in config.items()}
    return yaml.safe_dump({"config": {"aws:region": region, **values}}, sort_keys=False)


def _of_role(monitor: RecordingMonitor, typ: str, role: str) -> Registration:
    (found,) = [r for r in monitor.of_type(typ) if r.name.endswith(f"-{role}")]
    return found


def worker_group(monitor: RecordingMonitor) -> Registration:
    """The workers' Auto Scaling group as registered."""
    return _of_role(monitor, GROUP, "worker")


def worker_template(monitor: RecordingMonitor) -> Registration:
    """The workers' launch template as registered."""
    return _of_role(monitor, LAUNCH_TEMPLATE, "worker")


def master_group(monitor: RecordingMonitor) -> Registration:
    """The master's Auto Scaling group (of one) as registered."""
    return _of_role(monitor, GROUP, "master")


def master_template(monitor: RecordingMonitor) -> Registration:
    """The master's launch template as registered."""
    return _of_role(monitor, LAUNCH_TEMPLATE, "master")
