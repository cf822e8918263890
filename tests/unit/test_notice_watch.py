"""The per-node spot-notice watcher of a user's program (xeon_cluster/notice_watch.py), as a process.

Its metadata endpoint is a closed port on 127.0.0.1 (XEON_IMDS_ENDPOINT), so it polls nothing real.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys

from training.imds import ENDPOINT_VARIABLE

JOB = "20261123-101500-ab12"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_watcher(job_dir, **popen) -> subprocess.Popen:
    env = {**os.environ, ENDPOINT_VARIABLE: f"http://127.0.0.1:{closed_port()}",
           "XEON_CLUSTER_NOTICE_POLL_SECONDS": "0.2"}
    return subprocess.Popen([sys.executable, "-I", "-m", "xeon_cluster.notice_watch", str(job_dir), "none"],
                            cwd="/", env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **popen)


def record_rank(job_dir, pid: int) -> None:
    (job_dir / "ranks").mkdir(parents=True, exist_ok=True)
    (job_dir / "ranks" / "rank-1").write_text(f"{pid} {pid} {socket.gethostname()}\n")


def test_a_rank_that_ended_before_the_watcher_looked_ends_the_watcher_at_once(tmp_path):
    job_dir = tmp_path / JOB
    ended = subprocess.Popen(["true"])
    ended.wait()
    record_rank(job_dir, ended.pid)  # the rank ran and ended before the watcher's first look
    watcher = start_watcher(job_dir)
    assert watcher.wait(timeout=30) == 0  # not the minute it waits for a first rank record (it would time out)


def test_the_watcher_keeps_no_descriptor_of_the_launch_and_ends_with_the_rank(tmp_path):
    job_dir = tmp_path / JOB
    rank = subprocess.Popen(["sleep", "60"], env={**os.environ, "XEON_CLUSTER_JOB": JOB})
    record_rank(job_dir, rank.pid)
    read_end, write_end = os.pipe()  # stands for the launcher's pipe to the rank, which the watcher inherits
    watcher = start_watcher(job_dir, pass_fds=(write_end,))
    try:
        os.close(write_end)
        ready, _, _ = select.select([read_end], [], [], 10)
        assert ready and os.read(read_end, 1) == b"", "the watcher still holds the launcher's pipe"
        assert watcher.poll() is None  # while the rank runs, it keeps watching
    finally:
        os.close(read_end)
        rank.kill()
        rank.wait()
    assert watcher.wait(timeout=30) == 0
