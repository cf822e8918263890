"""A cluster's job history, kept on the controller (pure): what `fab jobs` and `fab get --job` still know
when the master that held a job's records was replaced or auto-stopped.

The master's records (cluster/job/joblist.py) are the truth while the master has them; every time fab
reads them they are merged into the history (`merged`), and the history's jobs that the master no longer
lists stay, marked with the master that had them. A job `fab train` starts goes in at once (`added`).
`loads`/`dumps` are the history file's text (node_setup/job_history.py keeps it in the controller's config
directory); the file is checked when it is read, as anything else is. `whereabouts` says where a job's
output may still be when its master is gone.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from typing import Sequence

from cluster.job.jobplan import JOB_ID_RE, shown
from cluster.job.joblist import ROW_FIELDS, STATES, UNKNOWN, JobRow, newest_named
from cluster.names import printable

FORMAT = 1
KEEP = 500  # jobs a history keeps (the newest)


def merged(history: Sequence[JobRow], master_rows: Sequence[JobRow]) -> list[JobRow]:
    """The master's rows and the history's jobs it no longer lists, newest first (at most KEEP). A job that
    the history last saw running but its master no longer lists has an unknown end."""
    listed = {row.id for row in master_rows}
    gone = [replace(row, state=UNKNOWN) if row.state == "running" else row for row in history if row.id not in listed]
    return sorted([*master_rows, *gone], key=lambda row: row.id, reverse=True)[:KEEP]


def added(history: Sequence[JobRow], row: JobRow) -> list[JobRow]:
    """The history with `row` in it (a job just started: the others are as they were), newest first."""
    return sorted([row, *(r for r in history if r.id != row.id)], key=lambda r: r.id, reverse=True)[:KEEP]


def dumps(rows: Sequence[JobRow]) -> str:
    return json.dumps({"format": FORMAT, "jobs": [asdict(row) for row in rows]}, indent=1) + "\n"


# Fields a history written before them lacks (read as None).
LATER_FIELDS = ("name", "loss", "samples_per_second", "run", "cost_usd")


def _row(item) -> JobRow | None:
    if isinstance(item, dict):
        item = {**dict.fromkeys(LATER_FIELDS), **item}
    if not isinstance(item, dict) or set(item) != set(ROW_FIELDS):
        return None
    if not isinstance(item["id"], str) or not JOB_ID_RE.match(item["id"]) or item["state"] not in STATES:
        return None
    for name in ("started", "output_dir", "launcher", "program", "checkpoint_uri", "master", "name", "run"):
        if item[name] is not None and not isinstance(item[name], str):
            return None
    for name in ("duration_s", "nodes", "ranks", "exit_code"):
        if item[name] is not None and (not isinstance(item[name], int) or isinstance(item[name], bool)):
            return None
    for name in ("loss", "samples_per_second", "cost_usd"):
        if item[name] is not None and (not isinstance(item[name], (int, float)) or isinstance(item[name], bool)):
            return None
    return JobRow(**item)


def loads(text: str, where: str) -> tuple[list[JobRow], str | None]:
    """(the history's rows, a problem as one line naming `where`, or None). A malformed entry is left out."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        return [], f"{where}: not JSON ({exc}); fab keeps a new history"
    if not isinstance(value, dict) or value.get("format") != FORMAT or not isinstance(value.get("jobs"), list):
        return [], f"{where}: not a job history of this version; fab keeps a new history"
    rows = [row for row in map(_row, value["jobs"]) if row is not None]
    skipped = len(value["jobs"]) - len(rows)
    return rows, (f"{where}: {skipped} malformed entr{'y' if skipped == 1 else 'ies'} left out" if skipped else None)


def find(rows: Sequence[JobRow], job_id: str) -> JobRow | None:
    """The row of `job_id`, or of the newest job named so (`fab train --name`), or None."""
    named = newest_named(rows, job_id)
    return next((row for row in rows if row.id in (job_id, named)), None)


def whereabouts(row: JobRow) -> list[str]:
    """Where the output of a job whose master is gone may still be (lines for `fab get`)."""
    lines = [f"job {row.id} ({printable(row.program or 'program unknown')}, {row.state}"
             + (f", exit code {row.exit_code}" if row.exit_code is not None else "")
             + f") ran on master {printable(row.master or '?')}, which no longer has it"]
    if row.output_dir:
        lines.append(f"its output folder was {shown(printable(row.output_dir))} on that master: on a disk the "
                     "nodes share, any node has it still; on the master's own disk it went with the master")
    if row.checkpoint_uri:
        lines.append(f"its checkpoints were uploaded to {printable(row.checkpoint_uri)} (`aws s3 cp --recursive "
                     f"{printable(row.checkpoint_uri)} DIR` copies them)")
    return lines
