"""fab preflight against moto accounts set up to pass and to fail each check.

moto 5.2 implements describe_instance_type_offerings (with AWS's real per-zone data: r7iz.metal-16xl
is offered in us-east-1a-d and f but not in us-east-1e, and not at all in us-west-1), DryRun on
run_instances, and IAM policy enforcement (`set_initial_no_auth_action_count`), but Service Quotas
only for the vpc service and no IAM policy simulator. EC2 quotas therefore come from
`stubbed_service_quotas` and the iam:PassRole simulation from `stubbed_iam`, test doubles built on
botocore's Stubber over real clients (they check our requests and their answers against the API's
shapes). The pass-role check's own tests are in test_pass_role.py.

Why this module is longer than about 400 lines (about 540): `fab preflight`'s checks and, at the
end, `fab train`'s (node_setup/aws/train_checks.py) run against the same moto account through the
same helpers: `spec_for`, `clients`, `canonical_image`, the IAM user with a denied API that moto
enforces (`_restricted_session`), `stubbed_service_quotas` and `stubbed_iam`, which
test_pick_zone.py and test_pass_role.py import from here too.
"""

import base64
import datetime as dt
import json

import boto3
import pytest
from botocore.stub import Stubber

moto = pytest.importorskip("moto")
from moto.core import set_initial_no_auth_action_count  # noqa: E402

from cluster.stack.spec import ClusterSpec  # noqa: E402
from node_setup.aws import preflight as pf  # noqa: E402
from node_setup.aws import quotas as vcpu_quotas  # noqa: E402
from node_setup.aws import train_checks  # noqa: E402
from node_setup.aws.preflight import AwsClients, run_preflight  # noqa: E402
from node_setup.aws.quotas import ON_DEMAND_QUOTA_CODE, SPOT_QUOTA_CODE  # noqa: E402

PUBLIC_KEY = "ssh-ed25519 " + base64.b64encode(
    b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + bytes(range(32))).decode() + " test"
MY_ADDRESS = "203.0.113.7"


def spec_for(region="us-east-1", **cfg):
    values = {"publicKey": PUBLIC_KEY, "adminCidrs": ["203.0.113.0/24"], "workerCount": 3,
              "instanceType": "r7iz.metal-16xl"}
    values.update(cfg)
    return ClusterSpec.from_config(values, stack="dev", region=region)


def canonical_image(region="us-east-1"):
    """moto ships a Canonical Ubuntu image; the stack names it as baseAmi."""
    images = boto3.client("ec2", region_name=region).describe_images(Owners=[pf.CANONICAL_OWNER])["Images"]
    return images[0]["ImageId"]


def stubbed_service_quotas(region="us-east-1", session=None, **values):
    """Test double for EC2's Service Quotas (moto has none): answers get_service_quota per code."""
    client = (session or boto3).client("service-quotas", region_name=region)
    stub = Stubber(client)
    for code, value in values.items():
        stub.add_response("get_service_quota",
                          {"Quota": {"ServiceCode": "ec2", "QuotaCode": code, "Value": float(value)}},
                          {"ServiceCode": "ec2", "QuotaCode": code})
    stub.activate()
    return client, stub


def clients(region="us-east-1", session=None, quotas=None, iam=None):
    s = session or boto3
    return AwsClients(sts=s.client("sts", region_name=region), ec2=s.client("ec2", region_name=region),
                      quotas=quotas, iam=iam)


MOTO_CALLER = "arn:aws:iam::123456789012:user/moto"  # moto's default identity, as an IAM user ARN
NODE_ROLE = "arn:aws:iam::123456789012:role/xeon-dev-node-0000000"  # named like the role `pulumi up` makes
PASSED_TO_EC2 = [{"ContextKeyName": "iam:PassedToService", "ContextKeyValues": ["ec2.amazonaws.com"],
                  "ContextKeyType": "string"}]
CLUSTER_INSTANCE = "arn:aws:ec2:us-east-1:123456789012:instance/*"  # any instance of the region: none exists yet
CLUSTER_TAG = [{"ContextKeyName": f"{prefix}:ResourceTag/xeon-cluster:cluster", "ContextKeyValues": ["xeon-dev"],
                "ContextKeyType": "string"} for prefix in ("ec2", "aws")]


