"""The ranks' world records (cluster/job/worldcheck.py) read from every node of a job, over SSH.

Each node lists its record files as one `FILE<tab>CONTENT` line each: the name's line breaks, carriage
returns and tabs made `?`, the content's (at most RECORD_BYTES) spaces, so that neither can make a line
of its own; cluster/job/worldcheck.py checks every record whole and names a malformed one.
"""

from __future__ import annotations

import shlex

from cluster.job.launch import job_dir
from cluster.job.worldcheck import RECORD_BYTES, RECORD_GLOB, RECORDS_PER_NODE, parse_records
from cluster.names import printable
from node_setup.ssh.fanout import each_node


def records_folder(job_id: str) -> str:
    """The job's ranks folder, relative to the home (where the runner writes the records)."""
    return f"{job_dir(job_id)}/ranks"


def listing_command(job_id: str) -> str:
    """The shell command that lists a node's record files (nothing, exit 0, without the folder)."""
    return (f"cd && cd {shlex.quote(records_folder(job_id))} 2>/dev/null || exit 0; n=0; "
            f"for f in {RECORD_GLOB}; do {{ [ -f \"$f\" ] && [ ! -L \"$f\" ]; }} || continue; n=$((n + 1)); "
            f"[ \"$n\" -gt {RECORDS_PER_NODE} ] && break; "
            "printf '%s' \"$f\" | tr '\\n\\r\\t' '???'; printf '\\t'; "
            f"head -c {RECORD_BYTES} \"$f\" | tr '\\n\\r' '  '; echo; done; exit 0")


def read_records(conns, job_id: str) -> tuple[dict[int, dict], list[str]]:
    """(the well-formed records by rank, one line per node that could not be read or record left out)."""
    command = listing_command(job_id)

    def one(name: str, conn) -> tuple[str, str, str | None]:
        try:
            return name, conn.run(command, hide=True, in_stream=False, warn=True).stdout, None
        except Exception as exc:  # noqa: BLE001 - reported as the node's
            return name, "", printable(f"{name}: {type(exc).__name__}: {exc}")

    results = each_node(conns, one)
    found = parse_records(((name, text) for name, text, _ in results), records_folder(job_id))
    unread = [f"world: cannot read the records on {why}" for _, _, why in results if why]
    return found.by_rank, [*unread, *found.problems]
