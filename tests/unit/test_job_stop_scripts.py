"""The stop scripts (cluster/shell/job-stop-master.sh, job-stop-node.sh) run by dash, the /bin/sh of
Debian and Ubuntu nodes, on real processes: each reaches the whole process group it is given, not
only the one pid it recorded. A process in that group without the job's marker is reached by the
group's signal alone (the scripts' per-pid fallbacks do not see it)."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cluster.job.jobcommands import STOP_MASTER_SH, STOP_NODE_SH
from cluster.job.launch import JOBS_DIR

# The node script ends every process of this machine marked with the job id: an id of this run's own, so that
# it never reaches another test's job script (test_launch.py's, test_job_torchrun_script.py's) running beside it
JOB = f"20260101-000000-{secrets.token_hex(2)}"
DASH = shutil.which("dash") or pytest.fail("dash is not installed (Debian's and Ubuntu's /bin/sh)")


def _gone(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def _group(tmp_path: Path, env: dict[str, str], *argv: str) -> tuple[subprocess.Popen, int]:
    """A new session whose leader runs `sh -c` with an unmarked child sleeping; (leader, child pid)."""
    child_file = tmp_path / "child"
    leader = subprocess.Popen(
        [DASH, "-c", f'env -u XEON_CLUSTER_JOB sleep 300 & echo $! > "{child_file}"; wait', *argv],
        env=env, start_new_session=True)
    deadline = time.monotonic() + 5
    while not (child_file.exists() and child_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return leader, int(child_file.read_text())


def _run(script: str, home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"HOME": str(home), "PATH": os.environ["PATH"]}
    return subprocess.run([DASH, "-c", script, "xeon-cluster", *args], env=env, capture_output=True,
                          text=True, timeout=30)


@pytest.fixture
def home(tmp_path):
    jobdir = tmp_path / JOBS_DIR / JOB
    (jobdir / "ranks").mkdir(parents=True)
    return tmp_path


def _cleanup(leader: subprocess.Popen, child: int) -> None:
    for kill in (lambda: os.killpg(leader.pid, signal.SIGKILL), lambda: os.kill(child, signal.SIGKILL)):
        try:
            kill()
        except ProcessLookupError:
            pass
    leader.wait(timeout=5)


def test_the_node_script_signals_each_recorded_rank_group(home, tmp_path):
    env = {"PATH": os.environ["PATH"], "XEON_CLUSTER_JOB": JOB}
    leader, child = _group(tmp_path, env)
    try:
        (home / JOBS_DIR / JOB / "ranks" / "rank-0").write_text(f"{leader.pid} {leader.pid}\n")
        result = _run(STOP_NODE_SH, home, JOB, "1")
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"rank 0: sent TERM to pid {leader.pid} (group {leader.pid})" in result.stdout
        assert leader.wait(timeout=5) == -signal.SIGTERM
        assert _gone(child), f"the rank's group member {child} (no job marker) outlived the stop: " + result.stderr
        assert "Illegal number" not in result.stderr
    finally:
        _cleanup(leader, child)


def test_the_master_script_signals_the_job_scripts_session(home, tmp_path):
    leader, child = _group(tmp_path, {"PATH": os.environ["PATH"]}, "job.sh", JOB)
    try:
        jobdir = home / JOBS_DIR / JOB
        (jobdir / "pid").write_text(f"{leader.pid}\n")
        result = _run(STOP_MASTER_SH, home, JOB)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"job script (session {leader.pid}): sent TERM" in result.stdout
        assert _gone(child), f"the job script's child {child} outlived the stop: " + result.stderr
        assert leader.wait(timeout=5) == -signal.SIGTERM
        assert (jobdir / "stopped").exists()
    finally:
        _cleanup(leader, child)
