"""`fab jobs`: the master's job records (cluster/shell/job-list.sh's answer) as rows, newest first.

Pure: `parse(text)` reads the one answer the master gave, `table(rows)` and `as_json(rows)` show
it. A record that is missing or malformed (no job.json, a job.json that is not a JSON object, a
field of the wrong type, an exit code that is no number) shows as "unknown", never an exception.

States: running, completed (exit code 0), failed (another code), interrupted (the code of a spot
reclaim: training/exit_codes.py INTERRUPTED), stopped (`fab stop` ended it) and unknown (the job
script is gone without an exit code, e.g. the master restarted, or its records cannot be read).
"""

from __future__ import annotations

import calendar
import json
import time
from dataclasses import asdict, dataclass

from cluster.job.jobplan import JOB_ID_RE, shown

INTERRUPTED_CODE = 75  # training/exit_codes.py INTERRUPTED (cluster/ imports nothing from training/)
UNKNOWN = "unknown"
STATES = ("running", "completed", "failed", "interrupted", "stopped", UNKNOWN)


@dataclass(frozen=True)
class JobRow:
    id: str
    state: str
    started: str | None  # as job.json has it: 2026-01-02T03:04:05Z
    duration_s: int | None
    nodes: int | None
    ranks: int | None
    exit_code: int | None
    output_dir: str | None
    launcher: str | None


def _epoch(stamp) -> int | None:
    if not isinstance(stamp, str):
        return None
    try:
        return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return None


def _int(text) -> int | None:
    text = str(text).strip()
    return int(text) if text.lstrip("-").isdigit() else None


def _count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _row(job_id: str, lines: list[str], meta_text: str, now: int | None) -> JobRow:
    fields = dict(line.partition(" ")[::2] for line in lines)
    state, code = UNKNOWN, None
    if "running" in fields:
        state = "running"
    elif "stopped" in fields:
        state = "stopped"
    elif "exited" in fields:
        code = _int(fields["exited"])
        if code is not None:
            state = "completed" if code == 0 else "interrupted" if code == INTERRUPTED_CODE else "failed"
    try:
        meta = json.loads(meta_text) if meta_text.strip() else {}
    except ValueError:
        meta = {}
    if not isinstance(meta, dict):
        meta = {}
    started = meta.get("started") if _epoch(meta.get("started")) is not None else None
    start = _epoch(started)
    end = now if state == "running" else _int(fields.get("ended", ""))
    duration = end - start if start is not None and end is not None and end >= start else None
    hosts = meta.get("hosts")
    nodes = len(hosts) if isinstance(hosts, list) and hosts else None
    output = meta.get("output_dir") if isinstance(meta.get("output_dir"), str) and meta.get("output_dir") else None
    launcher = meta.get("launcher") if isinstance(meta.get("launcher"), str) else None
    return JobRow(job_id, state, started, duration, nodes, _count(meta.get("world_size")), code, output, launcher)


def parse(text: str) -> list[JobRow]:
    """The rows of job-list.sh's answer, newest first (job ids begin with their start time).

    A directory whose name is no job id (cluster/job/jobplan.py JOB_ID_RE) is left out: no `fab train` made it.
    """
    now: int | None = None
    rows: list[JobRow] = []
    job_id: str | None = None
    lines: list[str] = []
    meta: list[str] = []
    in_json = False

    def flush():
        if job_id is not None and JOB_ID_RE.match(job_id):
            rows.append(_row(job_id, lines, "\n".join(meta), now))

    for line in text.splitlines():
        if line.startswith("@@job "):
            flush()
            job_id, lines, meta, in_json = line[6:].strip(), [], [], False
        elif line == "@@json":
            in_json = True
        elif line == "@@end":
            in_json = False
        elif in_json:
            meta.append(line)
        elif job_id is None and line.startswith("now "):
            now = _int(line[4:])
        elif job_id is not None:
            lines.append(line.strip())
    flush()
    return sorted(rows, key=lambda r: r.id, reverse=True)


def duration_text(seconds: int | None) -> str:
    if seconds is None:
        return UNKNOWN
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _shown(value) -> str:
    return UNKNOWN if value is None else str(value)


def table(rows: list[JobRow], cluster: str) -> str:
    if not rows:
        return f"no job on cluster {cluster} yet (fab train starts one)"
    header = (f"  {'job':<20} {'state':<12} {'started (UTC)':<21} {'duration':<9} {'nodes':>5} {'ranks':>5} "
              f"{'exit':>7}  output")
    lines = [f"jobs on cluster {cluster}, newest first:", header]
    for r in rows:
        lines.append(f"  {r.id:<20} {r.state:<12} {_shown(r.started):<21} {duration_text(r.duration_s):<9} "
                     f"{_shown(r.nodes):>5} {_shown(r.ranks):>5} {_shown(r.exit_code):>7}  "
                     f"{shown(r.output_dir) if r.output_dir else UNKNOWN}")
    return "\n".join(lines)


def as_json(rows: list[JobRow], cluster: str) -> str:
    """One JSON object: the cluster and its jobs, newest first (null where a record is missing)."""
    return json.dumps({"cluster": cluster, "jobs": [asdict(r) for r in rows]}, indent=2)
