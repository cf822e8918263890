"""tests/conftest.py's report of a subprocess that ran past its bound: the test fails with what the
command had printed by then (a pytest run of its own on a test whose child never ends in time)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SLOW_CHILD = """\
import subprocess, sys
def test_child():
    subprocess.run([sys.executable, "-c", "import time; print('seen before the bound', flush=True); time.sleep(60)"],
                   capture_output=True, text=True, timeout=3)
"""


def test_a_command_past_its_bound_fails_the_test_with_what_it_printed(tmp_path):
    (tmp_path / "test_slow_child.py").write_text(SLOW_CHILD)
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist",
                             "-p", "tests.conftest", "-c", "/dev/null", "--rootdir", str(tmp_path),
                             str(tmp_path / "test_slow_child.py")],
                            cwd=REPO, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    heading = "stdout of the command that timed out"
    assert heading in result.stdout, result.stdout[-3000:]
    assert "seen before the bound" in result.stdout.split(heading, 1)[1], result.stdout[-3000:]
