"""The xeon-cluster Pulumi program: read the config once, build the cluster, export its outputs."""

import os
import sys

# `pulumi up` runs this file with infra/ on sys.path; the packages live one level up.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import pulumi  # noqa: E402

from infra.cluster import build_cluster  # noqa: E402
from infra.config import load_spec  # noqa: E402

spec = load_spec()
outputs = build_cluster(spec)
for key, value in outputs.items():
    pulumi.export(key, value)
