"""Idle auto-stop on local clusters of their own (their nodes go down): `fab autostop`, the service
on the master, a `fab exec` resetting the clock, `--cancel`, and the local power-off through each
node's metadata service (never a real power-off). Short idle times and a 1 s poll; about 45 s.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from cluster import autostop
from node_setup.local import imds_server
from node_setup.local import system as local_system
from tests.ssh.conftest import FAB, REPO_ROOT, run_fab

pytestmark = [pytest.mark.ssh]

IDLE_S = 6
CANCEL_IDLE_S = 10  # room for two fab runs on a busy machine before it would fire


def _up(cluster, i: int) -> bool:
    node = cluster.state.nodes[i]
    return local_system.process_alive(node.sshd_pid) and local_system.is_our_sshd(node.sshd_pid, node)


def _log(cluster) -> str:
    path = Path(cluster.state.nodes[0].dir) / "root" / autostop.STATE_DIR / "log"
    return path.read_text() if path.exists() else f"(no {path})"


def _arm(cluster, idle: str, *extra: str) -> str:
    result = run_fab(cluster, "autostop", "--idle", idle, "--poll", "1", *extra, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_nodes_power_off_after_the_idle_time_and_an_exec_resets_it(local_cluster_factory):
    cluster = local_cluster_factory(2)
    armed = _arm(cluster, f"{IDLE_S}s")
    armed_at = time.monotonic()
    assert f"auto-stop: armed, {IDLE_S}s idle; powers off in" in armed, armed
    assert "(local power-off)" in armed
    # runs past the first deadline: a running exec is never idle, and its end restarts the clock
    busy = subprocess.Popen([*FAB, "exec", f"sleep {IDLE_S + 4}", "--cluster", cluster.cluster_arg], cwd=REPO_ROOT,
                            env=cluster.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(3)
    status = run_fab(cluster, "status", timeout=60)
    assert f"auto-stop: armed, {IDLE_S}s idle; 1 job(s)/exec(s) running" in status.stdout, status.stdout + status.stderr
    output = busy.communicate(timeout=60)[0]
    exec_end = time.monotonic()
    assert busy.returncode == 0, output
    assert exec_end - armed_at > IDLE_S + 1
    assert _up(cluster, 0) and _up(cluster, 1), "powered off while an exec ran"
    down_at = {}
    while len(down_at) < 2 and time.monotonic() - exec_end < IDLE_S + 20:
        for i in (0, 1):
            if i not in down_at and not _up(cluster, i):
                down_at[i] = time.monotonic()
        time.sleep(0.2)
    assert sorted(down_at) == [0, 1], f"the nodes did not go down; the service's log:\n{_log(cluster)}"
    for i, at in down_at.items():
        assert at - exec_end >= IDLE_S - 3, f"node{i} went down {at - exec_end:.1f} s after the exec, before the idle time"
        record = Path(cluster.state.nodes[i].imds_dir) / imds_server.POWERED_OFF_FILE
        assert record.exists(), f"node{i} was not taken down by its metadata service"
    assert down_at[1] <= down_at[0] + 0.5  # the worker first, then the master


def test_cancel_keeps_the_nodes_up(local_cluster_factory):
    cluster = local_cluster_factory(2)
    _arm(cluster, f"{CANCEL_IDLE_S}s")
    armed_at = time.monotonic()
    cancelled = run_fab(cluster, "autostop", "--cancel", timeout=60)
    assert cancelled.returncode == 0 and cancelled.stdout.strip() == "auto-stop: off", cancelled.stdout + cancelled.stderr
    # what `fab train` runs on an AWS master: the stack's default does not undo a cancel
    again = cluster.ssh(0, autostop.arm_default_command(2, 1))
    assert again.returncode == 0 and "armed=no" in again.stdout, again.stdout + again.stderr
    assert time.monotonic() - armed_at < CANCEL_IDLE_S, "too slow to tell: cancelled after the idle time"
    time.sleep(max(0.0, armed_at + CANCEL_IDLE_S + 3 - time.monotonic()))
    assert _up(cluster, 0) and _up(cluster, 1)
    assert "auto-stop: off" in run_fab(cluster, "status", timeout=60).stdout
