"""The markers the inner loop deselects (docs/testing.md, "The inner loop"): every test module under
tests/ssh starts or uses a local cluster (sshd in network namespaces), so each declares the `ssh` marker;
one that forgot would start a cluster in `pytest -m "not ssh"`."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module_marks(path: Path) -> set[str]:
    """The marker names of the module's `pytestmark` (one marker or a list of them)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                                for t in node.targets):
            return {n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute)} - {"mark"}
    return set()


def test_every_test_module_under_tests_ssh_is_marked_ssh():
    modules = sorted((ROOT / "tests" / "ssh").glob("test_*.py"))
    assert len(modules) >= 10  # the glob found the directory's modules
    unmarked = [m.name for m in modules if "ssh" not in _module_marks(m)]
    assert not unmarked, f"tests/ssh modules without pytestmark = [pytest.mark.ssh, ...]: {unmarked}"
