"""The run supervisor's decisions, in-process, against a fake backend (node_setup/supervisor/loop.py).

`FakeCluster` is a test double of everything the loop reaches on a real cluster: the group of
machines (members, instance states, consoles), the nodes (SSH answers, spot notices, presented host
keys, admission), the job (launch, outcome, checkpoints) and the run's files. Time is its own clock:
the loop's sleeps advance it and scripted events happen at their times, so every scenario runs in
milliseconds and in the same order every time.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass

import pytest

from cluster.job.request import Managed
from cluster.run import recovery as rc
from cluster.run import supervision as sv
from cluster.node.console import fingerprint
from cluster.run.supervision import Member
from node_setup.supervisor.loop import LoopSpec, Supervisor


def new_key() -> str:
    blob = b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + os.urandom(32)
    return "ssh-ed25519 " + base64.b64encode(blob).decode()


def console_of(key: str) -> str:
    return ("ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----\n"
            f"ec2: 256 {fingerprint(key.split()[1])} root@node (ED25519)\n"
            "ec2: -----END SSH HOST KEY FINGERPRINTS-----\n"
            f"-----BEGIN SSH HOST KEY KEYS-----\n{key} root@node\n-----END SSH HOST KEY KEYS-----\n")


@dataclass
class Batch:
    plan: rc.BatchPlan
    describe_line: str


class FakeCluster:
    """Test double: group, nodes, job and store of a 3-node cluster, on a scripted clock."""

    def __init__(self, events=()):
        self.now = 0.0
        self.events = sorted(events, key=lambda e: e[0])
        self.members = {n: Member(n, f"10.0.0.{i + 2}", f"i-{i:016x}")
                        for i, n in enumerate(("node0", "node1", "node2"))}
        self.states = {m.instance_id: "running" for m in self.members.values()}
        self.silent: set[str] = set()
        self.notices: dict[str, str] = {}
        self.keys: dict[str, str] = {}
        self.consoles: dict[str, str] = {}
        self.launches: list[tuple[list[str], bool, object]] = []
        self.adopted: list[str] = []  # jobs a restarted supervisor took over
        self.ids, self.reserved = 0, None  # job ids given out, the one the next launch takes
        self.ends: dict[str, float] = {}  # job -> when it ends
        self.codes: dict[str, int] = {}
        self.stopped: list[str] = []
        self.checkpoint = 20
        self.lines: list[str] = []
        self.saved: list[dict] = []
        self.finished: list[dict] = []
        self.final_state: dict = {}
        self.admitted: list[str] = []
        self.next_job_ends = [(100.0, 0)]  # (seconds after launch, exit code) for each launch in turn
        self.replaceable = True  # whether the group can replace a lost machine at all
        self.handed_back: list[str] = []  # instance ids the supervisor handed back to the group
        self.after_hand_back = None  # an event the group makes happen a minute after a hand-back

    # the clock
    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        while self.events and self.events[0][0] <= self.now:
            self.events.pop(0)[1](self)
        assert self.now < 5000, "the loop never ended: " + "\n".join(self.lines[-5:])

    # group
    def members_now(self):
        return dict(self.members)

    def instance_state(self, member):
        return self.states.get(member.instance_id, "gone")

    def console(self, member):
        return self.consoles.get(member.instance_id, "")

    # nodes
    def probe(self, member):
        if member.instance_id in self.silent or self.states.get(member.instance_id) != "running":
            return False, None
        return True, self.notices.get(member.instance_id)

    def host_key(self, member):
        return self.keys.get(member.instance_id)

    def admit(self, member, key):
        self.admitted.append(f"{member.name} {member.instance_id} {key}")
        return None

    def take_over(self, master, keys):
        self.taken_over = (master.name, dict(keys))

    # job
    def new_id(self):  # the next launch takes it, as the real job's does
        self.ids += 1
        self.reserved = f"job{self.ids}"
        return self.reserved

    def launch(self, members, *, resume, batch):
        job, self.reserved = self.reserved or self.new_id(), None
        self.launches.append(([m.name for m in members], resume, batch))
        after, code = self.next_job_ends.pop(0) if self.next_job_ends else (100.0, 0)
        self.ends[job], self.codes[job] = self.now + after, code
        return job

    def adopt(self, job, members, *, resume, launched_at):
        self.adopted.append(job)

    def outcome(self, job):
        if job in self.stopped:
            return 137
        if job not in self.codes:  # never launched: a folder without a pid or an exit code
            return -1
        return self.codes[job] if self.now >= self.ends[job] else None

    def stop(self, job):
        self.stopped.append(job)

    def newest_checkpoint(self):
        return self.checkpoint, self.now - 1

    def summary(self):
        return {"world_size": 3, "per_rank_batch_size": 16, "gradient_accumulation_steps": 1, "steps": self.checkpoint}

    def batch_for(self, count):
        if count == 3:
            return None
        plan = rc.batch_for(per_rank=16, accumulation=1, ranks_before=3, ranks=count)
        return Batch(plan, plan.describe(16, 1))

    def finish(self, records):
        self.finished = list(records)

    def restore_workdir(self, workers):
        return None

    def keep_for_controller(self):
        return "The output directory is on the disk every node shares."

    # store
    def say(self, line):
        self.lines.append(line)

    def state(self, **record):
        self.final_state = record

    def stop_requested(self):
        return False

    def records(self):
        return []

    def save_records(self, records):
        self.saved = list(records)


class FakeBackend:
    """Test double of a cluster's backend on the master (cluster/backend.py's MachineGroup): the fake
    cluster's group, instance states and consoles, which the scenarios script."""

    def __init__(self, fake: FakeCluster):
        self.fake = fake

    def members(self) -> dict[str, Member]:
        return self.fake.members_now()

    def instance_state(self, member: Member) -> str | None:
        return self.fake.instance_state(member)

    def console(self, member: Member) -> str:
        return self.fake.console(member)

    def replaces_lost(self) -> bool:
        return self.fake.replaceable

    def hand_back(self, member: Member) -> str:
        """The group terminates it (its state) and, with `after_hand_back`, launches another a minute later."""
        self.fake.handed_back.append(member.instance_id)
        self.fake.states[member.instance_id] = "terminated"
        if self.fake.after_hand_back:
            self.fake.events = sorted(self.fake.events + [(self.fake.now + 60, self.fake.after_hand_back)],
                                      key=lambda e: e[0])
        return "handed back: terminated through the group, which launches another"


