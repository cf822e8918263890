"""Cluster discovery: AWS clusters by tags (moto), inventory files, the local cluster's inventory."""

from __future__ import annotations

import boto3
import pytest
import yaml

from cluster.stack.tags import (CLUSTER_KEY, MANAGED_BY_KEY, MANAGED_BY_VALUE, PROFILE_KEY, RANK_KEY, ROLE_KEY,
                          ROLE_MASTER, ROLE_WORKER, SSH_USER_KEY)
from node_setup import discovery
from node_setup.aws import discovery as aws_discovery
from node_setup.discovery import ClusterSelectionError, resolve_cluster


MOTO_EXAMPLE_AMI = "ami-12c6146b"  # one of moto's built-in AMIs


class Launcher:
    """Starts tagged instances in moto's default subnet, at the private IPs a test chooses."""

    def __init__(self, region):
        self.ec2 = boto3.client("ec2", region_name=region)
        self.ami = MOTO_EXAMPLE_AMI  # describe_images would cost ~1 s per test
        subnet = self.ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"][0]
        self.subnet_id = subnet["SubnetId"]
        self.prefix = subnet["CidrBlock"].rsplit(".", 2)[0]  # e.g. 172.31

    def __call__(self, cluster, role, rank=None, *, ip, spot=False, managed=True, extra_tags=None,
                 instance_type="c6i.16xlarge"):
        tags = {CLUSTER_KEY: cluster, ROLE_KEY: role, **(extra_tags or {})}
        if managed:
            tags[MANAGED_BY_KEY] = MANAGED_BY_VALUE
        if rank is not None:
            tags[RANK_KEY] = str(rank)
        kwargs = dict(ImageId=self.ami, MinCount=1, MaxCount=1, InstanceType=instance_type,
                      SubnetId=self.subnet_id, PrivateIpAddress=f"{self.prefix}.{ip}",
                      TagSpecifications=[{"ResourceType": "instance",
                                          "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}])
        if spot:
            kwargs["InstanceMarketOptions"] = {"MarketType": "spot"}
        return self.ec2.run_instances(**kwargs)["Instances"][0]["InstanceId"]

    def public_ip(self, instance_id):
        [reservation] = self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        return reservation["Instances"][0]["PublicIpAddress"]


@pytest.fixture
def launch(mocked_aws, monkeypatch):
    monkeypatch.delenv(discovery.KEY_ENV, raising=False)
    return Launcher(mocked_aws)


def test_master_first_then_rank_then_private_ip(launch, mocked_aws, monkeypatch):
    monkeypatch.setenv(discovery.KEY_ENV, "/keys/demo_ed25519")
    # launched out of order; two workers without a rank tag are ordered by private IP as numbers
    no_rank_high = launch("demo", ROLE_WORKER, ip="0.200")
    w2 = launch("demo", ROLE_WORKER, 2, ip="0.12", spot=True)
    no_rank_low = launch("demo", ROLE_WORKER, ip="0.30")
    w1 = launch("demo", ROLE_WORKER, 1, ip="0.250", spot=True)
    master = launch("demo", ROLE_MASTER, 0, ip="0.99", instance_type="r7iz.metal-16xl")

    inventory = resolve_cluster("demo")

    assert [n.instance_id for n in inventory.nodes] == [master, w1, w2, no_rank_low, no_rank_high]
    assert [n.name for n in inventory.nodes] == ["node0", "node1", "node2", "node3", "node4"]
    assert [n.rank for n in inventory.nodes] == [0, 1, 2, 3, 4]
    assert [n.role for n in inventory.nodes] == [ROLE_MASTER] + [ROLE_WORKER] * 4
    public = launch.public_ip(master)
    assert inventory.master.address == public == inventory.gateway
    assert inventory.master.private_address == f"{launch.prefix}.0.99"
    # workers: addressed by private IP, hence reached through the gateway
    assert [n.address for n in inventory.nodes[1:]] == [f"{launch.prefix}.0.{ip}" for ip in (250, 12, 30, 200)]
    assert all(n.address == n.private_address for n in inventory.nodes[1:])
    assert [n.spot for n in inventory.nodes] == [False, True, True, False, False]
    assert inventory.master.instance_type == "r7iz.metal-16xl" == inventory.instance_type
    assert inventory.nodes[1].instance_type == "c6i.16xlarge"
    assert (inventory.kind, inventory.name, inventory.user, inventory.region) == ("aws", "demo", "ubuntu", mocked_aws)
    assert inventory.key_path == "/keys/demo_ed25519"
    assert inventory.profile == "stock"


def test_no_flag_picks_the_only_running_cluster(launch):
    master = launch("solo", ROLE_MASTER, 0, ip="1.10")
    launch("solo", ROLE_WORKER, 1, ip="1.11")
    launch("someone-else", ROLE_MASTER, 0, ip="1.12", managed=False)  # not ours: ignored
    inventory = resolve_cluster(None)
    assert inventory.name == "solo"
    assert inventory.master.instance_id == master and len(inventory.nodes) == 2
    assert inventory.key_path is None


def test_several_clusters_are_listed_with_how_to_pick(launch):
    for i, name in enumerate(("beta", "alpha")):
        launch(name, ROLE_MASTER, 0, ip=f"2.{10 + i}")
    launch("alpha", ROLE_WORKER, 1, ip="2.20")
    with pytest.raises(ClusterSelectionError) as err:
        resolve_cluster(None)
    message = str(err.value)
    assert "several xeon-cluster clusters are running in region us-east-1" in message
    assert "alpha (2 nodes), beta (1 node)" in message
    assert "--cluster NAME" in message
    assert resolve_cluster("beta").name == "beta"


def test_none_running_says_so_and_what_to_do(launch):
    with pytest.raises(ClusterSelectionError) as err:
        resolve_cluster(None)
    message = str(err.value)
    assert "no xeon-cluster cluster is running in region us-east-1" in message
    assert "pulumi up" in message and "fab local-up" in message


def test_stopped_and_terminated_instances_are_ignored(launch):
    master = launch("demo", ROLE_MASTER, 0, ip="3.10")
    worker = launch("demo", ROLE_WORKER, 2, ip="3.12")
    stopped = launch("demo", ROLE_WORKER, 1, ip="3.11")
    terminated = launch("demo", ROLE_WORKER, 3, ip="3.13")
    launch.ec2.stop_instances(InstanceIds=[stopped])
    launch.ec2.terminate_instances(InstanceIds=[terminated])
    inventory = resolve_cluster("demo")
    assert [n.instance_id for n in inventory.nodes] == [master, worker]
    assert {n.state for n in inventory.nodes} == {"running"}


def test_a_stopped_cluster_is_named_with_its_state(launch):
    launch("live", ROLE_MASTER, 0, ip="4.9")
    master = launch("sleepy", ROLE_MASTER, 0, ip="4.10")
    launch.ec2.stop_instances(InstanceIds=[master])
    with pytest.raises(ClusterSelectionError) as err:
        resolve_cluster("sleepy")
    message = str(err.value)
    assert "no running xeon-cluster cluster named 'sleepy'" in message
    assert "1 of its instances are stopped" in message
    assert "Running clusters: live (1 node)" in message
    # with nothing else running, a stopped cluster does not count for the no-flag choice either
    with pytest.raises(ClusterSelectionError, match="no running xeon-cluster cluster named 'nothing'"):
        resolve_cluster("nothing")


def test_cluster_without_running_master_is_an_error(launch):
    launch("headless", ROLE_WORKER, 1, ip="5.11")
    master = launch("headless", ROLE_MASTER, 0, ip="5.10", spot=True)
    launch.ec2.terminate_instances(InstanceIds=[master])  # e.g. the spot master was reclaimed
    with pytest.raises(ClusterSelectionError, match="cluster 'headless': no running master.*pulumi up"):
        resolve_cluster("headless")


def test_user_and_profile_tags(launch):
    launch("tagged", ROLE_MASTER, 0, ip="6.10", extra_tags={SSH_USER_KEY: "ec2-user", PROFILE_KEY: "intel"})
    inventory = resolve_cluster("tagged")
    assert (inventory.user, inventory.profile) == ("ec2-user", "intel")
    launch("badprofile", ROLE_MASTER, 0, ip="6.11", extra_tags={PROFILE_KEY: "cuda"})
    with pytest.raises(ClusterSelectionError, match="'cuda' names no profile; allowed: intel, stock"):
        resolve_cluster("badprofile")


def test_a_master_without_a_public_address_is_the_gateway_at_its_private_address():
    # A private subnet: the controller is inside the VPC (or routed into it), but only the master's
    # security group admits its SSH, so the workers are still reached through the master.
    def running(role, rank, ip):
        return {"InstanceId": f"i-{rank}", "PrivateIpAddress": ip, "State": {"Name": "running"},
                "Tags": [{"Key": ROLE_KEY, "Value": role}, {"Key": RANK_KEY, "Value": str(rank)}]}

    inventory = aws_discovery.inventory_from_instances(
        "private", [running(ROLE_WORKER, 1, "10.0.1.6"), running(ROLE_MASTER, 0, "10.0.1.5")],
        region="us-east-1", key_path=None)
    assert [(n.address, n.private_address) for n in inventory.nodes] == [("10.0.1.5", "10.0.1.5"),
                                                                          ("10.0.1.6", "10.0.1.6")]
    assert inventory.gateway == "10.0.1.5" == inventory.master.address


def test_no_region_suggests_the_alternatives(monkeypatch, tmp_path):
    for var in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    with pytest.raises(ClusterSelectionError) as err:
        resolve_cluster("demo")
    assert "no AWS region" in str(err.value) and "--cluster local" in str(err.value)


# ---------------------------------------------------------------- inventory files


def test_inventory_file_with_relative_key_and_gateway(tmp_path, monkeypatch):
    monkeypatch.delenv(discovery.KEY_ENV, raising=False)
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump({
        "user": "ops", "key": "keys/lab_ed25519", "gateway": "bastion.example.org", "sockets": 2,
        "physical_cores": 32, "hosts": [{"name": "head", "address": "192.0.2.10", "private_address": "10.0.0.10"},
                                        "192.0.2.11"]}))
    inventory = resolve_cluster(str(path))
    assert (inventory.name, inventory.kind, inventory.user) == ("lab", "file", "ops")
    assert inventory.key_path == str(tmp_path / "keys" / "lab_ed25519")
    assert inventory.gateway == "bastion.example.org"
    assert [(n.name, n.address, n.private_address) for n in inventory.nodes] == [
        ("head", "192.0.2.10", "10.0.0.10"), ("node1", "192.0.2.11", "192.0.2.11")]


def test_inventory_file_key_from_env_when_absent(tmp_path, monkeypatch):
    monkeypatch.setenv(discovery.KEY_ENV, "~/.ssh/site_key")
    path = tmp_path / "site.yml"
    path.write_text("hosts: [192.0.2.20]\n")
    inventory = resolve_cluster(str(path))
    assert inventory.key_path.endswith("/.ssh/site_key") and not inventory.key_path.startswith("~")


def test_local_kind_is_kept_from_the_file(tmp_path):
    path = tmp_path / "inventory.yaml"
    path.write_text("kind: local\nname: t1\nhosts: [10.200.0.2, 10.200.0.3]\n")
    assert resolve_cluster(str(path)).kind == "local"


@pytest.mark.parametrize("text, expected", [
    ("hosts: [192.0.2.1\nuser: x\n", r"not valid YAML at line \d+, column \d+"),
    ("- 192.0.2.1\n", "expected a mapping with 'hosts', got list"),
    ("user: ubuntu\n", "'hosts' must be a non-empty list, master first"),
    ("hosts:\n  - name: a\n", r"hosts\[0\] needs an 'address'"),
    ("hosts: [192.0.2.1]\nprofile: cuda\n", "profile 'cuda' is unknown; allowed: intel, stock"),
    ("hosts:\n  - {name: a, address: 192.0.2.1}\n  - {name: a, address: 192.0.2.2}\n", "host names repeat"),
])
def test_inventory_file_errors_name_the_file_and_problem(tmp_path, text, expected):
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    with pytest.raises(ClusterSelectionError, match=expected) as err:
        resolve_cluster(str(path))
    assert str(err.value).startswith(f"--cluster {path}: ")


def test_missing_inventory_file(tmp_path):
    with pytest.raises(ClusterSelectionError, match="inventory file not found"):
        resolve_cluster(str(tmp_path / "nope.yaml"))


# ---------------------------------------------------------------- the local cluster's inventory


def test_local_cluster_not_up_says_how_to_start_it(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    with pytest.raises(ClusterSelectionError, match=r"no local cluster named 'local' is up: start it with "
                                                    r"`fab local-up --nodes 4`"):
        resolve_cluster("local")
    with pytest.raises(ClusterSelectionError, match="`fab local-up --nodes 4 --name bench8`"):
        resolve_cluster("local:bench8")
    with pytest.raises(ClusterSelectionError, match="not a valid local cluster name"):
        resolve_cluster("local:Bad Name")
