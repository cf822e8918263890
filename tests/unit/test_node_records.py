"""Every record read back from a node, through the one reader (cluster/records.py), with hypothesis: job.json
and the job list, progress.json, summary.json, the supervisor's state.json, the ranks' world records and the
idle auto-stop's status (its `unstopped` file). Whatever a hostile node writes (any JSON, any text, nesting
60,000 deep, 1e400, 1e-320, '²', terminal escapes, wrong types in every known field), reading and then
showing it gives values or one-line problems naming the file: never an exception, and nothing a terminal
would take for an escape sequence.
"""

from __future__ import annotations

import base64
import json
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster import records
from cluster.job import joblist, jobprogress, jobsummary, logstream, worldcheck
from cluster.names import printable
from cluster.node import autostop
from cluster.run import supervision
from xeon_cluster import progress as progress_format

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HOSTILE_TEXT = st.sampled_from(["\x1b]0;owned\x07", "\x1b[2J", "a\nb", "\u202e", "²", "\x9b31m", "\x00"])
SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(10 ** 30), max_value=10 ** 30)
           | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([1e-320, 5e-324, 1e308, -0.0])
           | st.text(max_size=20) | HOSTILE_TEXT)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8) | HOSTILE_TEXT, inner, max_size=4), max_leaves=12)
# text no parser copes with by itself: deep nesting, numbers past a float, a bare unicode digit
NASTY = st.sampled_from(["[" * 60_000, '{"a":' * 5_000 + "1" + "}" * 5_000, '{"step": 1e400}', "1e-320", "²",
                         "9" * 5_000, '{"x": NaN}', "\ufeff{}", "[" * 33 + "]" * 33])


def record_texts(fields: dict) -> st.SearchStrategy[str]:
    """A record's JSON with its own fields, each either a good value or anything, or any JSON, or nasty text."""
    shaped = st.fixed_dictionaries({}, optional={k: st.one_of(good, VALUES) for k, good in fields.items()})
    return st.one_of(shaped.map(json.dumps), VALUES.map(json.dumps), NASTY, st.text(max_size=60))


def one_line_naming(line: str, where: str) -> None:
    assert "\n" not in line and printable(line) == line and where in line, line


def test_the_reader_refuses_each_kind_of_hostile_record_in_one_line():
    for text, why in (("[" * 60_000, "nested more than"), ('{"a": 1e400}', "out of range"),
                      ("[1e-320]", "out of range"), ('{"a": NaN}', "NaN"), ("1" * 40, "digits"),
                      ("x" * (records.MAX_BYTES + 1), "larger than"),
                      (records.REFUSED, "not a regular file")):
        with pytest.raises(records.RecordError, match=why) as caught:
            records.load(text, "node0: ~/f.json")
        one_line_naming(str(caught.value), "node0: ~/f.json")
    assert records.whole("²") is None and records.whole("12") == 12 and records.number("1e400") is None


def test_on_the_node_a_link_or_a_device_is_refused_and_a_file_is_read_bounded(tmp_path):
    (tmp_path / "big").write_text("x" * 100)
    (tmp_path / "zero").symlink_to("/dev/zero")
    (tmp_path / "fifo").touch()

    def read(name: str, limit: int = records.MAX_BYTES) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", "-c", records.read_command(name, limit)], env={"HOME": str(tmp_path),
                              "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=30)

    assert read("zero").stdout == records.REFUSED  # a link: not followed (here it would never end)
    assert read("big", 10).stdout == "x" * 11  # limit + 1 bytes: the reader sees it is larger
    assert read("missing").returncode == 3
    with pytest.raises(records.RecordError, match="larger than 10 bytes"):
        records.load(read("big", 10).stdout, "big", limit=10)


JOB_FIELDS = {"hosts": st.lists(st.text(max_size=6)), "world_size": st.integers(1, 64), "started": st.just(
    "2026-01-02T03:04:05Z"), "output_dir": st.text(max_size=12), "launcher": st.sampled_from(["mpirun", "torchrun"]),
    "script": st.text(max_size=8), "task": st.text(max_size=8), "checkpoint_uri": st.text(max_size=12)}


@FAST
@given(record_texts(JOB_FIELDS), st.one_of(st.text(max_size=5), HOSTILE_TEXT, st.sampled_from(["0", "²", "1e400"])))
def test_job_records_and_the_job_list(text, exit_code):
    where = "node0: ~/.xeon-cluster/jobs/20260102-030405-aaaa/job.json"
    record, problem = joblist.job_record(text, where)
    assert isinstance(record, dict)
    if problem:
        one_line_naming(problem, where)
    b64 = lambda t: base64.b64encode(t.encode()).decode()  # noqa: E731 - what job-list.sh sends
    answer = json.dumps({"now": 1767323045, "jobs": [{"id": "20260102-030405-aaaa", "state": "exited", "ended": 1,
                                                      "exit_code": b64(exit_code), "job_json": b64(text)}]})
    for listing in (answer, text):
        rows, problems = joblist.parse(listing, "node0")
        for line in problems:
            one_line_naming(line, "node0")
        for line in joblist.table(rows, "lab", "node0").splitlines():
            assert printable(line) == line


