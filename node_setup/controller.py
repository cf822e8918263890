"""This controller's own places: the project checkout, its version, and the config directory.

Written once here because several rooms need them: the project wheel that setup ships
(node_setup/ssh/wheels.py), the per-cluster keys that must never land in the checkout
(node_setup/ssh/keys.py) and the local cluster's files (node_setup/local/state.py).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (Ubuntu 22.04): the same parser, from PyPI
    import tomli as tomllib

PROJECT_ROOT = Path(__file__).resolve().parents[1]
PROJECT_PACKAGES = ("cluster", "infra", "node_setup", "training", "xeon_cluster")
DISTRIBUTION = "xeon-cluster"


def config_root() -> Path:
    """The user's xeon-cluster config directory: ``${XDG_CONFIG_HOME:-~/.config}/xeon-cluster``."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "xeon-cluster"


# The config directory's folders that hold the controller's secrets: the key store (every cluster's key pair
# and known_hosts, the run-spec signing key: node_setup/ssh/keys.py) and the local clusters' folders (each
# holds the controller's private key for that cluster: node_setup/local/state.py). A local node sees neither
# (node_setup/local/system.py hides them under an empty tmpfs); the rest of the config directory is not secret.
KEY_STORE_DIR = "keys"
SPEC_KEY_FILE = "run-spec-ed25519"  # in the key store: the private half that signs supervised runs' specs (.pub beside)
LOCAL_CLUSTERS_DIR = "local"
SECRET_DIRS = (KEY_STORE_DIR, LOCAL_CLUSTERS_DIR)


def secret_folders(root: Path) -> list[Path]:
    """The folders of config directory `root` that hold secrets (SECRET_DIRS)."""
    return [root / name for name in SECRET_DIRS]


def cache_root() -> Path:
    """The controller's cache: ``${XDG_CACHE_HOME:-~/.cache}/xeon-cluster`` (project wheels)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "xeon-cluster"


def source_files(root: Path) -> list[Path]:
    """What the project's version digest covers: pyproject.toml and every package file."""
    files = [root / "pyproject.toml"]
    for package in PROJECT_PACKAGES:
        files += sorted(p for p in (root / package).rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return files


def base_version(root: Path | None = None) -> str:
    """The version in pyproject.toml, or the installed distribution's when there is no checkout."""
    pyproject = (root or PROJECT_ROOT) / "pyproject.toml"
    if not pyproject.exists():
        from importlib.metadata import version

        return version(DISTRIBUTION)
    return tomllib.loads(pyproject.read_text())["project"]["version"]


def project_version(root: Path | None = None) -> str:
    """`<version>+src.<12 hex>`: the pyproject version and a digest of the package sources."""
    root = root or PROJECT_ROOT
    if not (root / "pyproject.toml").exists():
        return base_version(root)
    digest = hashlib.sha256()
    for path in source_files(root):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{base_version(root)}+src.{digest.hexdigest()[:12]}"
