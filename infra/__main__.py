"""The xeon-cluster Pulumi program: read the config once, build the cluster, export its outputs."""

import importlib.util
import os
import sys

# The setup step's provider runs in a separate Python process that imports `infra`, `cluster` and
# `node_setup` by name, so the project must be installed (`pip install -e .`), not only on our path.
_INSTALLED = importlib.util.find_spec("infra") is not None
# `pulumi up` runs this file with infra/ on sys.path; the packages live one level up.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import pulumi  # noqa: E402

from infra.cluster import build_cluster  # noqa: E402
from infra.config import load_spec  # noqa: E402

spec = load_spec()
if spec.bake and not _INSTALLED:
    pulumi.log.warn("the setup step imports this project in Pulumi's provider process; install it into the "
                    "Python that runs pulumi with `pip install -e .[controller]` or the step will fail")
outputs = build_cluster(spec)
for key, value in outputs.items():
    pulumi.export(key, value)
