"""One backend per kind of cluster: what differs between local, AWS and an inventory file is asked of
the kind's backend (node_setup/backends/), never decided by a check of the cluster's kind elsewhere.

A scan, like tests/unit/test_layers.py's of imports: every check of a cluster's kind in the project's
code is found by its syntax tree, in each form it takes (`test_the_scan_finds_every_form_of_a_kind_check`).
Outside node_setup/backends/ only the checks listed in ALLOWED remain, each with its reason; a new one
fails here. What each backend answers instead is tested below the scan.
"""

from __future__ import annotations

import ast
import functools
from collections import Counter
from pathlib import Path

import pytest

from cluster.backend import AWS, FILE, KINDS, LOCAL
from cluster.inventory import Inventory, Node

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("cluster", "infra", "node_setup", "training", "xeon_cluster", "bench", "scripts")
BACKENDS = ROOT / "node_setup" / "backends"
KIND_NAMES = {"LOCAL": LOCAL, "AWS": AWS, "FILE": FILE}  # cluster/backend.py's names, however imported
CLUSTER_WORDS = ("cluster", "cluster_name")  # a `--cluster` value or a cluster's name, whose prefix names a kind
PREFIXES = {f"{k}:" for k in KINDS}  # `local:NAME`

# file -> how many kind checks it keeps, and why they are not the backends' concerns (none remain: what
# differs is asked of the backend, or read from the inventory's facts)
ALLOWED: dict[str, tuple[int, str]] = {}


# ---------------------------------------------------------------- the scan


KIND_NAMES_SETS = {name: frozenset({kind}) for name, kind in KIND_NAMES.items()}
KEYED = "keyed by kinds"  # what `_constants` says of a table of kinds: a dict with two kinds or more as keys


