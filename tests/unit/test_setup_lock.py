"""The setup lock (cluster/shell/setup-lock.sh): the nodes of local clusters share /opt, so one setup at a
time installs; a waiter names the holder (cluster, checkout, node, pid) and breaks a lock whose holder is
gone (its process, or its node's namespace) instead of waiting out the timeout.

Each scenario runs the rendered functions in bash against a lock file in a temporary folder; the holders
are real processes of this test.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from cluster import shell
from cluster.node.profiles import PROFILES
from cluster.node.setup_script import InstallPlan, install_script, with_setup_lock

HOLDER = "cluster other, checkout /srv/alice/xeon-cluster"


def script(body: str, holder: str = "cluster mine, checkout /src/me/xeon-cluster") -> str:
    bare = "\n".join(["#!/bin/bash", shell.HEADER_START, shell.HEADER_END, "set -uo pipefail", body, ""])
    return with_setup_lock(bare, holder)


def take(lock, timeout_s: int = 1) -> subprocess.CompletedProcess:
    """This test's waiter: takes the lock (or gives up after `timeout_s`) and prints the record it wrote."""
    body = f'setup_lock "$1" {timeout_s} || exit 23\necho taken; cat "$1"'
    return subprocess.run(["bash", "-c", script(body), "waiter", str(lock)], capture_output=True, text=True,
                          timeout=30)


