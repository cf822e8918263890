"""A job's progress record: written by xeon_cluster/progress.py on rank 0 (what the built-in job's step timer
and xeon_cluster.callbacks.ProgressCallback use: tests/unit/test_xeon_cluster.py), read and checked by
cluster/job/jobprogress.py for `fab status`."""

from __future__ import annotations

import json

import pytest

from cluster.job import jobprogress
from xeon_cluster.progress import FILE, ProgressRecorder


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def read(directory) -> dict:
    return json.loads((directory / FILE).read_text())


def test_rank_0_records_steps_and_their_pace_after_the_first(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    clock = Clock()
    recorder = ProgressRecorder(total_steps=100, samples_per_step=32, directory=str(tmp_path), clock=clock)
    recorder.step(1)  # the first step carries the warm-up: no pace yet
    assert read(tmp_path) == {"format": 1, "step": 1, "total": 100, "steps_per_second": None,
                              "samples_per_second": None, "updated": 1000.0}
    for step in range(2, 12):  # 2 steps a second, written at most every 5 s
        clock.now += 0.5
        recorder.step(step)
    assert read(tmp_path)["step"] == 11 and read(tmp_path)["steps_per_second"] == 2.0
    clock.now += 0.5
    recorder.step(12)
    assert read(tmp_path)["step"] == 11  # not yet: the last write was less than 5 s ago
    recorder.finish()
    assert read(tmp_path) == {"format": 1, "step": 12, "total": 100, "steps_per_second": 2.0,
                              "samples_per_second": 64.0, "updated": 1005.5}
    progress, problem = jobprogress.parse((tmp_path / FILE).read_text(), "node0: progress.json")
    assert problem is None and (progress.step, progress.total, progress.samples_per_second) == (12, 100, 64.0)
    assert jobprogress.line(progress, now=1010.0, running_s=3600.0, usd_per_hour=2.5) == \
        "step 12 of 100 (12%), 64 samples/s, about 44s left, $2.50 so far (record 4s old)"


def test_other_ranks_write_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    recorder = ProgressRecorder(total_steps=10, directory=str(tmp_path))
    recorder.step(1)
    recorder.finish()
    assert not (tmp_path / FILE).exists()


@pytest.mark.parametrize(("text", "problem"), [
    ("{", "node0: progress.json: not JSON (Expecting property name enclosed in double quotes: line 1 column 2 "
          "(char 1))"),
    ('{"format": 2, "step": 1, "updated": 5}', "node0: progress.json: not a progress record of this version"),
    ('{"format": 1, "step": -1, "updated": 5}', "node0: progress.json: no step and time"),
    ('{"format": 1, "step": true, "updated": 5}', "node0: progress.json: no step and time"),
    ('{"format": 1, "step": 3, "updated": NaN}', "node0: progress.json: not JSON (NaN is not a number JSON allows)"),
])
def test_a_malformed_record_is_one_line_naming_node_and_file(text, problem):
    assert jobprogress.parse(text, "node0: progress.json") == (None, problem)


def test_what_cannot_be_known_is_said_so():
    assert jobprogress.parse(None, "x") == (None, None)
    progress, _ = jobprogress.parse('{"format": 1, "step": 7, "total": "many", "steps_per_second": -1, '
                                    '"samples_per_second": "fast", "updated": 100}', "x")
    assert (progress.total, progress.steps_per_second, progress.samples_per_second) == (None, None, None)
    assert jobprogress.line(progress, now=100.0, running_s=60.0, usd_per_hour=None) == \
        "step 7, samples/s not measured yet, cost so far unknown (no price for these nodes) (record 0s old)"
