"""`fab setup` and `fab check` on a local cluster: real sshd, real apt/venv/pip on the nodes.

The session's cluster is set up once (`installed_cluster` in conftest.py); these tests rerun
setup and check against it and make one more 2-node cluster with a stopped sshd. Budget: the
first setup of a fresh machine takes minutes (wheelhouse + venv, shared with later sessions);
on an installed machine the tests here take ~15 s, and the image build's component on a new node ~10 s more.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from pathlib import Path

import pytest

from cluster.job.jobplan import DEFAULT_OUTPUT_ROOT
from cluster.node import autostop
from cluster.node.profiles import PROFILES, venv_dir
from cluster.node.render import HOSTFILE_NAME, KEY_COMMENT_PREFIX
from cluster.node.setup_script import (PROFILE_MARKER, PROJECT_MARKER, InstallPlan, fingerprint_digest, install_script,
                                       parse_events)
from cluster.stack import image_build
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


def _tree(home: Path) -> dict[str, str]:
    """Every entry under a node's home, path relative to it: a file's SHA-256, else its kind."""
    found = {}
    for path in sorted(home.rglob("*")):
        rel = str(path.relative_to(home))
        found[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else (
            "link" if path.is_symlink() else "dir")
    return found


def test_the_image_builds_component_on_a_new_node_leaves_the_profile_and_nothing_of_a_cluster(installed_cluster,
                                                                                             local_cluster_factory):
    """What EC2 Image Builder's build runs (cluster/stack/image_build.py component_document: download the install
    script, run it as root, clean), with the install script infra/image.py puts in the bucket (tests/infra/
    test_program.py checks it is this text), on a node of its own that no `fab setup`, `fab distribute`, job or
    auto-stop ever touched: afterwards its home is as the machine came (the skeleton and the one login key the local
    cluster gives a new node, where Image Builder's instance has none), with no key, no cluster record, no run,
    and the profile's software is there. A local node's /opt and OS packages are this machine's, which the
    session's `fab setup` already filled (`installed_cluster`): the install finds the profile's venv and checks
    it rather than building it from nothing (a local node reaches no index), so the venv is checked here as the
    image would hold it."""
    cluster = local_cluster_factory(1)
    home = Path(cluster.state.nodes[0].dir) / "root"
    bare = _tree(home)
    document = json.loads(image_build.component_document("s3://xeon-dev-checkpoints/image-builder/install/x.sh"))
    (build,) = document["phases"]
    steps = build["steps"]
    assert [step["action"] for step in steps] == ["S3Download", "ExecuteBash", "ExecuteBash"]
    script = install_script(InstallPlan(STOCK))
    outputs = []
    for step in steps:
        if step["action"] == "S3Download":  # the bucket's object, put where the component downloads it
            (where,) = step["inputs"]
            dest = where["destination"]
            put = (f"mkdir -p {shlex.quote(str(Path(dest).parent))} && cat > {shlex.quote(dest)} && "
                   f"wc -c < {shlex.quote(dest)}")
            result = cluster.ssh(0, put, input=script)
            assert result.returncode == 0 and int(result.stdout) == len(script.encode()), result.stderr
            continue
        for command in step["inputs"]["commands"]:
            result = cluster.ssh(0, command, timeout=900)
            assert result.returncode == 0, f"{step['name']}: {command}\n{result.stdout}\n{result.stderr}"
            outputs.append(result.stdout)
    events = {e.name: e for e in parse_events(outputs[0]) if e.kind == "step"}
    assert events["apt"].status in ("changed", "unchanged") and events["venv"].status in ("changed", "unchanged")
    assert fingerprint_digest(STOCK) in events["venv"].detail
    assert events["project"].status == "skipped"  # the image holds the profile alone, no wheel of this project
    # Nothing the build put in stays but the install: its download folder and pip's cache are gone.
    gone = cluster.ssh(0, f"test ! -e {image_build.BUILD_DIR} && test ! -e /root/.cache/pip && echo gone")
    assert gone.stdout.strip() == "gone", gone.stdout + gone.stderr
    # The home is the bare machine's: no file added, removed or changed.
    after = _tree(home)
    assert after == bare, {"added": sorted(set(after) - set(bare)), "removed": sorted(set(bare) - set(after)),
                           "changed": sorted(k for k in set(after) & set(bare) if after[k] != bare[k])}
    # Named, so that a later change to what a new node's home holds cannot hide them: no key but the login one
    # (no cluster key pair, no cluster key line), no ssh config or known hosts, no hosts file, no auto-stop
    # record (armed, worker-group, nodes), no toolkit folder, no run.
    assert not list((home / ".ssh").glob("id_*")) and not (home / ".ssh" / "config").exists()
    assert not (home / ".ssh" / "known_hosts").exists()
    keys = (home / ".ssh" / "authorized_keys").read_text().splitlines()
    assert len(keys) == 1 and KEY_COMMENT_PREFIX not in keys[0]
    for name in (HOSTFILE_NAME, DEFAULT_OUTPUT_ROOT, Path(autostop.STATE_DIR).parent.as_posix()):
        assert not (home / name).exists(), name
    # The profile's software, as every node booted from the image runs it.
    probe = (f"{VENV}/bin/python -c 'import torch, transformers, accelerate, datasets, importlib.metadata as m; "
             "print(torch.__version__, transformers.__version__, accelerate.__version__, datasets.__version__, "
             "m.version(\"impi-rt\"))'")
    result = cluster.ssh(0, probe, timeout=120)
    assert result.returncode == 0, result.stderr
    torch, *rest = result.stdout.split()
    assert torch.split("+")[0] == STOCK.pin_of("torch")
    assert tuple(rest) == tuple(STOCK.pin_of(p) for p in ("transformers", "accelerate", "datasets", "impi-rt"))
    assert (VENV / PROFILE_MARKER).read_text().strip() == fingerprint_digest(STOCK)
    assert Path(autostop.SERVICE_PATH).is_file()  # the idle auto-stop's service, which the nodes' user data arms
