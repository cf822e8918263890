"""Which processes a signal cannot end, so that stopping a local node waits only for those it can."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from node_setup.local.system import drops_signal

TERM = 1 << (signal.SIGTERM - 1)


def _proc(tmp_path: Path, *, ns_pid: str = "4242", ignored: int = 0, blocked: int = 0, caught: int = 0) -> Path:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "status").write_text(
        f"Name:\tx\nNSpid:\t7\t{ns_pid}\nSigBlk:\t{blocked:016x}\nSigIgn:\t{ignored:016x}\nSigCgt:\t{caught:016x}\n")
    return tmp_path


@pytest.mark.parametrize("case, expected", [
    (dict(), False),  # an ordinary process: SIGTERM's default action ends it
    (dict(ignored=TERM), True),
    (dict(blocked=TERM), True),  # `unshare --fork` while it waits for the node's init
    (dict(ns_pid="1"), True),  # a PID namespace's init without a handler: the kernel drops it
    (dict(ns_pid="1", caught=TERM), False),  # an init with a handler takes it
    (dict(caught=TERM), False),
])
def test_a_signal_is_dropped_only_where_the_kernel_would_drop_it(tmp_path, case, expected):
    assert drops_signal(7, signal.SIGTERM, proc=_proc(tmp_path, **case)) is expected


def test_a_gone_process_does_not_count_as_dropping(tmp_path):
    assert drops_signal(7, signal.SIGTERM, proc=tmp_path) is False