def assumed_role_session(role_arn: str, session_name: str) -> boto3.Session:
    """A boto3 session of `role_arn` assumed through moto's STS (an assumed-role caller, as SSO gives one)."""
    creds = boto3.client("sts", region_name="us-east-1").assume_role(RoleArn=role_arn,
                                                                     RoleSessionName=session_name)["Credentials"]
    return boto3.Session(aws_access_key_id=creds["AccessKeyId"], aws_secret_access_key=creds["SecretAccessKey"],
                         aws_session_token=creds["SessionToken"], region_name="us-east-1")


def stubbed_iam(*answers):
    """Test double for IAM's policy simulator (moto has none), on botocore's Stubber over a real client.

    `answers`, in call order: ("role", name, arn) answers get_role, ("role-error", name, code) refuses
    it, ("simulate", source, decision) answers simulate_principal_policy for the node role with that
    decision, ("simulate-error", source, code) refuses it; ("console", source, decision) and
    ("console-error", source, code) do the same for ec2:GetConsoleOutput on an instance of the cluster
    (the console check). Each request is checked against the one expected.
    """
    client = boto3.client("iam", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    for kind, *args in answers:
        if kind == "role":
            name, arn = args
            stub.add_response("get_role", {"Role": {
                "Path": arn.split(":role", 1)[1].rsplit("/", 1)[0] + "/", "RoleName": name,
                "RoleId": "AROAEXAMPLEROLEID0001", "Arn": arn, "CreateDate": dt.datetime(2026, 1, 1)}},
                {"RoleName": name})
        elif kind == "role-error":
            name, code = args
            stub.add_client_error("get_role", service_error_code=code, http_status_code=403,
                                  expected_params={"RoleName": name})
        else:
            source, outcome = args
            action, resource, context = (("ec2:GetConsoleOutput", CLUSTER_INSTANCE, CLUSTER_TAG)
                                         if kind.startswith("console") else ("iam:PassRole", NODE_ROLE, PASSED_TO_EC2))
            asked = {"PolicySourceArn": source, "ActionNames": [action], "ResourceArns": [resource],
                     "ContextEntries": context}
            if kind in ("simulate", "console"):
                stub.add_response("simulate_principal_policy", {"EvaluationResults": [{
                    "EvalActionName": action, "EvalResourceName": resource, "EvalDecision": outcome}],
                    "IsTruncated": False}, asked)
            else:
                stub.add_client_error("simulate_principal_policy", service_error_code=outcome, http_status_code=403,
                                      expected_params=asked)
    stub.activate()
    return client, stub


def test_a_good_account_passes_every_check(mocked_aws):
    quotas, stub = stubbed_service_quotas(**{SPOT_QUOTA_CODE: 512})
    iam, iam_stub = stubbed_iam(("simulate", MOTO_CALLER, "allowed"), ("console", MOTO_CALLER, "allowed"))
    report = run_preflight(spec_for(baseAmi=canonical_image()), clients=clients(quotas=quotas, iam=iam),
                           public_ip=lambda: MY_ADDRESS)
    stub.assert_no_pending_responses()
    iam_stub.assert_no_pending_responses()
    assert report.exit_code == 0, report.render()
    assert [f.check for f in report.findings] == ["region", "credentials", "offering", "quota", "dry-run",
                                                  "dry-run", "pass-role", "console", "admin-cidr"]
    assert all(f.status == pf.OK for f in report.findings), report.render()
    offering = next(f for f in report.findings if f.check == "offering")
    assert "us-east-1a" in offering.message and "not offered in us-east-1e" in offering.message
    assert "4 x r7iz.metal-16xl (the master and 3 workers of the group) need 256" in report.render()


@pytest.mark.parametrize("itype, group", [
    ("r7iz.metal-16xl", "Standard"), ("c6i.16xlarge", "Standard"), ("m7i-flex.large", "Standard"),
    ("i4i.large", "Standard"), ("im4gn.large", "Standard"), ("is4gen.large", "Standard"), ("z1d.large", "Standard"),
    ("inf2.xlarge", "Inf"), ("trn1.2xlarge", "Trn"), ("dl1.24xlarge", "DL"), ("hpc7g.4xlarge", "HPC"),
    ("u-6tb1.metal", "High Memory"), ("u7i-12tb.224xlarge", "High Memory"), ("x2idn.large", "X"),
    ("g5.xlarge", "G and VT"), ("vt1.3xlarge", "G and VT"), ("p5.48xlarge", "P"), ("mac2.metal", "Mac"),
    ("q9.large", None),
])
def test_quota_group_by_family_not_by_first_letter(itype, group):
    assert vcpu_quotas.quota_group(itype) == group


def test_non_standard_types_are_not_checked_against_the_standard_quota(mocked_aws):
    report = pf.Report(region="us-east-1")
    vcpu_quotas.check_quotas(report, clients(quotas=None), spec_for(instanceType="inf2.48xlarge", sockets=2,
                                                           physicalCores=96))
    (finding,) = report.findings
    assert finding.status == pf.SKIPPED and "the Inf vCPU quota" in finding.message


def test_non_standard_instances_already_running_do_not_count_against_the_standard_quota(mocked_aws):
    ec2 = boto3.client("ec2", region_name="us-east-1")
    for itype in ("inf2.xlarge", "trn1.2xlarge", "c6i.16xlarge"):
        ec2.run_instances(ImageId=canonical_image(), InstanceType=itype, MinCount=1, MaxCount=1,
                          InstanceMarketOptions={"MarketType": "spot"})
    assert vcpu_quotas._in_use(ec2, "xeon-dev") == {"spot": 64, "on-demand": 0}  # only the c6i


def _sent_launches(ec2):
    sent = []
    ec2.meta.events.register("provide-client-params.ec2.RunInstances", lambda params, **kw: sent.append(params))
    return sent


def _default_group(ec2, vpc_id):
    (group,) = ec2.describe_security_groups(Filters=[{"Name": "vpc-id", "Values": [vpc_id]},
                                                     {"Name": "group-name", "Values": ["default"]}])["SecurityGroups"]
    return group["GroupId"]


def test_dry_run_launches_with_the_clusters_tags(mocked_aws):
    """Tagging on launch needs ec2:CreateTags: the dry run carries the tags the master gets."""
    from cluster.stack.tags import CLUSTER_KEY, MANAGED_BY_KEY, RANK_KEY, ROLE_KEY

    ec2 = boto3.client("ec2", region_name="us-east-1")
    sent = _sent_launches(ec2)
    report = pf.Report(region="us-east-1")
    pf.check_dry_run(report, AwsClients(sts=None, ec2=ec2, quotas=None),
                     spec_for(baseAmi=canonical_image(), tags=["team=ml"]), "us-east-1a")
    assert report.status_of("dry-run") == pf.OK, report.render()
    assert "with the cluster's tags" in report.findings[0].message and "iam:PassRole" in report.findings[0].message
    assert "instance profile (not yet made" in report.findings[1].message
    assert "a worker of the group (3 from its launch template)" in report.findings[1].message
    params, worker = sent  # the master, then a worker as the group's launch template launches it
    for launch, role, rank, name in ((params, "master", "0", "xeon-dev-master"),
                                     (worker, "worker", None, "xeon-dev-worker")):
        kinds = {spec["ResourceType"]: {t["Key"]: t["Value"] for t in spec["Tags"]}
                 for spec in launch["TagSpecifications"]}
        assert set(kinds) == {"instance", "volume"}
        for tags in kinds.values():
            assert tags[CLUSTER_KEY] == "xeon-dev" and tags[MANAGED_BY_KEY] == "xeon-cluster" and tags["team"] == "ml"
            assert (tags[ROLE_KEY], tags.get(RANK_KEY), tags["Name"]) == (role, rank, name)
        assert launch["MetadataOptions"]["HttpTokens"] == "required"
        assert launch["BlockDeviceMappings"][0]["Ebs"]["Encrypted"] is True
    # A zone and no subnet: the launch goes to the default VPC, and names that VPC's default group.
    (default_vpc,) = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
    group = _default_group(ec2, default_vpc["VpcId"])
    assert params["SecurityGroupIds"] == [group] and group in report.findings[0].message
    # Not before `pulumi up` makes them: profile, placement group, the cluster's groups, key pair.
    assert not {"IamInstanceProfile", "KeyName"} & set(params)
    assert "GroupName" not in params.get("Placement", {})


def test_dry_run_terminates_on_shutdown_in_both_markets_and_uses_the_subnets_vpc(mocked_aws):
    """Every node, spot or on-demand, terminates when it shuts itself down (infra/node.py)."""
    ec2 = boto3.client("ec2", region_name="us-east-1")
    vpc = ec2.create_vpc(CidrBlock="10.20.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.20.1.0/24", AvailabilityZone="us-east-1a")["Subnet"]
    sent = _sent_launches(ec2)
    report = pf.Report(region="us-east-1")
    pf.check_dry_run(report, AwsClients(sts=None, ec2=ec2, quotas=None),
                     spec_for(baseAmi=canonical_image(), subnetId=subnet["SubnetId"], masterSpot=False), "us-east-1a")
    assert [f.status for f in report.findings] == [pf.OK, pf.OK], report.render()
    on_demand, spot = sent  # in order: the on-demand master, then a spot worker
    assert "InstanceMarketOptions" not in on_demand and spot["InstanceMarketOptions"]["MarketType"] == "spot"
    for params in (on_demand, spot):
        assert params["InstanceInitiatedShutdownBehavior"] == "terminate"
        assert params["SubnetId"] == subnet["SubnetId"]
        assert params["SecurityGroupIds"] == [_default_group(ec2, vpc)]  # the subnet's VPC, not the default VPC


def test_the_base_image_lookup_sends_the_shared_filters(mocked_aws):
    """Without baseAmi, preflight asks for the image the program picks (hvm, x86_64, EBS, the name)."""
    from cluster.stack.images import BASE_IMAGE_FILTERS

    ec2 = boto3.client("ec2", region_name="us-east-1")
    asked = []
    ec2.meta.events.register("provide-client-params.ec2.DescribeImages", lambda params, **kw: asked.append(params))
    pf._base_image(ec2, spec_for())
    (params,) = asked
    assert params["Owners"] == [pf.CANONICAL_OWNER]
    filters = {f["Name"]: f["Values"] for f in params["Filters"]}
    assert filters == {name: [value] for name, value in BASE_IMAGE_FILTERS}
    assert filters["virtualization-type"] == ["hvm"] and filters["architecture"] == ["x86_64"]


def test_type_not_offered_in_the_subnets_zone_fails_and_names_the_good_zones(mocked_aws):
    ec2 = boto3.client("ec2", region_name="us-east-1")
    subnet_e = ec2.describe_subnets(Filters=[{"Name": "availability-zone", "Values": ["us-east-1e"]}])["Subnets"][0]
    quotas, _ = stubbed_service_quotas(**{SPOT_QUOTA_CODE: 512})
    report = run_preflight(spec_for(baseAmi=canonical_image(), subnetId=subnet_e["SubnetId"]),
                           clients=clients(quotas=quotas), public_ip=lambda: MY_ADDRESS)
    assert report.exit_code == 1
    bad = report.failures[0]
    assert bad.check == "offering" and "us-east-1e" in bad.message
    assert "us-east-1a, us-east-1b, us-east-1c, us-east-1d, us-east-1f" in bad.fix
    assert report.status_of("quota") == pf.OK  # the other checks still ran


def test_type_not_offered_in_the_region_suggests_catalog_types_offered_there(mocked_aws):
    region = "us-west-1"
    quotas, _ = stubbed_service_quotas(region, **{SPOT_QUOTA_CODE: 512})
    report = run_preflight(spec_for(region, baseAmi=canonical_image(region)), clients=clients(region, quotas=quotas),
                           public_ip=lambda: MY_ADDRESS)
    bad = [f for f in report.failures if f.check == "offering"][0]
    assert "not offered in us-west-1" in bad.message
    assert "c6i.16xlarge" in bad.fix and "r7iz.metal-16xl" not in bad.fix


def test_quota_too_small_fails_with_the_number_to_request(mocked_aws):
    ec2 = boto3.client("ec2", region_name="us-east-1")
    image = canonical_image()
    # Another cluster's spot node already holds 64 vCPUs; this cluster's own node does not count.
    ec2.run_instances(ImageId=image, InstanceType="c6i.16xlarge", MinCount=1, MaxCount=1,
                      InstanceMarketOptions={"MarketType": "spot"})
    ec2.run_instances(ImageId=image, InstanceType="r7iz.metal-16xl", MinCount=1, MaxCount=1,
                      InstanceMarketOptions={"MarketType": "spot"},
                      TagSpecifications=[{"ResourceType": "instance", "Tags": [
                          {"Key": "xeon-cluster:cluster", "Value": "xeon-dev"}]}])
    quotas, _ = stubbed_service_quotas(**{SPOT_QUOTA_CODE: 192, ON_DEMAND_QUOTA_CODE: 1024})
    report = run_preflight(spec_for(baseAmi=image, masterSpot=False), clients=clients(quotas=quotas),
                           public_ip=lambda: MY_ADDRESS)
    assert report.exit_code == 1
    quota = [f for f in report.findings if f.check == "quota"]
    spot = next(f for f in quota if "spot" in f.message and f.status == pf.FAIL)
    assert "64 already in use" in spot.message
    assert "3 x r7iz.metal-16xl (3 workers of the group) need 192" in spot.message
    assert "--quota-code L-34B43A08 --desired-value 256" in spot.fix
    assert "run 2 node(s)" in spot.fix  # 192 - 64 = 128 vCPUs still fit two nodes
    on_demand = next(f for f in quota if "on-demand" in f.message)
    assert on_demand.status == pf.OK and "1 x r7iz.metal-16xl (the master) need 64" in on_demand.message


def _restricted_session(deny):
    """An IAM user of the moto account that may do everything except `deny` (moto enforces IAM)."""
    iam = boto3.client("iam", region_name="us-east-1")
    iam.create_user(UserName="deployer")
    iam.put_user_policy(UserName="deployer", PolicyName="p", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": "*", "Resource": "*"},
            {"Effect": "Deny", "Action": deny, "Resource": "*"}]}))
    key = iam.create_access_key(UserName="deployer")["AccessKey"]
    return boto3.Session(aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"],
                         region_name="us-east-1")