def test_the_fake_backend_implements_every_operation_of_the_protocol():
    from cluster.backend import MachineGroup

    wanted = {n for n in vars(MachineGroup) if not n.startswith("_")}
    assert wanted == {"members", "instance_state", "console", "replaces_lost", "hand_back"}
    assert all(callable(getattr(FakeBackend, n, None)) for n in wanted)


def supervise(fake: FakeCluster, *, wait=600.0, min_nodes=1, max_recoveries=3) -> str:
    spec = LoopSpec("20261123-101500-ab12", list(fake.members.values()),
                    Managed(max_recoveries, min_nodes, wait), poll_s=5.0)
    loop = Supervisor(spec, FakeBackend(fake), fake, fake, fake, clock=fake.clock, sleep=fake.sleep)
    return loop.run()


# scripted events
def notice(name):
    return lambda f: f.notices.__setitem__(f.members[name].instance_id, '{"action": "terminate", "time": "..."}')


def gone(name):
    def act(f):
        f.states[f.members[name].instance_id] = "terminated"
    return act


def silent(name):
    return lambda f: f.silent.add(f.members[name].instance_id)


def replaced(name, *, console=True, presented=None, instance_type=""):
    def act(f):
        old = f.members[name]
        new = Member(name, old.address, f"i-{len(f.states) + 100:016x}", instance_type=instance_type)
        key = new_key()
        f.members[name] = new
        f.states[new.instance_id] = "running"
        f.keys[new.instance_id] = presented or key
        if console:
            f.consoles[new.instance_id] = console_of(key)
    return act


def console_shown(name):
    """The replacement in `name`'s slot prints its host keys on its console now (the end of its boot)."""
    def act(f):
        member = f.members[name]
        f.consoles[member.instance_id] = console_of(f.keys[member.instance_id])
    return act


def test_notice_the_worker_is_replaced_and_the_run_completes_with_its_key_verified():
    fake = FakeCluster([(10, notice("node2")), (20, gone("node2")), (60, replaced("node2"))])
    fake.next_job_ends = [(15.0, 75), (100.0, 0)]
    assert supervise(fake) == sv.COMPLETED
    assert [nodes for nodes, _, _ in fake.launches] == [["node0", "node1", "node2"]] * 2
    assert fake.launches[1][1] is True  # resumed
    (record,) = fake.finished
    assert record["cause"] == sv.NOTICE and record["nodes_lost"] == ["node2"] and record["step"] == 20
    assert record["nodes_after"] == ["node0", "node1", "node2"]
    assert record["host_keys"]["node2"].startswith("ssh-ed25519 SHA256:")
    assert record["seconds_waiting"] >= 40  # the replacement came at t=60, the job ended at t=15
    assert any("verified from its console" in line for line in fake.lines)
    assert fake.final_state["status"] == sv.COMPLETED


