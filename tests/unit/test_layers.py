"""The layers of docs/design.md, checked: `cluster/` decides and imports nothing that acts."""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import cluster

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("pulumi", "pulumi_aws", "boto3", "botocore", "fabric", "paramiko", "invoke", "torch", "transformers")


def test_importing_every_cluster_module_loads_nothing_that_acts():
    modules = sorted(m.name for m in pkgutil.walk_packages(cluster.__path__, "cluster."))
    assert len(modules) >= 40  # the walk found the sub-packages' modules
    probe = ("import importlib, json, sys\n"
             f"for name in {modules!r}: importlib.import_module(name)\n"
             "print(json.dumps(sorted(m.split('.')[0] for m in sys.modules)))")
    loaded = set(json.loads(subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                                           check=True).stdout))
    assert "cluster" in loaded
    assert not loaded & set(FORBIDDEN), f"cluster/ imports {sorted(loaded & set(FORBIDDEN))}"


# cluster/'s own order, lowest first: a module imports from its own layer or a lower one. The shared base (exit codes,
# durations, names, the record reader, the node-side shell) is for every layer; the cluster's vocabulary
# (inventory) sits with the nodes; backend (the kinds' one interface) on top.
CLUSTER_LAYERS = (("exit_codes", "durations", "names", "records", "shell"), ("stack",), ("node", "inventory"),
                  ("cost",), ("job",), ("run",), ("backend",))
# The arrows that still run back up, each (file, the higher unit it imports): this list only shrinks (the test
# below fails for one that is gone, so that it goes from here too).
CLUSTER_BACK_ARROWS = {
    ("cluster/stack/spec.py", "node"),  # the softwareProfile setting is checked against node/profiles.py
    ("cluster/node/autostop.py", "job"),  # JOBS_DIR: where a job's directory lies on a node
    ("cluster/cost/benchplan.py", "job"),  # `fab bench` plans its runs as jobs
    ("cluster/cost/jobcosts.py", "job"),  # `fab jobs --costs` reads `fab jobs`' rows
    ("cluster/cost/plan_options.py", "job"),  # LoRA's and the gradient sync's settings
    ("cluster/job/jobplan.py", "run"),  # a relaunch's batch plan and --resume words
    ("cluster/job/request.py", "run"),  # the run id's form, --resume's words
    ("cluster/job/train_options.py", "run"),  # the --managed defaults and --wait-for-capacity's reader
}
_CLUSTER_RANK = {unit: rank for rank, layer in enumerate(CLUSTER_LAYERS) for unit in layer}


def _cluster_arrows() -> set[tuple[str, str]]:
    """(file, unit) for every import of one of cluster/'s units (a sub-package or a top module) from another."""
    arrows = set()
    for path in sorted((ROOT / "cluster").rglob("*.py")):
        own = path.relative_to(ROOT / "cluster").with_suffix("").parts[0]
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "cluster" and len(parts) > 1 and parts[1] != own and parts[1] in _CLUSTER_RANK:
                arrows.add((str(path.relative_to(ROOT)), parts[1]))
    return arrows


def test_every_unit_of_cluster_has_its_place_in_the_order():
    units = {p.stem for p in (ROOT / "cluster").glob("*.py") if p.stem != "__init__"}
    units |= {p.parent.name for p in (ROOT / "cluster").glob("*/__init__.py")}
    assert units == set(_CLUSTER_RANK), sorted(units ^ set(_CLUSTER_RANK))


def test_cluster_imports_run_down_its_layers():
    own_rank = {}
    for path in (ROOT / "cluster").rglob("*.py"):
        unit = path.relative_to(ROOT / "cluster").with_suffix("").parts[0]
        own_rank[str(path.relative_to(ROOT))] = _CLUSTER_RANK.get(unit, -1)
    up = {(f, unit) for f, unit in _cluster_arrows() if _CLUSTER_RANK[unit] > own_rank[f]}
    assert not up - CLUSTER_BACK_ARROWS, f"imports against cluster/'s order: {sorted(up - CLUSTER_BACK_ARROWS)}"
    assert not CLUSTER_BACK_ARROWS - up, f"no longer imported: drop {sorted(CLUSTER_BACK_ARROWS - up)} from the list"