@set_initial_no_auth_action_count(4)
def _preflight_as_restricted_user(deny, quota_values, **cfg):
    session = _restricted_session(deny)
    quotas = session.client("service-quotas", region_name="us-east-1")
    stub = None
    if quota_values:
        quotas, stub = stubbed_service_quotas(session=session, **quota_values)
    spec = spec_for(baseAmi="ami-1e749f67", **cfg)
    return run_preflight(spec, clients=clients(session=session, quotas=quotas), public_ip=lambda: MY_ADDRESS)


def test_dry_run_refused_fails_and_other_checks_still_run(mocked_aws):
    assert canonical_image() == "ami-1e749f67"
    report = _preflight_as_restricted_user(["ec2:RunInstances"], {SPOT_QUOTA_CODE: 512})
    assert report.exit_code == 1
    assert report.status_of("dry-run") == pf.FAIL
    dry = next(f for f in report.findings if f.check == "dry-run")
    assert "not allowed" in dry.message and "ec2:RunInstances" in dry.fix
    assert report.status_of("offering") == pf.OK and report.status_of("quota") == pf.OK


def test_access_denied_on_service_quotas_is_reported_and_the_rest_runs(mocked_aws):
    report = _preflight_as_restricted_user(["servicequotas:GetServiceQuota"], None)
    quota = next(f for f in report.findings if f.check == "quota")
    assert quota.status == pf.WARN and "access denied" in quota.message and "256 vCPUs needed" in quota.message
    assert report.status_of("dry-run") == pf.OK and report.status_of("admin-cidr") == pf.OK
    assert report.exit_code == 0


