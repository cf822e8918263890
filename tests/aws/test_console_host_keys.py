"""A new AWS node's host key verified from its EC2 console output (node_setup/aws/console.py) before
the controller records it (node_setup/ssh/connections.py).

moto answers GetConsoleOutput with a canned kernel log and no host key block: that is the "no
fingerprints" case as it comes. For the verified and refused cases moto's canned text is replaced
(the module constant its answer is built from) by a cloud-init-shaped console, so the text still
travels through boto3 and moto's base64 as a real answer does. A denied GetConsoleOutput is a named
test double (moto enforces no IAM). No real SSH here: the presented key is handed to the
connection's host key policy as paramiko hands it over; tests/ssh/test_console_host_keys.py does
the same over real sshd on a local cluster.
"""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import boto3
import paramiko
import pytest
from botocore.exceptions import ClientError

from cluster.stack.tags import (CLUSTER_KEY, MANAGED_BY_KEY, MANAGED_BY_VALUE, RANK_KEY, ROLE_KEY, ROLE_MASTER,
                                ROLE_WORKER)
from node_setup.aws import discovery as aws_discovery
from node_setup.aws.console import AwsConsole
from node_setup.ssh.connections import (HostKeyRefused, HostKeyUnverified, PinnedHostKeys,
                                        host_key_name)

MOTO_EXAMPLE_AMI = "ami-12c6146b"


class FakeClock:
    """Time that passes only when the code under test sleeps: the bounded wait without waiting."""

    def __init__(self):
        self.now, self.slept = 0.0, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def make_key(where: Path, name: str) -> tuple[paramiko.PKey, str]:
    """A real ed25519 host key: (the key as paramiko presents it, `ssh-keygen -l`'s line)."""
    path = where / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "root@ip-172-31-0-10", "-f", str(path)],
                   check=True)
    keytype, b64 = Path(f"{path}.pub").read_text().split()[:2]
    listed = subprocess.run(["ssh-keygen", "-l", "-f", f"{path}.pub"], check=True, capture_output=True,
                            text=True).stdout.strip()
    return paramiko.PKey.from_type_string(keytype, base64.b64decode(b64)), listed


def console_of(listed: str, pub: paramiko.PKey) -> str:
    tag = "<14>Mar  4 10:00:01 ec2: "
    return (f"[   12.402114] cloud-init[812]: Cloud-init v. 24.4 running 'modules:final'\n"
            f"{tag}-----BEGIN SSH HOST KEY FINGERPRINTS-----\n{tag}{listed}\n"
            f"{tag}-----END SSH HOST KEY FINGERPRINTS-----\n-----BEGIN SSH HOST KEY KEYS-----\n"
            f"{pub.get_name()} {pub.get_base64()} root@ip-172-31-0-10\n-----END SSH HOST KEY KEYS-----\n")