def _constants(tree: ast.Module) -> dict[str, frozenset[str]]:
    """A module's names that hold kinds (`X = "local"`, `X = backend.AWS`, `X = (LOCAL, FILE)`), as the kinds
    they hold, and the dicts keyed by kinds, as {KEYED}."""
    found: dict[str, frozenset[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        kinds = _kinds(value, KIND_NAMES_SETS) or (frozenset({KEYED}) if len(_dict_keys(value, KIND_NAMES_SETS)) > 1
                                                   else frozenset())
        found.update({t.id: kinds for t in targets if isinstance(t, ast.Name) and kinds})
    return found


def _kinds(node: ast.AST, names: dict[str, frozenset[str]], *, prefixes: bool = False) -> frozenset[str]:
    """The kinds `node` is: a kind's literal (with `prefixes`, also `"local:"` or `LOCAL + ":"`), a name
    holding kinds, or a tuple, list or set of them; empty when it is none of these."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        if node.value in KINDS:
            return frozenset({node.value})
        return frozenset({node.value[:-1]}) if prefixes and node.value in PREFIXES else frozenset()
    if isinstance(node, (ast.Name, ast.Attribute)):
        return names.get(_name_of(node), frozenset()) - {KEYED}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts:
        parts = [_kinds(e, names, prefixes=prefixes) for e in node.elts]
        return frozenset().union(*parts) if all(parts) else frozenset()
    if prefixes and isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):  # LOCAL + ":"
        right = node.right
        if isinstance(right, ast.Constant) and right.value == ":":
            return _kinds(node.left, names)
    return frozenset()


def _dict_keys(node: ast.AST, names: dict[str, frozenset[str]]) -> frozenset[str]:
    """The kinds a dict display is keyed by (empty: none of its keys is a kind)."""
    if not isinstance(node, ast.Dict):
        return frozenset()
    return frozenset().union(*(_kinds(k, names) for k in node.keys if k is not None))


def _about_kind(node: ast.AST) -> bool:
    """`inventory.kind`, `spec["kind"]`, `spec.get("kind")`, `getattr(x, "kind")`, a name `kind` or `*_kind`,
    or what `cluster_kind(...)` returns."""
    if isinstance(node, ast.Attribute):
        return node.attr == "kind" or node.attr.endswith("_kind")
    if isinstance(node, ast.Name):
        return node.id == "kind" or node.id.endswith("_kind")
    if isinstance(node, ast.Subscript):
        key = node.slice
        return (isinstance(key, ast.Constant) and key.value == "kind") or _about_kind(node.value)
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name == "cluster_kind":
            return True
        kind_arg = [a for a in node.args if isinstance(a, ast.Constant) and a.value == "kind"]
        return bool(kind_arg) and (name == "get" and node.args[0] is kind_arg[0] or name == "getattr")
    return False


def _about_cluster(node: ast.AST) -> bool:
    """An expression made from a cluster's name or `--cluster` value (`cluster`, `self.cluster_name`,
    `cluster.split(":")[0]`, ...)."""
    return any(isinstance(n, ast.Name) and n.id in CLUSTER_WORDS or isinstance(n, ast.Attribute)
               and n.attr in CLUSTER_WORDS for n in ast.walk(node))


def _decides(kinds: frozenset[str]) -> bool:
    """A check against every kind (`kind in KINDS`, a spec's validation) decides nothing."""
    return bool(kinds) and kinds != frozenset(KINDS)


def kind_checks(source: str | ast.Module, names: dict[str, frozenset[str]] | None = None) -> list[int]:
    """The lines of `source` (or its syntax tree) that check a cluster's kind: a comparison of a kind (or of
    a cluster's name) with a kind, a `local:` prefix test, a `match` on a kind, a lookup in a dict keyed by
    kinds. `names`: the names that hold kinds in the other modules (by default only cluster/backend.py's)."""
    tree = ast.parse(source) if isinstance(source, str) else source
    names = {**KIND_NAMES_SETS, **(names or {}), **_constants(tree)}

    def keyed(node: ast.AST, key: ast.AST) -> bool:
        """A lookup in a table of kinds (a dict with two kinds or more as keys, or a name holding one), or by a
        kind in a dict with one as a key."""
        kinds = _dict_keys(node, names)
        return (len(kinds) > 1 or KEYED in names.get(_name_of(node), frozenset())
                or bool(kinds) and (_about_kind(key) or _about_cluster(key)))

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_about_kind(s) or _about_cluster(s) for s in sides) and any(
                    _decides(_kinds(s, names, prefixes=True)) for s in sides):
                lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method, args = node.func.attr, node.args
            if method in ("startswith", "endswith") and args:
                prefix = args[0]
                bare = _kinds(prefix, names)
                if _kinds(prefix, names, prefixes=True) - bare or (
                        bare and (_about_cluster(node.func.value) or _about_kind(node.func.value))):
                    lines.append(node.lineno)
            elif method == "get" and args and keyed(node.func.value, args[0]):
                lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and keyed(node.value, node.slice):
            lines.append(node.lineno)
        elif isinstance(node, ast.Match) and (_about_kind(node.subject) or _about_cluster(node.subject)):
            for case in node.cases:
                if any(isinstance(p, ast.MatchValue) and _decides(_kinds(p.value, names))
                       for p in ast.walk(case.pattern)):
                    lines.append(case.pattern.lineno)
    return sorted(lines)


def _name_of(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


@functools.cache
def project_trees() -> dict[Path, ast.Module]:
    """Every Python module of the project, parsed once for the tests here."""
    paths = [p for folder in SCANNED for p in sorted((ROOT / folder).rglob("*.py"))] + [ROOT / "fabfile.py"]
    return {path: ast.parse(path.read_text()) for path in paths}


@functools.cache
def project_constants() -> dict[str, frozenset[str]]:
    """Every module-level name in the project that holds kinds (a kind's constant, a tuple, a kind-keyed
    dict), so that a check against one imported from elsewhere is found too."""
    found: dict[str, frozenset[str]] = {}
    for tree in project_trees().values():
        found.update(_constants(tree))
    return found


def test_the_scan_finds_every_form_of_a_kind_check():
    source = '''
from cluster.backend import LOCAL
from cluster import backend
LOCAL_KIND = "local"
CLOUD = (backend.AWS,)
ROOTS = {"local": "/var/tmp", AWS: "runs"}
SHORT = {"file": "f", "nodes": "n"}
a = inventory.kind == "aws"
b = spec.get("kind") != "local"
c = spec["kind"] in ("local", "file")
d = kind not in CLOUD
e = plan.inventory.kind == backend.AWS
f = inventory.kind == LOCAL_KIND
g = cluster.startswith("local:")
h = name.startswith(LOCAL + ":")
i = cluster == LOCAL or self.cluster_name.startswith("local")
j = cluster.partition(":")[0] == "local"
k = ROOTS[inventory.kind]
l = {"local": 1, "aws": 2}.get(kind, 0)
m = getattr(inventory, "kind") == "file"
n = cluster_kind(value)[0] == IMPORTED
o = {"local": "/var/tmp"}.get(inventory.kind, "runs")
match inventory.kind:
    case "aws":
        pass
    case backend.LOCAL | "file":
        pass
    case _:
        pass
ok = event.kind == "step" or kind == "stop" or kind in KINDS or market == LOCAL_KIND
ok = uri.startswith("file://") or line.startswith("local") or Inventory(kind="aws") or spec.get("kind", "file")
ok = {"file": "f", "nodes": "n"}.get(option) or SHORT[option]
'''
    found = kind_checks(source, {"IMPORTED": frozenset({"aws"})})
    lines = source.splitlines()
    assert [lines[n - 1].split()[0] for n in found] == [
        *"abcdefghiijklmno", "case", "case"], [lines[n - 1] for n in found]
    assert (LOCAL, AWS, FILE) == KINDS


def test_kind_checks_of_the_backends_concerns_live_in_the_backends_folder_only():
    names = project_constants()
    found = Counter()
    for path, tree in project_trees().items():
        if BACKENDS in path.parents:
            continue
        count = len(kind_checks(tree, names))
        if count:
            found[str(path.relative_to(ROOT))] = count
    assert len(ALLOWED) <= 3
    new = {f: n for f, n in found.items() if n > ALLOWED.get(f, (0, ""))[0]}
    assert not new, (f"a check of the cluster's kind outside node_setup/backends/: {new}; ask the kind's backend "
                     "(node_setup/backends/backend_for) or read the inventory's facts instead, or add the check "
                     "to ALLOWED with why it is none of the backends' concerns")
    gone = {f: n for f, (n, _) in ALLOWED.items() if found.get(f, 0) < n}
    assert not gone, f"fewer kind checks than ALLOWED says (lower the count, or drop the entry): {gone}"


def test_the_backends_folder_picks_the_backend_in_one_function():
    """`backend_for` picks and `cluster_kind` reads `--cluster` (with `local_cluster_name` and `cluster_name`,
    whose inventory file's name is in the file); besides them only the inventory file's reader reads which
    kind a file says it is (`kind: local`, and then the local cluster's facts)."""
    names = project_constants()
    picks = {str(p.relative_to(ROOT)): kind_checks(tree, names) for p, tree in project_trees().items()
             if p.parent == BACKENDS}
    assert {f: len(lines) for f, lines in picks.items() if lines} == {"node_setup/backends/__init__.py": 6,
                                                                     "node_setup/backends/files.py": 2}


# ---------------------------------------------------------------- what each backend answers instead


def _backend(kind: str):
    from node_setup.backends import backend_for

    return backend_for(kind)


def _inventory(kind: str, **facts) -> Inventory:
    nodes = tuple(Node(name=f"node{i}", address=f"10.9.0.{i + 2}", private_address=f"10.9.0.{i + 2}", rank=i,
                       spot=True if kind == AWS else None) for i in range(2))
    return Inventory(name="demo", kind=kind, user="root", nodes=nodes, sockets=1, physical_cores=4, **facts)


@pytest.mark.parametrize("kind", [LOCAL, FILE])
def test_only_aws_checks_before_a_run_arms_a_default_auto_stop_and_keeps_a_group(kind, monkeypatch):
    """Neither the local cluster nor your own machines have a preflight, a stack's idle auto-stop, a workers'
    group for it or for `fab status` (the AWS backend's: tests/aws/)."""
    from node_setup import stack_config

    monkeypatch.setattr(stack_config, "stack_auto_stop_idle", lambda name, root=".": pytest.fail("read the stack"))
    backend, inventory = _backend(kind), _inventory(kind)
    assert backend.preflight_for_run(inventory) is None
    assert backend.default_idle_stop(inventory) is None
    assert backend.idle_stop_files(inventory) == {} and backend.group_status(inventory) is None


def test_the_aws_default_auto_stop_is_the_stacks(monkeypatch):
    from node_setup import stack_config

    asked = []
    monkeypatch.setattr(stack_config, "stack_auto_stop_idle", lambda name, root=".": asked.append(name) or 5400)
    assert _backend(AWS).default_idle_stop(_inventory(AWS)) == 5400 and asked == ["demo"]


def test_only_the_local_clusters_nodes_read_this_machines_wheelhouse():
    assert [_backend(k).copies_wheelhouse() for k in KINDS] == [False, True, True]


def test_a_local_cluster_is_found_with_its_facts(tmp_path):
    """What pure planning reads instead of the kind (cluster/job/jobplan.py, cluster/cost/benchplan.py, the
    supervisor): set by the local backend when it reads `fab local-up`'s inventory, carried in to_mapping."""
    from cluster.job.jobplan import LOCAL_OUTPUT_ROOT
    from node_setup.backends.files import load_inventory_file

    (tmp_path / "inventory.yaml").write_text("kind: local\nname: t1\nhosts: [10.200.0.2, 10.200.0.3]\n")
    (tmp_path / "lab.yaml").write_text("name: lab\nhosts: [192.0.2.10]\n")
    local, lab = load_inventory_file(tmp_path / "inventory.yaml"), load_inventory_file(tmp_path / "lab.yaml")
    assert (local.shared_output_root, local.shared_cores, local.offline) == (f"{LOCAL_OUTPUT_ROOT}/t1", True, True)
    assert (lab.shared_output_root, lab.shared_cores, lab.offline) == (None, False, False)
    again = Inventory.from_mapping(local.to_mapping(), default_name="x", kind=LOCAL)
    assert (again.shared_output_root, again.shared_cores, again.offline) == (f"{LOCAL_OUTPUT_ROOT}/t1", True, True)
    assert local.on_shared_disk(f"{LOCAL_OUTPUT_ROOT}/t1/run-1") and not local.on_shared_disk("xeon-cluster-runs/x")
    assert not local.on_shared_disk(f"{LOCAL_OUTPUT_ROOT}/t10/run-1") and not lab.on_shared_disk("/anything")


def test_planning_reads_the_facts_not_the_kind():
    """The same file's machines planned twice: with the local facts, shares of one machine, unpinned, writing
    to the shared root; without, whole machines, pinned, under each node's home. The kind is not read."""
    from cluster.cost import benchplan
    from cluster.job.jobplan import DEFAULT_OUTPUT_ROOT
    from tests.unit.test_jobplan import RUN, job_plan

    shared = _inventory(FILE, shared_output_root="/srv/runs", shared_cores=True)
    own = _inventory(LOCAL)
    a, b = (job_plan(inv, 2) for inv in (shared, own))
    assert (a.output_dir, a.layout.pin, a.layout.physical_cores) == (f"/srv/runs/{RUN}", False, 2)
    assert (b.output_dir, b.layout.pin, b.layout.physical_cores) == (f"{DEFAULT_OUTPUT_ROOT}/{RUN}", True, 4)
    bench = benchplan.plan_bench(shared, benchplan.BenchOptions(nodes=2), job_id="j2")
    assert bench.output_dir == "/srv/runs/bench-j2"


def test_the_demos_model_is_made_once_in_the_shared_root_where_there_is_one():
    """The offline demo's model: where the nodes share an output root, one for them all there (every node's prepare
    names it, the job reads it); without one, one in each node's home. The data stays in each home."""
    from cluster.job.demo import SYNTHETIC_MODEL_DIR
    from cluster.job.request import Demo
    from tests.unit.test_jobplan import job_plan

    for inv, model in ((_inventory(FILE, shared_output_root="/srv/runs/"), "/srv/runs/.synthetic-model"),
                       (_inventory(LOCAL), SYNTHETIC_MODEL_DIR)):
        job = job_plan(inv, 2, task="qa", demo=Demo("qa", 200))
        args = list(job.training_args)
        assert args[args.index("--model_name_or_path") + 1] == model
        assert args[args.index("--train_file") + 1] == "xeon-cluster-data/synthetic-qa-200/train.json"
        assert job.prepare[0].endswith(f" --model-dir {model} --examples 200 >/dev/null"), job.prepare


def test_the_demo_is_made_again_when_its_data_or_its_model_is_gone(tmp_path):
    """The prepare command every node runs: the generator only when the data or the model is missing (a shared
    root cleared while the homes keep their data, say). The generator here is a test double that records its
    call and writes what the real one would."""
    import subprocess

    from cluster.job.demo import synthetic_data

    fake = tmp_path / "fake-python"
    fake.write_text('#!/bin/sh\necho "$@" >> calls\nwhile [ $# -gt 0 ]; do case $1 in --out) d=$2;; '
                    '--model-dir) m=$2;; esac; shift; done\nmkdir -p "$d" "$m" && touch "$d/train.json"\n')
    fake.chmod(0o755)
    demo = synthetic_data("qa", 50, str(fake), shared_root=str(tmp_path / "shared"))
    calls = tmp_path / "calls"

    def prepare() -> int:
        subprocess.run(["sh", "-c", demo.prepare], cwd=tmp_path, check=True)
        return len(calls.read_text().splitlines()) if calls.exists() else 0

    assert prepare() == 1 and prepare() == 1  # made, then found
    (tmp_path / demo.model).rmdir()
    assert prepare() == 2  # the model was gone
    (tmp_path / demo.directory / "train.json").unlink()
    assert prepare() == 3  # the data was gone


def test_an_inventory_file_may_state_the_facts_and_a_bad_one_is_one_line():
    from cluster.inventory import InventoryError

    data = {"hosts": ["192.0.2.10"], "shared_output_root": "/mnt/nfs/runs", "shared_cores": True, "offline": True}
    inventory = Inventory.from_mapping(data, default_name="lab")
    assert (inventory.shared_output_root, inventory.shared_cores, inventory.offline) == ("/mnt/nfs/runs", True, True)
    assert Inventory.from_mapping(inventory.to_mapping(), default_name="lab") == inventory
    for bad, message in ((dict(shared_output_root="runs; id"), "shared_output_root: 'runs; id' is not allowed"),
                         (dict(offline="yes please"), "offline: 'yes please' is not allowed; allowed: true or false")):
        with pytest.raises(InventoryError, match=message):
            Inventory.from_mapping({"hosts": ["192.0.2.10"], **bad}, default_name="lab")


@pytest.mark.parametrize("kind, market", [(LOCAL, "local"), (AWS, "spot"), (FILE, None)])
def test_the_link_limit_is_only_a_local_clusters_record(kind, market, tmp_path, monkeypatch):
    """`fab bench`'s record of the link: the local cluster's `--link-mbit`, nothing elsewhere."""
    from node_setup.local import state as local_state

    monkeypatch.setattr(local_state, "paths_for", lambda name: pytest.fail("read a state") if kind != LOCAL
                        else local_state.ClusterPaths(name, tmp_path, tmp_path))
    assert _backend(kind).link_limit(_inventory(kind)) == ""  # no state recorded: not limited
    assert _backend(kind).market(_inventory(kind).master) == market
