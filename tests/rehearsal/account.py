"""The rehearsal's AWS account: a moto server on 127.0.0.1 that the unmodified `fab` reaches through
boto3's standard endpoint setting (`AWS_ENDPOINT_URL`), and the Pulumi mocks reach the same way.

moto 5.2 lacks six APIs the toolkit calls. Each is answered by a named test double that sits in
front of moto's server app (a WSGI middleware) and lets every other request through to moto:

- `PlacementGroupsDouble`: EC2 CreatePlacementGroup / DescribePlacementGroups / DeletePlacementGroup
  (moto has no placement groups), kept in memory with their tags;
- `InstanceProfileTagsDouble`: IAM ListInstanceProfileTags (moto stores the tags, but has no call
  to list them), answered from moto's own instance profile;
- `Ec2QuotasDouble`: Service Quotas GetServiceQuota for the two EC2 vCPU quotas `fab preflight`
  reads (moto knows quotas of the vpc service only);
- `PolicySimulatorDouble`: IAM SimulatePrincipalPolicy, which `fab preflight` asks whether the caller
  may pass the node role (moto has no policy simulator); it allows every action, as moto's account
  (which enforces no IAM policy) does.
- `ConsoleOutputDouble`: EC2 GetConsoleOutput (moto's is a canned kernel log without host keys),
  answered with the console file of the local node at the instance's private address, where a new
  node's host key is verified.
- `EbsDefaultKeyDouble`: EC2 GetEbsDefaultKmsKeyId, which `fab preflight` reads (moto implements
  ModifyEbsDefaultKmsKeyId only): the key that call set, else alias/aws/ebs, as AWS answers.

One more double sits behind moto's API, on its EC2 backend: `GroupLaunchDouble`
(tests/rehearsal/group_launches.py) gives the instances the workers' Auto Scaling group launches
the addresses of local nodes and the launch template's settings that moto's group leaves out.

The account is seeded with what a real region has and moto does not ship: Canonical's Ubuntu
24.04 amd64 image (the program's and preflight's lookup finds it), and the VPC and subnet of the
rehearsal (made through the API, with the local cluster's network as the subnet's CIDR).
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import secrets
import threading
import urllib.request
from pathlib import Path
from typing import Callable
from urllib.parse import parse_qs
from xml.sax.saxutils import escape

import boto3
from moto.core import DEFAULT_ACCOUNT_ID
from moto.server import ThreadedMotoServer

from cluster.stack.images import CANONICAL_OWNER
from node_setup.aws.quotas import ON_DEMAND_QUOTA_CODE, SPOT_QUOTA_CODE
from tests.rehearsal.group_launches import GroupLaunchDouble

ACCOUNT = DEFAULT_ACCOUNT_ID  # the account moto answers for
REGION = "us-east-1"
ZONE = "us-east-1a"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
UBUNTU_IMAGE_ID = "ami-0rehearsalnoble"
UBUNTU_IMAGE_NAME = "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20250601"
# The rehearsal account's EC2 vCPU quotas (Ec2QuotasDouble): room for the rehearsal's nodes.
EC2_VCPU_QUOTAS = {SPOT_QUOTA_CODE: 1024.0, ON_DEMAND_QUOTA_CODE: 1024.0}

EC2_XMLNS = "http://ec2.amazonaws.com/doc/2016-11-15/"
IAM_XMLNS = "https://iam.amazonaws.com/doc/2010-05-08/"

Response = tuple[str, list[tuple[str, str]], bytes]  # status, headers, body


def _xml(status: str, body: str) -> Response:
    return status, [("Content-Type", "text/xml")], body.encode()


def _indexed(form: dict[str, str], prefix: str) -> list[dict[str, str]]:
    """Query-protocol lists: `Prefix.1.Key=..&Prefix.1.Value=..` -> [{"Key": .., "Value": ..}]."""
    items: dict[int, dict[str, str]] = {}
    for key, value in form.items():
        if key.startswith(prefix + "."):
            index, _, field = key[len(prefix) + 1:].partition(".")
            if index.isdigit():
                items.setdefault(int(index), {})[field] = value
    return [items[i] for i in sorted(items)]


class PlacementGroupsDouble:
    """Test double: EC2 placement groups (moto 5.2 has none), in memory with their tags."""

    ACTIONS = ("CreatePlacementGroup", "DescribePlacementGroups", "DeletePlacementGroup")

    def __init__(self):
        self.groups: dict[str, dict] = {}
        self.lock = threading.Lock()

    def handle(self, action: str, form: dict[str, str]) -> Response:
        request_id = secrets.token_hex(8)
        with self.lock:
            if action == "CreatePlacementGroup":
                name = form["GroupName"]
                if name in self.groups:
                    return self._error("InvalidPlacementGroup.Duplicate",
                                       f"The placement group '{name}' already exists.")
                tags = {}
                for spec in range(1, 10):
                    if form.get(f"TagSpecification.{spec}.ResourceType") == "placement-group":
                        tags.update({t["Key"]: t.get("Value", "") for t in
                                     _indexed(form, f"TagSpecification.{spec}.Tag")})
                group = {"name": name, "strategy": form.get("Strategy", "cluster"),
                         "id": f"pg-{secrets.token_hex(8)}", "tags": tags}
                self.groups[name] = group
                return _xml("200 OK", f'<CreatePlacementGroupResponse xmlns="{EC2_XMLNS}"><requestId>{request_id}'
                            f"</requestId><return>true</return><placementGroup>{self._item(group)}</placementGroup>"
                            "</CreatePlacementGroupResponse>")
            if action == "DeletePlacementGroup":
                name = form.get("GroupName", "")
                if self.groups.pop(name, None) is None:
                    return self._error("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
                return _xml("200 OK", f'<DeletePlacementGroupResponse xmlns="{EC2_XMLNS}"><requestId>{request_id}'
                            "</requestId><return>true</return></DeletePlacementGroupResponse>")
            items = "".join(f"<item>{self._item(g)}</item>" for g in self.groups.values() if self._matches(g, form))
            return _xml("200 OK", f'<DescribePlacementGroupsResponse xmlns="{EC2_XMLNS}"><requestId>{request_id}'
                        f"</requestId><placementGroupSet>{items}</placementGroupSet></DescribePlacementGroupsResponse>")

    @staticmethod
    def _matches(group: dict, form: dict[str, str]) -> bool:
        names = [v for k, v in form.items() if k.startswith("GroupName.")]
        if names and group["name"] not in names:
            return False
        for flt in _indexed(form, "Filter"):
            values = [v for k, v in flt.items() if k.startswith("Value.")]
            name = flt.get("Name", "")
            if name.startswith("tag:"):
                if group["tags"].get(name[4:]) not in values:
                    return False
            elif name == "group-name" and group["name"] not in values:
                return False
        return True

    @staticmethod
    def _item(group: dict) -> str:
        tags = "".join(f"<item><key>{escape(k)}</key><value>{escape(v)}</value></item>"
                       for k, v in group["tags"].items())
        return (f"<groupName>{escape(group['name'])}</groupName><strategy>{group['strategy']}</strategy>"
                f"<state>available</state><groupId>{group['id']}</groupId><tagSet>{tags}</tagSet>")

    @staticmethod
    def _error(code: str, message: str) -> Response:
        return _xml("400 Bad Request", f"<Response><Errors><Error><Code>{code}</Code><Message>{escape(message)}"
                    f"</Message></Error></Errors><RequestID>{secrets.token_hex(8)}</RequestID></Response>")


class InstanceProfileTagsDouble:
    """Test double: IAM ListInstanceProfileTags (moto 5.2 lacks the call), from moto's stored profile."""

    ACTIONS = ("ListInstanceProfileTags",)

    def handle(self, action: str, form: dict[str, str]) -> Response:
        from moto.iam.models import iam_backends

        name = form.get("InstanceProfileName", "")
        try:
            profile = iam_backends[ACCOUNT]["aws"].get_instance_profile(name)
        except Exception:  # noqa: BLE001 - moto's IAMNotFoundException: answered as AWS does
            return _xml("404 Not Found", f'<ErrorResponse xmlns="{IAM_XMLNS}"><Error><Type>Sender</Type><Code>'
                        f"NoSuchEntity</Code><Message>Instance Profile {escape(name)} cannot be found.</Message>"
                        f"</Error><RequestId>{secrets.token_hex(8)}</RequestId></ErrorResponse>")
        tags = "".join(f"<member><Key>{escape(t['Key'])}</Key><Value>{escape(t['Value'])}</Value></member>"
                       for t in profile.tags)
        return _xml("200 OK", f'<ListInstanceProfileTagsResponse xmlns="{IAM_XMLNS}"><ListInstanceProfileTagsResult>'
                    f"<IsTruncated>false</IsTruncated><Tags>{tags}</Tags></ListInstanceProfileTagsResult>"
                    f"<ResponseMetadata><RequestId>{secrets.token_hex(8)}</RequestId></ResponseMetadata>"
                    "</ListInstanceProfileTagsResponse>")


