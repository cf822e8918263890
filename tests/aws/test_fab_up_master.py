"""`fab up` never says a cluster is up without a running master: after `pulumi up --refresh` it waits (at most
`--wait-for-capacity`) for the master's group to have its master in service (a group the idle auto-stop set to 0
launches its master only once `pulumi up` sets it back), and with no running master after that wait it exits 1
instead of reporting success.

The account is moto (tests/aws/test_fab_up.py's site: the cluster as infra/ makes it, the Pulumi CLI's double on
PATH, the arming's test double). A `pulumi up` that sets the stopped groups back is the Pulumi double plus that
update made in moto, which launches a group's missing instances as the group is next read.
"""

from __future__ import annotations

import os
from pathlib import Path

import boto3
import pytest
from invoke import Context, Exit

from node_setup.aws import termination
from node_setup.tasks import lifecycle as task
from tests.aws.test_fab_up import site  # noqa: F401 - the fixture
from tests.aws.test_worker_group import CLUSTER, MASTER_GROUP, REGION, _as_the_program_makes_it


def _stopped_master() -> str:
    """The master's group as the idle auto-stop leaves it: 0, its master terminated; the old master's id."""
    asg, ec2 = boto3.client("autoscaling", REGION), boto3.client("ec2", REGION)
    (old,) = termination.cluster_masters(CLUSTER, REGION)
    asg.update_auto_scaling_group(AutoScalingGroupName=MASTER_GROUP, MinSize=0, MaxSize=0, DesiredCapacity=0)
    ec2.terminate_instances(InstanceIds=[old])
    return old


def test_fab_up_waits_for_the_master_group_s_new_master_and_is_up_with_it(site, monkeypatch, capsys):  # noqa: F811
    _as_the_program_makes_it()
    old = _stopped_master()
    real = task._pulumi

    def pulumi_up(step):  # the program's refresh and update: the group back to 1
        code = real(step)
        boto3.client("autoscaling", REGION).update_auto_scaling_group(
            AutoScalingGroupName=MASTER_GROUP, MinSize=1, MaxSize=1, DesiredCapacity=1)
        return code

    monkeypatch.setattr(task, "_pulumi", pulumi_up)
    monkeypatch.setattr(task, "CAPACITY_POLL_S", 0.05)
    task.up(Context(), stack="dev", preflight=False, wait_for_capacity=5)
    (new,) = termination.cluster_masters(CLUSTER, REGION)
    assert new != old and "up: cluster xeon-dev is up" in capsys.readouterr().out
    assert len(site) == 1  # the new master armed


def test_with_no_running_master_after_pulumi_up_and_the_wait_fab_up_exits_1_and_never_says_it_is_up(
        site, monkeypatch, capsys):  # noqa: F811 - the fixture
    _as_the_program_makes_it()
    _stopped_master()  # and a `pulumi up` that did not set the group back
    monkeypatch.setattr(task, "CAPACITY_POLL_S", 0.05)
    with pytest.raises(Exit) as failed:
        task.up(Context(), stack="dev", preflight=False, wait_for_capacity=0.2)
    assert failed.value.code == 1
    assert failed.value.message.startswith(
        f"error: cluster {CLUSTER} has no running master after `pulumi up` (EC2 has none): nothing was armed and "
        "the cluster is not up; the master's group launches one by itself (`fab status` shows it); run `fab up` "
        "again")
    assert Path(os.environ["FAKE_PULUMI_LOG"]).exists() and site == []
    assert "is up" not in capsys.readouterr().out
