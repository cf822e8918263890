"""A test double of the run store (node_setup/aws/run_secrets.py's SsmStore, SSM Parameter Store) for the local
cluster, named as one: files (0600) in the cluster's data directory, SECRET_STORE_DOUBLE, under the same names
(cluster/run/runspec.py: the cluster's private SSH key, one record per supervised run). Every local node is root
on this machine and sees that directory, so it keeps nothing from a node: it stands in for the store's
interface, not for its access rule (on AWS only the master's role reads the parameters).
"""

from __future__ import annotations

import os
from pathlib import Path

from cluster.run import runspec

SECRET_STORE_DOUBLE = "secret-store-double"  # in a local cluster's data directory


class LocalStoreDouble:
    """Test double of the SSM run store for the local cluster (see the module's docstring)."""

    def __init__(self, data_dir: str | Path, cluster: str):
        self.root = Path(data_dir) / SECRET_STORE_DOUBLE / runspec.store_prefix(cluster).lstrip("/")

    def where(self, name: str) -> str:
        return str(self.root / name)

    def put(self, name: str, text: str) -> None:
        path = self.root / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            partial = path.with_name(path.name + ".xc-new")
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(text)
            os.replace(partial, path)
        except OSError as exc:
            raise runspec.StoreError(f"{path}: not written ({exc})") from None

    def get(self, name: str) -> str | None:
        try:
            return (self.root / name).read_text()
        except OSError:
            return None

    def names(self, folder: str) -> list[str]:
        try:
            return sorted(f"{folder}/{p.name}" for p in (self.root / folder).iterdir()
                          if not p.name.endswith(".xc-new"))
        except OSError:
            return []

    def delete(self, name: str) -> None:
        (self.root / name).unlink(missing_ok=True)

    def write(self, where: str, text: str) -> None:
        """A run's state mirrored beside its spec (`where`: a path on the disk every node shares)."""
        if not where.startswith("/"):
            raise runspec.StoreError(f"{where}: not written (the local store double writes the shared disk only)")
        try:
            Path(where).write_text(text)
        except OSError as exc:
            raise runspec.StoreError(f"{where}: not written ({exc})") from None

    def read(self, where: str) -> str | None:
        """The text of a run's spec or mirrored state at `where` (a path on the disk every node shares)."""
        try:
            return Path(where).read_text()
        except OSError:
            return None
