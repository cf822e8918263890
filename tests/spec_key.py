"""A run-spec key pair made for a test (node_setup/spec_signing.py's SpecKey): an Ed25519 pair from
`ssh-keygen` in a temporary folder, as the controller's key store makes its own."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from node_setup.spec_signing import SpecKey


def made_spec_key(directory: Path | None = None) -> SpecKey:
    folder = Path(directory or tempfile.mkdtemp(prefix="xc-spec-key-"))
    private = folder / "run-spec-ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "test", "-f", str(private)], check=True)
    return SpecKey(" ".join(private.with_name(private.name + ".pub").read_text().split()[:2]), private)