PROGRESS_FIELDS = {"format": st.just(progress_format.FORMAT), "step": st.integers(0, 10 ** 6),
                   "total": st.integers(1, 10 ** 6), "updated": st.floats(0, 2e9),
                   "steps_per_second": st.floats(0, 100), "samples_per_second": st.floats(0, 1000)}


@FAST
@given(record_texts(PROGRESS_FIELDS))
def test_progress_records(text):
    record, problem = jobprogress.parse(text, "node0: out/progress.json")
    if problem:
        one_line_naming(problem, "node0: out/progress.json")
    if record is not None:
        shown = jobprogress.line(record, now=2e9, running_s=60.0, usd_per_hour=1.5)
        assert printable(shown) == shown
        json.dumps(jobprogress.as_json(record, running_s=60.0, usd_per_hour=1.5))


SUMMARY_FIELDS = {"status": st.sampled_from(["completed", "interrupted"]), "steps": st.integers(0, 100),
                  "max_steps": st.integers(1, 100), "train_loss": st.floats(0, 10),
                  "samples_per_second": st.floats(0, 100), "metrics": st.dictionaries(st.text(max_size=4), VALUES),
                  "interruption": VALUES, "settings": VALUES}


@FAST
@given(record_texts(SUMMARY_FIELDS))
def test_summary_records(text):
    summary, warnings = jobsummary.parse(text, "node0: out/summary.json")
    for line in warnings:
        one_line_naming(line, "node0: out/summary.json")
    if summary is not None:
        shown = logstream.summary_line(summary)
        assert printable(shown) == shown


STATE_FIELDS = {"run": st.just("20260102-030405-aaaa"), "status": st.sampled_from(supervision.STATUSES),
                "job": st.none(), "nodes": st.lists(st.text(max_size=5)), "recoveries": st.integers(0, 9),
                "awaiting": st.lists(st.text(max_size=5)), "line": st.text(max_size=20), "restart": VALUES}


@FAST
@given(record_texts(STATE_FIELDS))
def test_supervisor_state_records(text):
    where = "node0: ~/.xeon-cluster/runs/current/state.json"
    try:
        state, problems = supervision.checked_state(records.load(text, where), where)
    except records.RecordError as exc:
        state, problems = None, [str(exc)]
    for line in problems:
        one_line_naming(line, where)
    if state is not None:
        shown = supervision.status_line(state)
        assert printable(shown) == shown and state["status"] in supervision.STATUSES


WORLD_FIELDS = {"rank": st.integers(0, 8), "expected": st.integers(1, 8), "largest": st.integers(0, 8),
                "joined": st.booleans()}


@FAST
@given(st.lists(record_texts(WORLD_FIELDS), max_size=3))
def test_world_records(texts):
    listing = "".join(f"world-{i}.json\t{t.replace(chr(10), ' ').replace(chr(13), ' ')}\n" for i, t in enumerate(texts))
    found = worldcheck.parse_records([("node1", listing)], "ranks")
    for line in found.problems:
        one_line_naming(line, "node1")
    worldcheck.verdict(found.by_rank, 4)


STATUS_KEYS = st.sampled_from(["armed", "idle", "mode", "since", "last", "running", "now", "deadline",
                               "powered_off", "unstopped", "unstopped_at", "nodes", "installed"])
STATUS_VALUES = st.one_of(st.text(max_size=12), HOSTILE_TEXT, st.sampled_from(
    ["1e400", "1e-320", "nan", "inf", "yes", "-5", "1e15", "node1 (unlisted)"]))


@FAST
@given(st.lists(st.tuples(STATUS_KEYS, STATUS_VALUES), max_size=8))
def test_auto_stop_status_and_its_unstopped_file(pairs):
    status = autostop.parse_status("".join(f"{k}={v}\n" for k, v in pairs))
    for line in (autostop.status_line(status), autostop.problem(status) or ""):
        assert printable(line) == line
    assert all(printable(name) == name for name in (*status.unstopped, *status.nodes))


@pytest.mark.parametrize("text", ['{"status": "running", "run": "20260102-030405-aaaa", "nodes": 5}', "[" * 60_000,
                                  '{"status": "running", "run": "\\u001b]0;x\\u0007"}', records.REFUSED])
def test_fab_stop_reads_a_hostile_state_file_in_one_line_and_goes_on(text):
    """`fab stop` asks the supervisor to stop first (request_stop): a state file it cannot use is one line."""
    from types import SimpleNamespace

    from node_setup.ssh import recovery

    class Master:  # test double of the master's connection: every command answered with the state file
        host = "node0"
        ran: list[str] = []

        def run(self, command, **_):
            self.ran.append(command)
            return SimpleNamespace(ok=True, stdout=text)

    said: list[str] = []
    state = recovery.supervised_state(Master(), say=said.append)
    assert all("\n" not in line and printable(line) == line and "node0: ~/" in line for line in said) and said
    assert state is None or "nodes" not in state