def test_silent_loss_confirmed_by_the_instance_state_stops_the_hung_job_and_recovers():
    fake = FakeCluster([(10, silent("node1")), (12, gone("node1")), (80, replaced("node1"))])
    fake.next_job_ends = [(10_000.0, 0), (100.0, 0)]  # the first job hangs (gloo would wait)
    assert supervise(fake) == sv.COMPLETED
    assert fake.stopped == ["job1"]
    assert fake.finished[0]["cause"] == sv.SILENT and fake.finished[0]["nodes_lost"] == ["node1"]


def test_silent_node_whose_instance_still_runs_is_not_taken_as_lost():
    fake = FakeCluster([(10, silent("node1"))])
    fake.next_job_ends = [(200.0, 0)]
    assert supervise(fake) == sv.COMPLETED
    assert fake.stopped == [] and fake.finished == [] and len(fake.launches) == 1


def test_a_partitioned_worker_is_said_once_and_again_when_it_answers():
    """sshd stopped for a while (the machine runs): one line when the probes find it silent, one when it answers."""
    fake = FakeCluster([(10, silent("node1")), (60, lambda f: f.silent.discard(f.members["node1"].instance_id))])
    fake.next_job_ends = [(200.0, 0)]
    assert supervise(fake) == sv.COMPLETED
    assert [line for line in fake.lines if line.startswith("node1")] == [
        "node1: no SSH answer for 3 probes, but its instance is running: not lost (a network partition?); the job "
        "goes on", "node1 answers again"]
    assert len(fake.launches) == 1 and fake.stopped == []


def test_replacement_late_survivors_keep_the_global_batch_and_it_joins_at_the_next_checkpoint():
    def later_checkpoint(f):
        f.checkpoint = 40
    fake = FakeCluster([(10, notice("node2")), (20, gone("node2")), (200, replaced("node2")),
                        (260, later_checkpoint)])
    fake.next_job_ends = [(15.0, 75), (10_000.0, 0), (100.0, 0)]
    assert supervise(fake, wait=60.0, min_nodes=2) == sv.COMPLETED
    nodes = [n for n, _, _ in fake.launches]
    assert nodes == [["node0", "node1", "node2"], ["node0", "node1"], ["node0", "node1", "node2"]]
    survivors_batch = fake.launches[1][2]
    assert survivors_batch.per_rank * survivors_batch.accumulation * 2 == 48  # the global batch kept
    assert fake.launches[2][2] is None  # the original batch back
    assert fake.stopped == ["job2"]  # stopped after checkpoint-40 to grow back
    first, grown = fake.finished
    assert first["nodes_after"] == ["node0", "node1"] and grown["cause"] == "grown back" and grown["step"] == 40


def test_replacement_never_comes_the_survivors_finish_or_too_few_stop():
    fake = FakeCluster([(10, notice("node2")), (20, gone("node2"))])
    fake.next_job_ends = [(15.0, 75), (100.0, 0)]
    assert supervise(fake, wait=60.0, min_nodes=2) == sv.COMPLETED
    assert fake.finished[0]["nodes_after"] == ["node0", "node1"]
    assert fake.final_state["pending"] == ["node2"]

    fake = FakeCluster([(10, notice("node2")), (20, gone("node2"))])
    fake.next_job_ends = [(15.0, 75)]
    assert supervise(fake, wait=60.0, min_nodes=3) == sv.FAILED
    assert "--min-nodes is 3" in fake.final_state["line"]


def test_where_no_replacement_can_come_the_survivors_go_on_at_once():
    """A group that replaces nothing (a local cluster without its keeper, an inventory file's machines): the
    run resumes on the survivors right after the job's end instead of waiting out --wait-for-capacity."""
    fake = FakeCluster([(10, notice("node2")), (20, gone("node2"))])
    fake.next_job_ends = [(15.0, 75), (100.0, 0)]
    fake.replaceable = False
    assert supervise(fake, wait=900.0, min_nodes=2) == sv.COMPLETED
    assert fake.launches[1][0] == ["node0", "node1"]
    assert fake.finished[0]["seconds_waiting"] < 30  # the scripted clock: a few polls, not the 900 s wait
    assert any("no replacement can come for node2" in line for line in fake.lines), fake.lines
    assert not any(line.startswith("awaiting replacement") for line in fake.lines)


