"""What a test sees of a job on the local cluster's nodes from this machine (the nodes share its
file system and pid space): a node's home, the newest job there, the job's processes, and waiting."""

from __future__ import annotations

import time
from pathlib import Path

from cluster.launch import JOBS_DIR


def node_home(cluster, index: int) -> Path:
    """The node's own /root, as seen from this machine."""
    return Path(cluster.state.nodes[index].dir) / "root"


def newest_job(cluster, index: int = 0) -> str | None:
    jobs = node_home(cluster, index) / JOBS_DIR
    ids = sorted(p.name for p in jobs.glob("2*")) if jobs.is_dir() else []
    return ids[-1] if ids else None


def job_processes(job_id: str) -> list[int]:
    """Every process on this machine (the local nodes share its pid space) marked with the job."""
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
