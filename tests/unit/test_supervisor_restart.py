"""A supervisor killed on the master and started again carries on from its state file.

The loop runs in-process against test_supervisor.py's fake cluster, with the real run files
(node_setup/supervisor/onmaster.py's RunFiles: the state file, the log, recoveries.json) in a temporary
folder. "Killed" is an exception raised from the fake's clock at a chosen moment, as SIGKILL would end the
process there: nothing of the loop runs after it. A second Supervisor is then built as
`python -m node_setup.supervisor` builds it after a restart (`LoopSpec.previous`: the state file read back),
and the run must end as an undisturbed one would: the job it watched adopted (not launched twice), a
recovery under way finished once, one record per recovery. The respawner (node_setup/supervisor/respawn.py)
and the rule both it and systemd's unit follow are tested with real child processes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cluster.job.request import Managed
from cluster.run import supervision as sv
from node_setup.supervisor import respawn
from node_setup.supervisor.loop import LoopSpec, Supervisor
from node_setup.supervisor.onmaster import RunFiles
from tests.unit.test_supervisor import FakeBackend, FakeCluster, gone, notice, replaced

RUN = "20261123-101500-ab12"


class Killed(BaseException):
    """The supervisor's process ended here (SIGKILL): no code of the loop runs after it."""


def killed_at(fake: FakeCluster, moment: float) -> None:
    """The fake's sleep ends the process once its clock reaches `moment`."""
    sleep = fake.sleep

    def sleep_then_die(seconds: float) -> None:
        sleep(seconds)
        if fake.now >= moment:
            fake.sleep = sleep  # the restarted supervisor sleeps as usual
            raise Killed

    fake.sleep = sleep_then_die


def supervisor(fake: FakeCluster, files: RunFiles, *, restart: bool, wait: float = 600.0) -> Supervisor:
    spec = LoopSpec(RUN, list(fake.members.values()), Managed(3, 1, wait), poll_s=5.0,
                    previous=files.previous() if restart else None)
    return Supervisor(spec, FakeBackend(fake), fake, fake, files, clock=fake.clock, sleep=lambda s: fake.sleep(s))


def run_killed_then_restarted(fake: FakeCluster, tmp_path: Path, moment: float) -> tuple[str, RunFiles]:
    files = RunFiles(tmp_path, str(tmp_path / "out"), RUN, clock=fake.clock)
    killed_at(fake, moment)
    with pytest.raises(Killed):
        supervisor(fake, files, restart=False).run()
    return supervisor(fake, files, restart=True).run(), files


def test_killed_while_the_job_runs_it_adopts_that_job_and_the_run_completes(tmp_path):
    fake = FakeCluster()
    fake.next_job_ends = [(100.0, 0)]
    status, files = run_killed_then_restarted(fake, tmp_path, 30)
    assert status == sv.COMPLETED
    assert len(fake.launches) == 1 and fake.adopted == ["job1"]  # watched again, never launched twice
    state = files.previous()
    assert state["status"] == sv.COMPLETED and state["job"] == "job1" and state["nodes"] == ["node0", "node1", "node2"]
    log = (tmp_path / sv.LOG_FILE).read_text()
    assert "the supervisor restarted after its process" in log and "carrying on from its state file: running" in log
    assert log.count(" started on 3 node(s)") == 1  # `fab logs` places the job once


def test_killed_while_awaiting_a_replacement_it_finishes_that_recovery_once(tmp_path):
    fake = FakeCluster([(10, notice("node2")), (20, gone("node2")), (60, replaced("node2"))])
    fake.next_job_ends = [(15.0, 75), (100.0, 0)]
    status, files = run_killed_then_restarted(fake, tmp_path, 40)  # after job1's end, before node2's return
    assert status == sv.COMPLETED
    assert [nodes for nodes, _, _ in fake.launches] == [["node0", "node1", "node2"]] * 2
    (record,) = fake.finished  # one recovery, one record
    assert record["cause"] == sv.NOTICE and record["nodes_lost"] == ["node2"] and record["number"] == 1
    assert record["at"] == "1970-01-01T00:00:15Z"  # when job1 ended, as the first supervisor saw it
    assert record["host_keys"]["node2"].startswith("ssh-ed25519 SHA256:")
    assert files.records() == [record]


