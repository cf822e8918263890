"""A job's summary.json read back from the master, however odd or hostile it is: every reader goes
through cluster/job/jobsummary.py, which leaves malformed fields out with one warning line each and
never raises; `fab train`'s report and reclaim report say what they can, and the reclaim cleanup
still runs. The master is a test double (MasterDouble: files in a dict; the follow stand-ins are
those of tests/training/test_fab_train_report.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace as NS

import pytest

from cluster.job import jobreport, jobsummary
from node_setup.tasks import job_run as fab_train
from tests.unit.test_spend import MasterDouble

OUT = "xeon-cluster-runs/job-1"
GOOD = {"status": "interrupted", "steps": 30, "metrics": {"eval_loss": 0.5},
        "interruption": {"step": 30, "seen_by_rank": 0},
        "checkpoints": [{"step": 30, "path": f"{OUT}/checkpoint-30", "uri": None, "upload_error": "AccessDenied"}],
        "checkpoint_upload_errors": [{"step": 30, "error": "AccessDenied"}],
        "settings": {"checkpoint_uri": "s3://ckpt/run1", "backend": "gloo"}, "hosts": ["node0"]}

# text of summary.json -> the fields left out (each one warning line)
HOSTILE = {
    '{"metrics": [1]}': ["metrics"],
    '{"metrics": {"eval_loss": {"x": 1}, "ok": 1}}': ["metrics.eval_loss"],
    '{"metrics": {"a\\nb": 1}}': ['metrics["a\\nb"]'],
    '{"checkpoint_upload_errors": [{}]}': ["checkpoint_upload_errors[0]"],
    '{"checkpoint_upload_errors": [{"step": "30", "error": "x"}, 5]}':
        ["checkpoint_upload_errors[0]", "checkpoint_upload_errors[1]"],
    '{"checkpoint_upload_errors": "boom"}': ["checkpoint_upload_errors"],
    '{"checkpoints": [{"step": 30}], "interruption": {"step": 30}}': ["checkpoints[0]"],
    '{"checkpoints": [{"step": true, "path": "p"}]}': ["checkpoints[0]"],
    '{"checkpoints": {"step": 30}}': ["checkpoints"],
    '{"interruption": 30}': ["interruption"],
    '{"interruption": {"step": "30"}}': ["interruption"],
    '{"settings": ["checkpoint_uri"]}': ["settings"],
    '{"settings": {"checkpoint_uri": 5}}': ["settings.checkpoint_uri"],
    '{"status": {"a": 1}, "steps": [30]}': ["status", "steps"],
    '{"status": "completed\\n  train_loss: 0.0"}': ["status"],
}
NOT_AN_OBJECT = ["[1]", '"summary"', "null", "3", "{", "", "[" * 100_000]


@pytest.mark.parametrize("text", HOSTILE)
def test_malformed_fields_are_left_out_with_one_warning_line_each(text):
    summary, warnings = jobsummary.parse(text, "out/summary.json")
    assert summary is not None
    assert len(warnings) == len(HOSTILE[text])
    for line, field in zip(warnings, HOSTILE[text]):
        assert line.startswith(f"warning: out/summary.json: {field}: ") and "left out; allowed: " in line
        assert "\n" not in line
    # what is left is what the readers expect: they say what they can and do not raise
    printed = jobreport.summary_lines(summary, "out/summary.json", "node0")
    reclaim = jobreport.reclaim_report(summary, "node0")
    assert all("\n" not in line for line in printed + reclaim)


@pytest.mark.parametrize("text", NOT_AN_OBJECT, ids=lambda t: t[:10] or "empty")
def test_a_file_that_is_not_a_json_object_is_not_read(text):
    summary, warnings = jobsummary.parse(text)
    assert summary is None and len(warnings) == 1 and warnings[0].startswith("warning: summary.json: ")
    assert jobreport.reclaim_report(summary, "node0")[0].startswith("spot capacity was reclaimed, and node0 has no "
                                                                   "readable summary.json")


def test_a_well_formed_summary_is_kept_whole():
    summary, warnings = jobsummary.parse(json.dumps(GOOD))
    assert (summary, warnings) == (GOOD, [])
    assert jobsummary.parse(json.dumps({**GOOD, "interruption": None, "checkpoints": None}))[1] == []
    assert jobsummary.parse(None) == (None, [])  # no file: nothing to warn about, the caller says so


def test_a_checkpoint_a_full_disk_could_not_hold_is_read_and_reported_as_not_saved():
    """The job's record of such a checkpoint (training/callbacks.py): no path, the reason."""
    record = {"step": 30, "path": None, "uri": None, "upload_error": None,
              "save_error": "no space left on the device of /out/checkpoint-30 (256 KiB free)"}
    summary, warnings = jobsummary.parse(json.dumps({**GOOD, "interruption": {"step": 30}, "checkpoints": [record]}))
    assert warnings == [] and summary["checkpoints"] == [record]
    [line] = jobreport.reclaim_report(summary, "node0")
    assert line.startswith("spot capacity was reclaimed at step 30, and no checkpoint was saved at step 30 (no space "
                           "left on the device of /out/checkpoint-30 (256 KiB free))"), line


