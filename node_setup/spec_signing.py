"""A supervised run's spec signed and verified with an Ed25519 key: OpenSSH's `ssh-keygen -Y sign` and
`-Y verify` (an allowed-signers file of one line), present on the controller and on every node wherever sshd
is, so that a node can verify what only the controller can sign (the node venv has no `cryptography`).

- `SpecKey(public, private)`: `sign(data)` (the controller, which holds the private half: node_setup/ssh/keys.py's
  `spec_key`), `verify(data, signature)` (anyone with the public half: `--resume` on the controller, a new
  master's boot step, node_setup/supervisor/boot.py). cluster/run/runspec.py decides what is signed.
- `checked_public_key(text)`: one `ssh-ed25519 <base64>` line, as it enters a node (a boot script's argument).

No secret is passed on a command line: the private half is read by ssh-keygen from its 0600 file.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

NAMESPACE = "xeon-cluster-run-spec"  # ssh-keygen's -n: a signature made for this use is valid for no other
IDENTITY = "xeon-cluster-controller"  # the allowed-signers line's principal
SIGNATURE_BEGIN = "-----BEGIN SSH SIGNATURE-----"
_PUBLIC = re.compile(r"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI[A-Za-z0-9+/]{43}=?\Z")
TIMEOUT_S = 30


class SigningError(RuntimeError):
    """ssh-keygen could not sign; the message says why."""


def checked_public_key(text: object, setting: str = "run-spec public key") -> str:
    """`text`'s `ssh-ed25519 <base64>` (a comment dropped), ValueError naming `setting` otherwise."""
    parts = text.split() if isinstance(text, str) else []
    key = " ".join(parts[:2])
    if len(parts) < 2 or not _PUBLIC.match(key):
        raise ValueError(f"{setting}: {str(text)[:60]!r} is not allowed; allowed: one 'ssh-ed25519 <base64>' line")
    return key


@dataclass(frozen=True)
class SpecKey:
    public: str  # "ssh-ed25519 <base64>"
    private: Path | None = None  # the private half's file (the controller's only)

    def sign(self, data: bytes) -> str:
        """The armored SSH signature of `data` (SigningError when this key has no private half or ssh-keygen fails)."""
        if self.private is None:
            raise SigningError("this run-spec key has no private half here: only the controller signs")
        try:
            done = subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-f", str(self.private), "-n", NAMESPACE],
                                  input=data, capture_output=True, timeout=TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SigningError(f"ssh-keygen -Y sign did not run: {exc}") from None
        text = done.stdout.decode(errors="replace")
        if done.returncode != 0 or not text.startswith(SIGNATURE_BEGIN):
            raise SigningError(f"ssh-keygen -Y sign failed: {done.stderr.decode(errors='replace').strip()[-300:]}")
        return text

    def verify(self, data: bytes, signature: str) -> bool:
        """Whether `signature` (armored) is this key's over `data`, in NAMESPACE."""
        if not isinstance(signature, str) or not signature.startswith(SIGNATURE_BEGIN):
            return False
        with tempfile.TemporaryDirectory(prefix="xc-verify-") as tmp:
            signers, sig = Path(tmp) / "allowed_signers", Path(tmp) / "spec.sig"
            signers.write_text(f'{IDENTITY} namespaces="{NAMESPACE}" {checked_public_key(self.public)}\n')
            sig.write_text(signature)
            try:
                done = subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(signers), "-I", IDENTITY, "-n",
                                       NAMESPACE, "-s", str(sig)], input=data, capture_output=True,
                                      timeout=TIMEOUT_S)
            except (OSError, subprocess.TimeoutExpired):
                return False
        return done.returncode == 0
