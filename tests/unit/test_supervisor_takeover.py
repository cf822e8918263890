"""A new master takes a supervised run over (node_setup/supervisor/loop.py's `_take_over`), in-process against
tests/unit/test_supervisor.py's fake cluster: the run its lost master supervised (the state it mirrored, given as
`LoopSpec.takeover`) is continued from the newest checkpoint, with each worker's host key verified from its
console first and the master replacement counted as one of the run's recoveries.
"""

from __future__ import annotations

from cluster.job.request import Managed
from cluster.node.console import fingerprint
from cluster.run import supervision as sv
from cluster.run.supervision import Member
from node_setup.supervisor.loop import LoopSpec, Supervisor
from tests.unit.test_supervisor import FakeBackend, FakeCluster, console_of, new_key

RUN = "20261123-101500-ab12"
EARLIER = {"number": 1, "cause": sv.NOTICE, "step": 10}  # a worker's recovery under the lost master


def new_master(fake: FakeCluster, *, lied: str | None = None) -> dict[str, str]:
    """The fake cluster after its master was lost: node0 a new machine at a new address; every machine presents
    a host key and the workers' consoles list theirs (`lied`: that worker presents another key)."""
    fake.members["node0"] = Member("node0", "10.0.0.254", "i-00000000000000ff")
    fake.states["i-00000000000000ff"] = "running"
    keys = {}
    for name, member in fake.members.items():
        keys[name] = new_key()
        fake.keys[member.instance_id] = new_key() if name == lied else keys[name]
        if name != "node0":
            fake.consoles[member.instance_id] = console_of(keys[name])
    return keys


def take_over(fake: FakeCluster, *, earlier=(EARLIER,), max_recoveries=3, wait=600.0, replaced=()) -> str:
    fake.records = lambda: [dict(r) for r in earlier]
    takeover = {"run": RUN, "status": sv.RUNNING, "job": "job0", "updated": fake.now - 30.0,
                "replaced": list(replaced)}
    spec = LoopSpec(RUN, list(fake.members.values()), Managed(max_recoveries, 1, wait), poll_s=5.0, resume=True,
                    takeover=takeover)
    return Supervisor(spec, FakeBackend(fake), fake, fake, fake, clock=fake.clock, sleep=fake.sleep).run()


def test_a_new_master_verifies_each_worker_from_its_console_and_continues_from_the_newest_checkpoint():
    fake = FakeCluster()
    fake.now, fake.checkpoint = 1000.0, 40
    keys = new_master(fake)
    assert take_over(fake) == sv.COMPLETED
    # the master's files written with its own key and each worker's, as their consoles list them
    assert fake.taken_over == ("node0", keys)
    assert sorted(line.split()[0] for line in fake.admitted) == ["node1", "node2"]
    assert sum("verified from its console" in line for line in fake.lines) == 2
    (launch,) = fake.launches  # one job: the run resumed on every node
    assert launch[0] == ["node0", "node1", "node2"] and launch[1] is True
    earlier, record = fake.finished  # the lost master's recoveries go on: this is the run's second
    assert earlier == EARLIER
    assert record["number"] == 2 and record["cause"] == sv.MASTER_REPLACED and record["step"] == 40
    assert record["nodes_lost"] == ["node0"] and record["nodes_after"] == ["node0", "node1", "node2"]
    assert record["host_keys"] == {n: f"ssh-ed25519 {fingerprint(keys[n].split()[1])}" for n in ("node1", "node2")}
    (entry,) = fake.final_state["replaced"]
    assert entry == {"at": 1000.0, "address": "10.0.0.254", "step": 40, "job": "job1"}
    assert sv.replaced_line(entry) == ("master replaced at 00:16:40 (new address 10.0.0.254); run continued from "
                                       "checkpoint-40 as job job1")


def test_a_worker_presenting_a_key_its_console_does_not_list_is_handed_back_and_the_run_goes_on_without_it():
    fake = FakeCluster()
    fake.now = 1000.0
    keys = new_master(fake, lied="node2")
    fake.replaceable = False
    assert take_over(fake) == sv.COMPLETED
    assert fake.handed_back == [fake.members["node2"].instance_id]
    assert fake.taken_over == ("node0", {n: keys[n] for n in ("node0", "node1")})
    assert fake.launches[0][0] == ["node0", "node1"]
    assert fake.finished[-1]["nodes_lost"] == ["node0", "node2"]


def test_a_takeover_past_max_recoveries_ends_the_run_failed_and_launches_nothing():
    fake = FakeCluster()
    new_master(fake)
    assert take_over(fake, max_recoveries=1) == sv.FAILED
    assert not fake.launches and "--max-recoveries 1 reached" in fake.final_state["line"]


def test_an_earlier_replacement_is_kept_in_the_state_beside_the_new_one():
    fake = FakeCluster()
    fake.now = 2000.0
    new_master(fake)
    before = sv.replaced_entry(at=900.0, address="10.0.0.200", step=20, job_id="20261123-101600-cd34")
    assert take_over(fake, replaced=[before]) == sv.COMPLETED
    assert [e["address"] for e in fake.final_state["replaced"]] == ["10.0.0.200", "10.0.0.254"]


def test_a_supervisor_killed_during_the_takeover_takes_the_run_over_again_with_one_record():
    """Killed (SIGKILL, the OOM killer) after it recorded the takeover under way but before its record: the
    supervisor started again carries on from its state file and takes the run over once, not twice."""
    fake = FakeCluster()
    fake.now, fake.checkpoint = 1000.0, 40
    new_master(fake)
    fake.records = lambda: [dict(EARLIER)]
    takeover = {"run": RUN, "status": sv.RUNNING, "job": "job0", "updated": 970.0, "replaced": []}
    members = {n: [m.address, m.instance_id, ""] for n, m in fake.members.items()}
    previous = {"run": RUN, "status": sv.RECOVERING, "job": None, "nodes": ["node0", "node1", "node2"], "pid": 4242,
                "restart": {"members": members, "recovering": {"takeover": takeover, "number": 2}}}
    spec = LoopSpec(RUN, list(fake.members.values()), Managed(3, 1, 600.0), poll_s=5.0, resume=True,
                    previous=previous, takeover=takeover)
    assert Supervisor(spec, FakeBackend(fake), fake, fake, fake, clock=fake.clock, sleep=fake.sleep).run() \
        == sv.COMPLETED
    assert len(fake.launches) == 1 and fake.launches[0][1] is True
    assert [r["cause"] for r in fake.finished] == [sv.NOTICE, sv.MASTER_REPLACED]
    assert any("the supervisor restarted after its process (pid 4242) ended" in line for line in fake.lines)