def test_admin_cidr_without_the_callers_address_fails(mocked_aws):
    quotas, _ = stubbed_service_quotas(**{SPOT_QUOTA_CODE: 512})
    report = run_preflight(spec_for(baseAmi=canonical_image()), clients=clients(quotas=quotas),
                           public_ip=lambda: "198.51.100.9")
    assert report.exit_code == 1
    assert report.failures[0].check == "admin-cidr"
    assert "198.51.100.9/32" in report.failures[0].fix


def test_missing_credentials_fail_with_what_to_do(monkeypatch, tmp_path):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never ask an instance metadata service
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", raising=False)
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", raising=False)
    monkeypatch.delenv("AWS_WEB_IDENTITY_TOKEN_FILE", raising=False)
    import boto3
    # boto3's default session keeps the credentials it first found: an earlier test's in this process
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    report = run_preflight(spec_for(), public_ip=None)
    assert report.exit_code == 1
    assert report.failures[0].check == "credentials" and "aws configure" in report.failures[0].fix


def test_unknown_region_fails_before_any_call(aws_credentials):
    report = run_preflight(spec_for("mars-north-1"), clients=AwsClients(None, None, None), public_ip=None)
    assert report.exit_code == 1 and report.failures[0].check == "region"
    assert "us-east-1" in report.failures[0].message


