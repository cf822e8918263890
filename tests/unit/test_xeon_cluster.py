"""What a user's program imports on a node (xeon_cluster/): the notice signal the launch configured,
and the Trainer callbacks: the one that handles it, the one that records the job's progress."""

from __future__ import annotations

import json
import os
import signal
from types import SimpleNamespace

import pytest

import xeon_cluster
from cluster.job.request import OwnProgram
from tests.unit.test_jobplan import job_plan
from tests.unit.test_userjob import inventory

HANDLED = (signal.SIGUSR1, signal.SIGUSR2)


@pytest.fixture
def handlers():
    """The signal handlers as they were, put back after the test."""
    saved = {s: signal.getsignal(s) for s in HANDLED}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.mark.parametrize("value, expected", [(None, "SIGUSR1"), ("SIGUSR2", "SIGUSR2"), ("none", None),
                                             ("NONE", None)])
def test_the_notice_signal_is_the_launchs(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv(xeon_cluster.NOTICE_SIGNAL_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(xeon_cluster.NOTICE_SIGNAL_VARIABLE, value)
    assert xeon_cluster.notice_signal() == expected


@pytest.mark.parametrize("configured", ["SIGUSR2", None])
def test_the_callback_handles_the_signal_the_launch_gives_every_rank(monkeypatch, handlers, configured):
    pytest.importorskip("transformers")
    from xeon_cluster.callbacks import SpotNoticeCallback

    plan = job_plan(inventory(), 1, program=OwnProgram(script="train.py", signal=configured))
    for key, value in plan.launch.rank_env.items():  # what every rank's environment holds
        monkeypatch.setenv(key, value)
    for s in HANDLED:
        signal.signal(s, signal.SIG_IGN)
    callback = SpotNoticeCallback()
    if configured is None:  # --notice-signal none: no handler taken over
        assert callback.signal_name is None and all(signal.getsignal(s) == signal.SIG_IGN for s in HANDLED)
        return
    assert callback.signal_name == "SIGUSR2" and signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
    assert not callback.noticed
    os.kill(os.getpid(), signal.SIGUSR2)
    assert callback.noticed and callback.signalled


def test_a_signal_named_by_the_program_wins_over_the_launchs(monkeypatch, handlers):
    pytest.importorskip("transformers")
    from xeon_cluster.callbacks import SpotNoticeCallback

    monkeypatch.setenv(xeon_cluster.NOTICE_SIGNAL_VARIABLE, "SIGUSR2")
    assert SpotNoticeCallback("SIGUSR1").signal_name == "SIGUSR1"
    assert SpotNoticeCallback("none").signal_name is None


def test_the_trainer_callback_records_the_trainers_steps(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from xeon_cluster.callbacks import ProgressCallback

    monkeypatch.delenv("RANK", raising=False)
    args = SimpleNamespace(per_device_train_batch_size=8, gradient_accumulation_steps=2, world_size=4,
                           output_dir=str(tmp_path))
    state = SimpleNamespace(max_steps=50, global_step=0)
    callback = ProgressCallback()
    callback.on_train_begin(args, state, None)
    for step in (1, 2, 3):
        state.global_step = step
        callback.on_step_end(args, state, None)
    callback.on_train_end(args, state, None)
    record = json.loads((tmp_path / "progress.json").read_text())
    assert (record["step"], record["total"]) == (3, 50)
    assert callback.recorder.samples_per_step == 64  # the global batch
