"""`fab train`, `fab status`, `fab logs`, `fab stop` on a local cluster: real sshd, real Intel MPI,
real multi-rank training of the small synthetic model.

The session's cluster has 3 nodes; the jobs that run ranks use 2 of them (each rank costs a few CPU-seconds just
to start), so that `fab status` and `fab stop` also show a node the job left alone.

Budget: about 40 seconds in all (the synthetic data is made once per node, its model once for the cluster, in its
shared output root; both are reused).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.job.demo import SYNTHETIC_MODEL_NAME
from cluster.job.jobplan import LOCAL_OUTPUT_ROOT
from node_setup.local import system as local_system
from cluster.job.launch import JOBS_DIR
from cluster.cost.spend import COST_KEY, LOCAL_NO_PRICE
from cluster.node.profiles import PROFILES, venv_dir
from tests.ssh.jobs_on_nodes import job_processes, newest_job, node_home, wait_for, wait_for_new_job

pytestmark = [pytest.mark.ssh, pytest.mark.mpi]

ROOT = Path(__file__).resolve().parents[2]
FAB = [sys.executable, "-m", "fabric"]
SMALL = ["--synthetic-examples", "200"]
VENV = venv_dir(PROFILES["stock"])


def fab(cluster, *args, timeout=240, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*FAB, *args, "--cluster", cluster.cluster_arg], cwd=ROOT, env=cluster.env(),
                          capture_output=True, text=True, timeout=timeout, **kw)


def sigint_as_in_a_terminal() -> None:
    """In the child before fab starts: SIGINT at its default, so that Python makes it a KeyboardInterrupt. A
    suite started in the background of a non-interactive shell ignores SIGINT, and a child keeps that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def fab_background(cluster, *args) -> subprocess.Popen:
    return subprocess.Popen([*FAB, *args, "--cluster", cluster.cluster_arg], cwd=ROOT, env=cluster.env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=sigint_as_in_a_terminal)


def rank_file(cluster, index: int, job_id: str, rank: int) -> Path:
    return node_home(cluster, index) / JOBS_DIR / job_id / "ranks" / f"rank-{rank}"


@pytest.fixture(scope="module")
def train_cluster(request, local_cluster):
    """The session's 3-node cluster with the stock profile installed and keys distributed."""
    try:
        return request.getfixturevalue("installed_cluster")
    except pytest.FixtureLookupError:
        pass
    if not Path(VENV, "bin", "python").exists():
        pytest.skip(f"needs the stock profile installed in {VENV} (fab setup)")
    try:
        import node_setup.ssh.distribute  # noqa: F401
    except ImportError:
        pytest.skip("needs node_setup.ssh.distribute (ssh keys and config on the master)")
    return local_cluster


@pytest.fixture(scope="module", autouse=True)
def remove_job_outputs(request):
    """Remove the shared output directories this module's jobs wrote (named after the cluster)."""
    yield
    try:
        cluster = request.getfixturevalue("local_cluster")
    except Exception:  # the machine cannot run a local cluster: nothing was written
        return
    shutil.rmtree(Path(LOCAL_OUTPUT_ROOT) / cluster.name, ignore_errors=True)


