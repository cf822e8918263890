"""`fab setup` and `fab check` on a local cluster: real sshd, real apt/venv/pip on the nodes.

The session's cluster is set up once (`installed_cluster` in conftest.py); these tests rerun
setup and check against it and make one more 2-node cluster with a stopped sshd. Budget: the
first setup of a fresh machine takes minutes (wheelhouse + venv, shared with later sessions);
on an installed machine the tests here take ~15 s.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cluster.node.profiles import PROFILES, venv_dir
from cluster.node.setup_script import PROFILE_MARKER, PROJECT_MARKER, fingerprint_digest
from tests.ssh.conftest import run_fab
from tests.ssh.shared_venv import setup_lock_held

pytestmark = pytest.mark.ssh

STOCK = PROFILES["stock"]
VENV = Path(venv_dir(STOCK))


def rows(output: str, names=("node0", "node1", "node2")) -> dict[str, str]:
    """The final table's row per node (the lines that start with a node name)."""
    found = {}
    for line in output.splitlines():
        for name in names:
            if re.match(rf"^{name}\s+(ok|failed)\b", line):
                found[name] = line
    return found


def test_setup_installed_the_profile_on_every_node(installed_cluster, setup_runs):
    out = setup_runs["setup"].stdout
    table = rows(out)
    assert set(table) == {"node0", "node1", "node2"}, out
    assert all(re.match(r"^node\d\s+ok\s", line) for line in table.values()), out
    assert "setup: 3/3 node(s) ok" in out
    # per-node progress lines came before the table
    for name in table:
        assert re.search(rf"^  {name}: apt (unchanged|changed)", out, re.M), out
    # every node runs the venv's Python (the OS one, not /root's) with the profile's versions
    probe = (f"{VENV}/bin/python -c 'import sys, torch, transformers, accelerate, datasets, training, "
             "importlib.metadata as m; print(sys.base_prefix, torch.__version__, transformers.__version__, "
             "accelerate.__version__, datasets.__version__, m.version(\"impi-rt\"))'")
    for i in range(3):
        result = installed_cluster.ssh(i, probe, timeout=120)
        assert result.returncode == 0, result.stderr
        base, torch, transformers, accelerate, datasets, impi = result.stdout.split()
        assert not base.startswith("/root")
        assert torch.split("+")[0] == STOCK.pin_of("torch")
        assert (transformers, accelerate, datasets, impi) == (
            STOCK.pin_of("transformers"), STOCK.pin_of("accelerate"), STOCK.pin_of("datasets"), STOCK.pin_of("impi-rt"))
    assert (VENV / PROFILE_MARKER).read_text().strip() == fingerprint_digest(STOCK)


def test_second_setup_changes_nothing_and_says_so(installed_cluster):
    """The markers are read with the shared venv's setup lock held (another test may be pinning the project
    marker meanwhile, and puts it back as it found it)."""
    def marker_times():
        with setup_lock_held("tests/ssh/test_setup.py, reading the venv's markers"):
            return {p: p.stat().st_mtime_ns for p in (VENV / PROFILE_MARKER, VENV / PROJECT_MARKER)}

    markers = marker_times()
    result = run_fab(installed_cluster, "setup", timeout=300)  # how long it takes: bench/bench_fab_setup.py
    assert result.returncode == 0, result.stdout + result.stderr
    table = rows(result.stdout)
    assert len(table) == 3
    for line in table.values():
        assert re.search(r"\sok\s+no\s.*already installed, nothing changed", line), line
    for name in table:
        assert f"{name}: venv unchanged" in result.stdout and f"{name}: project unchanged" in result.stdout
    assert marker_times() == markers  # nothing rewritten


def test_check_passes_and_names_a_mismatch(installed_cluster):
    ok = run_fab(installed_cluster, "check", timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    table = rows(ok.stdout)
    assert len(table) == 3 and all(re.search(r"\sok\s", line) for line in table.values()), ok.stdout
    assert "torch 2.13.0" in table["node0"] or "2.13.0" in table["node0"]
    assert re.search(r"GiB free", table["node0"])
    # the same nodes checked against the intel profile (its own venv, not installed here): named per item
    bad = run_fab(installed_cluster, "check", "--profile", "intel", timeout=120)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    row = rows(bad.stdout)["node1"]
    assert re.match(r"^node1\s+failed\s", row)
    assert "venv: /opt/xeon-cluster/venv-intel missing: run `fab setup`" in row
    assert "torch: missing (torch==2.8.0)" in row and "intel-extension-for-pytorch: missing" in row


def test_unreachable_node_is_named_and_the_others_finish(installed_cluster, local_cluster_factory):
    cluster = local_cluster_factory(2)
    cluster.stop_sshd(1)
    result = run_fab(cluster, "setup", "--ssh-timeout", "5s", timeout=300)  # its time: bench/bench_daily_loop.py
    assert result.returncode == 3, result.stdout + result.stderr
    table = rows(result.stdout, ("node0", "node1"))
    assert re.match(r"^node0\s+ok\s", table["node0"]), result.stdout
    assert re.match(r"^node1\s+failed\s", table["node1"])
    address = cluster.state.nodes[1].address
    assert f"unreachable: root@{address}:22" in table["node1"] and "refused" in table["node1"].lower()
    assert "failed: node1 (rerun `fab setup` to pick up)" in result.stdout

    check = run_fab(cluster, "check", timeout=120)
    assert check.returncode == 3 and "unreachable" in rows(check.stdout, ("node1",))["node1"]