def test_throttling_is_retried(mocked_aws):
    """`throttle_once` (a test double) answers the first GetCallerIdentity with HTTP 400 Throttling."""
    from botocore.awsrequest import AWSResponse

    from node_setup.aws import clients as aws

    sts = aws.client("sts", "us-east-1")
    calls = []

    def throttle_once(request, **kwargs):
        calls.append(request.url)
        if len(calls) == 1:
            body = (b"<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code>"
                    b"<Message>Rate exceeded</Message></Error></ErrorResponse>")
            return AWSResponse(request.url, 400, {}, _Raw(body))
        return None

    sts.meta.events.register_first("before-send.sts.GetCallerIdentity", throttle_once)
    report = pf.Report(region="us-east-1")
    assert pf.check_credentials(report, AwsClients(sts=sts, ec2=None, quotas=None))
    assert len(calls) == 2 and report.findings[0].status == pf.OK


class _Raw:
    def __init__(self, body):
        self._body = body

    def stream(self, **kwargs):
        yield self._body


# --- preflight_for_train: the checks `fab train` runs on a cluster that is up ------------------------


def _instances(ec2, ids):
    return [i for r in ec2.describe_instances(InstanceIds=ids)["Reservations"] for i in r["Instances"]]


def running_cluster(ec2, name="train", workers=2, spot=False):
    """A master and workers tagged as the Pulumi program tags them, and the Inventory discovery makes."""
    from cluster.stack.tags import ROLE_MASTER, ROLE_WORKER, cluster_tags, node_tags
    from node_setup.aws.discovery import inventory_from_instances

    base = cluster_tags(name, "dev")
    market = {"InstanceMarketOptions": {"MarketType": "spot"}} if spot else {}
    ids = []
    for rank in range(workers + 1):
        tags = node_tags(base, ROLE_MASTER if rank == 0 else ROLE_WORKER, rank, f"{name}-{rank}")
        ids += [i["InstanceId"] for i in ec2.run_instances(
            ImageId=canonical_image(), InstanceType="c6i.16xlarge", MinCount=1, MaxCount=1, **market,
            TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v}
                                                                     for k, v in tags.items()]}])["Instances"]]
    return inventory_from_instances(name, _instances(ec2, ids), region="us-east-1", key_path=None)


