"""The cluster's worker group and master group on moto (a server on 127.0.0.1, so the auto-stop's own script
reaches it too): fab reads each group by its role tag, AWS replaces a terminated worker (and a terminated master)
and discovery finds the new one, and after the auto-stop's stop-group command (the workers' group, then the
master's) no node is relaunched and `fab status` says the group is stopped.

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


MASTER_GROUP = f"{CLUSTER}-master-5a6b7c"


def _group_as_the_program_makes_it(role: str, count: int) -> tuple[str, str]:
    """One role's launch template and group of `count`, tagged as infra/node_group.py tags them; (group, template)."""
    ec2, asg = boto3.client("ec2", REGION), boto3.client("autoscaling", REGION)
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    image = ec2.describe_images()["Images"][0]["ImageId"]
    base = cluster_tags(CLUSTER, "dev")
    tags = [{"Key": k, "Value": v} for k, v in {**base, ROLE_KEY: role, "Name": f"{CLUSTER}-{role}"}.items()]
    template = ec2.create_launch_template(LaunchTemplateName=f"{CLUSTER}-{role}", TagSpecifications=[
        {"ResourceType": "launch-template", "Tags": [{"Key": k, "Value": v} for k, v in base.items()]}],
        LaunchTemplateData={
        "ImageId": image, "InstanceType": "c6i.large", "InstanceInitiatedShutdownBehavior": "terminate",
        "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}]})["LaunchTemplate"]["LaunchTemplateId"]
    name = f"{CLUSTER}-{role}-5a6b7c"
    asg.create_auto_scaling_group(
        AutoScalingGroupName=name, MinSize=count, MaxSize=count, DesiredCapacity=count, VPCZoneIdentifier=subnet,
        LaunchTemplate={"LaunchTemplateId": template, "Version": "1"},
        Tags=[{"Key": t["Key"], "Value": t["Value"], "PropagateAtLaunch": True} for t in tags])
    return name, template


def master_instance() -> str:
    """The master's group of one, as the program makes it; the id of the instance it launched."""
    name, _ = _group_as_the_program_makes_it(ROLE_MASTER, 1)
    (group,) = boto3.client("autoscaling", REGION).describe_auto_scaling_groups(
        AutoScalingGroupNames=[name])["AutoScalingGroups"]
    (instance,) = group["Instances"]
    return instance["InstanceId"]


def _as_the_program_makes_it(count: int = 3) -> tuple[str, str]:
    """The master's group of one and the worker group of `count`; (the worker group, its template)."""
    master_instance()
    return _group_as_the_program_makes_it(ROLE_WORKER, count)


class NoMasterInService:
    """Test double of the Auto Scaling client: moto's, with the master's group shown as `record` (moto launches a
    group's missing instance as soon as the group is read, so it never shows one without its master)."""

    def __init__(self, autoscaling, record: dict):
        self._asg, self.record = autoscaling, record

    def __getattr__(self, name):
        return getattr(self._asg, name)

    def get_paginator(self, operation):
        pages = self._asg.get_paginator(operation)
        record = self.record

        class Shown:
            def paginate(self, **kwargs):
                for page in pages.paginate(**kwargs):
                    yield {**page, "AutoScalingGroups": [record if g["AutoScalingGroupName"] == record[
                        "AutoScalingGroupName"] else g for g in page["AutoScalingGroups"]]}
        return Shown()


def _running_workers() -> list[str]:
    ec2 = boto3.client("ec2", REGION)
    pages = ec2.describe_instances(Filters=[{"Name": f"tag:{ROLE_KEY}", "Values": [ROLE_WORKER]},
                                            {"Name": "instance-state-name", "Values": ["pending", "running"]}])
    return sorted(i["InstanceId"] for r in pages["Reservations"] for i in r["Instances"])


def test_fab_reads_the_group_and_a_terminated_worker_is_replaced_and_discovered(endpoint):
    from node_setup.aws.discovery import find_cluster
    from node_setup.aws.worker_group import master_group, status_lines, worker_group

    name, template = _as_the_program_makes_it()
    group = worker_group(CLUSTER, REGION)
    assert (group.name, group.desired, group.min_size, group.max_size) == (name, 3, 3, 3)
    assert group.launch_template == template and len(group.instances) == 3 and not group.stopped
    assert worker_group("another-cluster", REGION) is None
    master = master_group(CLUSTER, REGION)  # told apart by the role tag
    assert (master.name, master.desired, len(master.in_service)) == (MASTER_GROUP, 1, 1)
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
    # A lost master: its group launches another by itself, which discovery finds as the master.
    ec2 = boto3.client("ec2", REGION)
    ec2.terminate_instances(InstanceIds=[ids[0]])
    assert master_group(CLUSTER, REGION).instances != (ids[0],)
    assert find_cluster(CLUSTER, REGION).nodes[0].instance_id == master_group(CLUSTER, REGION).instances[0]
    # While the master's group has none in service, `fab status` says so (and --json's problem names it).
    empty = {"AutoScalingGroupName": MASTER_GROUP, "DesiredCapacity": 1, "MinSize": 1, "MaxSize": 1,
             "Instances": [], "Tags": [{"Key": k, "Value": v} for k, v in
                                       {**cluster_tags(CLUSTER, "dev"), ROLE_KEY: ROLE_MASTER}.items()]}
    line, problem = status_lines(CLUSTER, REGION, autoscaling=NoMasterInService(boto3.client("autoscaling", REGION),
                                                                                 empty))
    assert line.splitlines()[1] == f"master group {MASTER_GROUP}: no master in service; AWS launches one by itself"
    assert problem == line.splitlines()[1]


@pytest.mark.slow  # 6-11 s of CPU (moto): outside the inner loop, docs/testing.md
def test_after_the_auto_stop_sets_the_group_to_zero_no_worker_is_relaunched(endpoint, tmp_path):
    from node_setup.aws.worker_group import group_file, master_group, status_lines, worker_group

    name, _ = _as_the_program_makes_it()
    workers = _running_workers()
    assert len(workers) == 3
    (master,) = master_group(CLUSTER, REGION).instances
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
    # The workers' group first, then the master's: the master, which runs this, goes last.
    assert done.stdout.strip().splitlines() == [f"worker group {name}: min, max and desired 0 (boto3)",
                                                f"master group {MASTER_GROUP}: min, max and desired 0 (boto3)"]

    # The nodes power off (terminate); neither group launches one again.
    boto3.client("ec2", REGION).terminate_instances(InstanceIds=workers + [master])
    stopped = master_group(CLUSTER, REGION)
    assert (stopped.desired, stopped.min_size, stopped.max_size, stopped.instances) == (0, 0, 0, ())
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
    (home / autostop.STATE_DIR / autostop.GROUP_FILE).write_text("name=g\nregion=us-east-1\nmaster=m; reboot\n")
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and done.stdout.strip() == "master group: bad name in " + str(
        home / autostop.STATE_DIR / autostop.GROUP_FILE)
    with pytest.raises(autostop.AutostopError, match="master group name 'm; reboot' is not allowed"):
        autostop.group_file_text("g", REGION, "m; reboot")
    assert autostop.group_file_text("g", REGION, "m") == "name=g\nregion=us-east-1\nmaster=m\n"
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
    # The master is gone (a destroy that forgot the groups after the auto-stop set the master's to 0): both
    # groups are leaked, the master's found by the same tags.
    asg.update_auto_scaling_group(AutoScalingGroupName=MASTER_GROUP, MinSize=0, MaxSize=0, DesiredCapacity=0)
    masters = ec2.describe_instances(Filters=[{"Name": f"tag:{ROLE_KEY}", "Values": [ROLE_MASTER]}])
    ec2.terminate_instances(InstanceIds=[i["InstanceId"] for r in masters["Reservations"] for i in r["Instances"]])
    listing = sweep.collect(ec2, s3, REGION, autoscaling=asg)
    leaked = {(r.kind, r.id) for r in listing.leaked()}
    assert {("auto-scaling-group", name), ("auto-scaling-group", MASTER_GROUP), ("launch-template", template)} <= leaked
    assert sum(kind == "instance" for kind, _ in leaked) == 3
    outcomes = sweep_delete.delete(listing, ec2, s3, waiter_delay=1, autoscaling=asg)
    assert [r.kind for r, _ in outcomes[:2]] == ["auto-scaling-group"] * 2
    assert all(outcome.startswith("removed") for _, outcome in outcomes[:2])
    assert all(outcome in ("removed", "terminated") or outcome.startswith("removed") for _, outcome in outcomes)
    # Nothing comes back: no group, no template, no worker launched again.
    assert asg.describe_auto_scaling_groups()["AutoScalingGroups"] == []
    assert ec2.describe_launch_templates()["LaunchTemplates"] == [] and _running_workers() == []
    again = sweep.collect(ec2, s3, REGION, autoscaling=asg)
    assert [r for r in again.leaked() if r.kind != "instance"] == []


def test_a_master_group_whose_stack_is_gone_is_leaked_with_its_master_and_one_with_its_stack_is_up(mocked_aws):
    """A master its group launched keeps a cluster up only while the stack's marker is there: a destroy that
    forgot the groups leaves a group that launches a master again after every termination."""
    from cluster.stack.tags import STACK_MARKER_KEY
    from node_setup.aws import sweep, sweep_delete
    from tests.aws.test_sweep import FakePlacementGroups  # test double: moto has no placement groups

    name, _ = _as_the_program_makes_it(count=1)
    s3, asg = boto3.client("s3", REGION), boto3.client("autoscaling", REGION)
    ec2 = FakePlacementGroups(boto3.client("ec2", REGION))
    leaked = {(r.kind, r.id) for r in sweep.collect(ec2, s3, REGION, autoscaling=asg).leaked()}
    assert {("auto-scaling-group", name), ("auto-scaling-group", MASTER_GROUP)} <= leaked
    assert sum(kind == "instance" for kind, _ in leaked) == 2  # the master and the worker
    # With the stack's marker (the cluster security group the program tags) the same cluster is up.
    vpc = ec2.describe_vpcs()["Vpcs"][0]["VpcId"]
    marker = ec2.create_security_group(GroupName="xeon-dev-cluster", Description="cluster", VpcId=vpc,
                                       TagSpecifications=[{"ResourceType": "security-group", "Tags": [
                                           {"Key": k, "Value": v} for k, v in
                                           {**cluster_tags(CLUSTER, "dev"), STACK_MARKER_KEY: "dev"}.items()]}])
    listing = sweep.collect(ec2, s3, REGION, autoscaling=asg)
    assert listing.leaked() == [] and CLUSTER in listing.up_clusters
    ec2.delete_security_group(GroupId=marker["GroupId"])
    listing = sweep.collect(ec2, s3, REGION, autoscaling=asg)
    sweep_delete.delete(listing, ec2, s3, waiter_delay=1, autoscaling=asg)
    assert asg.describe_auto_scaling_groups()["AutoScalingGroups"] == []
    live = ec2.describe_instances(Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])
    assert [i for r in live["Reservations"] for i in r["Instances"]] == []  # no master launched again
