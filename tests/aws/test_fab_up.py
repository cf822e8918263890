"""`fab up` after `pulumi up`: it returns only when the workers' group has its workers in service (bounded by
--wait-for-capacity), fails with the group's own reason when it has not, and arms the master's idle auto-stop
with the stack's autoStopIdle, also after a failed `pulumi up` once the group exists.

The account is moto (the cluster as infra/ makes it: a tagged master and the workers' group,
tests/aws/test_worker_group.py's helper). moto launches whatever a group lacks whenever it is read and
records no scaling activities, so `ShortGroupDouble`, a named test double around moto's Auto Scaling
client, shows the group as AWS shows one whose launch failed: one instance fewer than it wants, and the
failed activity AWS records. The Pulumi CLI is tests/unit/fake_pulumi.py on PATH (its exit code scripted), and
the arming over SSH is `arm_at_setup`'s test double (the real one is tested against a local cluster in
tests/ssh); what reaches it (the cluster found by its tags, the stack's idle time) is the real code's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import boto3
import pytest
from invoke import Context, Exit

from cluster.node import autostop
from node_setup.aws import worker_group as aws_worker_group
from node_setup.tasks import lifecycle as task
from tests.aws.test_worker_group import REGION, _as_the_program_makes_it, master_instance

FAKE = Path(__file__).resolve().parents[1] / "unit" / "fake_pulumi.py"
CLIENT = aws_worker_group.clients.client
REFUSED = ("Could not launch Spot Instances. InsufficientInstanceCapacity - There is no Spot capacity available "
           "that matches your request. Launching EC2 instance failed.")


class ShortGroupDouble:
    """Test double of the Auto Scaling client: moto's, but a group's last instance is left out (the launch AWS
    could not make) and DescribeScalingActivities answers `activities` (newest first)."""

    def __init__(self, activities: list[dict]):
        self._moto = boto3.client("autoscaling", REGION)
        self._activities = activities

    def describe_scaling_activities(self, **kwargs):
        return {"Activities": list(self._activities)}

    def get_paginator(self, operation):
        pages = self._moto.get_paginator(operation)
        if operation != "describe_auto_scaling_groups":
            return pages

        class Short:
            def paginate(self, **kwargs):
                for page in pages.paginate(**kwargs):
                    yield {**page, "AutoScalingGroups": [{**g, "Instances": g["Instances"][:-1]}
                                                         for g in page["AutoScalingGroups"]]}
        return Short()

    def __getattr__(self, name):
        return getattr(self._moto, name)


@pytest.fixture
def site(mocked_aws, tmp_path, monkeypatch):
    """A stack file for the cluster (stack dev, autoStopIdle 45m) in the working directory, the Pulumi double
    on PATH, and the arming's test double; what it was asked to arm."""
    (tmp_path / "Pulumi.dev.yaml").write_text(
        f"config:\n  aws:region: {REGION}\n  xeon-cluster:workerCount: \"3\"\n  xeon-cluster:autoStopIdle: 45m\n"
        "  xeon-cluster:publicKey: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICECnqlEndt9BEuNRtVWwmWQcvgQq/FYgx/iofqx4Int\n"
        "  xeon-cluster:adminCidrs:\n    - 198.51.100.0/24\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pulumi").write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    (bin_dir / "pulumi").chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_PULUMI_LOG", str(tmp_path / "pulumi.log"))
    armed: list[tuple] = []

    def arm_at_setup(inventory, conns, idle_s, *, force):  # test double: the arming over SSH
        armed.append(([n.instance_id for n in inventory.nodes], idle_s, force))
        return autostop.Status(armed=True, idle_s=idle_s)

    monkeypatch.setattr("node_setup.ssh.autostop.arm_at_setup", arm_at_setup)
    monkeypatch.setattr("node_setup.tasks.common.connect", lambda inventory: {})
    return armed


def _short_of_one_worker(activities: list[dict], monkeypatch) -> str:
    """The group with 2 of its 3 workers (ShortGroupDouble), and the activities AWS recorded."""
    name, _ = _as_the_program_makes_it()
    double = ShortGroupDouble(activities)
    monkeypatch.setattr(aws_worker_group.clients, "client",
                        lambda service, region=None: double if service == "autoscaling" else boto3.client(
                            service, region_name=REGION))
    return name