def test_train_preflight_passes_on_a_running_cluster(mocked_aws):
    ec2 = boto3.client("ec2", region_name="us-east-1")
    inventory = running_cluster(ec2)
    report = train_checks.preflight_for_train(inventory, clients=clients())
    assert report.ok, report.render()
    assert [(f.check, f.status) for f in report.findings] == [("credentials", pf.OK), ("nodes", pf.OK)]
    assert "all 3 node(s) running" in report.render()


def test_the_aws_backend_runs_the_train_preflight(mocked_aws):
    """The checks before a run are the AWS backend's `preflight_for_run` (the other backends have none:
    tests/unit/test_backend_kinds.py)."""
    from node_setup.backends import backend_for

    inventory = running_cluster(boto3.client("ec2", region_name="us-east-1"))
    report = backend_for(inventory.kind).preflight_for_run(inventory)
    assert report is not None and report.ok, report.render()
    assert "all 3 node(s) running" in report.render()


def test_train_preflight_fails_naming_a_terminated_worker(mocked_aws):
    ec2 = boto3.client("ec2", region_name="us-east-1")
    inventory = running_cluster(ec2)
    lost = inventory.nodes[2]
    ec2.terminate_instances(InstanceIds=[lost.instance_id])  # a reclaimed spot worker
    report = train_checks.preflight_for_train(inventory, clients=clients())
    assert not report.ok and report.exit_code == 1
    [bad] = report.failures
    assert bad.check == "nodes" and "node2" in bad.message and lost.instance_id in bad.message
    assert "terminated" in bad.message
    assert "`pulumi up --refresh`" in bad.fix and "--nodes 2" in bad.fix  # plain `pulumi up` sees no change
    assert "launch would fail" in report.render()


def test_train_preflight_a_stopped_master_cannot_be_left_out(mocked_aws):
    ec2 = boto3.client("ec2", region_name="us-east-1")
    inventory = running_cluster(ec2, workers=1)
    ec2.stop_instances(InstanceIds=[inventory.master.instance_id])
    [bad] = train_checks.preflight_for_train(inventory, clients=clients()).failures
    assert "node0" in bad.message and "stopped" in bad.message
    assert "master cannot be left out" in bad.fix and "--nodes" not in bad.fix