def test_master_notice_is_recorded_as_not_final_for_a_new_master_to_continue():
    fake = FakeCluster([(10, notice("node0"))])
    assert supervise(fake) == sv.MASTER_LEAVING
    assert fake.final_state["status"] == sv.MASTER_LEAVING and sv.MASTER_LEAVING not in sv.FINAL
    assert "A new master continues the run" in fake.final_state["line"]
    assert "disk every node shares" in fake.final_state["line"]
    assert len(fake.launches) == 1 and not fake.stopped  # the job checkpoints at its own notice
    assert not fake.finished  # no summary written: the run goes on


def test_console_without_fingerprints_is_waited_for_then_refused_and_handed_back():
    fake = FakeCluster([(10, notice("node2")), (20, gone("node2")),
                        (40, replaced("node2", console=False, instance_type="r7iz.metal-16xl"))])
    fake.next_job_ends = [(15.0, 75), (4000.0, 0)]
    assert supervise(fake, wait=900.0, min_nodes=2) == sv.COMPLETED
    assert fake.launches[1][0] == ["node0", "node1"]
    assert fake.finished[0]["seconds_waiting"] >= 900 - 15  # the whole wait: nothing usable came
    # refused only once the metal type's boot is over (2400 s after it came), then handed back to the group
    refusals = [line for line in fake.lines if "refused" in line]
    assert len(refusals) == 1 and "listed no host key fingerprints in 2400 s" in refusals[0]
    assert "handed back: terminated through the group" in refusals[0]
    assert fake.admitted == [] and len(fake.handed_back) == 1


def test_a_metal_replacement_is_awaited_as_long_as_it_boots_and_joins_when_its_console_lists_its_keys():
    """A metal worker's console lists its host keys only at the end of a boot that can take over 20 minutes:
    the survivors go on after --wait-for-capacity, and the replacement joins at the next checkpoint once its
    keys are there (refused after 300 s before, and left running, billed, for the rest of the run)."""
    def later_checkpoint(f):
        f.checkpoint = 40
    fake = FakeCluster([(10, notice("node2")), (20, gone("node2")),
                        (60, replaced("node2", console=False, instance_type="r7iz.metal-16xl")),
                        (1260, console_shown("node2")), (1300, later_checkpoint)])
    fake.next_job_ends = [(15.0, 75), (10_000.0, 0), (100.0, 0)]
    assert supervise(fake, wait=600.0, min_nodes=2) == sv.COMPLETED
    assert [n for n, _, _ in fake.launches] == [["node0", "node1", "node2"], ["node0", "node1"],
                                                ["node0", "node1", "node2"]]
    assert not any("refused" in line for line in fake.lines) and fake.handed_back == []
    assert any("awaited up to 2400 s" in line for line in fake.lines), fake.lines
    assert fake.finished[-1]["cause"] == "grown back" and fake.finished[-1]["host_keys"]["node2"]


def test_no_fingerprints_yet_is_awaited_until_wait_for_capacity_runs_out():
    """--min-nodes 3: the run waits for its replacement as long as --wait-for-capacity allows, longer than
    the type's boot (c6i.16xlarge: 15 minutes), rather than refuse it and stop with too few nodes."""
    fake = FakeCluster([(10, notice("node2")), (20, gone("node2")),
                        (40, replaced("node2", console=False, instance_type="c6i.16xlarge")),
                        (1500, console_shown("node2"))])
    fake.next_job_ends = [(15.0, 75), (100.0, 0)]
    assert supervise(fake, wait=2000.0, min_nodes=3) == sv.COMPLETED
    assert fake.launches[1][0] == ["node0", "node1", "node2"] and fake.handed_back == []
    assert any("awaited up to 1975 s (its instance type's boot, or the recovery's wait)" in line
               for line in fake.lines), fake.lines


def test_a_replacement_that_cannot_be_admitted_is_handed_back_and_the_next_one_joins():
    fake = FakeCluster([(10, notice("node2")), (20, gone("node2")), (40, replaced("node2", presented=new_key()))])
    fake.after_hand_back = replaced("node2")  # the group launches another: this one's console is right
    fake.next_job_ends = [(15.0, 75), (100.0, 0)]
    assert supervise(fake, wait=600.0, min_nodes=3) == sv.COMPLETED
    (refusal,) = [line for line in fake.lines if "refused" in line]
    assert "but its console lists SHA256:" in refusal and refusal.endswith(
        "; handed back: terminated through the group, which launches another")
    assert len(fake.handed_back) == 1 and fake.launches[1][0] == ["node0", "node1", "node2"]
    assert fake.finished[0]["host_keys"]["node2"].startswith("ssh-ed25519 SHA256:")


