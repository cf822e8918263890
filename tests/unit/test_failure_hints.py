"""The hints after a failed job's report (cluster/job/joblog.py `hints`), from what real processes print:
the rank wrapper (cluster/shell/rank-wrapper.sh) around a program killed by SIGKILL, and a Python program
whose write meets a full disk (/dev/full: the kernel's ENOSPC)."""

from __future__ import annotations

import socket
import subprocess
import sys

from cluster.job.joblog import failure_report
from cluster.job.launch import RANK_WRAPPER

HOSTS = ["node0", "node1"]


def as_rank_1(tmp_path, *program: str) -> str:
    """The log of a 2-rank job whose rank 1 ran `program` under the rank wrapper, as Intel MPI writes it."""
    env = {"HOME": str(tmp_path), "XEON_CLUSTER_JOB": "j1", "PMI_RANK": "1", "MASTER_ADDR": "127.0.0.1",
           "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}
    done = subprocess.run(["sh", "-c", RANK_WRAPPER, "xeon-rank", *program], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0, done.stdout + done.stderr
    return "[0] step 1\n" + "".join(f"[1] {line}\n" for line in (done.stdout + done.stderr).splitlines())


def test_a_rank_killed_by_sigkill_gets_the_out_of_memory_hint(tmp_path):
    log = as_rank_1(tmp_path, "sh", "-c", "kill -9 $$")
    report = failure_report(log, HOSTS, 255)
    assert report[0].startswith(f"rank 1 on node node1 (host {socket.gethostname()}, pid "), report
    assert report[0].endswith("killed by signal: 9"), report
    assert report[1:] == ["hint: rank 1 on node node1 was killed by SIGKILL (signal 9, exit 137): out of memory? "
                          "the kernel's OOM killer sends it (`dmesg` on that node says so); fewer ranks per node, a "
                          "smaller batch or a node with more memory"]


def test_a_program_that_meets_a_full_disk_gets_the_disk_hint(tmp_path):
    log = as_rank_1(tmp_path, sys.executable, "-c", "open('/dev/full', 'w').write('x' * 8192)")
    assert "No space left on device" in log
    report = failure_report(log, HOSTS, 255)
    assert report[0].endswith("exit code 1"), report
    assert report[1:] == ["hint: a disk was full (\"No space left on device\" or torch's \"basic_ios::clear: "
                          "iostream error\" in the log): free space in the output folder's file system (`df -h` on "
                          "the node), or save less often (fewer checkpoints kept)"]


def test_torchs_stream_error_hydras_sigkill_and_a_job_that_succeeded():
    hydra = ("[0] [enforce fail at inline_container.cc:664] . unexpected pos 128 vs 64\n"
             "[0] RuntimeError: [enforce fail] . basic_ios::clear: iostream error\n"
             "=   RANK 1 PID 4242 RUNNING AT ip-10-0-0-11\n=   KILLED BY SIGNAL: 9 (Killed)\n")
    report = failure_report(hydra, HOSTS, 255)
    assert report[0] == "rank 1 on node node1 (host ip-10-0-0-11, pid 4242): killed by signal: 9 (killed)"
    assert [line.split(" (")[0] for line in report[1:]] == ["hint: a disk was full",
                                                            "hint: rank 1 on node node1 was killed by SIGKILL"]
    assert failure_report("[0] No space left on device, retried: saved\n", HOSTS, 0) == []