def hold(lock, then: str = "sleep 60") -> subprocess.Popen:
    """Another setup: takes the lock, says so, then runs `then` (its own record written as setup_lock does)."""
    body = f'setup_lock "$1" 5 || exit 23\necho held\n{then}'
    holder = subprocess.Popen(["bash", "-c", script(body, HOLDER), "holder", str(lock)], stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def locked_by_flock(lock) -> subprocess.Popen:
    """A process that holds the lock and wrote no record (`flock FILE sleep`), once it holds it."""
    process = subprocess.Popen(["flock", "-n", str(lock), "sleep", "60"], start_new_session=True)
    for _ in range(200):
        try:
            with open(lock) as probe:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(probe, fcntl.LOCK_UN)
        except BlockingIOError:
            return process
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    end(process)
    raise AssertionError("flock never took the lock")


def end(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGKILL)  # the holder and whatever it started (its own session)
    process.wait()


def test_a_waiter_names_the_holder_and_gives_up_after_its_timeout(tmp_path):
    lock = tmp_path / ".setup-stock.lock"
    holder = hold(lock)
    try:
        waited = take(lock, timeout_s=1)
    finally:
        end(holder)
    assert waited.returncode == 23, waited.stdout + waited.stderr
    said = f"held by {HOLDER}, node {socket.gethostname()}"
    assert f"::xc:: progress lock waiting for the setup lock {lock} (up to 1s): {said}" in waited.stdout
    assert f"gave up after 1s: the setup lock {lock} is still held by {HOLDER}" in waited.stdout
    first = lock.read_text().splitlines()[0]
    assert first.split()[0] == str(holder.pid)  # the record names the holder's own shell


def test_a_lock_whose_holder_process_is_gone_is_broken(tmp_path):
    """The holder's shell ended while something it started still has the lock's file open (as pip did
    before every command under the lock got fd 9 closed): the waiter breaks it at once."""
    lock = tmp_path / ".setup-stock.lock"
    holder = hold(lock, then="sleep 60 &\nexit 0")  # the background sleep inherits fd 9, the lock with it
    holder.wait()
    try:
        took = take(lock, timeout_s=30)
    finally:
        end(holder)
    assert took.returncode == 0, took.stdout + took.stderr
    assert f"the setup lock {lock} was held by {HOLDER}, node {socket.gethostname()}, which is gone; " \
           "breaking it" in took.stdout
    record = took.stdout.split("taken\n", 1)[1].splitlines()
    assert record[2].startswith("cluster mine, checkout /src/me/xeon-cluster, node ")


def test_a_lock_whose_holder_node_namespace_is_gone_is_broken(tmp_path):
    """The holder's process still runs but the node it ran on is gone (its namespace removed)."""
    lock = tmp_path / ".setup-stock.lock"
    sleeper = locked_by_flock(lock)
    try:
        started = open(f"/proc/{sleeper.pid}/stat").read().rsplit(") ", 1)[1].split()[19]
        lock.write_text(f"{sleeper.pid} {started}\n{tmp_path / 'netns' / 'xc-gone-n1'}\n{HOLDER}, node node1\n")
        took = take(lock, timeout_s=30)
        assert sleeper.poll() is None  # its process still runs: the namespace decided
    finally:
        end(sleeper)
    assert took.returncode == 0, took.stdout + took.stderr
    assert f"was held by {HOLDER}, node node1, which is gone; breaking it" in took.stdout


def test_a_holder_on_another_node_is_judged_by_its_node_not_by_a_pid_this_waiter_cannot_see(tmp_path):
    """Each local node has its own PID namespace: a holder's pid, as its node numbers it, means nothing on
    another node. Its record names that namespace, so the waiter waits while the holder's node is there (its
    pid not found here), and breaks the lock once the node is gone."""
    lock, node = tmp_path / ".setup-stock.lock", tmp_path / "netns-xc-there-n0"
    node.touch()
    sleeper = locked_by_flock(lock)
    try:
        unseen = max(int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()) + 10_000
        lock.write_text(f"{unseen} 123 pid:[1]\n{node}\n{HOLDER}, node node0\n")
        waited = take(lock, timeout_s=3)
        node.unlink()
        took = take(lock, timeout_s=30)
    finally:
        end(sleeper)
    assert waited.returncode == 23 and "breaking" not in waited.stdout, waited.stdout
    assert f"still held by {HOLDER}, node node0" in waited.stdout
    assert took.returncode == 0 and f"held by {HOLDER}, node node0, which is gone; breaking it" in took.stdout
    record = took.stdout.split("taken\n", 1)[1].splitlines()
    assert record[0].split()[2] == os.readlink("/proc/self/ns/pid")  # the waiter's own record names its namespace


def test_a_lock_without_a_record_is_waited_for_not_broken(tmp_path):
    """A holder that wrote no record (an older setup) cannot be judged: the waiter waits it out."""
    lock = tmp_path / ".setup-stock.lock"
    sleeper = locked_by_flock(lock)
    try:
        waited = take(lock, timeout_s=1)
    finally:
        end(sleeper)
    assert waited.returncode == 23 and "breaking" not in waited.stdout
    assert "held by a setup that does not name itself" in waited.stdout


@pytest.mark.slow
def test_setups_that_come_and_go_never_hold_the_lock_together(tmp_path):
    """Four setups take the lock twice each and end: every holder leaves its record behind when it ends (its
    process then gone), and the next holder's record replaces it; no waiter may take such a record for a
    holder that is gone while the lock's new holder runs (two inside at once would fail mkdir)."""
    lock, inside, one = tmp_path / ".setup-stock.lock", tmp_path / "inside", tmp_path / "one-setup.sh"
    one.write_text(script(f'setup_lock "$1" 60 || exit 23\nmkdir {inside} || exit 9\nsleep 0.3\nrmdir {inside}'))
    twice = f'for round in 1 2; do bash {one} "$1" || exit $?; done'
    setups = [subprocess.Popen(["bash", "-c", twice, "setup", str(lock)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True) for _ in range(4)]
    outputs = [s.communicate(timeout=120)[0] for s in setups]
    assert [s.returncode for s in setups] == [0] * 4, outputs
    assert not any("breaking" in out for out in outputs), outputs


def test_commands_under_the_lock_do_not_inherit_it():
    """What runs under the lock (venv, pip) gets fd 9 closed, so the lock ends with the install's shell."""
    text = install_script(InstallPlan(PROFILES["stock"], project_wheel="/tmp/p.whl", project_version="0.1"))
    locked = text[text.index('setup_lock "$NODE_ROOT'):text.index("flock -u 9")]
    commands = [line for line in locked.splitlines() if re.search(r'-m (pip|venv)\b', line)]
    assert len(commands) == 4
    for line in commands:
        continued = locked[locked.index(line):].split("||", 1)[0]
        assert "9>&-" in continued, line


@pytest.mark.parametrize("holder", ["two\nlines", "\x1b[31mred", "x" * 400])
def test_a_holder_text_that_is_not_one_printable_line_is_refused(holder):
    with pytest.raises(ValueError, match="lock_holder: .* is not allowed; allowed: one line of printable text"):
        InstallPlan(PROFILES["stock"], lock_holder=holder)
