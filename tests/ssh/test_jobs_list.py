"""`fab jobs` and the busy-cluster refusal of `fab train` on a local cluster: real sshd, real Intel MPI.

One job completes, one fails, one runs (a script that sleeps until `fab stop --job NAME`, named with
`fab train --name`); while it runs a
second `fab train` on its nodes is refused with the running job's id, and `--allow-busy` starts it
anyway. `fab jobs` (table and --json) lists all of them with the state each really has.
"""

from __future__ import annotations

import json
import queue
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from cluster.job.jobplan import LOCAL_OUTPUT_ROOT
from tests.ssh.conftest import FAB, REPO_ROOT

pytestmark = [pytest.mark.ssh, pytest.mark.mpi]

ONE_THREAD = ["--threads", "1", "--ranks-per-node", "1"]
STARTED = re.compile(r"^job (\d{8}-\d{6}-[0-9a-f]{4}) started on ", re.M)


def fab(cluster, *args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([*FAB, *args, "--cluster", cluster.cluster_arg], cwd=REPO_ROOT, env=cluster.env(),
                          capture_output=True, text=True, timeout=timeout)


def started_id(output: str) -> str:
    found = STARTED.search(output)
    assert found, output
    return found.group(1)


@pytest.fixture(scope="module")
def cluster(installed_cluster):
    yield installed_cluster
    shutil.rmtree(Path(LOCAL_OUTPUT_ROOT) / installed_cluster.name, ignore_errors=True)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("jobs-work")
    (work / "ok.py").write_text("print('done')\n")
    (work / "fail.py").write_text("raise SystemExit(3)\n")
    (work / "sleep.py").write_text("import time\nprint('sleeping', flush=True)\ntime.sleep(600)\n")
    return work


@pytest.fixture(scope="module")
def three_jobs(cluster, work):
    """(completed id, failed id, running id, the refused run, the --allow-busy run, fab jobs --json while running)."""
    done = fab(cluster, "train", "--nodes", "1", *ONE_THREAD, "--script", str(work / "ok.py"))
    assert done.returncode == 0, done.stdout + done.stderr
    failed = fab(cluster, "train", "--nodes", "1", *ONE_THREAD, "--script", str(work / "fail.py"))
    assert failed.returncode == 3, failed.stdout + failed.stderr  # the program's code
    running = subprocess.Popen([*FAB, "train", "--nodes", "2", *ONE_THREAD, "--independent-ranks", "--script",
                                str(work / "sleep.py"), "--name", "sleeper", "--cluster", cluster.cluster_arg],
                               cwd=REPO_ROOT, env=cluster.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in running.stdout], daemon=True)
    reader.start()
    log: list[str] = []
    try:
        deadline = time.monotonic() + 300
        while not any("sleeping" in line for line in log):  # every rank prints it once it runs
            assert time.monotonic() < deadline and running.poll() is None, "".join(log)
            try:
                log.append(lines.get(timeout=1))
            except queue.Empty:
                continue
        while sum("sleeping" in line for line in log) < 2:
            log.append(lines.get(timeout=120))
        running_id = started_id("".join(log))
        listed = fab(cluster, "jobs", "--json")
        refused = fab(cluster, "train", "--nodes", "2", *ONE_THREAD, "--script", str(work / "ok.py"))
        allowed = fab(cluster, "train", "--nodes", "1", *ONE_THREAD, "--allow-busy", "--script", str(work / "ok.py"))
    finally:  # by its name (`--name`): the newest job may be the --allow-busy one
        found = STARTED.search("".join(log))
        stopped = fab(cluster, "stop", *(["--job", "sleeper"] if found else []))
        running.wait(timeout=120)
        reader.join(timeout=10)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    return started_id(done.stdout), started_id(failed.stdout), running_id, refused, allowed, listed


def by_id(listed: subprocess.CompletedProcess) -> dict[str, dict]:
    assert listed.returncode == 0, listed.stdout + listed.stderr
    return {job["id"]: job for job in json.loads(listed.stdout)["jobs"]}


def test_fab_jobs_json_lists_a_completed_a_failed_and_a_running_job(cluster, three_jobs):
    done, failed, running, _, _, listed = three_jobs
    jobs = by_id(listed)
    assert jobs[done]["state"] == "completed" and jobs[done]["exit_code"] == 0
    assert jobs[failed]["state"] == "failed" and jobs[failed]["exit_code"] not in (None, 0)  # the launcher's code
    assert jobs[running]["state"] == "running" and jobs[running]["exit_code"] is None
    assert (jobs[running]["nodes"], jobs[running]["ranks"], jobs[done]["nodes"]) == (2, 2, 1)
    assert jobs[running]["output_dir"].endswith(running) and jobs[done]["duration_s"] >= 0
    assert (jobs[running]["program"], jobs[failed]["program"]) == ("script sleep.py", "script fail.py")
    assert (jobs[running]["name"], jobs[done]["name"]) == ("sleeper", None)
    assert jobs[running]["started"] and jobs[running]["duration_s"] >= 0
    ids = list(jobs)
    assert ids == sorted(ids, reverse=True) and ids.index(running) < ids.index(failed) < ids.index(done)


def test_fab_jobs_table_after_the_stop(cluster, three_jobs):
    done, failed, running, *_ = three_jobs
    result = fab(cluster, "jobs")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()[2:]}
    assert rows[done][2] == "completed" and rows[failed][2] == "failed" and rows[running][2] == "stopped"
    assert rows[running][1] == "sleeper" and rows[done][1] == "-"  # the name `fab stop --job sleeper` stopped it by
    assert rows[failed][7] not in ("0", "unknown")
    assert rows[running][7].isdigit() and rows[running][7] != "0"  # a stopped job's code: the launcher's, after TERM


def test_a_second_job_on_busy_nodes_is_refused_naming_the_running_one(cluster, three_jobs):
    _, _, running, refused, _, _ = three_jobs
    assert refused.returncode == 1, refused.stdout + refused.stderr
    error = refused.stderr.strip().splitlines()
    assert len(error) == 1 and error[0].startswith(f"error: cannot launch: job {running} still runs on ")
    assert f"`fab logs --follow --job {running}`" in error[0] and "--allow-busy" in error[0]
    assert "started on" not in refused.stdout
    newest = max(p.name for p in (Path(cluster.state.nodes[1].dir) / "root" / ".xeon-cluster" / "jobs").glob("2*"))
    assert newest == running  # the refused job left no directory on the nodes


def test_allow_busy_launches_beside_the_running_job(cluster, three_jobs):
    _, _, running, _, allowed, _ = three_jobs
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert started_id(allowed.stdout) != running