def test_changed_key_is_refused_at_once():
    fake = FakeCluster([(10, notice("node2")), (20, gone("node2")), (40, replaced("node2", presented=new_key()))])
    fake.next_job_ends = [(15.0, 75), (100.0, 0)]
    assert supervise(fake, wait=300.0, min_nodes=2) == sv.COMPLETED
    refusals = [line for line in fake.lines if "refused" in line]
    assert len(refusals) == 1 and "but its console lists SHA256:" in refusals[0]
    assert fake.admitted == [] and fake.launches[1][0] == ["node0", "node1"]


def test_max_recoveries_and_a_plain_failure_are_not_recovered():
    fake = FakeCluster()
    fake.next_job_ends = [(15.0, 1)]
    assert supervise(fake) == sv.FAILED
    assert "not an interruption" in fake.final_state["line"]

    fake = FakeCluster([(10, notice("node2")), (20, gone("node2"))])
    fake.next_job_ends = [(15.0, 75)]
    assert supervise(fake, max_recoveries=0) == sv.FAILED
    assert "--max-recoveries 0 reached" in fake.final_state["line"]


@pytest.mark.parametrize("presented, console, outcome", [
    (None, "", "wait"),
    ("k", "", "wait"),
])
def test_key_verdict_waits_while_time_is_left(presented, console, outcome):
    member = Member("node1", "10.0.0.3", "i-00000000000000aa")
    key = new_key() if presented else None
    assert sv.host_key_verdict(member, key, console, waited_s=1).outcome == outcome
    assert sv.host_key_verdict(member, key, console, waited_s=sv.replacement_wait_s(member)).outcome == "refused"
    # a type's boot: metal (and a type not known) 40 minutes, others 15; longer while a recovery waits
    assert sv.replacement_wait_s(member) == sv.replacement_wait_s(
        Member("node1", "10.0.0.3", "i-00000000000000aa", instance_type="r7iz.metal-16xl")) == 2400
    assert sv.replacement_wait_s(Member("node1", "10.0.0.3", "i-0a", instance_type="c6i.16xlarge")) == 900
    assert sv.replacement_wait_s(member, recovery_left_s=3000) == 3000


def test_a_job_that_ended_75_lost_its_node_to_a_notice_even_when_no_probe_read_it():
    fake = FakeCluster([(1, silent("node2")), (1, gone("node2")), (60, replaced("node2"))])
    fake.next_job_ends = [(2.0, 75), (100.0, 0)]  # the node went before the first probe
    assert supervise(fake) == sv.COMPLETED
    assert fake.finished[0]["cause"] == sv.NOTICE


# ---------------------------------------------------------------- the user's own program restarted


@pytest.mark.parametrize("template", ["--resume_from_checkpoint {checkpoint}", "--load={checkpoint} --fresh-optim"])
def test_resume_arg_words_hold_the_placeholder(template):
    assert any(sv.CHECKPOINT_PLACEHOLDER in w for w in sv.resume_words(template))


@pytest.mark.parametrize("template", ["--resume_from_checkpoint", "--x {checkpoint};rm", "--x {ckpt} {checkpoint}",
                                      "$(id) {checkpoint}"])
def test_resume_arg_without_the_placeholder_or_with_shell_characters_is_refused(template):
    with pytest.raises(sv.SupervisionError, match="^--resume-arg: "):
        sv.resume_words(template)


def test_newest_checkpoint_is_the_highest_numbered_folder_with_files_in_the_output_or_its_checkpoints_folder():
    found = {"checkpoint-500": 4, "checkpoint-1000": 3, "checkpoints/checkpoint_1200": 0, "runs/checkpoint-9000": 2,
             "checkpoint-best": 5}
    assert sv.newest_checkpoint_folder(found) == ("checkpoint-1000", 1000)  # the empty 1200 is not written yet
    assert sv.newest_checkpoint_folder({**found, "checkpoints/checkpoint_1200": 1}) == \
        ("checkpoints/checkpoint_1200", 1200)  # accelerate's automatic naming
    assert sv.newest_checkpoint_folder({"runs/checkpoint-9": 1}) is None


def test_restart_arguments_fill_the_checkpoint_into_the_words_and_the_environment():
    words = sv.resume_words("--resume_from_checkpoint {checkpoint}")
    assert sv.restart_arguments(("--lr", "1e-4"), words, None) == (("--lr", "1e-4"), {})
    args, env = sv.restart_arguments(("--lr", "1e-4"), words, "/home/u/out/checkpoint-30")
    assert args == ("--lr", "1e-4", "--resume_from_checkpoint", "/home/u/out/checkpoint-30")
    assert env == {"XEON_CLUSTER_RESUME_FROM": "/home/u/out/checkpoint-30"}
    with pytest.raises(sv.SupervisionError):
        sv.restart_arguments((), words, "/home/u/out/../../etc")


