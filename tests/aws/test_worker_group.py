"""The cluster's worker group on moto (a server on 127.0.0.1, so the auto-stop's own script reaches it
too): fab reads the group, AWS replaces a terminated worker and discovery finds the new one, and after
the auto-stop's stop-group command no worker is relaunched and `fab status` says the group is stopped.

moto 5 launches a group's instances from its launch template and, when its desired capacity is
above the instances it has, launches the missing ones as a group is read; it records no scaling
activities (the failure message is tested under the Pulumi mocks and in tests/unit)."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys

import pytest

from cluster.node import autostop
from cluster.stack.tags import (ROLE_KEY, ROLE_MASTER, ROLE_WORKER,
                          cluster_tags)

moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

REGION = "us-east-1"
CLUSTER = "xeon-dev"


@pytest.fixture
def endpoint(aws_credentials, monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST"), timeout=10).close()
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)
    try:
        yield url
    finally:
        server.stop()


def master_instance() -> str:
    """A running master instance of the cluster, tagged as infra/master.py tags it; its id."""
    ec2 = boto3.client("ec2", REGION)
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    tags = {**cluster_tags(CLUSTER, "dev"), ROLE_KEY: ROLE_MASTER}
    (made,) = ec2.run_instances(
        ImageId=ec2.describe_images()["Images"][0]["ImageId"], InstanceType="c6i.large", MinCount=1, MaxCount=1,
        SubnetId=subnet, TagSpecifications=[{"ResourceType": "instance", "Tags": [
            {"Key": k, "Value": v} for k, v in tags.items()]}])["Instances"]
    return made["InstanceId"]


def _as_the_program_makes_it(count: int = 3) -> tuple[str, str]:
    """A master instance and the worker group of `count` (template + group tagged as infra/workers.py does)."""
    ec2, asg = boto3.client("ec2", REGION), boto3.client("autoscaling", REGION)
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    image = ec2.describe_images()["Images"][0]["ImageId"]
    base = cluster_tags(CLUSTER, "dev")
    worker = [{"Key": k, "Value": v} for k, v in {**base, ROLE_KEY: ROLE_WORKER, "Name": f"{CLUSTER}-worker"}.items()]
    master_instance()
    template = ec2.create_launch_template(LaunchTemplateName=f"{CLUSTER}-worker", TagSpecifications=[
        {"ResourceType": "launch-template", "Tags": [{"Key": k, "Value": v} for k, v in base.items()]}],
        LaunchTemplateData={
        "ImageId": image, "InstanceType": "c6i.large", "InstanceInitiatedShutdownBehavior": "terminate",
        "TagSpecifications": [{"ResourceType": "instance", "Tags": worker}]})["LaunchTemplate"]["LaunchTemplateId"]
    name = f"{CLUSTER}-worker-5a6b7c"
    asg.create_auto_scaling_group(
        AutoScalingGroupName=name, MinSize=count, MaxSize=count, DesiredCapacity=count, VPCZoneIdentifier=subnet,
        LaunchTemplate={"LaunchTemplateId": template, "Version": "1"},
        Tags=[{"Key": t["Key"], "Value": t["Value"], "PropagateAtLaunch": True} for t in worker])
    return name, template


def _running_workers() -> list[str]:
    ec2 = boto3.client("ec2", REGION)
    pages = ec2.describe_instances(Filters=[{"Name": f"tag:{ROLE_KEY}", "Values": [ROLE_WORKER]},
                                            {"Name": "instance-state-name", "Values": ["pending", "running"]}])
    return sorted(i["InstanceId"] for r in pages["Reservations"] for i in r["Instances"])


def test_fab_reads_the_group_and_a_terminated_worker_is_replaced_and_discovered(endpoint):
    from node_setup.aws.discovery import find_cluster
    from node_setup.aws.worker_group import status_lines, worker_group

    name, template = _as_the_program_makes_it()
    group = worker_group(CLUSTER, REGION)
    assert (group.name, group.desired, group.min_size, group.max_size) == (name, 3, 3, 3)
    assert group.launch_template == template and len(group.instances) == 3 and not group.stopped
    assert worker_group("another-cluster", REGION) is None
    first = set(group.instances)
    lost = sorted(first)[0]
    boto3.client("ec2", REGION).terminate_instances(InstanceIds=[lost])

    again = worker_group(CLUSTER, REGION)  # AWS (moto) launched a replacement from the template
    assert len(again.instances) == 3 and lost not in again.instances
    (new,) = set(again.instances) - first
    inventory = find_cluster(CLUSTER, REGION)
    ids = [n.instance_id for n in inventory.nodes]
    assert ids[0] not in again.instances and new in ids and lost not in ids and len(ids) == 4
    line, problem = status_lines(CLUSTER, REGION)
    assert line.startswith(f"worker group {name}: 3 of 3 worker(s) in service") and problem is None


@pytest.mark.slow  # 6-11 s of CPU (moto): outside the inner loop, docs/testing.md
def test_after_the_auto_stop_sets_the_group_to_zero_no_worker_is_relaunched(endpoint, tmp_path):
    from node_setup.aws.worker_group import group_file, status_lines, worker_group

    name, _ = _as_the_program_makes_it()
    workers = _running_workers()
    assert len(workers) == 3
    # What fab writes on the master with the node list, and the stop-group command the service runs,
    # with a node venv whose python has boto3 (this one) and no AWS CLI on PATH.
    home = tmp_path / "home"
    for path, text in group_file(CLUSTER, REGION).items():
        (home / path).parent.mkdir(parents=True, exist_ok=True)
        (home / path).write_text(text)
    venv_bin = tmp_path / "opt" / "venv-stock" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    (venv_bin / "python").chmod(0o755)
    script = tmp_path / "stop-group"
    script.write_text(autostop.stop_group_script(node_root=str(tmp_path / "opt")))
    env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    env.update(HOME=str(home), PATH="/usr/bin:/bin")
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == f"worker group {name}: min, max and desired 0 (boto3)"

    # The workers power off (terminate); the group launches none again.
    boto3.client("ec2", REGION).terminate_instances(InstanceIds=workers)
    group = worker_group(CLUSTER, REGION)
    # all three 0: the master role's condition (infra/node_role.py) allows no other sizes
    assert (group.desired, group.min_size, group.max_size, group.instances) == (0, 0, 0, ())
    assert _running_workers() == [] and group.stopped
    line, problem = status_lines(CLUSTER, REGION)
    assert "stopped (min, max and desired 0, as the idle auto-stop sets it)" in line and "fab up" in line \
        and problem is None


def test_the_stop_group_command_refuses_a_bad_record_and_says_when_it_has_none(tmp_path):
    script = tmp_path / "stop-group"
    script.write_text(autostop.stop_group_script(node_root=str(tmp_path / "none")))
    home = tmp_path / "home"
    (home / autostop.STATE_DIR).mkdir(parents=True)
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout.strip()) == (3, "no worker group recorded")
    (home / autostop.STATE_DIR / autostop.GROUP_FILE).write_text("name=g; reboot\nregion=us-east-1\n")
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "bad name" in done.stdout
    with pytest.raises(autostop.AutostopError, match="worker group name 'g; reboot' is not allowed"):
        autostop.group_file_text("g; reboot", REGION)
    with pytest.raises(autostop.AutostopError, match="region 'us-east-1\\\\n' is not allowed"):
        autostop.group_file_text("g", "us-east-1\n")


def test_sweep_lists_a_leaked_group_and_template_and_deletes_the_group_before_its_workers(mocked_aws):
    from node_setup.aws import sweep, sweep_delete
    from tests.aws.test_sweep import FakePlacementGroups  # test double: moto has no placement groups

    name, template = _as_the_program_makes_it()
    s3, asg = boto3.client("s3", REGION), boto3.client("autoscaling", REGION)
    ec2 = FakePlacementGroups(boto3.client("ec2", REGION))
    # The master is gone (a destroy that forgot the group, or a reclaim with no stack): the group is leaked.
    masters = ec2.describe_instances(Filters=[{"Name": f"tag:{ROLE_KEY}", "Values": [ROLE_MASTER]}])
    ec2.terminate_instances(InstanceIds=[i["InstanceId"] for r in masters["Reservations"] for i in r["Instances"]])
    listing = sweep.collect(ec2, s3, REGION, autoscaling=asg)
    leaked = {(r.kind, r.id) for r in listing.leaked()}
    assert ("auto-scaling-group", name) in leaked and ("launch-template", template) in leaked
    assert sum(kind == "instance" for kind, _ in leaked) == 3
    outcomes = sweep_delete.delete(listing, ec2, s3, waiter_delay=1, autoscaling=asg)
    assert outcomes[0][0].kind == "auto-scaling-group" and outcomes[0][1].startswith("removed")
    assert all(outcome in ("removed", "terminated") or outcome.startswith("removed") for _, outcome in outcomes)
    # Nothing comes back: no group, no template, no worker launched again.
    assert asg.describe_auto_scaling_groups()["AutoScalingGroups"] == []
    assert ec2.describe_launch_templates()["LaunchTemplates"] == [] and _running_workers() == []
    again = sweep.collect(ec2, s3, REGION, autoscaling=asg)
    assert [r for r in again.leaked() if r.kind != "instance"] == []