def test_dry_run_prints_the_plan_and_touches_nothing(local_cluster):
    before = [newest_job(local_cluster, i) for i in range(3)]
    result = fab(local_cluster, "train", "--nodes", "3", "--dry-run", "--threads", "1", timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    master = local_cluster.state.nodes[0].address
    for node in ("node0", "node1", "node2"):
        assert re.search(rf"^  {node}\s", out, re.M), out
    assert f"MASTER_ADDR={master}" in out
    assert "OMP_NUM_THREADS=1" in out and "I_MPI_WAIT_MODE=1" in out
    assert re.search(r"mpirun -f \S+/hosts -n 3 -ppn 1 -prepend-rank", out)
    model = f"{LOCAL_OUTPUT_ROOT}/{local_cluster.name}/.{SYNTHETIC_MODEL_NAME}"  # made once, in the nodes' shared root
    assert (f"-m training --task qa --model_name_or_path {model} "
            "--train_file xeon-cluster-data/synthetic-qa/") in out
    assert "dry run: nothing was started" in out
    job_id = re.search(r"^job (\S+) on cluster", out, re.M).group(1)
    for i in range(3):
        assert not (node_home(local_cluster, i) / JOBS_DIR / job_id).exists()
    assert [newest_job(local_cluster, i) for i in range(3)] == before


def test_node_count_out_of_range_is_refused_before_anything_runs(local_cluster):
    result = fab(local_cluster, "train", "--nodes", "4", "--dry-run", timeout=60)
    assert result.returncode == 2
    assert "--nodes: 4 is not possible" in result.stderr and "allowed 1 to 3" in result.stderr


def test_layout_override_beyond_cores_is_refused(local_cluster):
    result = fab(local_cluster, "train", "--nodes", "3", "--threads", "64", "--dry-run", timeout=60)
    assert result.returncode == 2
    assert "threads per rank: 64" in result.stderr and "never more threads than physical cores" in result.stderr


@pytest.mark.slow
def test_train_on_two_nodes_writes_summary_and_status_and_logs_find_it(train_cluster):
    result = fab(train_cluster, "train", "--nodes", "2", *SMALL, "--max-steps", "6")
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr
    assert "[node0 r0]" in out and "hidden: 1 line(s) of the other ranks' metrics" in out  # rank 1: metrics only
    assert "finished: exit code 0" in out
    started = re.search(r"^job (\S+) started on node0 .*; output (\S+)$", out, re.M)
    job_id, output_dir = started.group(1), Path(started.group(2))
    try:
        data = json.loads((output_dir / "summary.json").read_text())
        assert data["world_size"] == 2 and data["nodes"] == 2 and data["status"] == "completed"
        assert data["steps"] == 6
        assert "world_size: 2" in out
        assert not job_processes(job_id)
        # the planned and actual time and cost: the planner has no catalog type for local nodes, which cost nothing
        assert re.search(rf"^planned: cannot plan this run: the machines of cluster '{train_cluster.name}' have no "
                         rf"instance type from the planner's catalog \({LOCAL_NO_PRICE}\)$", out, re.M), out[-3000:]
        actual = re.search(rf"^actual: (?:(\d+)m )?(\d+)s, \$0\.00 \({LOCAL_NO_PRICE}\)$", out, re.M)
        assert actual, out[-3000:]
        cost = data[COST_KEY]
        assert cost["planned_seconds"] is None and "planner's catalog" in cost["not_planned"]
        assert cost["hourly_usd"] == 0 and cost["actual_usd"] == 0 and cost["price_source"] == LOCAL_NO_PRICE
        assert cost["nodes"] == 2  # the job's nodes, not the cluster's 3
        assert abs(cost["actual_seconds"] - (int(actual.group(1) or 0) * 60 + int(actual.group(2)))) <= 1
        # status and logs find the finished job
        status = fab(train_cluster, "status", timeout=60)
        assert status.returncode == 0 and f"job {job_id}: finished, exit code 0" in status.stdout
        assert re.search(rf"last log line: .*job {job_id} exited with code 0", status.stdout), status.stdout
        for node in ("node0", "node1", "node2"):  # market, uptime, price and spend of every node, the job's or not
            assert re.search(rf"^  {node} .* local\s+(\d+h )?(\d+m )?\d+s\s+\$0\.0000\s+\$0\.00 yes",
                             status.stdout, re.M), status.stdout
        assert f"total: 3 node(s), $0.0000/hour, $0.00 spent so far ({LOCAL_NO_PRICE})" in status.stdout
        as_json = fab(train_cluster, "status", "--json", timeout=60)
        report = json.loads(as_json.stdout)  # nothing but the JSON on stdout
        assert [n["market"] for n in report["nodes"]] == ["local"] * 3
        assert all(n["uptime_seconds"] >= cost["actual_seconds"] for n in report["nodes"])  # up before the job
        assert report["total"] == {"nodes": 3, "usd_per_hour": 0.0, "spent_usd": 0.0, "unpriced": []}
        assert report["job"]["id"] == job_id and report["job"]["described"] == "finished, exit code 0"
        logs = fab(train_cluster, "logs", "--lines", "3", timeout=60)
        assert logs.returncode == 0 and f"job {job_id} exited with code 0" in logs.stdout
        assert len(logs.stdout.splitlines()) == 3  # the lines as shown, progress bars and pieces joined
        every = fab(train_cluster, "logs", "--all-ranks", timeout=60)  # every rank's lines, labelled with its node
        assert "[node1 r1] {'train_runtime'" in every.stdout and "[node2 " not in every.stdout  # node2 ran no rank
    finally:
        shutil.rmtree(output_dir, ignore_errors=True)  # what this test's jobs wrote


@pytest.mark.slow
def test_killed_rank_names_node_and_rank_and_leaves_nothing(train_cluster):
    before = newest_job(train_cluster, 0)
    proc = fab_background(train_cluster, "train", "--nodes", "2", *SMALL, "--max-steps", "5000")
    try:
        job_id = wait_for_new_job(train_cluster, before, proc)
        wait_for(lambda: rank_file(train_cluster, 1, job_id, 1).exists(), 90, "rank 1 on node1")
        pid = int(rank_file(train_cluster, 1, job_id, 1).read_text().split()[0])  # as node1 numbers it
        time.sleep(2)
        on_host = local_system.host_pid(train_cluster.state.nodes[1].namespace, pid)
        assert on_host is not None, f"rank 1 (pid {pid} on node1) is not running"
        os.kill(on_host, signal.SIGKILL)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, out[-3000:]
    assert f"rank 1 on node node1 (host node1, pid {pid}): killed by signal: 9" in out, out[-3000:]
    assert "hint: rank 1 on node node1 was killed by SIGKILL (signal 9, exit 137): out of memory?" in out, out[-3000:]
    assert "no rank of the job is left on any node" in out
    assert not job_processes(job_id)


@pytest.mark.slow
def test_ctrl_c_keeps_job_then_fab_stop_ends_every_rank(train_cluster):
    before = newest_job(train_cluster, 0)
    proc = fab_background(train_cluster, "train", "--nodes", "2", *SMALL, "--max-steps", "5000")
    try:
        job_id = wait_for_new_job(train_cluster, before, proc)
        for i in range(2):
            wait_for(lambda i=i: rank_file(train_cluster, i, job_id, i).exists(), 90, f"rank {i}")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate("n\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out[-2000:]
    assert f"job {job_id} keeps running" in out
    assert len(job_processes(job_id)) >= 2  # detaching left the job alone

    status = fab(train_cluster, "status", timeout=60)
    assert f"job {job_id}: running" in status.stdout, status.stdout
    assert status.stdout.count("1 running") == 2, status.stdout  # node0 and node1, one rank each
    assert re.search(r"^  node2 .* none running$", status.stdout, re.M), status.stdout  # not the job's node

    stop = fab(train_cluster, "stop", timeout=90)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert stop.stdout.count(f"no process of job {job_id} left") == 3  # every node of the cluster, node2 too
    assert not job_processes(job_id)
    status = fab(train_cluster, "status", timeout=60)
    assert f"job {job_id}: stopped by fab stop" in status.stdout


def test_unreachable_node_at_launch_is_named(local_cluster_factory):
    cluster = local_cluster_factory(2)
    try:
        os.kill(cluster.state.nodes[1].sshd_pid, signal.SIGTERM)  # this test's own cluster
        result = fab(cluster, "train", "--nodes", "2", *SMALL, "--max-steps", "2", timeout=120)
        assert result.returncode == 3, result.stdout + result.stderr
        assert "node1" in result.stderr and "cannot" in result.stderr.lower()
        assert "node1" in result.stdout  # the per-node table names the node and the reason
    finally:
        cluster.destroy()