# docs/design.md's layer table for node_setup's rooms, as data: the project modules each room may import
# besides its own, and the packages it must never import. The table there names each of them too.
ROOMS = {
    "node_setup/tasks": (("cluster", "node_setup"), ()),
    "node_setup/aws": (("cluster",), ("fabric", "paramiko")),
    "node_setup/ssh": (("cluster", "node_setup.controller", "node_setup.local.state",
                        "node_setup.local.console", "node_setup.aws.console", "node_setup.backends",
                        "node_setup.job_lifecycle.transport", "node_setup.spec_signing"),
                       ("boto3",)),
    "node_setup/local": (("cluster", "node_setup.controller", "training.imds", "training.hardware"), ("boto3",)),
    "node_setup/supervisor": (("cluster", "node_setup.backends", "node_setup.job_lifecycle", "node_setup.spec_signing"),
                              ("fabric", "paramiko", "invoke")),
    "node_setup/job_lifecycle": (("cluster",), ("fabric", "paramiko", "invoke", "boto3")),
    "node_setup/backends": (("cluster", "node_setup.local", "node_setup.aws", "node_setup.stack_config"),
                            ("fabric", "paramiko", "invoke")),
}
NEVER_IN_NODE_SETUP = ("pulumi", "pulumi_aws", "torch", "transformers")
PROJECT_PACKAGES = ("cluster", "node_setup", "training", "infra", "xeon_cluster", "bench", "scripts", "tests")


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _imports(path: Path) -> set[str]:
    """Every module (or module.name) the file imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's own package
                package = path.relative_to(ROOT).parent.parts
                base = ".".join(package[:len(package) - node.level + 1] + ((base,) if base else ()))
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _design_row(room: str) -> str:
    """The 'may import' cell of docs/design.md's layer table for `room`."""
    for line in (ROOT / "docs" / "design.md").read_text().splitlines():
        if line.startswith(f"| `{room}/` |"):
            return line.rsplit("|", 2)[-2].lower()
    raise AssertionError(f"docs/design.md's layer table has no row for {room}/")


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_each_node_setup_room_imports_only_what_the_layer_table_allows(room):
    allowed, never = ROOMS[room]
    own = room.replace("/", ".")
    files = sorted((ROOT / room).glob("*.py"))
    assert len(files) >= 3  # the glob found the room's modules
    wrong = []
    for path in files:
        for name in sorted(_imports(path)):
            project = name.split(".")[0] in PROJECT_PACKAGES
            if (project and not any(_within(name, p) for p in (own, *allowed))
                    or any(_within(name, p) for p in never)):
                wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not wrong, f"not allowed for {room}/ by docs/design.md's layer table: {wrong}"


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_the_layer_table_names_what_each_node_setup_room_may_and_may_not_import(room):
    allowed, never = ROOMS[room]
    row = _design_row(room)
    forms = {m: (m, m.replace(".", "/") + ".py", m.replace(".", "/") + "/") for m in allowed}
    missing = [m for m, names in forms.items() if not any(n.lower() in row for n in names)]
    missing += [f"never {p}" for p in never if p not in row.partition("never")[2]]
    assert not missing, f"docs/design.md's row for {room}/ does not name {missing}"


def test_nothing_in_node_setup_imports_pulumi_torch_or_transformers():
    wrong = [f"{path.relative_to(ROOT)} imports {name}" for path in sorted((ROOT / "node_setup").rglob("*.py"))
             for name in _imports(path) if any(_within(name, p) for p in NEVER_IN_NODE_SETUP)]
    assert not wrong


# What `fab --list`, `fab --help TASK` and a bad option pay for at start-up: node_setup.tasks and what it
# imports at module level. AWS, Kubernetes and the training stack load inside the tasks that use them.
NOT_AT_FAB_START = ("boto3", "botocore", "pulumi", "pulumi_aws", "torch", "transformers", "kubernetes", "kubeflow",
                    "kubeflow_trainer_api")


def test_importing_the_fab_tasks_loads_no_aws_kubernetes_or_training_stack():
    probe = "import json, sys, node_setup.tasks; print(json.dumps(sorted(m.split('.')[0] for m in sys.modules)))"
    loaded = set(json.loads(subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                                           check=True).stdout))
    assert "invoke" in loaded  # the probe imported the tasks
    heavy = sorted(loaded & set(NOT_AT_FAB_START))
    assert not heavy, f"importing node_setup.tasks loads {heavy}: import them inside the task that needs them"