@pytest.mark.slow  # about 4 s (moto, two runs of the Pulumi double): outside the inner loop
def test_fab_up_fails_with_the_groups_own_reason_while_workers_are_missing_and_returns_once_they_are_in(
        site, monkeypatch, capsys):
    name = _short_of_one_worker([{"StatusCode": "Failed", "StatusMessage": REFUSED}], monkeypatch)
    with pytest.raises(Exit) as failed:
        task.up(Context(), stack="dev", preflight=False, wait_for_capacity=0)
    out = capsys.readouterr().out
    assert failed.value.code == 1
    line = failed.value.message
    assert line.startswith("error: 2 of 3 worker(s) in service after 0s; ")
    assert f"{name}: AWS could not launch the 3 worker(s) of the group: {REFUSED}" in line  # the group's reason
    assert "workerSpot: false" in line and "keeps trying" in line and "billed" in line
    (armed,) = site  # the cluster found by its tags, the stack's autoStopIdle, a cancel on the master kept
    assert armed[1:] == (45 * 60, False)
    assert "auto-stop: armed, 45m idle" in out and "is up" not in out

    monkeypatch.setattr(aws_worker_group.clients, "client", CLIENT)  # AWS launched it: every worker in service
    task.up(Context(), stack="dev", preflight=False)
    out = capsys.readouterr().out
    assert "up: cluster xeon-dev is up" in out and "auto-stop: armed, 45m idle" in out and len(site) == 2


