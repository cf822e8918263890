"""README's package map names every module of every Python folder it has a row for, and only modules that exist.

A row's first cell is one folder (`cluster/job/`); in its second cell, every backticked word that could be a module
name (letters, digits, underscores) must be a module of that folder, and every module of that folder (but
`__init__`) must be named there. Other backticked text (`fab train`, `--managed`, `backend_for(kind)`) is prose.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROW_RE = re.compile(r"^\| `(?P<folder>[a-z_/]+/)` \| (?P<holds>.*) \|$")
WORD_RE = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`")
# Every folder of Python modules a user or a developer would look for a feature in.
PACKAGES = ("cluster", "infra", "node_setup", "training", "xeon_cluster")


def _rows() -> dict[str, set[str]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Package map", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        found = ROW_RE.match(line)
        if found:
            rows[found.group("folder")] = set(WORD_RE.findall(found.group("holds")))
    return rows


def _python_folders() -> list[Path]:
    return sorted(p.parent for top in PACKAGES for p in (ROOT / top).rglob("__init__.py")
                  if "__pycache__" not in p.parts)


def _modules(folder: Path) -> set[str]:
    return {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}


def test_every_python_folder_has_a_row():
    rows = _rows()
    missing = [f"{f.relative_to(ROOT)}/" for f in _python_folders()
               if f"{f.relative_to(ROOT)}/" not in rows and _modules(f)]
    assert not missing, f"README's package map has no row for {missing}"


@pytest.mark.parametrize("folder", [f"{f.relative_to(ROOT)}/" for f in _python_folders()])
def test_a_row_names_every_module_of_its_folder_and_nothing_else(folder):
    rows = _rows()
    if folder not in rows:
        pytest.skip(f"{folder} holds no modules")
    modules = _modules(ROOT / folder)
    named = rows[folder]
    assert not modules - named, f"README's row for {folder} does not name {sorted(modules - named)}"
    assert not named - modules, f"README's row for {folder} names {sorted(named - modules)}, not modules there"
