"""Command-line mistakes: one line with a suggestion, exit 2 (node_setup/tasks/parsing.py).

Run in-process through the `xeon-cluster` program (the same tasks and parser wrap as `fab`);
one subprocess `fab` run proves the wrap is in place for Fabric's own program too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from node_setup.tasks.parsing import suggestion, unknown_message
from node_setup.tasks.program import program

ROOT = Path(__file__).resolve().parents[2]


def run(capsys, *argv: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as ended:
        program.run(["xeon-cluster", *argv])
    captured = capsys.readouterr()
    return ended.value.code, captured.err


@pytest.mark.parametrize("argv, line", [
    (("trian",), "error: no task or option 'trian'; did you mean 'train'? (fab --list shows the tasks)"),
    (("train", "--node", "4"), "error: no option '--node' of `train`; did you mean '--nodes'? "
                                "(fab --help train shows its options)"),
    (("plan", "--epochs"), "error: --epochs needs a value (a whole number)"),
    (("status", "--jsn"), "error: no option '--jsn' of `status`; did you mean '--json'? "
                           "(fab --help status shows its options)"),
    (("--help", "trian"), "error: no task or option 'trian'; did you mean 'train'? (fab --list shows the tasks)"),
    (("frobnicate",), "error: no task or option 'frobnicate' (fab --list shows the tasks)"),
])
def test_a_mistake_is_one_line_with_a_suggestion_and_exit_2(capsys, argv, line):
    code, err = run(capsys, *argv)
    assert code == 2
    assert err.strip() == line
    assert "<_CheckedArgument" not in err and "Traceback" not in err


def test_suggestions_only_for_close_words():
    assert suggestion("trian", ["train", "plan"]) == "; did you mean 'train'?"
    assert suggestion("zzzz", ["train", "plan"]) == ""
    assert unknown_message("--node", [], ["--nodes", "--notice"], "train").startswith(
        "no option '--node' of `train`; did you mean '--nodes'?")


def test_fab_itself_suggests_too():
    done = subprocess.run([sys.executable, "-m", "fabric", "trian"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().endswith("did you mean 'train'? (fab --list shows the tasks)")
