"""node_setup/local/runs.py: the local cluster's run folder is root's own, 0700, never a symlink,
on the real filesystem (a temporary root here; the last test runs `fab local-up` against the real
/var/tmp/xeon-cluster-runs with a name of its own). Needs root, as the local cluster does."""

from __future__ import annotations

import os
import secrets
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.job.jobplan import LOCAL_OUTPUT_ROOT
from node_setup.local.runs import ensure_run_folder
from node_setup.local.state import LocalClusterError

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the local cluster's run folder is root's: run as root")
NOBODY = 65534


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_it_makes_both_levels_root_owned_0700(tmp_path):
    root = tmp_path / "runs"
    assert ensure_run_folder("demo", str(root)) == root / "demo"
    for level in (root, root / "demo"):
        assert level.is_dir() and not level.is_symlink()
        assert os.lstat(level).st_uid == 0 and mode(level) == 0o700
    assert ensure_run_folder("demo", str(root)) == root / "demo"  # again: nothing to change


def test_a_safe_folder_of_an_older_version_is_tightened_to_0700(tmp_path):
    root = tmp_path / "runs"
    (root / "demo").mkdir(parents=True)
    os.chmod(root, 0o755)
    os.chmod(root / "demo", 0o755)
    ensure_run_folder("demo", str(root))
    assert mode(root) == mode(root / "demo") == 0o700


@pytest.mark.parametrize("level", ["top", "cluster"])
def test_a_symlink_is_refused_and_not_followed(tmp_path, level):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    root = tmp_path / "runs"
    if level == "top":
        root.symlink_to(elsewhere)
        link = root
    else:
        root.mkdir(mode=0o700)
        link = root / "demo"
        link.symlink_to(elsewhere)
    with pytest.raises(LocalClusterError, match=rf"^run folder {link}: a symlink; allowed: a directory owned by root"):
        ensure_run_folder("demo", str(root))
    assert list(elsewhere.iterdir()) == [] and mode(elsewhere) == 0o700  # nothing made or changed through it


@pytest.mark.parametrize("level", ["top", "cluster"])
def test_a_folder_someone_else_owns_is_refused(tmp_path, level):
    root = tmp_path / "runs"
    (root / "demo").mkdir(parents=True, mode=0o700)
    taken = root if level == "top" else root / "demo"
    os.chown(taken, NOBODY, NOBODY)
    with pytest.raises(LocalClusterError, match=rf"^run folder {taken}: owned by uid {NOBODY}, not 0;"):
        ensure_run_folder("demo", str(root))
    assert os.lstat(taken).st_uid == NOBODY  # left as it was


@pytest.mark.parametrize("loose", [0o777, 0o770, 0o1777])
def test_a_group_or_world_writable_folder_is_refused(tmp_path, loose):
    root = tmp_path / "runs"
    root.mkdir()
    os.chmod(root, loose)
    with pytest.raises(LocalClusterError, match=r"writable by its group or others \(mode \d{4}\)"):
        ensure_run_folder("demo", str(root))
    assert mode(root) == loose and not (root / "demo").exists()


def test_fab_local_up_refuses_a_run_folder_that_is_a_symlink_in_one_line_before_making_anything(tmp_path):
    name = f"xcrf{secrets.token_hex(3)}"
    top = Path(LOCAL_OUTPUT_ROOT)
    ensure_run_folder("local", str(top))  # the real top level, root's own (as any local-up leaves it)
    link = top / name
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link.symlink_to(elsewhere)
    config = tmp_path / "config"
    try:
        result = subprocess.run([sys.executable, "-m", "fabric", "local-up", "--nodes", "1", "--name", name], cwd=ROOT,
                                capture_output=True, text=True, timeout=120,
                                env={**os.environ, "XDG_CONFIG_HOME": str(config)})
    finally:
        link.unlink()
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.splitlines() == [f"error: run folder {link}: a symlink; allowed: a directory owned by root, "
                                          "mode 0700, that is not a symlink (someone else may have made it: look at "
                                          "it, remove it, and run fab local-up again)"]
    assert not (config / "xeon-cluster" / "local" / name).exists() and list(elsewhere.iterdir()) == []
