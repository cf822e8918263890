"""The ranks' world records (cluster/job/worldcheck.py) read from every node of a job, over SSH."""

from __future__ import annotations

import shlex

from cluster.job.launch import job_dir
from cluster.job.worldcheck import RECORD_GLOB
from node_setup.ssh.fanout import each_node


def read_records(conns, job_id: str) -> tuple[list[str], list[str]]:
    """(every node's record lines, the nodes that could not be read, with why)."""
    folder = shlex.quote(f"{job_dir(job_id)}/ranks")
    command = (f"cd && cd {folder} 2>/dev/null || exit 0; "
               f"for f in {RECORD_GLOB}; do [ -f \"$f\" ] && {{ cat \"$f\"; echo; }}; done; exit 0")

    def one(name: str, conn) -> tuple[str, str | None]:
        try:
            return conn.run(command, hide=True, in_stream=False, warn=True).stdout, None
        except Exception as exc:  # noqa: BLE001 - reported as the node's
            return "", f"{name}: {type(exc).__name__}: {exc}"

    results = each_node(conns, one)
    return [text for text, _ in results], [why for _, why in results if why]
