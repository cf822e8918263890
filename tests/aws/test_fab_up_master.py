"""`fab up` never says a cluster is up without a running master: an old master that is `shutting-down` (just
after the idle auto-stop or a reclaim; the provider keeps it in the stack until it is `terminated`) is waited for,
bounded and saying so, before `pulumi up --refresh`; still there after the wait, nothing is run and `fab up` exits 1
saying what to do; and with no running master after `pulumi up`, `fab up` exits 1 instead of reporting success.

The account is moto (tests/aws/test_fab_up.py's site: the cluster as infra/ makes it, the Pulumi CLI's double on
PATH, the arming's test double). moto terminates an instance at once, so `ShuttingDownMaster`, a named test double
around moto's EC2 client, shows the master as AWS shows one on its way out: `shutting-down` for its first reads,
then terminated. A `pulumi up` that makes a new master is the Pulumi double plus that master put into moto.
"""

from __future__ import annotations

import os
from pathlib import Path

import boto3
import pytest
from invoke import Context, Exit

from node_setup.aws import clients, termination
from node_setup.tasks import lifecycle as task
from tests.aws.test_fab_up import site  # noqa: F401 - the fixture
from tests.aws.test_worker_group import CLUSTER, REGION, _as_the_program_makes_it, master_instance

CLIENT = clients.client


class ShuttingDownMaster:
    """Test double of the EC2 client: moto's, but instance `master` shows as `shutting-down` for the first
    `reads` DescribeInstances answers that hold it; after those it is terminated (in moto) and shows so."""

    def __init__(self, master: str, reads: int):
        self._moto = boto3.client("ec2", region_name=REGION)
        self.master, self.reads = master, reads

    def _pages(self, kwargs: dict) -> list[dict]:
        pages = list(self._moto.get_paginator("describe_instances").paginate(**kwargs))
        if not any(i["InstanceId"] == self.master for p in pages for r in p["Reservations"] for i in r["Instances"]):
            return pages
        if self.reads <= 0:  # its shutdown ends
            self._moto.terminate_instances(InstanceIds=[self.master])
            return list(self._moto.get_paginator("describe_instances").paginate(**kwargs))
        self.reads -= 1
        return [{**p, "Reservations": [{**r, "Instances": [
            {**i, "State": {"Code": 32, "Name": "shutting-down"}} if i["InstanceId"] == self.master else i
            for i in r["Instances"]]} for r in p["Reservations"]]} for p in pages]

    def get_paginator(self, operation):
        if operation != "describe_instances":
            return self._moto.get_paginator(operation)
        double = self

        class Shown:
            def paginate(self, **kwargs):
                return iter(double._pages(kwargs))
        return Shown()

    def __getattr__(self, name):
        return getattr(self._moto, name)


def _master() -> str:
    (master,) = termination.cluster_masters(CLUSTER, REGION)
    return master


def _new_master_by_pulumi(monkeypatch) -> None:
    """The Pulumi double's `pulumi up`, and the new master it makes put into moto (as infra/ tags it)."""
    real = task._pulumi

    def pulumi_up(step):
        code = real(step)
        master_instance()
        return code

    monkeypatch.setattr(task, "_pulumi", pulumi_up)


def _shutting_down(monkeypatch, reads: int) -> str:
    _as_the_program_makes_it()
    master = _master()
    double = ShuttingDownMaster(master, reads)
    monkeypatch.setattr(clients, "client",
                        lambda service, region=None: double if service == "ec2" else CLIENT(service, region))
    monkeypatch.setattr(task, "MASTER_GONE_POLL_S", 0.01)
    return master


@pytest.mark.slow  # about 3 s (moto, the Pulumi double, a new master): outside the inner loop
def test_fab_up_waits_for_a_shutting_down_master_to_be_gone_before_pulumi_up_and_is_up_with_the_new_one(
        site, monkeypatch, capsys):  # noqa: F811 - the fixture
    old = _shutting_down(monkeypatch, reads=3)
    monkeypatch.setattr(termination, "PROGRESS_S", 0.0)  # a progress line at every look
    _new_master_by_pulumi(monkeypatch)
    task.up(Context(), stack="dev", preflight=False, wait_for_capacity=0)
    out = capsys.readouterr().out
    waiting = out.index(f"fab: the old master of {CLUSTER} ({old}) is shutting-down: waiting for EC2 to report it "
                        "terminated before `pulumi up --refresh` (at most 30m 00s;")
    assert f"still not terminated after 0s ({old}: shutting-down); waiting at most 30m 00s" in out
    gone = out.index("fab: the old master is terminated: `pulumi up --refresh` makes a new one")
    assert waiting < gone < out.index("fab: running pulumi up")
    assert "up: cluster xeon-dev is up" in out and len(site) == 1  # the new master armed


def test_a_master_still_shutting_down_after_the_wait_runs_no_pulumi_and_exits_1(site, monkeypatch,  # noqa: F811
                                                                                 capsys):
    old = _shutting_down(monkeypatch, reads=10**6)
    monkeypatch.setattr(task, "MASTER_GONE_WAIT_S", 0.05)
    with pytest.raises(Exit) as refused:
        task.up(Context(), stack="dev", preflight=False, wait_for_capacity=0)
    assert refused.value.code == 1
    line = refused.value.message
    assert "\n" not in line and line.startswith(
        f"error: the old master of {CLUSTER} is still not terminated after 0s ({old}: shutting-down): a `pulumi up "
        "--refresh` now would keep it and make no new master, so nothing was changed; run `fab up` again once "
        f"`aws ec2 describe-instances --instance-ids {old} --region {REGION} --query "
        "'Reservations[].Instances[].State.Name'` says terminated")
    assert not Path(os.environ["FAKE_PULUMI_LOG"]).exists() and site == []  # no Pulumi, nothing armed
    assert "is up" not in capsys.readouterr().out


def test_with_no_running_master_after_pulumi_up_fab_up_exits_1_and_never_says_it_is_up(site, capsys):  # noqa: F811
    _as_the_program_makes_it()
    boto3.client("ec2", region_name=REGION).terminate_instances(InstanceIds=[_master()])  # a `pulumi up` made none
    with pytest.raises(Exit) as failed:
        task.up(Context(), stack="dev", preflight=False, wait_for_capacity=0)
    assert failed.value.code == 1
    assert failed.value.message.startswith(
        f"error: cluster {CLUSTER} has no running master after `pulumi up` (EC2 has none): nothing was armed and "
        "the cluster is not up; run `fab up` again")
    assert Path(os.environ["FAKE_PULUMI_LOG"]).exists() and site == []
    assert "is up" not in capsys.readouterr().out
