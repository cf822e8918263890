"""Idle auto-stop on local clusters of their own (their nodes go down): `fab autostop`, the service
on the master, a `fab exec` resetting the clock, `--cancel`, and the local power-off through each
node's metadata service (never a real power-off); every node of the cluster powered off after a job
narrowed `~/hosts`, a worker that cannot be stopped keeping the master up (and `fab status` saying
so), arming at `fab setup`, and a stale `fab exec` record. Short idle times and a 1 s poll.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from cluster.node import autostop
from node_setup.local import imds_server
from node_setup.local import system as local_system
from tests.ssh.conftest import FAB, REPO_ROOT, run_fab
from tests.ssh.jobs_on_nodes import node_home, wait_for

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
    result = run_fab(cluster, "autostop", "--idle", idle, "--poll", "1s", *extra, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_nodes_power_off_after_the_idle_time_and_an_exec_resets_it(local_cluster_factory):
    cluster = local_cluster_factory(2)
    # runs past the first deadline: a running exec is never idle, and its end restarts the clock. It is running
    # before the idle time is armed (its record seen): a `fab exec` that took longer than IDLE_S to start on a
    # loaded machine once found the nodes already powered off
    busy = subprocess.Popen([*FAB, "exec", f"sleep {IDLE_S + 16}", "--cluster", cluster.cluster_arg], cwd=REPO_ROOT,
                            env=cluster.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    records = node_home(cluster, 0) / autostop.ACTIVITY_DIR
    wait_for(lambda: busy.poll() is not None or any(records.glob("exec-*")), 60, f"the exec's record in {records}")
    assert busy.poll() is None, f"the exec ended before its record was seen:\n{busy.communicate()[0]}"
    armed = _arm(cluster, f"{IDLE_S}s")
    armed_at = time.monotonic()
    assert f"auto-stop: armed, {IDLE_S}s idle (powers off node0, node1)" in armed, armed
    assert "(local power-off)" in armed
    status = run_fab(cluster, "status", timeout=60)
    assert f"auto-stop: armed, {IDLE_S}s idle (powers off node0, node1); 1 job(s)/exec(s) running" in status.stdout, (
        status.stdout + status.stderr)
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
        assert at - exec_end >= IDLE_S - 3, (f"node{i} went down {at - exec_end:.1f} s after the exec, "
                                             "before the idle time")
        record = Path(cluster.state.nodes[i].imds_dir) / imds_server.POWERED_OFF_FILE
        assert record.exists(), f"node{i} was not taken down by its metadata service"
    assert down_at[1] <= down_at[0] + 0.5  # the worker first, then the master


def test_cancel_keeps_the_nodes_up(local_cluster_factory):
    cluster = local_cluster_factory(2)
    _arm(cluster, f"{CANCEL_IDLE_S}s")
    armed_at = time.monotonic()
    cancelled = run_fab(cluster, "autostop", "--cancel", timeout=60)
    assert cancelled.returncode == 0 and cancelled.stdout.strip() == "auto-stop: off", (cancelled.stdout
                                                                                        + cancelled.stderr)
    # what `fab train` runs on an AWS master: the stack's default does not undo a cancel
    again = cluster.ssh(0, autostop.arm_default_command(2, 1))
    assert again.returncode == 0 and "armed=no" in again.stdout, again.stdout + again.stderr
    if time.monotonic() - armed_at >= CANCEL_IDLE_S:  # a machine this busy cannot tell a cancel from a late one
        pytest.skip(f"the cancel took over the {CANCEL_IDLE_S} s idle time: nothing to tell here")
    time.sleep(max(0.0, armed_at + CANCEL_IDLE_S + 3 - time.monotonic()))
    assert _up(cluster, 0) and _up(cluster, 1)
    assert "auto-stop: off" in run_fab(cluster, "status", timeout=60).stdout


def _wait_down(cluster, indexes, within_s: float) -> set[int]:
    """The nodes among `indexes` that went down within `within_s` seconds (watched every 0.2 s)."""
    down: set[int] = set()
    end = time.monotonic() + within_s
    while down != set(indexes) and time.monotonic() < end:
        down |= {i for i in indexes if i not in down and not _up(cluster, i)}
        time.sleep(0.2)
    return down


def _narrow_like_a_job(cluster, monkeypatch, nodes: int) -> None:
    """What `fab train --nodes N` does to the master's files before its job starts (train.py calls
    this same distribution with its N nodes): ~/hosts, the ssh config block and known_hosts name
    those N only."""
    from dataclasses import replace

    from node_setup.ssh.distribute import distribute

    for key, value in cluster.env().items():
        monkeypatch.setenv(key, value)
    inventory = cluster.inventory
    distribute(replace(inventory, nodes=inventory.nodes[:nodes]))
    hosts = cluster.ssh(0, "cat ~/hosts")
    assert hosts.stdout.split() == [n.name for n in inventory.nodes[:nodes]], hosts.stdout


def test_every_node_powers_off_after_a_job_on_two_of_three(local_cluster_factory, monkeypatch):
    cluster = local_cluster_factory(3)
    _arm(cluster, f"{CANCEL_IDLE_S}s")  # arming distributes to all 3; the job's narrowing comes after
    _narrow_like_a_job(cluster, monkeypatch, 2)
    down = _wait_down(cluster, (0, 1, 2), CANCEL_IDLE_S + 25)
    assert down == {0, 1, 2}, f"up: {sorted({0, 1, 2} - down)}; the service's log:\n{_log(cluster)}"


def test_a_worker_that_cannot_be_stopped_keeps_the_master_up_and_status_says_so(local_cluster_factory):
    cluster = local_cluster_factory(3)
    _arm(cluster, "5s")  # room to stop node2's sshd before the service fires, on a busy machine too
    cluster.stop_sshd(2)  # node2 runs on, but the master cannot reach it to power it off
    worker = cluster.state.nodes[2].name
    deadline = time.monotonic() + 40
    shown = ""
    while time.monotonic() < deadline:
        shown = cluster.ssh(0, autostop.status_command()).stdout
        if f"unstopped={worker}" in shown:
            break
        time.sleep(0.5)
    assert f"unstopped={worker}" in shown, f"{shown}\nthe service's log:\n{_log(cluster)}"
    # its power-off answers "accepted" before it acts, so the reachable worker goes down just after
    assert _wait_down(cluster, (1,), 20) == {1}, "the worker that could be reached was not powered off"
    assert _up(cluster, 0), "the master powered off with a worker left running"
    status = run_fab(cluster, "status", timeout=90)
    assert f"auto-stop: could not power off {worker}" in status.stdout, status.stdout + status.stderr
    as_json = json.loads(run_fab(cluster, "status", "--json", timeout=90).stdout)
    assert any(f"could not power off {worker}" in p for p in as_json["problems"]), as_json["problems"]
    time.sleep(3)  # a few more polls (1 s each): the master is still up, still trying
    assert _up(cluster, 0)


def test_a_cluster_only_set_up_powers_off(local_cluster_factory):
    cluster = local_cluster_factory(2)
    result = run_fab(cluster, "setup", "--auto-stop", f"{IDLE_S}s", timeout=1800)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"auto-stop: armed, {IDLE_S}s idle" in result.stdout, result.stdout
    down = _wait_down(cluster, (0, 1), IDLE_S + 25)
    assert down == {0, 1}, f"the nodes did not go down; the service's log:\n{_log(cluster)}"


def test_a_stale_exec_record_whose_pid_was_reused_does_not_block_power_off(local_cluster_factory):
    cluster = local_cluster_factory(2)
    # a record left by a `fab exec` that died; its pid now belongs to another process (this test's)
    # and the record's start time is not that process's
    records = Path(cluster.state.nodes[0].dir) / "root" / autostop.ACTIVITY_DIR
    records.mkdir(parents=True, exist_ok=True)
    (records / f"exec-{os.getpid()}").write_text(f"{os.getpid()} 1\n")
    _arm(cluster, f"{IDLE_S}s")
    down = _wait_down(cluster, (0, 1), IDLE_S + 25)
    assert down == {0, 1}, f"the nodes did not go down; the service's log:\n{_log(cluster)}"