def test_checked_leaves_its_argument_as_it_was():
    data = {"settings": {"checkpoint_uri": 5, "backend": "gloo"}, "checkpoints": [{"step": 1}]}
    before = json.dumps(data)
    summary, _ = jobsummary.checked(data)
    assert json.dumps(data) == before
    assert summary == {"settings": {"backend": "gloo"}, "checkpoints": []}


def follow_to_end(monkeypatch, code, read):
    """`fab train`'s follow, the job ended with `code`; `read` stands in for reading a file on the master.
    Returns the calls of the cleanup (jobs.stop)."""
    stopped = []
    monkeypatch.setattr(fab_train.jobs, "follow", lambda *a, **k: None)
    monkeypatch.setattr(fab_train.jobs, "log_text", lambda master, job_id: "")
    monkeypatch.setattr(fab_train.jobs, "read_remote_record", lambda conn, path: read(path))
    plan = NS(job_id="job-1", launch=NS(rank_hosts=["node0", "node1"], launcher="mpirun"), output_dir=OUT, user=None,
              inventory=NS(master=NS(name="node0")))
    life = NS(transport=NS(master="node0", conns={"node0": object()}),  # the lifecycle: the job ended with `code`
              outcome=lambda job: jobreport.outcome(f"exited {code}", "", job.launch.rank_hosts),
              stop=lambda job, grace=10: stopped.append(job) or [])
    assert fab_train.follow_to_end(life, plan) == code
    return stopped


@pytest.mark.parametrize("text", list(HOSTILE) + NOT_AN_OBJECT, ids=lambda t: t[:40] or "empty")
@pytest.mark.parametrize("code", [0, 75])
def test_fab_train_reports_a_hostile_summary_without_a_traceback_and_still_cleans_up(monkeypatch, capsys, text, code):
    stopped = follow_to_end(monkeypatch, code, lambda path: text)
    out = capsys.readouterr().out
    assert "warning: " in out and "Traceback" not in out
    if code == 75:
        assert len(stopped) == 1 and "no rank of the job is left on any node" in out


def test_the_reclaim_cleanup_runs_when_the_summary_cannot_be_read_at_all(monkeypatch, capsys):
    def read(path):
        raise EOFError("the master went away")  # what paramiko raises when the session ends

    stopped = follow_to_end(monkeypatch, 75, read)
    out = capsys.readouterr().out
    assert len(stopped) == 1
    assert "what was saved cannot be read from node0 (EOFError: the master went away)" in out


@pytest.mark.parametrize("text", ['{"metrics": [1], "steps": 5}', "[" * 100_000, "[1]"],
                         ids=["bad field", "deep nesting", "a list"])
def test_the_records_added_to_summary_json_go_through_the_same_check(capsys, text):
    from cluster.cost import spend
    from node_setup.tasks.spend import record_cost

    path = "/out/job-9/summary.json"
    cost = spend.RunCost(2, 0.0, spend.LOCAL_NO_PRICE, None, "why")
    for add in (lambda master: record_cost(master, path, cost),):
        master = MasterDouble({path: text})
        added = add(master)
        out = capsys.readouterr().out
        assert "warning: /out/job-9/summary.json: " in out and "Traceback" not in out
        if text.startswith("{"):  # an object: the record is added, the malformed field left out
            assert added is True
            written = json.loads(master.files[path])
            assert "metrics" not in written and written["steps"] == 5
            assert spend.COST_KEY in written
        else:  # not an object: nothing to add to, the file is left as it was
            assert added is False and master.files[path] == text
