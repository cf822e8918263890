"""`fab train --launcher torchrun` on a local cluster: one torchrun per node over real SSH, the c10d
rendezvous on the master, the built-in job and a user's script, `fab status`/`fab stop`, and an
elastic run (`--min-nodes 2`) that loses a node mid-run and resumes on the other two from its
checkpoint.

Budget: about 3 minutes on a 2-core machine: on the session's cluster four jobs of two nodes, one rank
a node (the built-in job, 6 steps, and its report; a user's script that ends 0, one whose rank 1 fails,
one that `fab stop` ends); on a cluster of this module's own the elastic run (three nodes, 170 steps),
whose node 2 loses its sshd and its processes. Two nodes are the master and another: what the
elastic run does not check on three (the secret on a node's stdin, a rank named with its node, the
other node's lines in the stream, status and stop on every node) needs no third.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cluster.job.jobplan import LOCAL_OUTPUT_ROOT
from node_setup.local import system as local_system
from cluster.job.launch import JOBS_DIR
from cluster.job.torchrun import AGENT_FILE
from tests.ssh.jobs_on_nodes import job_processes, newest_job, node_home, wait_for, wait_for_new_job
from training.checkpoints import MANIFEST

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
FAB = [sys.executable, "-m", "fabric"]
TORCHRUN = ["--launcher", "torchrun", "--threads", "1"]
SMALL = ["--synthetic-examples", "200"]

USER_SCRIPT = '''
import hashlib, os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
assert os.environ["LOCAL_RANK"] == "0" and os.environ["NODE_RANK"] == str(rank), dict(os.environ)
total = torch.tensor([rank + 1])
dist.all_reduce(total)
token = hashlib.sha256(os.environ.get("HF_TOKEN", "").encode()).hexdigest()[:16]  # the --env secret, never printed
print(f"rank {rank} of {world} on {os.environ['XEON_CLUSTER_NODE']}: sum {int(total)}, args {sys.argv[1:]}, "
      f"token {token}", flush=True)
if "--fail" in sys.argv and rank == 1:
    sys.exit(7)
if "--wait" in sys.argv:
    time.sleep(300)
dist.barrier()
dist.destroy_process_group()
'''


def fab(cluster, *args, timeout=240) -> subprocess.CompletedProcess:
    return subprocess.run([*FAB, *args, "--cluster", cluster.cluster_arg], cwd=ROOT, env=cluster.env(),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cluster(installed_cluster):
    yield installed_cluster
    shutil.rmtree(Path(LOCAL_OUTPUT_ROOT) / installed_cluster.name, ignore_errors=True)


def test_builtin_job_under_torchrun_on_two_nodes(cluster):
    # --all-ranks: every rank's metrics in the stream (rank 0's only without it), each line with its node and rank
    result = fab(cluster, "train", "--nodes", "2", *TORCHRUN, *SMALL, "--max-steps", "6", "--all-ranks",
                 "--name", "tiny-torchrun", "--extra=--logging_steps 2")
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr
    # a successful job's log: no agent's shutdown trace, no load report of the new QA head (each counted)
    assert "failed to shutdown the rendezvous" not in out and "recvVector" not in out, out[-4000:]
    assert "LOAD REPORT" not in out and "hidden: 7 line(s) of transformers' load report" in out, out[-4000:]
    assert re.search(r"^\[node0 r0\s*\] ", out, re.M) and re.search(r"^\[node1 r1\s*\] ", out, re.M), out[-4000:]
    assert "torchrun --nnodes 2, rendezvous" in out and "finished: exit code 0" in out, out[-4000:]
    job_id, output_dir = re.search(r"^job (\S+) started on node0 .*; output (\S+)$", out, re.M).groups()
    summary = json.loads((Path(output_dir) / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2 and summary["nodes"] == 2, summary
    assert summary["steps"] == 6, summary
    for key in ("status: completed", "world_size: 2", "nodes: 2", "global_batch_size: 32", "steps: 6",
                "train_loss: ", "samples_per_second: "):  # the summary fab prints after mpirun too
        assert f"  {key}" in out, out[-2000:]
    assert not job_processes(job_id)
    status = fab(cluster, "status", timeout=60)
    assert f"job {job_id}: finished, exit code 0" in status.stdout, status.stdout
    # its report, by its name: the curves of its trainer_state.json inline in one HTML file, and as PNGs
    to = Path(output_dir).parent / f"report-{job_id}"
    made = fab(cluster, "report", "--job", "tiny-torchrun", "--to", str(to), "--png", timeout=120)
    assert made.returncode == 0, made.stdout + made.stderr
    page = (to / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == 4 and f"tiny-torchrun ({job_id})" in page, made.stdout
    assert sorted(p.name for p in to.glob("*.png")) == ["learning_rate.png", "loss.png", "samples_per_second.png",
                                                         "step_seconds.png"]


def test_user_script_under_torchrun_runs_fails_with_its_code_and_stops(cluster, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "run.py").write_text(textwrap.dedent(USER_SCRIPT))
    secret = "hf_" + "Qw3" * 12
    ok = fab(cluster, "train", "--nodes", "2", *TORCHRUN, "--script", str(work / "run.py"), "--args", "--x 'a b'",
             "--env", f"HF_TOKEN={secret}")
    out = ok.stdout + ok.stderr
    assert ok.returncode == 0, out[-4000:]
    token = hashlib.sha256(secret.encode()).hexdigest()[:16]
    for rank in range(2):  # every node's torchrun got the secret on its stdin, from the master's 0600 env file
        assert f"rank {rank} of 2 on node{rank}: sum 3, args ['--x', 'a b'], token {token}" in out, out[-4000:]
    job_dir = node_home(cluster, 0) / JOBS_DIR / re.search(r"^job (\S+) started", out, re.M).group(1)
    assert (job_dir / "env").stat().st_mode & 0o777 == 0o600
    assert secret not in (job_dir / "run.sh").read_text() and secret not in (job_dir / "log").read_text()

    failed = fab(cluster, "train", "--nodes", "2", *TORCHRUN, "--script", str(work / "run.py"),
                 "--args", "--fail --wait")
    out = failed.stdout + failed.stderr
    # torchrun's own code is 1; fab names the rank and its node and passes the program's 7 on
    assert re.search(r"^  rank 1 on node node1 \(pid \d+\): exit code 7$", out, re.M), out[-4000:]
    assert failed.returncode == 7, out[-4000:]
    assert "no rank of the job is left on any node" in out, out[-4000:]

    before = newest_job(cluster)
    proc = subprocess.Popen([*FAB, "train", "--nodes", "2", *TORCHRUN, "--script", str(work / "run.py"), "--args",
                             "--wait", "--cluster", cluster.cluster_arg], cwd=ROOT, env=cluster.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        job_id = wait_for_new_job(cluster, before, proc)
        ranks = lambda: all((node_home(cluster, i) / JOBS_DIR / job_id / "ranks" / f"rank-{i}").exists()  # noqa: E731
                            for i in range(2))
        wait_for(ranks, 120, "a rank on every node")
        status = fab(cluster, "status", timeout=60)
        # the job's two nodes run a rank each, the cluster's third none; fab stop clears every node of the cluster
        assert f"job {job_id}: running" in status.stdout and status.stdout.count("1 running") == 2 and \
            status.stdout.count("none running") == len(cluster.state.nodes) - 2, status.stdout
        stop = fab(cluster, "stop", timeout=120)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert stop.stdout.count(f"no process of job {job_id} left") == len(cluster.state.nodes), stop.stdout
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, out[-3000:]  # fab stop ended it
    assert not job_processes(job_id)


@pytest.fixture(scope="module")
def elastic_cluster(setup_runs, local_cluster_factory):
    """Three nodes of this module's own (node 2 loses its sshd); the venv under /opt, which every
    local node sees, is installed by the session's `fab setup` (`setup_runs`)."""
    made = local_cluster_factory(3)
    yield made
    shutil.rmtree(Path(LOCAL_OUTPUT_ROOT) / made.name, ignore_errors=True)
    made.destroy()