def test_killed_after_the_record_before_the_relaunch_it_launches_without_a_second_record(tmp_path):
    fake = FakeCluster([(10, notice("node2")), (20, gone("node2")), (60, replaced("node2"))])
    fake.next_job_ends = [(15.0, 75), (100.0, 0)]

    class DiesAfterTheRecord(RunFiles):
        def save_records(self, records):
            super().save_records(records)
            raise Killed

    with pytest.raises(Killed):
        supervisor(fake, DiesAfterTheRecord(tmp_path, str(tmp_path / "out"), RUN, clock=fake.clock),
                   restart=False).run()
    files = RunFiles(tmp_path, str(tmp_path / "out"), RUN, clock=fake.clock)
    assert len(files.records()) == 1 and files.previous()["status"] == sv.RECOVERING
    assert supervisor(fake, files, restart=True).run() == sv.COMPLETED
    assert len(fake.launches) == 2 and fake.launches[1][1] is True  # the relaunch, resumed
    assert fake.launches[1][0] == ["node0", "node1", "node2"]  # with the replacement it had admitted
    assert [r["number"] for r in fake.finished] == [1]
    assert fake.stopped == ["job1"]  # the ended job: stopping it again leaves nothing of it


def test_killed_in_the_middle_of_a_launch_it_watches_the_job_that_started(tmp_path):
    """The job started, its supervisor died before the state said so: the restart finds it by the id the state
    recorded before the launch, and watches it rather than starting a second job beside it."""
    fake = FakeCluster()
    fake.next_job_ends = [(100.0, 0)]
    files = RunFiles(tmp_path, str(tmp_path / "out"), RUN, clock=fake.clock)
    launch = fake.launch

    def started_then_died(members, *, resume, batch):
        launch(members, resume=resume, batch=batch)
        raise Killed

    fake.launch = started_then_died
    with pytest.raises(Killed):
        supervisor(fake, files, restart=False).run()
    assert files.previous()["restart"]["launching"] == {"job": "job1", "resume": False}
    fake.launch = launch
    assert supervisor(fake, files, restart=True).run() == sv.COMPLETED
    assert len(fake.launches) == 1 and fake.adopted == ["job1"] and fake.stopped == []
    assert (tmp_path / sv.LOG_FILE).read_text().count("job job1 started on 3 node(s)") == 1


def test_a_launch_that_never_started_is_cleared_and_launched_again(tmp_path):
    fake = FakeCluster()
    fake.next_job_ends = [(100.0, 0)]
    files = RunFiles(tmp_path, str(tmp_path / "out"), RUN, clock=fake.clock)
    launch = fake.launch

    def died_before_the_job_started(members, *, resume, batch):
        raise Killed

    fake.launch = died_before_the_job_started
    with pytest.raises(Killed):
        supervisor(fake, files, restart=False).run()
    fake.launch = launch  # job1 was never launched: the fake says so as a folder with no pid or code does
    assert supervisor(fake, files, restart=True).run() == sv.COMPLETED
    assert fake.stopped == ["job1"]  # what the cut-short launch left goes first
    assert len(fake.launches) == 1  # the run's one job, launched by the restarted supervisor


def test_a_run_that_had_ended_is_left_as_it_ended(tmp_path):
    fake = FakeCluster()
    fake.next_job_ends = [(20.0, 0)]
    files = RunFiles(tmp_path, str(tmp_path / "out"), RUN, clock=fake.clock)
    assert supervisor(fake, files, restart=False).run() == sv.COMPLETED
    assert supervisor(fake, files, restart=True).run() == sv.COMPLETED
    assert len(fake.launches) == 1 and fake.adopted == []


