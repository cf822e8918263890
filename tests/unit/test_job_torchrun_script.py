"""The torchrun job script (cluster/shell/job-torchrun.sh) run by bash on real processes, with a stand-in
`ssh` that runs a node's command here: how the job's code is collected from the nodes' torchrun, and
that a node's torchrun still running after the master's has ended cannot hold the job open."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from cluster import shell
from cluster.job.launch import ENV_FILE

JOB_DIR = "jobs/20260101-000000-abcd"
END_WAIT_S = 1
# The stand-in ssh: `ssh [OPTIONS] -- HOST COMMAND` runs COMMAND here.
FAKE_SSH = '#!/bin/sh\nwhile [ "$1" != "--" ]; do shift; done\nexec sh -c "$3"\n'
STOP = 'kill -TERM "$(cat "$HOME/agent")"'
HANGS = 'echo $$ > "$HOME/agent"; exec sleep 600'  # a torchrun that never ends by itself


def run_job(tmp_path: Path, commands: list[str], *, elastic: bool = False) -> tuple[int, str, str]:
    """The job script over two nodes (node0 the master) running `commands`; (its exit code, the job's
    recorded exit_code, its log)."""
    home = tmp_path / "home"
    (home / JOB_DIR).mkdir(parents=True)
    (home / JOB_DIR / ENV_FILE).write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(FAKE_SSH)
    (bin_dir / "ssh").chmod(0o755)
    script = shell.render("job-torchrun.sh", {
        "XEON_CLUSTER_JOB": "20260101-000000-abcd", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400",
        "JOB_DIR": JOB_DIR, "WORLD_SIZE": "2", "RANKS_PER_NODE": "1", "NNODES": "1:2" if elastic else "2",
        "ELASTIC": "yes" if elastic else "no", "NODES": ["node0", "node1"], "COMMANDS": commands,
        "STOP_COMMAND": STOP, "END_WAIT": str(END_WAIT_S), "ENV_FILE": f"{JOB_DIR}/{ENV_FILE}",
        "INTERRUPTED": "75", "OUTCOME_PREFIX": "outcome-"},
        exported=("XEON_CLUSTER_JOB", "MASTER_ADDR", "MASTER_PORT"))
    env = {**os.environ, "HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    try:
        done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    finally:  # a torchrun stand-in the script did not end is ended here, by the pid it recorded
        agent = home / "agent"
        if agent.is_file():
            subprocess.run(["kill", agent.read_text().strip()], capture_output=True)
    job = home / JOB_DIR
    return done.returncode, (job / "exit_code").read_text().strip(), (job / "log").read_text()


@pytest.mark.parametrize("elastic", [False, True])
def test_a_node_still_running_after_the_master_ended_is_ended_and_the_job_keeps_the_masters_code(
        tmp_path, elastic):
    code, recorded, log = run_job(tmp_path, ["sleep 0.2", HANGS], elastic=elastic)
    assert (code, recorded) == (0, "0"), log
    assert "ending torchrun on the nodes still running" in log, log
    assert "node node1: torchrun exited with code 143" in log, log


def test_a_failing_node_ends_a_fixed_size_job_with_its_code_and_the_master_is_ended(tmp_path):
    master = 'echo $$ > "$HOME/agent"; exec sleep 600'  # the stop command reaches it by that file
    code, recorded, log = run_job(tmp_path, [master, "sleep 0.2; exit 7"])
    assert (code, recorded) == (7, "7"), log
    assert "node node1: torchrun exited with code 7" in log and "ending torchrun" in log, log


def test_a_node_failing_after_the_master_succeeded_fails_the_fixed_size_job(tmp_path):
    code, recorded, log = run_job(tmp_path, ["exit 0", "sleep 0.3; exit 5"])
    assert (code, recorded) == (5, "5"), log
    assert "ending torchrun" not in log, log