@pytest.fixture
def cluster(mocked_aws):
    """A 2-node cluster in moto; its Inventory as discovery makes it."""
    ec2 = boto3.client("ec2", region_name=mocked_aws)
    subnet = ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"][0]
    prefix = subnet["CidrBlock"].rsplit(".", 2)[0]
    for rank, role in enumerate((ROLE_MASTER, ROLE_WORKER)):
        tags = {CLUSTER_KEY: "demo", ROLE_KEY: role, MANAGED_BY_KEY: MANAGED_BY_VALUE, RANK_KEY: str(rank)}
        ec2.run_instances(ImageId=MOTO_EXAMPLE_AMI, MinCount=1, MaxCount=1, InstanceType="c6i.large",
                          SubnetId=subnet["SubnetId"], PrivateIpAddress=f"{prefix}.0.{10 + rank}",
                          TagSpecifications=[{"ResourceType": "instance",
                                              "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}])
    return aws_discovery.find_cluster("demo", mocked_aws)


def store_for(inventory, tmp_path, clock, ec2=None) -> PinnedHostKeys:
    source = AwsConsole(inventory, ec2, wait_s=300, poll_s=10)
    if not (tmp_path / "known_hosts").exists():
        (tmp_path / "known_hosts").write_text("")
    return PinnedHostKeys(tmp_path / "known_hosts", inventory.name, source, clock=clock, sleep=clock.sleep)


def present(store: PinnedHostKeys, host: str, key: paramiko.PKey) -> paramiko.SSHClient:
    """What paramiko does when `host` shows `key` and nothing is recorded for it."""
    client = paramiko.SSHClient()
    store.attach(client)
    client._policy.missing_host_key(client, host_key_name(host), key)
    return client


def test_moto_console_without_fingerprints_is_refused_after_the_bounded_wait(cluster, tmp_path):
    clock = FakeClock()
    store = store_for(cluster, tmp_path, clock)
    worker = cluster.nodes[1]
    with pytest.raises(HostKeyUnverified) as refused:
        store.prepare(host_key_name(worker.address))
    line = str(refused.value)
    assert f"EC2 console output of {worker.instance_id} shows no SSH host key fingerprints after 300 s" in line
    assert "never trusted on first use" in line and f"--instance-id {worker.instance_id}" in line
    assert clock.now >= 300 and set(clock.slept) == {10}  # polled, bounded
    assert (tmp_path / "known_hosts").read_text() == ""  # nothing recorded


def test_the_key_the_console_shows_is_recorded_with_its_instance(cluster, tmp_path, monkeypatch):
    from moto.ec2.responses import general

    key, listed = make_key(tmp_path, "host")
    monkeypatch.setattr(general, "SAMPLE_CONSOLE_OUTPUT", console_of(listed, key))
    store = store_for(cluster, tmp_path, FakeClock())
    worker = cluster.nodes[1]
    client = present(store, worker.address, key)
    assert (tmp_path / "known_hosts").read_text() == (
        f"{worker.address} ssh-ed25519 {key.get_base64()} {worker.instance_id}\n")
    assert client.get_host_keys().lookup(worker.address)["ssh-ed25519"] == key
    assert store.lookup(worker.address)["ssh-ed25519"] == key  # paramiko reads the file with the instance id


def test_another_key_than_the_console_shows_is_refused_with_the_line(cluster, tmp_path, monkeypatch):
    from moto.ec2.responses import general

    key, listed = make_key(tmp_path, "host")
    intruder, _ = make_key(tmp_path, "intruder")
    monkeypatch.setattr(general, "SAMPLE_CONSOLE_OUTPUT", console_of(listed, key))
    store = store_for(cluster, tmp_path, FakeClock())
    master = cluster.nodes[0]
    with pytest.raises(HostKeyRefused) as refused:
        present(store, master.address, intruder)
    line = str(refused.value)
    assert f"it presents ssh-ed25519 {intruder.fingerprint}" in line
    assert f"EC2 console output of {master.instance_id} shows {listed.split()[1]} (ED25519)" in line
    assert "do not connect" in line
    assert (tmp_path / "known_hosts").read_text() == ""


class DeniedConsoleEc2Double:
    """Test double for an EC2 client whose caller lacks ec2:GetConsoleOutput (moto enforces no IAM)."""

    def get_console_output(self, **_):
        raise ClientError({"Error": {"Code": "UnauthorizedOperation", "Message": "not authorized"},
                           "ResponseMetadata": {"HTTPStatusCode": 403}}, "GetConsoleOutput")


def test_a_console_that_cannot_be_read_refuses_the_node_and_names_the_permission(cluster, tmp_path):
    store = store_for(cluster, tmp_path, FakeClock(), ec2=DeniedConsoleEc2Double())
    with pytest.raises(HostKeyUnverified) as refused:
        store.prepare(cluster.nodes[1].address)
    assert "allow ec2:GetConsoleOutput" in str(refused.value) and "refused" in str(refused.value)


def test_a_host_outside_the_cluster_is_refused(cluster, tmp_path):
    key, _ = make_key(tmp_path, "host")
    with pytest.raises(HostKeyUnverified, match="has no node at that address"):
        present(store_for(cluster, tmp_path, FakeClock()), "203.0.113.9", key)


def test_records_of_a_replaced_instance_are_dropped_and_others_kept(cluster, tmp_path):
    master, worker = cluster.nodes
    key, _ = make_key(tmp_path, "host")
    (tmp_path / "known_hosts").write_text(
        f"{master.address} ssh-ed25519 {key.get_base64()} {master.instance_id}\n"  # still this instance: kept
        f"{worker.address} ssh-ed25519 {key.get_base64()} i-0gone\n"  # another instance had the address: dropped
        f"198.51.100.7 ssh-ed25519 {key.get_base64()}\n")  # no instance recorded (setup step's TOFU): kept
    store = store_for(cluster, tmp_path, FakeClock())
    assert store.forget_replaced() == 1
    assert [line.split()[0] for line in (tmp_path / "known_hosts").read_text().splitlines()] == [
        master.address, "198.51.100.7"]
