"""The intel profile's Python stack from PyPI, in its own virtual environment, for the IPEX test.

`python -m tests.training.ipex_env` builds it (scripts/setup-dev.sh does, unless
XEON_CLUSTER_SKIP_IPEX=1): the intel profile's pins (cluster/node/profiles.py) except those PyPI does
not carry (the oneCCL bindings come only from Intel's index, which this machine cannot reach), so
the job runs with IPEX over gloo. PyPI's torch 2.8.0 is the CUDA build: it runs on the CPU but
pulls about 3.5 GB of NVIDIA libraries, a 7 GB environment built in about 2 minutes here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cluster.node.profiles import get_profile

VENV = Path(os.environ.get("XEON_CLUSTER_IPEX_VENV") or "/var/cache/xeon-cluster/venv-intel-pypi")
NOT_ON_PYPI = ("oneccl_bind_pt",)
# What the job needs beside the profile's pins (the node venv gets it from this project's wheel).
JOB_EXTRAS = ("pyyaml>=6",)


def python() -> Path:
    return VENV / "bin" / "python"


def pins() -> list[str]:
    return [pin for pin in get_profile("intel").pip_pins if not pin.startswith(NOT_ON_PYPI)] + list(JOB_EXTRAS)


def _runs(code: str) -> bool:
    return python().exists() and subprocess.run([str(python()), "-c", code], capture_output=True).returncode == 0


def ready() -> bool:
    """The environment exists and imports IPEX and transformers (what building it checks)."""
    return _runs("import intel_extension_for_pytorch, transformers")


def installed() -> bool:
    """The environment exists and holds IPEX and transformers (the tests' check: their ranks import them)."""
    return _runs("import importlib.util as u; assert u.find_spec('intel_extension_for_pytorch') and "
                 "u.find_spec('transformers')")


def main() -> int:
    if ready():
        print(f"{VENV}: ready")
        return 0
    print(f"{VENV}: installing {' '.join(pins())} (about 7 GB)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(python()), "-m", "pip", "install", "-q", *pins()], check=True)
    return 0 if ready() else 1


if __name__ == "__main__":
    sys.exit(main())
