"""The xeon-cluster Pulumi program: read the config once, build the cluster, export its outputs."""

import importlib.util
import os
import sys

# The setup step's provider runs in a separate Python process, started in infra/, that imports
# `infra`, `cluster` and `node_setup` by name: the project must be installed in the Python that
# runs pulumi (Pulumi.yaml names the project's .venv), not only be on this program's path.
_INSTALLED = importlib.util.find_spec("infra") is not None
# `pulumi up` runs this file with infra/ on sys.path; the packages live one level up, and go first
# so that the project's packages win over any module of infra/ by the same name.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [_ROOT] + [p for p in sys.path if p != _ROOT]

import pulumi  # noqa: E402

from infra.config import load_spec  # noqa: E402
from infra.program import build_cluster  # noqa: E402

spec = load_spec()
if spec.bake and not _INSTALLED:
    pulumi.log.warn("the setup step imports this project in Pulumi's provider process, which preview, refresh "
                    "and destroy need too; from the repository root run `python3 -m venv .venv && "
                    ".venv/bin/pip install -e '.[controller]'` (Pulumi.yaml runs the program from .venv)")
outputs = build_cluster(spec)
for key, value in outputs.items():
    pulumi.export(key, value)
