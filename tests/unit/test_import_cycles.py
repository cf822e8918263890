"""No import cycles among the project's modules: a static scan of every `import` and `from` statement.

Imports inside functions count too: a cycle that only a function-level import keeps from failing at
start-up is still two modules that need each other (the shared piece belongs in a third). Not
counted: imports under `if TYPE_CHECKING:` (never run), and a module's import of its own ancestor
packages (Python imports the package before the module in any case).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cluster", "node_setup", "training", "infra", "xeon_cluster")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _type_checking_only(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"
            or isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statements(tree: ast.AST):
    """Every import statement of the tree, less those under `if TYPE_CHECKING:`."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif _type_checking_only(node):
            yield from (s for other in node.orelse for s in _statements(ast.Module(body=[other], type_ignores=[])))
        else:
            yield from _statements(node)


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules that module `name` (file `path`) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    wanted = set()
    for node in _statements(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            wanted.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            parts = package.split(".")[:len(package.split(".")) - node.level + 1]
            base = ".".join(parts + ([base] if base else []))
        wanted.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
        wanted.add(base)
    found = set()
    for target in wanted:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name and not name.startswith(target + "."):  # not its own ancestors
            found.add(target)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_project_has_no_import_cycles():
    modules = _modules()
    assert len(modules) > 100  # the walk found the project
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert "node_setup.tasks.managed" in graph["node_setup.tasks.train"]  # the scan sees imports
    found = cycles(graph)
    assert not found, f"import cycles (move what both need into a module of its own): {found}"


def test_the_scan_finds_a_cycle_through_a_function_level_import(tmp_path):
    (tmp_path / "pkg").mkdir()
    files = {"pkg/__init__.py": "from pkg import a\n",
             "pkg/a.py": "from pkg.b import THING\n",
             "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import c\n"
                         "THING = 1\ndef late():\n    from pkg import a\n",
             "pkg/c.py": "from . import b\n"}
    for rel, text in files.items():
        (tmp_path / rel).write_text(text)
    modules = {"pkg": tmp_path / "pkg/__init__.py", **{f"pkg.{m}": tmp_path / f"pkg/{m}.py" for m in "abc"}}
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": {"pkg.b"}}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
