"""`fab jobs`: the master's job records (cluster/shell/job-list.sh's JSON answer) as rows, newest first.

Pure. Everything here was read from a node, so nothing is trusted: `parse(answer, node)` decodes the one
JSON answer the master gave and checks every record (`job_record` checks a job.json, which
node_setup/ssh/job.py's read_metadata uses too); a record that is malformed (a job.json that is not JSON,
not an object or has a field of the wrong type, an exit code that is no number) is one line naming the
node and the file, and its row shows what could be read ("unknown" for the rest), never an exception.
Each row has the job's name (`fab train --name`) and what it measured (final loss and samples per second,
from its summary.json and progress.json in its output folder, which job-list.sh reads through the job
directory's `output` link). `table(rows)` and `as_json(rows)` show the rows (the table a supervised run's jobs
beneath their run's line); every text in the table goes
through cluster/names.py's `printable` (no escape sequence or control character from a node reaches the terminal).

States: running, completed (exit code 0), failed (another code), interrupted (the code of a spot
reclaim: cluster/exit_codes.py INTERRUPTED), stopped (`fab stop` ended it; its exit code is the
launcher's, once it returned) and unknown (the job script is gone without an exit code, e.g. the master
restarted, or its records cannot be read).
"""

from __future__ import annotations

import base64
import binascii
import calendar
import json
import time
from dataclasses import asdict, dataclass, fields, replace
from typing import Sequence

from cluster.job.jobplan import JOB_ID_RE, shown
from cluster import exit_codes
from cluster.job.launch import JOBS_DIR, LAUNCHERS
from cluster import records
from cluster.cost.spend import COST_KEY
from cluster.job import jobprogress, jobsummary
from cluster.names import JOB_NAME_RE, printable

UNKNOWN = "unknown"
STATES = ("running", "completed", "failed", "interrupted", "stopped", UNKNOWN)
_MASTER_STATES = ("running", "stopped", "exited", "lost")  # what job-list.sh says of a job


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
    program: str | None = None  # "built-in qa", "script train.py", "module pkg.train"
    checkpoint_uri: str | None = None  # where the built-in job uploads its checkpoints
    master: str | None = None  # the master that held its records (the job history: cluster/job/jobhistory.py)
    name: str | None = None  # `fab train --name`
    loss: float | None = None  # the final training loss (its summary.json's train_loss)
    samples_per_second: float | None = None  # its summary.json's, else its progress record's (progress.json)
    run: str | None = None  # the supervised run (`fab train --managed`) it is a job of
    cost_usd: float | None = None  # what `fab train` recorded it cost (its summary's cost record)


def epoch(stamp) -> int | None:
    if not isinstance(stamp, str):
        return None
    try:
        return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return None


def _int(text) -> int | None:
    return records.whole(str(text), -(10 ** 11), 10 ** 11)  # ASCII digits only ('²' is a digit to str.isdigit)