class Ec2QuotasDouble:
    """Test double: Service Quotas' EC2 vCPU quotas (moto 5.2 answers the vpc service only)."""

    TARGET = "ServiceQuotasV20190624.GetServiceQuota"

    def __init__(self, values: dict[str, float] | None = None):
        self.values = dict(values or EC2_VCPU_QUOTAS)

    def wants(self, payload: dict) -> bool:
        return payload.get("ServiceCode") == "ec2" and payload.get("QuotaCode") in self.values

    def handle(self, payload: dict) -> Response:
        code = payload["QuotaCode"]
        body = {"Quota": {"ServiceCode": "ec2", "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
                          "QuotaCode": code, "QuotaArn": f"arn:aws:servicequotas:{REGION}:{ACCOUNT}:ec2/{code}",
                          "Value": self.values[code], "Unit": "None", "Adjustable": True, "GlobalQuota": False}}
        return "200 OK", [("Content-Type", "application/x-amz-json-1.1")], json.dumps(body).encode()


class PolicySimulatorDouble:
    """Test double: IAM SimulatePrincipalPolicy (moto 5.2 lacks it). Every action on every resource
    asked about is `allowed`: the rehearsal's moto account enforces no IAM policy either."""

    ACTIONS = ("SimulatePrincipalPolicy",)

    def handle(self, action: str, form: dict[str, str]) -> Response:
        actions = [form[k] for k in sorted(form, key=_member_index) if k.startswith("ActionNames.member.")]
        resources = [form[k] for k in sorted(form, key=_member_index) if k.startswith("ResourceArns.member.")]
        results = "".join(
            f"<member><EvalActionName>{escape(a)}</EvalActionName><EvalResourceName>{escape(r)}</EvalResourceName>"
            "<EvalDecision>allowed</EvalDecision><MatchedStatements/><MissingContextValues/></member>"
            for a in actions for r in (resources or ["*"]))
        return _xml("200 OK", f'<SimulatePrincipalPolicyResponse xmlns="{IAM_XMLNS}"><SimulatePrincipalPolicyResult>'
                    f"<IsTruncated>false</IsTruncated><EvaluationResults>{results}</EvaluationResults>"
                    f"</SimulatePrincipalPolicyResult><ResponseMetadata><RequestId>{secrets.token_hex(8)}"
                    "</RequestId></ResponseMetadata></SimulatePrincipalPolicyResponse>")


