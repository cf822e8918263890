"""The small traps of daily use: a closed pipe (`fab jobs | head`), an option that Fabric's own core option
shadows (`--connect-timeout`), a near miss of a local cluster's name (`--cluster lokal`), `fab --list`'s
descriptions cut mid-sentence, and scripts/setup-dev.sh when another apt holds the dpkg lock."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.inventory import ClusterSelectionError
from node_setup import discovery
from node_setup.tasks import ns
from node_setup.tasks.program import CLOSED_PIPE, program
from tests.fab_run import ROOT, fab_in_process

FAB = [str(Path(sys.executable).with_name("fab"))]


def test_a_reader_that_stops_early_ends_fab_quietly():
    """`fab --list` into a pipe whose reader is gone: exit 141 (as a shell reports SIGPIPE), nothing on stderr."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([*FAB, "--list"], stdout=write, stderr=subprocess.PIPE, cwd=ROOT, text=True,
                              timeout=60)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (CLOSED_PIPE, "")


def test_no_task_option_is_shadowed_by_one_of_fabrics_own():
    core = {name for arg in program.core_args() for name in arg.names if len(name) > 1}  # long names (`-f` of
    # `fab train -f job.yaml` is the job file's on purpose: after the task, the task's flags come first)
    assert "connect-timeout" in core
    for name in ns.task_names:
        flags = {n.replace("_", "-") for arg in ns[name].get_arguments() for n in arg.names if len(n) > 1}
        assert not flags & core, f"fab {name}: {sorted(flags & core)} is also an option of fab itself"


def test_fabrics_own_option_with_a_bad_value_after_a_task_is_one_line_and_exit_2():
    ran = fab_in_process("train", "--connect-timeout", "3s", "--dry-run")
    assert ran.returncode == 2 and ran.stdout == ""
    assert ran.stderr.strip() == ("error: --connect-timeout: '3s' is not a whole number (an option of fab itself, "
                                  "given before the task: `fab --help` lists them)")
    ran = fab_in_process("setup", "--ssh-timeout", "3")
    assert ran.returncode == 2 and ran.stderr.strip().startswith("error: --ssh-timeout: '3' has no unit")


@pytest.mark.parametrize("name", sorted(ns.task_names))
def test_fab_list_shows_each_tasks_first_sentence_whole(name):
    """`fab --list` shows a docstring's first line: it is the whole first paragraph, one sentence."""
    first_paragraph = (inspect.getdoc(ns[name]) or "").split("\n\n")[0]
    assert "\n" not in first_paragraph and first_paragraph.endswith("."), \
        f"fab {name}: `fab --list` would cut {first_paragraph!r}"


def test_a_near_miss_of_a_local_clusters_name_gets_a_suggestion(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    for name in ("bench8", "local", "t1"):
        (tmp_path / "xeon-cluster" / "local" / name).mkdir(parents=True)
        (tmp_path / "xeon-cluster" / "local" / name / "state.json").write_text("{}")
    assert discovery.local_suggestion("lokal") == "; did you mean `--cluster local`?"
    assert discovery.local_suggestion("local:bench9") == "; did you mean `--cluster local:bench8`?"
    assert discovery.local_suggestion("bench8") == "; did you mean `--cluster local:bench8`?"
    assert discovery.local_suggestion("production") == ""
    assert discovery.local_suggestion("t1") == "; did you mean `--cluster local:t1`?"  # the exact name given
    for variable in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(ClusterSelectionError, match=r"did you mean `--cluster local`\?$"):
        discovery.resolve_cluster("lokal")
    with pytest.raises(ClusterSelectionError, match=r"did you mean `--cluster local:t1`\?$"):
        discovery.resolve_cluster("t1")  # as `fab local-up --name t1` named it: not AWS's "no region" alone


def test_setup_dev_waits_for_the_dpkg_lock_saying_so(tmp_path):
    """scripts/setup-dev.sh's apt step while another apt holds the lock: one line saying it waits and for whom,
    then it goes on once the lock is free (its `apt_get` with a stand-in apt-get on PATH that answers as apt
    does while another holds the lock)."""
    holder = tmp_path / "held"
    holder.write_text("")
    apt = tmp_path / "bin" / "apt-get"
    apt.parent.mkdir()
    apt.write_text(f"#!/bin/sh\nif [ -e {holder} ]; then\n  echo 'E: Could not get lock /var/lib/dpkg/lock-frontend. "
                   f"It is held by process 4242 (apt-get)' >&2; exit 100\nfi\necho \"$*\" >> {tmp_path}/apt.log\n")
    apt.chmod(0o755)
    script = (ROOT / "scripts" / "setup-dev.sh").read_text()
    start = script.index("apt_get() {")
    function = script[start:script.index("\n}\n", start) + 3]
    run = subprocess.Popen(["bash", "-c", f"SUDO=''\n{function}\napt_get install -y x && echo installed"],
                           env={**os.environ, "PATH": f"{apt.parent}:{os.environ['PATH']}", "APT_LOCK_POLL_S": "0.1"},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert run.stdout.readline() == ("== waiting for the dpkg lock: another apt or dpkg (pid 4242) holds it; trying "
                                     "again every 0.1 s, up to 1800 s\n")
    assert not (tmp_path / "apt.log").exists()
    holder.unlink()
    assert run.communicate(timeout=30)[0] == "installed\n" and run.returncode == 0
    assert (tmp_path / "apt.log").read_text() == "install -y x\n"
