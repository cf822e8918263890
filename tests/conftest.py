"""Fixtures every test folder may use.

Every test, and every process a test starts with this environment, has boto3's instance metadata
lookups (credentials, region) turned off: nothing may be sent to 169.254.169.254 from the host's
own namespace, where a real metadata service may answer. (The local nodes' fake metadata services
live inside their namespaces and are asked by the job's spot watcher, not by boto3.)

Every test session has its own XDG_CONFIG_HOME (a temporary folder, removed at the end): cluster
keys, inventories and local-cluster records that a test makes never land in the user's own
~/.config/xeon-cluster, and concurrent sessions or pytest-xdist workers never share one.

For speed, every botocore session in the test process shares one loader: the service models (EC2's
is several MB of JSON) are parsed once per process instead of once per client. Loaded models are
read-only, so no test can observe the sharing.

The test command is the set-up's venv python (`.venv/bin/python -m pytest`, no activation): the
tools that venv installs (hadolint, mpirun, fab) come first on PATH, as `. .venv/bin/activate` does.
"""

import atexit
import functools
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

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
_VENV_BIN = str(Path(sys.executable).parent)
if _VENV_BIN not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = os.pathsep.join([_VENV_BIN, os.environ.get("PATH", "")])

AWS_TEST_REGION = "us-east-1"


@pytest.fixture
def aws_credentials(monkeypatch):
    """Fake credentials and region, and no endpoint override: boto3 can only reach moto."""
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SECURITY_TOKEN": "testing", "AWS_SESSION_TOKEN": "testing",
                       "AWS_DEFAULT_REGION": AWS_TEST_REGION, "AWS_REGION": AWS_TEST_REGION}.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(key, raising=False)