def test_elastic_run_loses_a_node_and_resumes_on_two_from_its_checkpoint(elastic_cluster):
    cluster = elastic_cluster
    out_dir = Path(LOCAL_OUTPUT_ROOT) / cluster.name / "elastic"
    # node 2 goes at the first complete checkpoint, a second in (steps 12 to 16 on a 2-core machine, fewer
    # under load): over 150 steps are left, so the run is still on three nodes when it goes
    steps = 170
    proc = subprocess.Popen([*FAB, "train", "--nodes", "3", *TORCHRUN, "--min-nodes", "2", "--max-restarts", "2",
                             *SMALL, "--max-steps", str(steps), "--checkpoint-every", "1s",
                             "--output-dir", str(out_dir), "--cluster", cluster.cluster_arg], cwd=ROOT,
                            env=cluster.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        job_id = wait_for_new_job(cluster, None, proc)
        # a complete checkpoint (its manifest is written last) before the node goes
        wait_for(lambda: list(out_dir.glob(f"checkpoint-*/{MANIFEST}")), 150, "a first checkpoint")
        node2 = node_home(cluster, 2) / JOBS_DIR / job_id
        agent = int((node2 / AGENT_FILE).read_text().split()[0])
        ranks = [int(f.read_text().split()[0]) for f in (node2 / "ranks").glob("rank-*")]
        cluster.stop_sshd(2)  # the node is gone: no SSH either
        for pid in [agent, *ranks]:  # this job's torchrun on node 2 and its rank, by recorded pid (the node's own)
            on_host = local_system.host_pid(cluster.state.nodes[2].namespace, pid)
            try:
                if on_host is not None:
                    os.kill(on_host, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            out, _ = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate()[0]
            raise AssertionError("the elastic run did not end within 300 s:\n" + out[-8000:]) from None
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-6000:]
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == steps, summary
    assert summary["world_size"] == 2 and summary["nodes"] == 2, summary  # finished on the two left
    assert summary["resumed_from"] and summary["start_step"] > 0, summary  # from the checkpoint, not step 0
    assert re.search(r"\[xeon-cluster\] node node2: (torchrun exited with code|no end after)", out), out[-6000:]
