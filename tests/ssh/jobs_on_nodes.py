"""What a test sees of a job on the local cluster's nodes from this machine (the nodes share its
file system; each node's own PID namespace lies inside this machine's, so this machine sees every node's
processes, by its own numbers): a node's home, the newest job there, the job's processes, waiting, and
acting on the cluster once a running `fab train` has reached a given line."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

from cluster.job.launch import JOBS_DIR


def node_home(cluster, index: int) -> Path:
    """The node's own /root, as seen from this machine."""
    return Path(cluster.state.nodes[index].dir) / "root"


def newest_job(cluster, index: int = 0) -> str | None:
    jobs = node_home(cluster, index) / JOBS_DIR
    ids = sorted(p.name for p in jobs.glob("2*")) if jobs.is_dir() else []
    return ids[-1] if ids else None


def job_processes(job_id: str) -> list[int]:
    """Every process on this machine (every node's too, as this machine numbers them) marked with the job."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"XEON_CLUSTER_JOB={job_id}".encode() in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return found


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def wait_for_new_job(cluster, before: str | None, proc: subprocess.Popen, timeout: float = 60) -> str:
    """The id of the job that `proc` (a running `fab train`, its output piped) made on node0 after `before`;
    fails with fab's output should fab end first or the time run out."""
    def made():
        newest = newest_job(cluster, 0)
        if newest != before and newest:
            return newest
        if proc.poll() is not None:
            raise AssertionError(f"fab ended with code {proc.returncode} before its job's directory appeared:\n"
                                 + proc.communicate()[0][-4000:])
        return None

    try:
        return wait_for(made, timeout, "the job directory")
    except AssertionError as missing:
        if proc.poll() is None:
            proc.kill()
            raise AssertionError(f"{missing}; fab's output:\n{proc.communicate()[0][-4000:]}") from None
        raise


REPO_ROOT = Path(__file__).resolve().parents[2]


def act_while_training(cluster, train_args: list[str], action: list[str], ready: tuple[str, ...],
                       *, timeout: float = 300) -> tuple[subprocess.CompletedProcess, int, str]:
    """Start `fab <train_args>`; once a line of its output holds one of `ready` (or it ends), run
    `fab <action> --cluster local:NAME`; then wait for the training. (the action's run, fab train's
    exit code, fab train's output)."""
    job = subprocess.Popen([sys.executable, "-m", "fabric", *train_args], cwd=REPO_ROOT, env=cluster.env(),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in job.stdout], daemon=True)
    reader.start()
    log, deadline = [], time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            log.append(lines.get(timeout=1))
        except queue.Empty:
            if job.poll() is not None:
                break
            continue
        if any(marker in log[-1] for marker in ready):
            break
    acted = subprocess.run([sys.executable, "-m", "fabric", *action, "--cluster", f"local:{cluster.name}"],
                           cwd=REPO_ROOT, env=cluster.env(), capture_output=True, text=True, timeout=300)
    try:
        code = job.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        job.kill()
        job.wait()
        code = None
    reader.join(timeout=10)
    while not lines.empty():
        log.append(lines.get())
    if code is None:
        raise AssertionError(f"fab {' '.join(train_args[:1])} had not ended {timeout:.0f} s after `fab "
                             f"{' '.join(action)}`; it printed:\n{''.join(log)[-6000:]}\nthe action's output:\n"
                             f"{acted.stdout[-2000:]}{acted.stderr[-2000:]}")
    return acted, code, "".join(log)
