"""Fixtures every test folder may use.

Every test, and every process a test starts with this environment, has boto3's instance metadata
lookups (credentials, region) turned off: nothing may be sent to 169.254.169.254 from the host's
own namespace, where a real metadata service may answer. (The local nodes' fake metadata services
live inside their namespaces and are asked by the job's spot watcher, not by boto3.)

Every test session has its own XDG_CONFIG_HOME (a temporary folder, removed at the end): cluster
keys, inventories and local-cluster records that a test makes never land in the user's own
~/.config/xeon-cluster, and concurrent sessions or pytest-xdist workers never share one.

For speed, moto loads only its default images (not every region's latest ones: MOTO_AMIS_PATH), and
every botocore session in the test process shares one loader: the service models (EC2's
is several MB of JSON) are parsed once per process instead of once per client. Loaded models are
read-only, so no test can observe the sharing.

The test command is the set-up's venv python (`.venv/bin/python -m pytest`, no activation): the
tools that venv installs (hadolint, mpirun, fab) come first on PATH, as `. .venv/bin/activate` does.
"""

import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.isolation import stdlib_pickler

pytest_plugins = ["tests.cpu_seconds"]  # the CPU-seconds per file, printed at the end

os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
_CONFIG_HOME = tempfile.mkdtemp(prefix="xc-test-config-")
atexit.register(shutil.rmtree, _CONFIG_HOME, True)
os.environ["XDG_CONFIG_HOME"] = _CONFIG_HOME
try:
    import botocore.loaders
    import botocore.session
except ImportError:  # the controller extra is not installed: the AWS tests skip
    pass
else:
    botocore.session.create_loader = functools.lru_cache(maxsize=None)(botocore.loaders.create_loader)


def _moto_default_images_only() -> None:
    """moto starts each region's EC2 with its ~1,200 "latest" images for that region (the most of a
    region's start, and a sweep starts every region); the tests use only its default images
    (amis.json: moto's example AMIs and the Canonical one). With MOTO_AMIS_PATH naming those, moto loads
    them alone. Set before moto's EC2 models are imported (they read it once)."""
    import gzip
    import importlib.util

    spec = importlib.util.find_spec("moto")
    if spec is None or not spec.submodule_search_locations or "MOTO_AMIS_PATH" in os.environ:
        return
    source = Path(spec.submodule_search_locations[0]) / "ec2" / "resources" / "amis.json.gz"
    if source.exists():
        target = Path(_CONFIG_HOME).with_name(Path(_CONFIG_HOME).name + "-moto-amis.json")
        target.write_bytes(gzip.decompress(source.read_bytes()))
        atexit.register(target.unlink, True)
        os.environ["MOTO_AMIS_PATH"] = str(target)


_moto_default_images_only()
_VENV_BIN = str(Path(sys.executable).parent)
if _VENV_BIN not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = os.pathsep.join([_VENV_BIN, os.environ.get("PATH", "")])

AWS_TEST_REGION = "us-east-1"


@pytest.fixture(autouse=True)
def _stdlib_pickler():
    """Every test starts with pickle's own Pickler (tests/isolation.py: what pulumi.dynamic leaves on it)."""
    with stdlib_pickler():
        yield


@pytest.fixture
def aws_credentials(monkeypatch):
    """Fake credentials and region, and no endpoint override: boto3 can only reach moto."""
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SECURITY_TOKEN": "testing", "AWS_SESSION_TOKEN": "testing",
                       "AWS_DEFAULT_REGION": AWS_TEST_REGION, "AWS_REGION": AWS_TEST_REGION}.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(key, raising=False)


# The longest files, longest first (from CI's --durations on a 2-core machine). Only the order of the
# files changes with this list: a stale entry costs minutes of wall time, never a test.
LONGEST_FILES = (
    "tests/ssh/test_torchrun.py", "tests/ssh/test_supervised_run.py", "tests/rehearsal/test_sitting.py",
    "tests/training/test_compile_ddp.py", "tests/training/test_mpi_training.py", "tests/training/test_faithful_runs.py",
    "tests/ssh/test_soak.py", "tests/ssh/test_lost_master.py", "tests/ssh/test_bench_layouts.py",
    "tests/ssh/test_script_shapes.py", "tests/ssh/test_spot_rehearsal.py", "tests/ssh/test_k8s_pods.py",
    "tests/ssh/test_autostop.py", "tests/ssh/test_resume.py", "tests/ssh/test_bench.py",
    "tests/training/test_causal_lm.py", "tests/ssh/test_train.py", "tests/ssh/test_user_script.py",
)


def pytest_collection_modifyitems(config, items):
    """Files in the order the workers finish soonest: LONGEST_FILES first, then the other files that
    bring up local clusters or launch MPI, then the rest; each file's tests together and in their
    order. pyproject's addopts hand out whole files in this order (`--dist loadfile
    --no-loadscope-reorder`; xdist would otherwise start the files with the most tests first)."""
    root = Path(str(config.rootpath))
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    long_files = {item.path for item in items if any(item.get_closest_marker(m) for m in ("ssh", "mpi", "ipex"))}

    def key(item):
        name = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
        return (rank.get(name, len(rank)), item.path not in long_files)

    items.sort(key=key)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A subprocess that ran past its bound (`subprocess.run(..., timeout=N)`, `communicate(timeout=N)`)
    fails the test with what it had printed by then, not with its command line alone."""
    outcome = yield
    if call.excinfo is None or not isinstance(call.excinfo.value, subprocess.TimeoutExpired):
        return
    expired = call.excinfo.value
    for name, data in (("stdout", expired.stdout), ("stderr", expired.stderr)):
        if data:
            text = data.decode(errors="replace") if isinstance(data, bytes) else data
            outcome.get_result().sections.append((f"{name} of the command that timed out", text[-6000:]))
