"""The arming at the end of `fab up` leaves out a worker it cannot reach, names it and gives it back to the workers'
group, and arms the rest: one whose console shows no host key fingerprints in time is handed back (terminated
through the group, which launches another: node_setup/backends/aws.py's AwsGroup, as the supervisor hands back a
replacement it cannot admit); one reclaimed between discovery and connect is the group's to replace already.

The account is moto (tests/aws/test_fab_up.py's site: the cluster as infra/ makes it, the Pulumi CLI's double, the
arming's test double, which records the nodes it was given). The connections are `FakeConnection`, a named test
double of a node's Fabric connection: it opens, except where the test makes it fail as a real one does. The worker
whose console shows no fingerprints goes through the real host key store and the real EC2 console source (moto
answers GetConsoleOutput with a canned kernel log and no host key block), with no wait.
"""

from __future__ import annotations

import boto3
import pytest
from invoke import Context

from node_setup.aws.console import AwsConsole
from node_setup.ssh.connections import PinnedHostKeys, host_key_name
from node_setup.tasks import lifecycle as task
from tests.aws.test_fab_up import site  # noqa: F401 - the fixture
from tests.aws.test_worker_group import CLUSTER, REGION, _as_the_program_makes_it


class FakeConnection:
    """Test double of a node's Fabric connection (what the arming's reachability check uses of one): `open()` runs
    `opening` (which may raise, as a failing open does) or succeeds."""

    def __init__(self, host: str, opening=None):
        self.host, self.user, self.port, self.connect_timeout, self.gateway = host, "ubuntu", 22, 10, None
        self.opening = opening
        self.closed = False

    def open(self):
        if self.opening is not None:
            self.opening()

    def close(self):
        self.closed = True


def _connections(monkeypatch, failing: dict[str, object]) -> list[dict]:
    """`common.connect` answers FakeConnections, `failing` (node name -> its open) for some; the dicts it made."""
    made: list[dict] = []

    def connect(inventory):
        conns = {n.name: FakeConnection(n.address, failing.get(n.name)) for n in inventory.nodes}
        made.append(conns)
        return conns

    monkeypatch.setattr("node_setup.tasks.common.connect", connect)
    return made


def _node(name: str):
    from node_setup.aws.discovery import find_cluster

    return next(n for n in find_cluster(CLUSTER, REGION).nodes if n.name == name)


def _group(name: str) -> dict:
    (group,) = boto3.client("autoscaling", REGION).describe_auto_scaling_groups(
        AutoScalingGroupNames=[name])["AutoScalingGroups"]
    return group


@pytest.mark.slow  # about 5 s (moto: the group, a hand-back and its replacement): outside the inner loop
def test_a_worker_whose_console_shows_no_fingerprints_in_time_is_handed_back_and_the_rest_are_armed(
        site, monkeypatch, tmp_path, capsys):  # noqa: F811 - the fixture
    from node_setup.aws.discovery import find_cluster

    name, _ = _as_the_program_makes_it()
    worker = _node("node2")
    store = PinnedHostKeys(tmp_path / "known_hosts", CLUSTER,
                           AwsConsole(find_cluster(CLUSTER, REGION), wait_s=0, poll_s=0))
    made = _connections(monkeypatch, {"node2": lambda: store.prepare(host_key_name(worker.address))})

    task.up(Context(), stack="dev", preflight=False, wait_for_capacity=0)

    out = capsys.readouterr().out
    iid = worker.instance_id
    assert (f"warning: node2 ({iid}) is left out of the arming: host key of {worker.address} (instance {iid}) not "
            f"verified: its EC2 console output of {iid} shows no SSH host key fingerprints after 0 s; refused") in out
    assert f"; handed back: terminated through the group {name}, which launches another\n" in out
    ((armed_ids, idle_s, force),) = site  # the rest armed: the master and the two other workers
    assert iid not in armed_ids and len(armed_ids) == 3 and (idle_s, force) == (45 * 60, False)
    assert "auto-stop: armed, 45m idle" in out and "up: cluster xeon-dev is up" in out
    state = boto3.client("ec2", REGION).describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
    assert state["State"]["Name"] in ("shutting-down", "terminated")
    assert _group(name)["DesiredCapacity"] == 3  # not lowered: the group launches another in its place
    assert all(conn.closed for conn in made[0].values())  # the one left out closed too


def test_a_worker_reclaimed_between_discovery_and_connect_is_left_out_for_its_group_to_replace(
        site, monkeypatch, capsys):  # noqa: F811 - the fixture
    name, _ = _as_the_program_makes_it()
    worker = _node("node1")

    def reclaimed():  # AWS takes it back while the controller connects: the connection times out
        boto3.client("ec2", REGION).terminate_instances(InstanceIds=[worker.instance_id])
        raise TimeoutError("timed out")

    _connections(monkeypatch, {"node1": reclaimed})
    task.up(Context(), stack="dev", preflight=False, wait_for_capacity=0)
    out = capsys.readouterr().out
    assert (f"warning: node1 ({worker.instance_id}) is left out of the arming: unreachable: ubuntu@{worker.address}"
            f":22: no answer within the connect timeout (10 s); EC2 says it is terminated: the group {name} launches "
            "its replacement\n") in out
    ((armed_ids, _, _),) = site
    assert worker.instance_id not in armed_ids and len(armed_ids) == 3 and "up: cluster xeon-dev is up" in out


def test_a_master_that_cannot_be_reached_arms_nothing_and_says_so(site, monkeypatch, capsys):  # noqa: F811
    _as_the_program_makes_it()

    def refused():
        raise ConnectionRefusedError(111, "Connection refused")

    _connections(monkeypatch, {"node0": refused})
    task.up(Context(), stack="dev", preflight=False, wait_for_capacity=0)
    out = capsys.readouterr().out
    master = _node("node0")
    assert site == [] and (f"warning: the idle auto-stop is not armed (the master node0 ({master.instance_id}) "
                           f"cannot be reached: unreachable: ubuntu@{master.address}:22: ConnectionRefusedError") in out
