"""The per-node spot-notice watcher of a user's program (started by the rank wrapper on local rank 0).

    python -I -m xeon_cluster.notice_watch JOB_DIR SIGNAL|none

`-I` and the working directory `/` keep the user's workdir (its own `training/` or `cluster.py`)
off the import path. Polls the metadata service with the built-in job's client
(training/imds.py: IMDSv2, stale notices left from before the start ignored, broken replies
survived); on an interruption notice it writes JOB_DIR/notice (JSON: the notice's `action` and
`time`, and `noticed_at`) and sends SIGNAL to every rank of the job recorded on this node. It
keeps no descriptor of the launch open, and exits once every rank recorded on this node has ended. Off the metadata
service's reach (not EC2, no XEON_IMDS_ENDPOINT) it only waits for the ranks, so no other machine ever calls
169.254.169.254.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

from xeon_cluster import NO_SIGNAL

RANK_WAIT_SECONDS = 60  # how long to wait for the first rank record
CHECK_SECONDS = 0.5


def _job_of(job_dir: Path) -> str:
    return job_dir.name


def rank_pids(job_dir: Path) -> tuple[bool, list[int]]:
    """Whether any rank of the job has been recorded on this node, and the pids of those that still
    run (checked by the job marker)."""
    host, marker = socket.gethostname(), f"XEON_CLUSTER_JOB={_job_of(job_dir)}".encode()
    recorded, pids = False, []
    for record in (job_dir / "ranks").glob("rank-*"):
        try:
            pid, _, where = record.read_text().split()[:3]
            if where != host:
                continue
            recorded = True
            if marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                pids.append(int(pid))
        except (OSError, ValueError):
            continue
    return recorded, pids


def write_notice(job_dir: Path, body: str) -> dict:
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = {}
    notice = {"action": parsed.get("action") if isinstance(parsed, dict) else None,
              "time": parsed.get("time") if isinstance(parsed, dict) else None,
              "noticed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    tmp = job_dir / "notice.tmp"
    tmp.write_text(json.dumps(notice) + "\n")
    tmp.replace(job_dir / "notice")
    return notice


def main(argv: list[str]) -> int:
    # Let go of every descriptor inherited from the rank's launch (MPI's PMI socket, the launcher's
    # output pipes): while this process held them, Intel MPI's proxy took the rank for still running
    # and a failed job's other ranks were not ended until this watcher exited.
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    import logging

    from training import hardware, imds

    logging.basicConfig(stream=sys.stdout, level=logging.WARNING, format="%(asctime)s %(message)s")
    job_dir, signal_name = Path(argv[0]), argv[1]
    signum = None if signal_name == NO_SIGNAL else getattr(signal, signal_name)
    poll = float(os.environ.get("XEON_CLUSTER_NOTICE_POLL_SECONDS", "5"))
    watcher = None
    if imds.watch_enabled("auto", on_ec2=hardware.on_ec2()):
        watcher = imds.InterruptionWatcher(imds.ImdsClient(imds.endpoint()), poll)
    start, next_poll, seen_rank, acted = time.monotonic(), 0.0, False, False
    while True:
        recorded, pids = rank_pids(job_dir)
        seen_rank = seen_rank or recorded
        if (seen_rank and not pids) or (not seen_rank and time.monotonic() - start > RANK_WAIT_SECONDS):
            return 0
        if watcher is not None and not acted and time.monotonic() >= next_poll:
            next_poll = time.monotonic() + poll
            body = watcher.poll_once()
            if body is not None:
                acted = True
                notice = write_notice(job_dir, body)
                sent = []
                for pid in pids:
                    if signum is not None:
                        try:
                            os.kill(pid, signum)
                            sent.append(pid)
                        except OSError:
                            pass
                print(f"spot interruption notice {notice}: " + (f"sent {signal_name} to {sent}" if signum
                      else "no signal sent (--notice-signal none)"), flush=True)
        time.sleep(CHECK_SECONDS)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