@set_initial_no_auth_action_count(4)
def _train_preflight_as_restricted_user(inventory, deny):
    session = _restricted_session(deny)
    return train_checks.preflight_for_train(inventory, clients=clients(session=session))


def test_train_preflight_access_denied_is_a_finding_not_a_stop(mocked_aws):
    ec2 = boto3.client("ec2", region_name="us-east-1")
    inventory = running_cluster(ec2, workers=1, spot=True)
    assert all(n.spot for n in inventory.nodes)
    report = _train_preflight_as_restricted_user(inventory, ["ec2:DescribeInstances"])
    nodes = next(f for f in report.findings if f.check == "nodes")
    assert nodes.status == pf.WARN and "access denied to ec2:DescribeInstances" in nodes.message
    assert "allow ec2:DescribeInstances" in nodes.fix
    assert report.status_of("credentials") == pf.OK
    # the spot check still ran after the denied one, looking the requests up by instance id
    assert report.status_of("spot") == pf.OK
    assert report.ok  # nothing known to be wrong


class SpotNoticeEc2:
    """Test double: a moto EC2 client plus what moto lacks for spot interruption notices.

    moto's instances carry no SpotInstanceRequestId and its spot requests never change status; this
    double names a request per spot instance and answers describe_spot_instance_requests with the
    status codes given (`notices`: instance id -> code, others "fulfilled"). Everything else is moto.
    """

    def __init__(self, ec2, notices):
        self._ec2, self.notices = ec2, notices

    def __getattr__(self, name):
        return getattr(self._ec2, name)

    def get_paginator(self, operation):
        real = self._ec2.get_paginator(operation)
        if operation != "describe_instances":
            return real
        double = self

        class Pages:
            def paginate(self, **kwargs):
                for page in real.paginate(**kwargs):
                    for reservation in page.get("Reservations", []):
                        for inst in reservation["Instances"]:
                            if inst.get("InstanceLifecycle") == "spot":
                                inst["SpotInstanceRequestId"] = double.request_of(inst["InstanceId"])
                    yield page
        return Pages()

    @staticmethod
    def request_of(instance_id):
        return "sir-" + instance_id[2:10]

    def describe_spot_instance_requests(self, SpotInstanceRequestIds):
        requests = []
        for instance_id, code in self.notices.items():
            if self.request_of(instance_id) in SpotInstanceRequestIds:
                requests.append({"SpotInstanceRequestId": self.request_of(instance_id), "InstanceId": instance_id,
                                 "State": "active", "Status": {"Code": code}})
        return {"SpotInstanceRequests": requests}


def test_train_preflight_fails_on_a_spot_interruption_notice(mocked_aws):
    ec2 = boto3.client("ec2", region_name="us-east-1")
    inventory = running_cluster(ec2, workers=2, spot=True)
    notices = {n.instance_id: "fulfilled" for n in inventory.nodes}
    notices[inventory.nodes[1].instance_id] = "marked-for-termination"
    double = SpotNoticeEc2(ec2, notices)
    report = train_checks.preflight_for_train(
        inventory, clients=AwsClients(sts=boto3.client("sts", region_name="us-east-1"), ec2=double, quotas=None))
    assert report.status_of("nodes") == pf.OK
    [bad] = report.failures
    assert bad.check == "spot" and "node1" in bad.message and "marked-for-termination" in bad.message
    assert "--nodes 1" in bad.fix

    double.notices[inventory.nodes[1].instance_id] = "fulfilled"
    report = train_checks.preflight_for_train(
        inventory, clients=AwsClients(sts=boto3.client("sts", region_name="us-east-1"), ec2=double, quotas=None))
    assert report.ok and report.status_of("spot") == pf.OK


def test_fab_train_stops_before_connecting_when_a_node_is_gone(mocked_aws, capsys):
    from invoke.exceptions import Exit

    from node_setup.tasks import job_run
    from node_setup.tasks.common import BAD_INPUT

    ec2 = boto3.client("ec2", region_name="us-east-1")
    inventory = running_cluster(ec2, workers=1)
    job_run.preflight(inventory)  # all running: no exit, nothing printed
    assert capsys.readouterr().out == ""
    ec2.terminate_instances(InstanceIds=[inventory.nodes[1].instance_id])
    with pytest.raises(Exit) as stopped:
        job_run.preflight(inventory)
    assert stopped.value.code == BAD_INPUT and "preflight failed" in str(stopped.value.message)
    assert "node1 (worker" in capsys.readouterr().out