def _member_index(key: str) -> tuple[str, int]:
    """Sort `Name.member.10` after `Name.member.2`."""
    name, _, index = key.rpartition(".")
    return name, int(index) if index.isdigit() else 0


class ConsoleOutputDouble:
    """Test double: EC2 GetConsoleOutput, answered with the console file of the local node that stands in
    for the instance (the node at the instance's private address), as EC2 answers with the instance's own
    console; moto's own answer is a canned kernel log with no host keys, which `fab` would refuse."""

    ACTIONS = ("GetConsoleOutput",)

    def __init__(self):
        self.consoles: dict[str, str] = {}  # private address -> the local node's console file

    def handle(self, action: str, form: dict[str, str]) -> Response | None:
        from moto.ec2.models import ec2_backends

        instance_id = form.get("InstanceId", "")
        try:
            address = ec2_backends[ACCOUNT][REGION].get_instance(instance_id).private_ip_address
        except Exception:  # noqa: BLE001 - moto answers its own error for an unknown instance
            return None
        if address not in self.consoles:
            return None
        try:
            text = Path(self.consoles[address]).read_text()
        except FileNotFoundError:
            text = ""
        output = base64.b64encode(text.encode()).decode()
        return _xml("200 OK", f'<GetConsoleOutputResponse xmlns="{EC2_XMLNS}"><requestId>{secrets.token_hex(8)}'
                    f"</requestId><instanceId>{escape(instance_id)}</instanceId>"
                    "<timestamp>2025-03-04T10:00:01.000Z</timestamp>"
                    f"<output>{output}</output></GetConsoleOutputResponse>")