def _count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _strings(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


# job.json's fields that fab reads, and what each must be.
_CHECKS = {
    "started": (lambda v: epoch(v) is not None, "a time such as 2026-01-02T03:04:05Z"),
    "hosts": (lambda v: _strings(v) and bool(v), "a list of node names"),
    "rank_hosts": (_strings, "a list of node names"),
    "world_size": (lambda v: _count(v) is not None, "a whole number"),
    "output_dir": (lambda v: isinstance(v, str) and bool(v), "a path"),
    "launcher": (lambda v: v in LAUNCHERS, f"one of {', '.join(LAUNCHERS)}"),
    "task": (lambda v: isinstance(v, str), "a task name"),
    "script": (lambda v: isinstance(v, str) and bool(v), "a script's path"),
    "module": (lambda v: isinstance(v, str) and bool(v), "a module name"),
    "checkpoint_uri": (lambda v: isinstance(v, str), "an s3:// URI"),
    "supervised_run": (lambda v: isinstance(v, str) and JOB_ID_RE.match(v) is not None, "a run id"),
    "name": (lambda v: isinstance(v, str) and JOB_NAME_RE.fullmatch(v) is not None, "a job name (fab train --name)"),
}


# job-list.sh's answer: every job's records, each file read bounded there (job.json: 64 KiB)
LIST_LIMIT = 256 * records.MAX_BYTES


def job_file(job_id: str, name: str = "job.json") -> str:
    """A file of the job's directory on the master, as a line names it."""
    return f"~/{JOBS_DIR}/{job_id}/{name}"


def job_record(text: str | None, where: str) -> tuple[dict, str | None]:
    """A job.json's fields, checked: (every field, those fab reads only when they are what they must be; the
    first problem as one line naming `where`, or None). Missing text is no problem (an empty record)."""
    try:
        value = records.load_object(text, where)
    except records.RecordError as exc:
        return {}, str(exc)
    if value is None:
        return {}, None
    problem = None
    for key, (check, allowed) in _CHECKS.items():
        if key in value and not check(value[key]):
            problem = problem or f"{where}: {key} is {printable(repr(value[key]))[:60]}, not {allowed}"
            del value[key]
    return value, problem


def program_of(record: dict) -> str | None:
    """What the job ran, in a few words: the built-in job and its task, or your script or module (job.json's
    fields, which cluster/job/jobplan.py writes from the run's request)."""
    for kind in ("script", "module"):
        if record.get(kind):
            return f"{kind} {record[kind]}"
    if "task" not in record:
        return None
    return f"built-in {record['task']}" if record["task"] else "built-in"


def _decoded(value, field: str, where: str, problems: list[str]) -> str | None:
    if value in (None, ""):
        return None
    try:
        return base64.b64decode(str(value), validate=True).decode("utf-8", errors="replace")
    except (binascii.Error, ValueError):
        problems.append(f"{where}: its {field} is not what job-list.sh sends (base64)")
        return None


def _row(item: dict, now: int | None, node: str, problems: list[str]) -> JobRow | None:
    job_id = item.get("id")
    if not isinstance(job_id, str) or not JOB_ID_RE.match(job_id):
        problems.append(f"{node}: a job record with no job id ({printable(repr(job_id))[:40]}) left out")
        return None
    where = f"{node}: {job_file(job_id)}"
    state, code = UNKNOWN, None
    exit_text = _decoded(item.get("exit_code"), "exit_code", f"{node}: {job_file(job_id, 'exit_code')}", problems)
    if exit_text is not None:
        code = _int(exit_text.partition("\n")[0])
        if code is None:
            problems.append(f"{node}: {job_file(job_id, 'exit_code')}: {printable(exit_text)[:30]!r} is no exit code")
    said = item.get("state")
    if said == "running":
        state = "running"
    elif said == "stopped":
        state = "stopped"
    elif said == "exited" and code is not None:
        state = "completed" if code == 0 else "interrupted" if code == exit_codes.INTERRUPTED else "failed"
    elif said not in _MASTER_STATES:
        problems.append(f"{where}: state {printable(repr(said))[:30]} is not one job-list.sh says")
    meta, problem = job_record(_decoded(item.get("job_json"), "job.json", where, problems), where)
    if problem:
        problems.append(problem)
    row = row_of(job_id, meta, node, state=state, exit_code=None if state == "running" else code,
                 end=now if state == "running" else _count(item.get("ended")))
    return _with_results(row, _decoded(item.get("summary"), "summary.json", f"{where} (output)", problems),
                         _decoded(item.get("progress"), jobprogress.FILE, f"{where} (output)", problems), where)


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _with_results(row: JobRow, summary_text: str | None, progress_text: str | None, where: str) -> JobRow:
    """The row with what the job measured: its summary's final loss and samples per second, else its progress
    record's samples per second (each checked; a malformed record gives nothing, as a missing one)."""
    summary, _ = jobsummary.parse(summary_text, f"{where}: summary.json")
    progress, _ = jobprogress.parse(progress_text, f"{where}: {jobprogress.FILE}")
    summary = summary or {}
    speed = _number(summary.get("samples_per_second"))
    if speed is None and progress is not None:
        speed = progress.samples_per_second
    cost = summary.get(COST_KEY)
    return replace(row, loss=_number(summary.get("train_loss")), samples_per_second=speed,
                   cost_usd=_number(cost.get("actual_usd")) if isinstance(cost, dict) else None)


def row_of(job_id: str, meta: dict, master: str, *, state: str = "running", exit_code: int | None = None,
           end: int | None = None) -> JobRow:
    """The row of a job from its checked job.json (`job_record`), kept on `master`; `end`: epoch seconds."""
    start = epoch(meta.get("started"))
    duration = end - start if start is not None and end is not None and end >= start else None
    return JobRow(job_id, state, meta.get("started"), duration, len(meta["hosts"]) if "hosts" in meta else None,
                  meta.get("world_size"), exit_code, meta.get("output_dir"), meta.get("launcher"), program_of(meta),
                  meta.get("checkpoint_uri"), master, meta.get("name"), run=meta.get("supervised_run") or None)


def parse(answer: str, node: str) -> tuple[list[JobRow], list[str]]:
    """(the rows of job-list.sh's answer from `node`, newest first (job ids begin with their start time); the
    problems found, one line each, naming the node and the file)."""
    try:
        value = records.load(answer, f"{node}: the job list", limit=LIST_LIMIT)
    except records.RecordError as exc:
        return [], [f"{node}: the job list is {exc.why}; is this project's job-list.sh what ran there?"]
    if not isinstance(value, dict) or not isinstance(value.get("jobs"), list):
        return [], [f"{node}: the job list is not the object job-list.sh writes"]
    now = _count(value.get("now"))
    problems: list[str] = []
    rows = [row for item in value["jobs"] if isinstance(item, dict)
            for row in [_row(item, now, node, problems)] if row is not None]
    return sorted(rows, key=lambda r: r.id, reverse=True), problems


def newest_named(rows: Sequence[JobRow], name: str) -> str | None:
    """The id of the newest job named `name` (`fab train --name`), or None."""
    return max((row.id for row in rows if row.name == name), default=None)  # ids begin with their start time


def duration_text(seconds: int | None) -> str:
    if seconds is None:
        return UNKNOWN
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _shown(value) -> str:
    return UNKNOWN if value is None else printable(value)


def _figure(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def grouped(rows: Sequence[JobRow]) -> list[tuple[str | None, list[JobRow]]]:
    """The rows (newest first) in the order `fab jobs` shows them: a supervised run's jobs together under
    their run (the group where its newest job is, its jobs newest first), every other job a group of its own
    (run None)."""
    groups: list[tuple[str | None, list[JobRow]]] = []
    runs: dict[str, list[JobRow]] = {}
    for row in sorted(rows, key=lambda r: r.id, reverse=True):
        if row.run is None:
            groups.append((None, [row]))
        elif row.run in runs:
            runs[row.run].append(row)
        else:
            runs[row.run] = [row]
            groups.append((row.run, runs[row.run]))
    return groups


def run_line(run: str, jobs: Sequence[JobRow]) -> str:
    """A supervised run's line above its jobs (newest first): its id, its jobs and recoveries, its newest job's
    state."""
    return (f"  supervised run {printable(run)}: {len(jobs)} job(s), {len(jobs) - 1} recovery(ies); "
            f"the newest {jobs[0].state}")


def table(rows: list[JobRow], cluster: str, master: str | None = None) -> str:
    """The rows as `fab jobs` prints them (a supervised run's jobs beneath its run's line, `grouped`). A row
    from the job history whose records are not on `master` (the master was replaced) says so in its output
    column."""
    if not rows:
        return f"no job on cluster {printable(cluster)} yet (fab train starts one)"
    width = max([len(_shown(r.program)) for r in rows] + [7])
    named = max([len(printable(r.name)) for r in rows if r.name] + [4])
    indent = 2 if any(r.run is not None for r in rows) else 0  # a run's jobs sit beneath its line
    header = (f"  {'job':<{20 + indent}} {'name':<{named}} {'state':<12} {'started (UTC)':<21} {'duration':<9} "
              f"{'nodes':>5} {'ranks':>5} {'exit':>7} {'loss':>8} {'samples/s':>9}  {'program':<{width}}  output")
    lines = [f"jobs on cluster {printable(cluster)}, newest first:", header]
    for run, group in grouped(rows):
        if run is not None:
            lines.append(run_line(run, group))
        for r in group:
            output = shown(printable(r.output_dir)) if r.output_dir else UNKNOWN
            if master is not None and r.master not in (None, master):
                output += f" (on {printable(r.master)}, a master since replaced: `fab get --job {r.id}` says where)"
            job = f"{' ' * indent}{r.id:<20}" if run is not None else f"{r.id:<{20 + indent}}"
            lines.append(f"  {job} {printable(r.name or '-'):<{named}} {r.state:<12} {_shown(r.started):<21} "
                         f"{duration_text(r.duration_s):<9} {_shown(r.nodes):>5} {_shown(r.ranks):>5} "
                         f"{_shown(r.exit_code):>7} {_figure(r.loss, 4):>8} {_figure(r.samples_per_second, 1):>9}  "
                         f"{_shown(r.program):<{width}}  {output}")
    return "\n".join(lines)


def as_json(rows: list[JobRow], cluster: str, problems: Sequence[str] = ()) -> str:
    """One JSON object: the cluster, its jobs, newest first (null where a record is missing), and the problems."""
    return json.dumps({"cluster": cluster, "jobs": [asdict(r) for r in rows], "problems": list(problems)}, indent=2)


ROW_FIELDS = tuple(f.name for f in fields(JobRow))
