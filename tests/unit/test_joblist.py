"""`fab jobs`'s reading of the master's records (cluster/job/joblist.py): states, durations, and "unknown"
for whatever is missing or malformed, never an exception. The text is what cluster/shell/job-list.sh
prints; the script itself runs against real job directories in tests/ssh/test_jobs_list.py."""

from __future__ import annotations

import json

from cluster.job.joblist import as_json, parse, table

META = {"started": "2026-01-02T03:04:05Z", "hosts": ["node0", "node1"], "world_size": 4,
        "output_dir": "xeon-cluster-runs/20260102-030405-aaaa", "launcher": "mpirun"}


def record(job_id: str, *lines: str, meta: str | None = None) -> str:
    return "\n".join([f"@@job {job_id}", *lines, "@@json", json.dumps(META) if meta is None else meta, "@@end"])


def test_states_durations_and_newest_first():
    start = 1767323045  # 2026-01-02T03:04:05Z
    text = "\n".join([f"now {start + 3700}",
                      record("20260102-030405-aaaa", "exited 0", f"ended {start + 65}"),
                      record("20260102-030406-bbbb", "exited 1", f"ended {start + 5}"),
                      record("20260102-030407-cccc", "exited 75", f"ended {start + 5}"),
                      record("20260102-030408-dddd", "stopped 2026-01-02T03:05:00Z", f"ended {start + 55}"),
                      record("20260102-030409-eeee", "running 123")])
    rows = parse(text)
    assert [(r.id[-4:], r.state, r.exit_code, r.duration_s) for r in rows] == [
        ("eeee", "running", None, 3700), ("dddd", "stopped", None, 55), ("cccc", "interrupted", 75, 5),
        ("bbbb", "failed", 1, 5), ("aaaa", "completed", 0, 65)]
    assert (rows[0].nodes, rows[0].ranks, rows[0].started) == (2, 4, "2026-01-02T03:04:05Z")
    shown = table(rows, "lab").splitlines()
    assert shown[2].split()[:5] == ["20260102-030409-eeee", "running", "2026-01-02T03:04:05Z", "1h01m", "2"]
    assert shown[-1].split()[3] == "1m05s"


def test_missing_or_malformed_records_show_as_unknown():
    text = "\n".join(["now 1767323100",
                      record("20260102-030405-aaaa", "exited banana", meta="{not json"),
                      record("20260102-030406-bbbb", "lost", meta=""),
                      record("20260102-030407-cccc", "exited 0", "ended soon",
                             meta=json.dumps({"started": 5, "hosts": "node0", "world_size": "4", "output_dir": 7})),
                      record("20260102-030408-dddd", "running 9", meta="[1, 2]"),
                      record("current", "running 1"),  # no job id: not a job of fab train
                      "@@job 20260102-030409-eeee"])  # cut off mid-record
    rows = {r.id[-4:]: r for r in parse(text)}
    assert set(rows) == {"aaaa", "bbbb", "cccc", "dddd", "eeee"}
    assert [rows[k].state for k in ("aaaa", "bbbb", "cccc", "dddd", "eeee")] == [
        "unknown", "unknown", "completed", "running", "unknown"]
    for row in rows.values():
        assert (row.started, row.duration_s, row.nodes, row.ranks, row.output_dir) == (None, None, None, None, None)
    line = next(line for line in table(list(rows.values()), "lab").splitlines() if "aaaa" in line)
    assert line.split()[1:] == ["unknown"] * 7
    assert json.loads(as_json(parse(text), "lab"))["jobs"][0]["state"] == "unknown"


def test_no_job_yet():
    assert parse("now 5\n") == []
    assert table([], "lab") == "no job on cluster lab yet (fab train starts one)"