class EbsDefaultKeyDouble:
    """Test double: EC2 GetEbsDefaultKmsKeyId (moto 5.2 lacks it): the key moto's ModifyEbsDefaultKmsKeyId
    recorded, else the AWS managed key, as AWS answers an account that never set one."""

    ACTIONS = ("GetEbsDefaultKmsKeyId",)

    def handle(self, action: str, form: dict[str, str]) -> Response:
        from moto.ec2.models import ec2_backends

        from node_setup.aws.ebs_key import AWS_MANAGED_KEY

        key = ec2_backends[ACCOUNT][REGION].default_kms_key_id or AWS_MANAGED_KEY
        return _xml("200 OK", f'<GetEbsDefaultKmsKeyIdResponse xmlns="{EC2_XMLNS}"><requestId>{secrets.token_hex(8)}'
                    f"</requestId><kmsKeyId>{escape(key)}</kmsKeyId></GetEbsDefaultKmsKeyIdResponse>")


class MissingApiDoubles:
    """WSGI middleware in front of moto's server app: the doubles above answer their calls, moto the rest."""

    def __init__(self, app: Callable):
        self.app = app
        self.placement_groups = PlacementGroupsDouble()
        self.profile_tags = InstanceProfileTagsDouble()
        self.quotas = Ec2QuotasDouble()
        self.policy_simulator = PolicySimulatorDouble()
        self.console = ConsoleOutputDouble()
        self.ebs_key = EbsDefaultKeyDouble()
        self.answered: dict[str, int] = {}  # action -> how often a double answered it (for the report)

    def __call__(self, environ, start_response):
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(body)  # moto reads it again
        answer, action = None, ""
        if environ.get("HTTP_X_AMZ_TARGET") == Ec2QuotasDouble.TARGET:
            payload = json.loads(body or b"{}")
            if self.quotas.wants(payload):
                answer, action = self.quotas.handle(payload), "GetServiceQuota"
        elif environ.get("CONTENT_TYPE", "").startswith("application/x-www-form-urlencoded"):
            form = {k: v[0] for k, v in parse_qs(body.decode(), keep_blank_values=True).items()}
            action = form.get("Action", "")
            if action in PlacementGroupsDouble.ACTIONS:
                answer = self.placement_groups.handle(action, form)
            elif action in InstanceProfileTagsDouble.ACTIONS:
                answer = self.profile_tags.handle(action, form)
            elif action in PolicySimulatorDouble.ACTIONS:
                answer = self.policy_simulator.handle(action, form)
            elif action in ConsoleOutputDouble.ACTIONS:
                answer = self.console.handle(action, form)
            elif action in EbsDefaultKeyDouble.ACTIONS:
                answer = self.ebs_key.handle(action, form)
        if answer is None:
            return self.app(environ, start_response)
        self.answered[action] = self.answered.get(action, 0) + 1
        status, headers, data = answer
        start_response(status, headers + [("Content-Length", str(len(data)))])
        return [data]