def recording_shell():
    """Test double of the supervisor's transport (ShellTransport): records each command, runs the master's part
    of the job's preparation for real (folders in HOME only) and answers the start with a pid."""
    from node_setup.job_lifecycle.transport import Answer
    from node_setup.supervisor.onmaster import ShellTransport

    class RecordingShell(ShellTransport):
        def __init__(self):
            super().__init__("node0", "20261126-101500-ab12")
            self.commands: list[tuple[str, str]] = []

        def run_one(self, node, command, timeout=120, data=None):
            import subprocess

            self.commands.append((node, command))
            if node == self.master and "/ranks )" in command:  # the job's preparation on the master
                done = subprocess.run(["bash", "-c", command], cwd=os.environ["HOME"], capture_output=True, text=True)
                return Answer(node, done.returncode, done.stdout + done.stderr)
            return Answer(node, 0, "4242\n" if "setsid nohup" in command else "")

    return RecordingShell()


def _user_job(tmp_path, monkeypatch, resume_arg="--resume_from_checkpoint {checkpoint}"):
    from cluster.inventory import Inventory
    from cluster.job.request import Managed, OwnProgram, RunRequest
    from node_setup.supervisor.onmaster import Job, Nodes

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    inventory = Inventory.from_mapping({"name": "lab", "sockets": 1, "physical_cores": 4,
                                        "hosts": [{"name": f"node{i}", "address": f"10.0.0.{i + 2}"}
                                                  for i in range(3)]}, default_name="lab")
    from cluster.node.render import MasterPaths

    known = tmp_path / MasterPaths("lab").known_hosts[2:]  # the cluster's known_hosts, as distribution wrote it
    known.parent.mkdir(parents=True, exist_ok=True)
    known.write_text("".join(f"node{i} {new_key()}\n" for i in range(3)))
    own = OwnProgram(script="train.py", args=("--lr", "1e-4"), signal="SIGUSR1", workdir="/home/u/proj",
                     resume_arg=resume_arg)
    request = RunRequest("20261126-101500-ab12", 3, own, output_dir="runs/r1", managed=Managed())
    shell_ = recording_shell()
    return Job(request, shell_, Nodes(shell_, inventory, None, "/venv/bin/python")), shell_, inventory


def _run_script(tmp_path, job_id) -> str:
    from cluster.job.launch import job_dir

    return (tmp_path / job_dir(job_id) / "run.sh").read_text()


def test_user_program_is_restarted_with_the_newest_checkpoint_in_its_arguments_and_environment(tmp_path, monkeypatch):
    job, shell_, inventory = _user_job(tmp_path, monkeypatch)
    members = [Member(n.name, n.address, f"i-{i:016x}") for i, n in enumerate(inventory.nodes)]
    first_id = job.launch(members, resume=False, batch=None)
    first = _run_script(tmp_path, first_id)
    assert "train.py" in first and "--lr" in first
    assert "resume_from_checkpoint" not in first
    assert "XEON_CLUSTER_RESUME_FROM" not in job.plans[first_id].launch.rank_env

    out = tmp_path / "runs/r1"
    for step, files in ((10, 2), (30, 2), (40, 0)):  # checkpoint-40 is being written: no file yet
        (out / f"checkpoint-{step}").mkdir(parents=True)
        for i in range(files):
            (out / f"checkpoint-{step}" / f"f{i}").write_text("x")
    assert job.newest_checkpoint()[0] == 30
    shell_.commands.clear()
    replacement = Member("node2", "10.0.0.9", "i-00000000000000ff")  # a new machine in node2's slot
    job_id = job.launch(members[:2] + [replacement], resume=True, batch=None)
    again = _run_script(tmp_path, job_id)
    newest = f"{tmp_path}/runs/r1/checkpoint-30"
    assert f"--resume_from_checkpoint {newest}" in again
    launch = job.plans[job_id].launch
    assert launch.program[-4:] == ("--lr", "1e-4", "--resume_from_checkpoint", newest)
    assert launch.rank_env["XEON_CLUSTER_RESUME_FROM"] == newest and newest in again
    # the run's workdir reaches this job's directory on every node, the replacement through ssh from the master
    copies = [c for n, c in shell_.commands if "workdir" in c and ("tar -C" in c or "cp -a" in c)]
    assert len(copies) == 3 and any("| ssh -o BatchMode=yes node2 " in c for c in copies)
    assert all(n == "node0" for n, c in shell_.commands if "tar -C" in c or "cp -a" in c)