@pytest.mark.slow  # about 3 s (moto, two runs of the Pulumi double)
def test_a_failed_pulumi_up_names_the_groups_reason_and_arms_once_the_group_exists(site, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_PULUMI_EXIT", "255")
    with pytest.raises(Exit) as failed:  # no group yet: the master may not be set up; nothing armed
        task.up(Context(), stack="dev", preflight=False)
    assert failed.value.code == 255 and site == []
    _short_of_one_worker([{"StatusCode": "Failed", "StatusMessage": REFUSED}], monkeypatch)
    with pytest.raises(Exit) as failed:
        task.up(Context(), stack="dev", preflight=False)
    out = capsys.readouterr().out
    assert failed.value.code == 255 and "`pulumi up` exited with code 255" in failed.value.message
    assert "2 of 3 worker(s) in service after `pulumi up`" in out and REFUSED in out
    # without preflight's report, fab up says itself which image `pulumi up` boots
    assert f"fab: image: bakes a new image: no kept image in {REGION}: this stack bakes its own" in out
    assert len(site) == 1 and "auto-stop: armed" in out


def test_a_workers_console_is_read_as_long_as_the_clusters_type_boots():
    """`fab up` arms the auto-stop once the group's workers are in service, which a metal instance is long
    before its boot ends and its console lists its host keys: the controller waits for them as long."""
    from cluster.inventory import Inventory, Node
    from node_setup.aws.console import AwsConsole

    def console(itype):
        return AwsConsole(Inventory(name="xeon-dev", kind="aws", user="ubuntu", region=REGION, instance_type=itype,
                                    nodes=(Node("node0", "10.0.0.10", "10.0.0.10", 0, role="master",
                                                instance_id="i-0123456789abcdef0"),)))

    assert console("r7iz.metal-16xl").wait_s == 2400 and console("c6i.16xlarge").wait_s == 900


def test_fab_up_zone_writes_the_zone_and_the_move_before_pulumi_up_and_refuses_a_bad_zone_first(site, capsys):
    stack_file = Path("Pulumi.dev.yaml")
    before = stack_file.read_text()
    with pytest.raises(Exit) as bad:
        task.up(Context(), stack="dev", preflight=False, zone="us-west-2a")
    assert bad.value.code == 2 and bad.value.message.startswith(
        "error: --zone: 'us-west-2a' is not a zone of aws:region us-east-1; allowed: a zone name")
    assert stack_file.read_text() == before and not Path(os.environ["FAKE_PULUMI_LOG"]).exists()
    _as_the_program_makes_it()
    task.up(Context(), stack="dev", preflight=False, zone="us-east-1c", wait_for_capacity=0)
    out = capsys.readouterr().out
    assert "Pulumi.dev.yaml: availabilityZone = us-east-1c, zoneMove = true (the whole cluster moves there)" in out
    text = stack_file.read_text()
    assert "xeon-cluster:availabilityZone: us-east-1c\n" in text and "xeon-cluster:zoneMove: true\n" in text
    assert '"up", "--stack", "dev", "--refresh"' in Path(os.environ["FAKE_PULUMI_LOG"]).read_text()


@pytest.mark.slow  # about 4 s (moto, two runs of the Pulumi double)
def test_on_demand_fallback_raises_the_groups_on_demand_base_after_its_wait_and_spot_returns_after_a_stop(
        site, monkeypatch, capsys):
    from tests.aws.test_worker_group_types import TYPES, _mixed_group

    with Path("Pulumi.dev.yaml").open("a") as stack_file:
        stack_file.write("  xeon-cluster:onDemandFallback: 0.2s\n  xeon-cluster:instanceTypes:\n"
                         + "".join(f"    - {t}\n" for t in TYPES))
    _mixed_group(3)
    master_instance()
    double = ShortGroupDouble([{"StatusCode": "Failed", "StatusMessage": REFUSED}])  # 2 of 3, spot refused
    monkeypatch.setattr(aws_worker_group.clients, "client",
                        lambda service, region=None: double if service == "autoscaling" else boto3.client(
                            service, region_name=REGION))
    monkeypatch.setattr(task, "CAPACITY_POLL_S", 0.05)
    with pytest.raises(Exit):  # the double keeps one worker missing: fab up still ends short, naming the group
        task.up(Context(), stack="dev", preflight=False, wait_for_capacity=0.4)
    out = capsys.readouterr().out
    assert ("xeon-dev-worker-1a2b: no spot capacity for 0s (" + REFUSED + "); onDemandFallback: the group's "
            "on-demand base is now 1, so it launches 1 worker(s) on demand, of the same types") in out
    (group,) = boto3.client("autoscaling", REGION).describe_auto_scaling_groups(
        AutoScalingGroupNames=["xeon-dev-worker-1a2b"])["AutoScalingGroups"]
    policy = group["MixedInstancesPolicy"]
    assert policy["InstancesDistribution"]["OnDemandBaseCapacity"] == 1
    assert [o["InstanceType"] for o in policy["LaunchTemplate"]["Overrides"]] == TYPES  # the rest kept
    # the idle auto-stop sets the group to 0 (moto drops a policy an update does not repeat): the next fab up
    # asks for spot first again
    policy["LaunchTemplate"]["LaunchTemplateSpecification"].pop("LaunchTemplateName")
    boto3.client("autoscaling", REGION).update_auto_scaling_group(
        AutoScalingGroupName=group["AutoScalingGroupName"], MinSize=0, MaxSize=0, DesiredCapacity=0,
        MixedInstancesPolicy=policy)
    monkeypatch.setattr(aws_worker_group.clients, "client", CLIENT)
    task.up(Context(), stack="dev", preflight=False, wait_for_capacity=0)
    assert "on-demand base 1 -> 0 (onDemandFallback: the group is stopped" in capsys.readouterr().out
    (group,) = boto3.client("autoscaling", REGION).describe_auto_scaling_groups(
        AutoScalingGroupNames=["xeon-dev-worker-1a2b"])["AutoScalingGroups"]
    assert group["MixedInstancesPolicy"]["InstancesDistribution"]["OnDemandBaseCapacity"] == 0


def test_fab_up_zone_auto_moves_the_cluster_to_the_best_ranked_zone_that_offers_its_type(site, monkeypatch, capsys):
    """`--zone auto`: the zones ranked as `fab preflight --pick-zone` ranks them (tests/aws/test_pick_zone.py's
    placement scores and prices: us-east-1e scores 10 but does not offer r7iz.metal-16xl; us-east-1b and
    us-east-1c score 9, us-east-1c is cheaper), the best written with zoneMove before `pulumi up`."""
    from tests.aws.test_pick_zone import PRICES, SCORES, ScoresAndPricesEc2

    ec2 = ScoresAndPricesEc2(boto3.client("ec2", region_name=REGION), SCORES, PRICES)
    monkeypatch.setattr(aws_worker_group.clients, "client",
                        lambda service, region=None: ec2 if service == "ec2" else CLIENT(service, region))
    _as_the_program_makes_it()
    task.up(Context(), stack="dev", preflight=False, zone="auto", wait_for_capacity=0)
    out = capsys.readouterr().out
    assert "Pulumi.dev.yaml: availabilityZone = us-east-1c, zoneMove = true (the whole cluster moves there)" in out
    (asked,) = ec2.score_requests
    assert asked["InstanceTypes"] == ["r7iz.metal-16xl"] and asked["TargetCapacity"] == 4  # master + 3 workers
    text = Path("Pulumi.dev.yaml").read_text()
    assert "xeon-cluster:availabilityZone: us-east-1c\n" in text and "xeon-cluster:zoneMove: true\n" in text
    assert '"up", "--stack", "dev", "--refresh"' in Path(os.environ["FAKE_PULUMI_LOG"]).read_text()