class RehearsalMotoServer(ThreadedMotoServer):
    """moto's threaded server on 127.0.0.1, with MissingApiDoubles in front of its app."""

    def __init__(self):
        super().__init__(ip_address="127.0.0.1", port=0, verbose=False)
        self.doubles: MissingApiDoubles | None = None

    def _server_entry(self) -> None:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        self.doubles = MissingApiDoubles(DomainDispatcherApplication(create_backend_app))
        self._server = make_server(self._ip_address, self._port, self.doubles, True)
        self._server_ready_event.set()
        self._server.serve_forever()


class Account:
    """The rehearsal's account: start() the server, then clients and the env for `fab`."""

    def __init__(self):
        self.server = RehearsalMotoServer()
        self.url = ""
        self.group_launches: GroupLaunchDouble | None = None

    def start(self) -> "Account":
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.url = f"http://{host}:{port}"
        self._reset()  # moto's backends live in this process: start from an empty account
        self._seed_ubuntu_image()
        from moto.ec2.models import ec2_backends

        self.group_launches = GroupLaunchDouble.install(ec2_backends[ACCOUNT][REGION])  # after the reset
        return self

    def stop(self) -> None:
        self._reset()  # moto's backends are this process's: leave them empty for whatever runs next
        self.server.stop()

    def _reset(self) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{self.url}/moto-api/reset", method="POST"), timeout=30)

    def client(self, service: str):
        return boto3.session.Session(aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                                     aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                                     region_name=REGION).client(service, endpoint_url=self.url)

    def fab_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of a `fab` subprocess: boto3's standard settings pointing at this account (every
        other `AWS_*` variable of the caller, e.g. a profile or a service's own endpoint, is dropped), and
        boto3 never asks the host's instance metadata address (for credentials or a region)."""
        env = {k: v for k, v in (base or os.environ).items() if not k.startswith("AWS_")}
        env.update(CREDENTIALS, AWS_ENDPOINT_URL=self.url, AWS_REGION=REGION, AWS_DEFAULT_REGION=REGION,
                   AWS_EC2_METADATA_DISABLED="true")
        return env

    def _seed_ubuntu_image(self) -> None:
        """Canonical's Ubuntu 24.04 amd64 image, as every real region has it (moto ships none)."""
        from moto.ec2.models import ec2_backends
        from moto.ec2.models.amis import Ami

        backend = ec2_backends[ACCOUNT][REGION]
        backend.amis[UBUNTU_IMAGE_ID] = Ami(
            backend, ami_id=UBUNTU_IMAGE_ID, name=UBUNTU_IMAGE_NAME, owner_id=CANONICAL_OWNER, public=True,
            architecture="x86_64", virtualization_type="hvm", root_device_type="ebs", root_device_name="/dev/sda1",
            description="Canonical, Ubuntu, 24.04, amd64 noble image")

    def make_network(self, cidr: str, name: str) -> tuple[str, str]:
        """A VPC and one subnet (zone ZONE) with `cidr`, no public addresses on launch: (vpc id, subnet id)."""
        ec2 = self.client("ec2")

        def named(kind: str) -> list[dict]:
            return [{"ResourceType": kind, "Tags": [{"Key": "Name", "Value": name}]}]

        vpc = ec2.create_vpc(CidrBlock=cidr, TagSpecifications=named("vpc"))["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=cidr, AvailabilityZone=ZONE, TagSpecifications=named("subnet"))
        return vpc, subnet["Subnet"]["SubnetId"]
