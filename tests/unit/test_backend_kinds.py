"""One backend per kind of cluster: what differs between local, AWS and an inventory file is asked of
the kind's backend (node_setup/backends/), never decided by a check of the cluster's kind elsewhere.

A scan, like tests/unit/test_layers.py's of imports: every comparison of a cluster's kind with one of
the kinds ("local", "aws", "file", or cluster/backend.py's names for them) in node_setup/ and cluster/
is found by its syntax tree. Outside node_setup/backends/ only the checks listed in ALLOWED remain,
each a decision that is none of the backends' concerns; a new one fails here.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from cluster.backend import AWS, FILE, KINDS, LOCAL

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ROOT / "node_setup" / "backends"
KIND_NAMES = {"LOCAL", "AWS", "FILE"}  # a check against every kind (`in KINDS`) decides nothing

# file -> how many kind checks it keeps, and why they are not the backends' concerns
ALLOWED = {
    "cluster/cost/spend.py": (2, "the market column: local, spot, on-demand (a rendering)"),
    "cluster/job/jobreport.py": (1, "the spot advice without --checkpoint-uri, for an AWS cluster's spot nodes"),
    "cluster/job/jobplan.py": (2, "a local cluster's nodes share this machine's cores (the layout); its output "
                             "root under /var/tmp, planned in cluster/ (the supervisor and pure tests plan jobs)"),
    "cluster/cost/benchplan.py": (1, "a local cluster's output root, as cluster/job/jobplan.py's"),
    "cluster/node/autostop.py": (1, "the idle auto-stop is the stack's, on AWS only"),
    "node_setup/ssh/requirements.py": (1, "the nodes of a local cluster install from this machine's wheelhouse"),
    "node_setup/ssh/install.py": (1, "as node_setup/ssh/requirements.py"),
    "node_setup/ssh/autostop.py": (1, "the workers' group the AWS auto-stop sets to 0"),
    "node_setup/ssh/job.py": (1, "the stack's idle auto-stop armed after an AWS job's start"),
    "node_setup/aws/train_checks.py": (1, "the AWS checks before a run"),
    "node_setup/tasks/jobs.py": (1, "`fab status`'s line on the AWS workers' group and the auto-stop"),
    "node_setup/tasks/train.py": (4, "synthetic data by default locally; AWS's preflight before a run"),
    "node_setup/tasks/managed.py": (4, "AWS's preflight, the spot master's warning, its recovery, and the "
                                       "checkpoints only on its disk"),
    "node_setup/tasks/bench.py": (1, "`fab bench`'s link limit: recorded by a local cluster"),
    "node_setup/supervisor/onmaster.py": (1, "where a lost master's checkpoints survive: the local disk is shared"),
}


def _about_kind(node: ast.expr) -> bool:
    """`inventory.kind`, `x.kind`, `spec["kind"]`, `spec.get("kind")`, or a variable named `kind`."""
    if isinstance(node, ast.Attribute):
        return node.attr == "kind"
    if isinstance(node, ast.Name):
        return node.id == "kind"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "kind"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "kind"
    return False


def _a_kind(node: ast.expr) -> bool:
    """"local", "aws", "file", or LOCAL/AWS/FILE (backend.LOCAL, spend.LOCAL, ...), or a tuple of them."""
    if isinstance(node, ast.Constant):
        return node.value in KINDS
    if isinstance(node, ast.Name):
        return node.id in KIND_NAMES
    if isinstance(node, ast.Attribute):
        return node.attr in KIND_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(_a_kind(e) for e in node.elts)
    return False


def kind_checks(source: str) -> list[int]:
    """The lines of `source` that compare a cluster's kind with a kind."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_about_kind(s) for s in sides) and any(_a_kind(s) for s in sides):
                lines.append(node.lineno)
    return lines


def test_the_scan_finds_the_forms_a_kind_check_takes():
    found = kind_checks('if inventory.kind == "aws": pass\n'
                        'x = spec.get("kind") != "local"\n'
                        'y = spec["kind"] in ("local", "file")\n'
                        'z = kind == LOCAL\n'
                        'w = plan.inventory.kind == backend.AWS\n'
                        'ok = event.kind == "step" or kind == "stop"\n')
    assert found == [1, 2, 3, 4, 5]
    assert (LOCAL, AWS, FILE) == KINDS


def test_kind_checks_of_the_backends_concerns_live_in_the_backends_folder_only():
    found = Counter()
    for path in sorted((ROOT / "node_setup").rglob("*.py")) + sorted((ROOT / "cluster").rglob("*.py")):
        if BACKENDS in path.parents:
            continue
        count = len(kind_checks(path.read_text()))
        if count:
            found[str(path.relative_to(ROOT))] = count
    assert sum(found.values()) >= 10  # the scan found the checks that remain
    new = {f: n for f, n in found.items() if n > ALLOWED.get(f, (0, ""))[0]}
    assert not new, (f"a check of the cluster's kind outside node_setup/backends/: {new}; ask the kind's backend "
                     "(node_setup/backends/backend_for) instead, or add the check to ALLOWED with why it is none "
                     "of the backends' concerns")
    gone = {f: n for f, (n, _) in ALLOWED.items() if found.get(f, 0) < n}
    assert not gone, f"fewer kind checks than ALLOWED says (lower the count): {gone}"


def test_the_backends_folder_picks_the_backend_in_one_function():
    """`backend_for` picks; besides it only the inventory file's reader reads which kind a file says it is
    (`kind: local`, and then the local nodes' start times)."""
    picks = {str(p.relative_to(ROOT)): kind_checks(p.read_text()) for p in sorted(BACKENDS.glob("*.py"))}
    assert {f: len(lines) for f, lines in picks.items() if lines} == {"node_setup/backends/__init__.py": 2,
                                                                     "node_setup/backends/files.py": 2}