def test_user_program_without_resume_arg_gets_only_the_environment(tmp_path, monkeypatch):
    job, _, inventory = _user_job(tmp_path, monkeypatch, resume_arg="")
    (tmp_path / "runs/r1/checkpoints/checkpoint_7").mkdir(parents=True)
    (tmp_path / "runs/r1/checkpoints/checkpoint_7/model.safetensors").write_text("x")
    members = [Member(n.name, n.address, f"i-{i:016x}") for i, n in enumerate(inventory.nodes)]
    launch = job.plans[job.launch(members, resume=True, batch=None)].launch
    assert launch.rank_env["XEON_CLUSTER_RESUME_FROM"] == f"{tmp_path}/runs/r1/checkpoints/checkpoint_7"
    assert launch.program[-2:] == ("--lr", "1e-4")  # the arguments unchanged


# ---------------------------------------------------------------- fab train's side: one line, exit 2


@pytest.mark.parametrize("argv, line", [
    (["--detach"], "error: --detach: only with --managed"),
    (["--script", "{script}", "--resume-arg=--load {checkpoint}"], "error: --resume-arg: only with --managed"),
    (["--managed", "--resume-arg=--load {checkpoint}"], "error: --resume-arg: only with --script/--module"),
    (["--managed", "--script", "{script}", "--resume-arg=--load"], "error: --resume-arg: '--load' has no {checkpoint}"),
    (["--managed", "--script", "{script}", "--resume-arg=--load {checkpoint};id"],
     "error: --resume-arg: the word '{checkpoint};id' is not allowed"),
    (["--managed", "--script", "{script}", "--requirements", "{requirements}"],
     "error: --requirements: not with --managed"),
])
def test_fab_train_supervision_options_refused_in_one_line_and_exit_2(tmp_path, argv, line):
    """Against an inventory of documentation addresses (never reached: every case stops first)."""
    from tests.fab_run import fab_in_process

    inventory = tmp_path / "lab.yaml"
    inventory.write_text("name: lab\nuser: ubuntu\ninstance_type: r7iz.metal-16xl\nhosts: [192.0.2.10, 192.0.2.11]\n")
    (tmp_path / "prog").mkdir()
    (tmp_path / "prog/train.py").write_text("print('hi')\n")
    (tmp_path / "prog/requirements.txt").write_text("tqdm\n")
    values = {"{script}": str(tmp_path / "prog/train.py"), "{requirements}": str(tmp_path / "prog/requirements.txt")}
    result = fab_in_process("train", "-c", str(inventory), *[values.get(a, a) for a in argv])
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), result.stderr


def test_fab_train_managed_takes_your_own_program(tmp_path):
    """--managed --script is planned (the dry run) instead of refused as before."""
    from tests.fab_run import fab_in_process

    inventory = tmp_path / "lab.yaml"
    inventory.write_text("name: lab\nuser: ubuntu\ninstance_type: r7iz.metal-16xl\nhosts: [192.0.2.10, 192.0.2.11]\n")
    (tmp_path / "prog").mkdir()
    (tmp_path / "prog/train.py").write_text("print('hi')\n")
    result = fab_in_process("train", "-c", str(inventory), "--managed", "--script", str(tmp_path / "prog/train.py"),
                            "--resume-arg=--resume_from_checkpoint {checkpoint}", "--dry-run")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "dry run: nothing was started" in result.stdout


# ---------------------------------------------------------------- on AWS: the spec names the worker group


def _aws_run_spec(region="us-east-1"):
    """The supervisor's spec for an AWS cluster named as tests/aws/test_worker_group.py's."""
    import dataclasses

    from cluster.inventory import Inventory
    from cluster.job.jobplan import plan
    from cluster.job.request import BuiltinJob, Managed, RunRequest
    from node_setup.tasks.managed import supervisor_spec

    inventory = dataclasses.replace(Inventory.from_mapping(
        {"name": "xeon-dev", "sockets": 1, "physical_cores": 4, "hosts": ["10.0.1.5", "10.0.1.6"]},
        default_name="xeon-dev", kind="aws"), region=region)
    request = RunRequest("20261126-101500-ab12", 2, BuiltinJob(), output_dir="runs/r1", managed=Managed(3, 1, 60.0))
    return supervisor_spec(request, inventory, plan(request, inventory))[0]


