"""The layers of docs/design.md, checked: `cluster/` decides and imports nothing that acts."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import cluster

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("pulumi", "pulumi_aws", "boto3", "botocore", "fabric", "paramiko", "invoke", "torch", "transformers")


def test_importing_every_cluster_module_loads_nothing_that_acts():
    modules = sorted(f"cluster.{m.name}" for m in pkgutil.iter_modules(cluster.__path__))
    assert len(modules) >= 15  # the walk found the package's modules
    probe = ("import importlib, json, sys\n"
             f"for name in {modules!r}: importlib.import_module(name)\n"
             "print(json.dumps(sorted(m.split('.')[0] for m in sys.modules)))")
    loaded = set(json.loads(subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                                           check=True).stdout))
    assert "cluster" in loaded
    assert not loaded & set(FORBIDDEN), f"cluster/ imports {sorted(loaded & set(FORBIDDEN))}"
