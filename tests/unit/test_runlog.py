"""A supervised run's whole log (`fab logs` on a `fab train --managed` run): cluster/run/runlog.py's order and
end, and node_setup/ssh/supervised_log.py's reads against a local stand-in for the master.

`LocalMaster` is a test double of the master's SSH connection: the same commands, run by this machine's
shell with HOME at a temporary folder that holds the run's files as the supervisor and the job script
write them (node_setup/ssh reaches the master only through `run` and `get`). The run's progress is
scripted on the reader's own waits: each time it waits for news, the next event happens.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import invoke
import pytest

from cluster.job.request import Managed
from cluster.run import runlog
from cluster.run import supervision as sv
from cluster.job.launch import job_dir
from node_setup.ssh.supervised_log import show_run
from node_setup.supervisor.loop import LoopSpec, Supervisor
from node_setup.tasks import common
from node_setup.tasks.managed import run_exit_code
from tests.unit.test_supervisor import FakeBackend, FakeCluster, gone, notice, replaced

RUN = "20261123-101500-ab12"
J1, J2 = "20261123-101501-0001", "20261123-101640-0002"


def stamped(*lines: str) -> str:
    return "".join(f"managed: [10:15:00] {line}\n" for line in lines)


# ---------------------------------------------------------------- the order (pure)


def test_pieces_put_each_job_after_the_line_that_started_it_and_wait_for_a_line_being_written():
    reader = runlog.RunFollower()
    text = stamped("the master supervises the run", runlog.started_line(J1, ["node0", "node1"]),
                   f"job {J1} ended with exit code 75; lost: node1 (spot notice)") + "managed: [10:16:0"
    pieces = reader.take(text)
    assert [p.job for p in pieces] == [J1, None]
    assert pieces[0].lines[-1].endswith(f"job {J1} started on 2 node(s): node0, node1")
    assert pieces[1].lines == (f"managed: [10:15:00] job {J1} ended with exit code 75; lost: node1 (spot notice)",)
    assert reader.rest(text) == "managed: [10:16:0"  # not taken until its newline comes
    text += "0] recovery 1: resuming\n" + stamped(runlog.started_line(J2, ["node0", "node1"]))
    later = reader.take(text)
    assert [p.lines[0] for p in later] == ["managed: [10:16:00] recovery 1: resuming"]
    assert [p.job for p in later] == [J2] and reader.jobs == [J1, J2]
    assert reader.take(text) == []  # nothing twice


def test_the_loops_start_lines_give_the_jobs_in_the_order_it_launched_them():
    """The supervisor's own lines (a notice, a replacement, two jobs) read back by the run's reader."""
    fake = FakeCluster([(10, notice("node2")), (20, gone("node2")), (60, replaced("node2"))])
    fake.next_job_ends = [(15.0, 75), (100.0, 0)]
    ids = iter([J1, J2])
    launch = fake.launch

    def launch_with_real_ids(members, *, resume, batch):
        job = launch(members, resume=resume, batch=batch)
        real = next(ids)
        fake.ends[real], fake.codes[real] = fake.ends.pop(job), fake.codes.pop(job)
        return real

    fake.launch = launch_with_real_ids
    spec = LoopSpec(RUN, list(fake.members.values()), Managed(3, 1, 600.0), poll_s=5.0)
    loop = Supervisor(spec, FakeBackend(fake), fake, fake, fake, clock=fake.clock, sleep=fake.sleep)
    assert loop.run() == sv.COMPLETED
    reader = runlog.RunFollower()
    pieces = reader.take(stamped(*fake.lines))
    assert reader.jobs == [J1, J2]
    between = [line for p in pieces[1:] for line in p.lines]
    assert any("host key" in line and "verified from its console" in line for line in between)
    assert any(line.endswith(f"job {J2} finished: exit code 0") for line in between)


@pytest.mark.parametrize(("state", "took", "alive", "verdict"), [
    ({"status": sv.RUNNING}, True, False, runlog.GOING),  # new lines: read again before anything else
    ({"status": sv.COMPLETED}, True, False, runlog.GOING),
    ({"status": sv.COMPLETED}, False, False, runlog.ENDED),
    ({"status": sv.MASTER_LEAVING}, False, True, runlog.GOING),  # a new master continues the run
    ({"status": sv.RECOVERING}, False, True, runlog.GOING),
    ({"status": sv.RECOVERING}, False, False, runlog.SUPERVISOR_GONE),
    (None, False, False, runlog.SUPERVISOR_GONE),
])
def test_the_run_ends_with_a_final_state_or_when_its_supervisor_is_gone(state, took, alive, verdict):
    assert runlog.RunFollower.verdict(state, took=took, supervisor_alive=alive) == verdict


@pytest.mark.parametrize(("status", "code"), [(sv.COMPLETED, common.OK), (sv.STOPPED, common.STOPPED),
                                              (sv.FAILED, common.FAILED)])
def test_the_runs_exit_code_is_its_final_status(status, code):
    assert run_exit_code(runlog.ENDED, {"status": status}) == code
    assert run_exit_code(runlog.SUPERVISOR_GONE, {"status": sv.RUNNING}) == common.FAILED


# ---------------------------------------------------------------- the reads, on a stand-in master


class LocalMaster:
    """Test double of the master's SSH connection (see the module's docstring)."""

    def __init__(self, home: Path):
        self.home, self.context = home, invoke.Context()

    def run(self, command: str, **options):
        return self.context.run(f"cd && {command}", env={"HOME": str(self.home)}, **options)  # SSH starts at home

    def get(self, remote: str, local) -> None:
        local.write((self.home / remote).read_bytes())

    def close(self) -> None:
        pass


def _process(*words: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(120)", *words])


class Run:
    """The run's files under the stand-in master's home, as the supervisor and the job script write them."""

    def __init__(self, home: Path):
        self.home, self.dir = home, home / sv.RUN_ROOT / RUN
        self.dir.mkdir(parents=True)
        self.supervisor = _process(RUN)

    def say(self, *lines: str) -> None:
        with open(self.dir / sv.LOG_FILE, "a") as log:
            log.write(stamped(*lines))

    def state(self, status: str, pid: int | None = None, keeper: int | None = None) -> None:
        (self.dir / sv.STATE_FILE).write_text(json.dumps({"run": RUN, "status": status, "job": None, "nodes": [],
                                                          "pid": pid or self.supervisor.pid, "keeper": keeper,
                                                          "recoveries": 0}))

    def job(self, job_id: str, lines: list[str], code: int | None) -> None:
        d = self.home / job_dir(job_id)
        d.mkdir(parents=True)
        (d / "job.json").write_text(json.dumps({"rank_hosts": ["node0", "node1"], "launcher": "mpirun",
                                                "supervised_run": RUN}))
        (d / "log").write_text("".join(line + "\n" for line in lines))
        if code is not None:
            (d / "exit_code").write_text(f"{code}\n")
            return
        # a job still running: its script's pid, whose command line names the job; it writes on, then ends
        script = (f"import pathlib, time\nd = pathlib.Path({str(d)!r})\n"
                  "for step in (2, 3):\n    time.sleep(0.3)\n"
                  "    with open(d / 'log', 'a') as log: log.write(f'[1] job two step {step}\\n')\n"
                  "(d / 'exit_code').write_text('0\\n')\n")
        # started as the job script is (detached, not this test's child): init reaps it when it ends, so
        # `tail --pid` sees it go (a child of this process would stay a zombie until waited for)
        started = subprocess.run(["sh", "-c", 'setsid "$0" -c "$1" "$2" </dev/null >/dev/null 2>&1 & echo $!',
                                  sys.executable, script, job_id], capture_output=True, text=True, check=True)
        (d / "pid").write_text(started.stdout)

    def end(self) -> None:
        self.supervisor.kill()
        self.supervisor.wait()


@pytest.fixture
def run(tmp_path):
    made = Run(tmp_path)
    yield made
    made.end()


def test_follow_shows_every_job_and_the_supervisors_lines_in_order_until_the_run_ends(run, tmp_path):
    run.say("the master supervises the run", runlog.started_line(J1, ["node0", "node1"]))
    run.job(J1, ["[0] job one step 1"], 75)
    run.state(sv.RUNNING)

    def recovered():
        run.say(f"job {J1} ended with exit code 75; lost: node1 (spot notice)", "node1 (i-1): host key verified",
                "recovery 1: lost node1 at step 1; resuming from checkpoint-1")
        run.job(J2, ["[1] job two step 1"], None)
        run.say(runlog.started_line(J2, ["node0", "node1"]))

    def completed():  # the reader waited: it followed job two to its end first
        run.say(f"job {J2} finished: exit code 0")
        run.state(sv.COMPLETED)
        run.end()

    events = [recovered, completed]
    out = io.StringIO()
    verdict, state = show_run(LocalMaster(tmp_path), RUN, follow=True, out=out, sleep=lambda s: events.pop(0)())
    assert events == [] and verdict == runlog.ENDED and state["status"] == sv.COMPLETED
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    order = ["the master supervises the run", f"job {J1} started", "[node0 r0] job one step 1",
             f"job {J1} ended with exit code 75", "host key verified", "recovery 1:", f"job {J2} started",
             "[node1 r1] job two step 1", "[node1 r1] job two step 2", "[node1 r1] job two step 3",
             f"job {J2} finished: exit code 0"]
    assert len(lines) == len(order), lines
    for line, expected in zip(lines, order):
        assert expected in line, (line, expected)
    assert run_exit_code(verdict, state) == common.OK


def test_a_run_whose_supervisor_died_without_a_final_state_ends_the_follow(run, tmp_path):
    run.say(runlog.started_line(J1, ["node0", "node1"]))
    run.job(J1, ["[0] job one step 1"], 137)
    run.state(sv.RECOVERING)
    run.end()
    out = io.StringIO()
    verdict, state = show_run(LocalMaster(tmp_path), RUN, follow=True, out=out,
                              sleep=lambda s: pytest.fail("waited for a supervisor that is gone"))
    assert verdict == runlog.SUPERVISOR_GONE and run_exit_code(verdict, state) == common.FAILED
    assert "its supervisor on the master is gone" in runlog.end_line(RUN, state, verdict)


def test_a_follow_goes_on_while_the_keeper_of_a_killed_supervisor_starts_it_again(run, tmp_path):
    """The supervisor's process is gone, its keeper (node_setup/supervisor/respawn.py, running this run) is not:
    the follow waits for the restarted supervisor instead of calling the run gone."""
    run.say(runlog.started_line(J1, ["node0", "node1"]))
    run.job(J1, ["[0] job one step 1"], 0)
    gone = _process(RUN)
    gone.kill()
    gone.wait()
    run.state(sv.RUNNING, pid=gone.pid, keeper=run.supervisor.pid)

    def restarted():
        run.say("the supervisor restarted after its process ended; carrying on from its state file: running")
        run.state(sv.COMPLETED)

    events = [restarted]
    verdict, state = show_run(LocalMaster(tmp_path), RUN, follow=True, out=io.StringIO(),
                              sleep=lambda s: events.pop(0)() if events else None)
    assert verdict == runlog.ENDED and state["status"] == sv.COMPLETED and events == []


def test_unfollowed_the_whole_run_so_far_and_its_last_lines(run, tmp_path):
    run.say("the master supervises the run", runlog.started_line(J1, ["node0", "node1"]))
    run.job(J1, ["[0] job one step 1", "[1] job one step 1"], 75)
    run.say(f"job {J1} ended with exit code 75; lost: node1 (spot notice)", runlog.started_line(J2, ["node0"]))
    run.job(J2, ["[0] job two step 1"], 0)
    run.state(sv.RUNNING)
    out = io.StringIO()
    verdict, _ = show_run(LocalMaster(tmp_path), RUN, follow=False, out=out)
    assert verdict == runlog.GOING
    lines = out.getvalue().splitlines()
    assert lines[2:4] == ["[node0 r0] job one step 1", "[node1 r1] job one step 1"]
    assert lines[-1] == "[node0 r0] job two step 1" and len(lines) == 7
    last = io.StringIO()
    show_run(LocalMaster(tmp_path), RUN, follow=False, last_lines=2, out=last)
    assert last.getvalue().splitlines() == lines[-2:]