def test_aws_run_spec_names_the_worker_group_so_the_supervisor_waits_for_its_replacements(aws_credentials):
    moto = pytest.importorskip("moto")
    from node_setup.backends.aws import AwsGroup
    from tests.aws.test_worker_group import REGION, _as_the_program_makes_it

    with moto.mock_aws():
        assert "worker_group" not in _aws_run_spec(REGION)  # no group (a stack made before it): survivors go on
        name, _ = _as_the_program_makes_it()
        spec = _aws_run_spec(REGION)
    assert (spec["worker_group"], spec["region"]) == (name, REGION)
    group = AwsGroup(spec["region"], spec["worker_group"], [Member("node0", "10.0.1.5", "i-0000000000000001")])
    assert (group.group_name, group.region) == (name, REGION)


@pytest.mark.parametrize("group_name, region, refused", [
    ("xeon-dev-worker;reboot", "us-east-1", "worker_group: 'xeon-dev-worker;reboot' is not allowed"),
    ("xeon-dev-worker\n", "us-east-1", "worker_group: "),
    ("", "us-east-1", "worker_group: '' is not allowed"),
    ("xeon-dev-worker", "us-east-1$(id)", "region: 'us-east-1$(id)' is not allowed"),
    ("xeon-dev-worker", "us-east-1\n", "region: "),
])
def test_worker_group_and_region_from_the_spec_are_checked_whole(group_name, region, refused):
    from node_setup.backends.aws import AwsGroup
    from node_setup.backends.members import checked_group

    with pytest.raises(ValueError) as err:
        checked_group(group_name, region)
    assert str(err.value).startswith(refused) and "allowed:" in str(err.value)
    with pytest.raises(ValueError):
        AwsGroup(region, group_name, [])


# ---------------------------------------------------------------- a replacement in the master's files


def test_an_admitted_replacement_is_named_in_the_masters_ssh_files_and_the_auto_stops_node_list(tmp_path,
                                                                                                monkeypatch):
    """Else the auto-stop, at idle, would look for the old machine, find it gone and keep the master up for good;
    `fab status` names the nodes it powers off (cluster/node/autostop.py's status line)."""
    import subprocess

    from cluster.inventory import Inventory
    from cluster.node import autostop
    from node_setup.supervisor.onmaster import Nodes, known_keys

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    hosts = [{"name": f"node{i}", "address": f"10.0.0.{i + 2}"} for i in range(4)]
    cluster = Inventory.from_mapping({"name": "lab", "sockets": 1, "physical_cores": 4, "hosts": hosts},
                                     default_name="lab")
    keys = {f"node{i}": new_key() for i in range(4)}
    (tmp_path / ".ssh/xeon-cluster-lab.known_hosts").write_text("".join(f"node{i} {keys[f'node{i}']}\n"
                                                                        for i in range(3)))
    (tmp_path / autostop.STATE_DIR).mkdir(parents=True)
    for path, text in autostop.node_list_files("lab", cluster.nodes, "root", keys).items():  # what fab setup wrote
        (tmp_path / path).write_text(text)
    shell = recording_shell()
    nodes = Nodes(shell, cluster.first(3), cluster, "/venv/bin/python")  # the run uses 3 of the cluster's 4 nodes
    new = new_key()
    assert nodes.admit(Member("node2", "10.0.0.99", "i-00000000000000ff"), new) is None
    for listed in (tmp_path / autostop.STATE_DIR / autostop.KNOWN_HOSTS_FILE,
                   tmp_path / ".ssh/xeon-cluster-lab.known_hosts"):
        found = known_keys(listed)
        assert found["node2"] == new and found["node1"] == keys["node1"]
    listed = known_keys(tmp_path / autostop.STATE_DIR / autostop.KNOWN_HOSTS_FILE)
    assert listed["node3"] == keys["node3"]  # the node the run does not use stays on the list
    for config in (tmp_path / autostop.STATE_DIR / autostop.SSH_CONFIG_FILE, tmp_path / ".ssh/config"):
        block = config.read_text().split("Host node2")[1].split("Host ")[0]
        assert "HostName 10.0.0.99" in block
    assert (tmp_path / autostop.STATE_DIR / autostop.NODES_FILE).read_text().split() == [f"node{i}" for i in range(4)]
    script = autostop.service_script()
    said = subprocess.run(["bash", "-c", script, "xeon-cluster-autostop", "status"], env={**os.environ},
                          capture_output=True, text=True, timeout=30).stdout
    status = autostop.parse_status(said)
    assert status.nodes == ("node0", "node1", "node2", "node3")
    armed = autostop.Status(armed=True, idle_s=1800, nodes=status.nodes)
    assert autostop.status_line(armed).startswith("auto-stop: armed, 30m idle (powers off node0, node1, node2, node3)")