def test_a_state_file_of_another_run_is_not_carried_on(tmp_path):
    fake = FakeCluster()
    other = RunFiles(tmp_path, str(tmp_path / "out"), "20261123-090000-0000", clock=fake.clock)
    other.state(status=sv.RUNNING, job_id="jobX", nodes=["node0"], recoveries=[])
    assert RunFiles(tmp_path, str(tmp_path / "out"), RUN).previous() is None


# ---------------------------------------------------------------- who starts it again


@pytest.mark.parametrize("code, status, again", [
    (-9, sv.RUNNING, True),  # SIGKILL (the OOM killer, a kill -9)
    (-11, sv.RECOVERING, True),  # a crash
    (-9, None, True),  # killed before it wrote a state
    (-15, sv.RUNNING, False),  # a clean stop (systemctl stop, local-down)
    (-9, sv.COMPLETED, False),  # the run had ended
    (1, sv.RUNNING, False),  # it exited (a bad spec): starting it again would fail again
    (0, sv.COMPLETED, False),
])
def test_the_restart_rule(code, status, again):
    assert sv.restarted(code, status) is again


def _child(tmp_path: Path, script: str) -> list[str]:
    return [sys.executable, "-c", script, str(tmp_path)]


KILLED_FIRST = """
import os, signal, sys
from pathlib import Path
runs = Path(sys.argv[1]) / "runs"
runs.write_text(runs.read_text() + "x" if runs.exists() else "x")
if len(runs.read_text()) == 1:
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_respawner_starts_a_killed_supervisor_again_and_ends_with_it(tmp_path, capsys):
    slept = []
    assert respawn.keep(tmp_path, _child(tmp_path, KILLED_FIRST), sleep=slept.append) == 0
    assert (tmp_path / "runs").read_text() == "xx" and slept == [sv.RESTART_DELAY_S]
    said = capsys.readouterr().out
    assert said.startswith("managed: [") and "was killed by SIGKILL" in said and "carries on from its state" in said


@pytest.mark.parametrize("status, signal_name", [(sv.COMPLETED, "SIGKILL"), (sv.RUNNING, "SIGTERM")])
def test_the_respawner_leaves_a_finished_run_or_a_clean_stop_alone(tmp_path, status, signal_name):
    (tmp_path / sv.STATE_FILE).write_text(f'{{"run": "{RUN}", "status": "{status}"}}')
    script = f"import os, signal; os.kill(os.getpid(), signal.{signal_name})"
    assert respawn.keep(tmp_path, [sys.executable, "-c", script], sleep=lambda s: pytest.fail("restarted")) == \
        128 + int(getattr(__import__("signal"), signal_name))


def test_the_local_start_runs_the_respawner_and_the_unit_restarts_on_abnormal_ends():
    """Test double of the master connection: the start commands as they reach a shell on the master (the
    local one runs in tests/ssh/test_soak.py, where the supervisor is killed; systemd only on AWS)."""
    from node_setup.ssh import recovery

    class Master:
        def __init__(self):
            self.commands = []

        def run(self, command, **kwargs):
            self.commands.append(command)
            return subprocess.CompletedProcess(command, 0, "", "")

        def put(self, *args, **kwargs):
            pass

    spec = {"request": {"run_id": RUN}, "inventory": {"profile": "stock"}}
    for systemd, wanted in ((False, f"-m {sv.RESPAWN_MODULE} \"$HOME\"/.xeon-cluster/supervisor/{RUN} -- "),
                            (True, f"--property Restart={sv.RESTART_POLICY} --property RestartSec=")):
        master = Master()
        recovery.start_supervisor(master, spec, {}, systemd=systemd)
        first, start = master.commands[0], master.commands[-1]
        assert f"{sv.STATE_FILE}" in first and first.startswith("cd && mkdir -p")  # a new hand-off: no old state
        assert wanted in start and f"-m {sv.SUPERVISOR_MODULE} run" in start
