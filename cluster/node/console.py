"""A node's SSH host keys as its boot console shows them, and whether a presented key is one of them.

At the end of a node's boot cloud-init writes two blocks to the node's console (on EC2 read with
GetConsoleOutput; a local node writes the same blocks into its console file at start-up). The
fingerprint lines are `ssh-keygen -l`'s own (bits, `SHA256:` and base64 without padding, comment,
type), usually behind the syslog tag cloud-init logs them with; the keys block is the `.pub` files:

    <14>Mar  4 10:00:01 ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----
    <14>Mar  4 10:00:01 ec2: 256 SHA256:Ha0b... root@ip-10-0-1-5 (ECDSA)
    <14>Mar  4 10:00:01 ec2: 256 SHA256:8nVx... root@ip-10-0-1-5 (ED25519)
    <14>Mar  4 10:00:01 ec2: 3072 SHA256:Zp1q... root@ip-10-0-1-5 (RSA)
    <14>Mar  4 10:00:01 ec2: -----END SSH HOST KEY FINGERPRINTS-----
    -----BEGIN SSH HOST KEY KEYS-----
    ecdsa-sha2-nistp256 AAAA... root@ip-10-0-1-5
    ssh-ed25519 AAAA... root@ip-10-0-1-5
    ssh-rsa AAAA... root@ip-10-0-1-5
    -----END SSH HOST KEY KEYS-----

Rules: a marker counts wherever it stands in a line (behind any prefix); only a complete block
(BEGIN ... END) counts, and of several (one per boot) the last; inside a block only lines of the
block's own shape count, so kernel messages printed in between are skipped. A presented key is
verified when its SHA256 fingerprint is one the fingerprint block lists. Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass

FINGERPRINTS_BEGIN = "-----BEGIN SSH HOST KEY FINGERPRINTS-----"
FINGERPRINTS_END = "-----END SSH HOST KEY FINGERPRINTS-----"
KEYS_BEGIN = "-----BEGIN SSH HOST KEY KEYS-----"
KEYS_END = "-----END SSH HOST KEY KEYS-----"

# `ssh-keygen -l`'s name for each key type (the last field of a fingerprint line)
TYPE_LABELS = {
    "ssh-ed25519": "ED25519",
    "ssh-rsa": "RSA",
    "ecdsa-sha2-nistp256": "ECDSA",
    "ecdsa-sha2-nistp384": "ECDSA",
    "ecdsa-sha2-nistp521": "ECDSA",
    "ssh-dss": "DSA",
}
_FINGERPRINT_LINE = re.compile(r"(?:^|\s)(\d{3,5}) (SHA256:[A-Za-z0-9+/]{43}) (.*?) ?\(([A-Z0-9-]+)\)\s*\Z")
_KEY_LINE = re.compile(r"(?:^|\s)(" + "|".join(re.escape(t) for t in TYPE_LABELS) + r") (AAAA[A-Za-z0-9+/]+={0,2})"
                       r"(?: .*)?\Z")


class ConsoleUnreadable(RuntimeError):
    """A node's console could not be read at all; the message says why and what to do."""


@dataclass(frozen=True)
class Fingerprint:
    bits: int
    sha256: str  # "SHA256:" + unpadded base64, as `ssh-keygen -l` prints it
    comment: str
    label: str  # ED25519, ECDSA, RSA, DSA

    def __str__(self) -> str:
        return f"{self.sha256} ({self.label})"


@dataclass(frozen=True)
class ConsoleHostKeys:
    fingerprints: tuple[Fingerprint, ...] = ()
    keys: tuple[str, ...] = ()  # "type base64", from the keys block

    def match(self, key_type: str, key_b64: str) -> Fingerprint | None:
        """The listed fingerprint of the presented key, or None when the console does not list it."""
        wanted = fingerprint(key_b64)
        return next((f for f in self.fingerprints if f.sha256 == wanted), None)

    def verified_keys(self) -> tuple[str, ...]:
        """The keys block's keys whose fingerprints the fingerprint block lists."""
        listed = {f.sha256 for f in self.fingerprints}
        return tuple(k for k in self.keys if fingerprint(k.split()[1]) in listed)


def fingerprint(key_b64: str) -> str:
    """`SHA256:...` of a public key's base64 blob, as `ssh-keygen -l` prints it; "" when not base64."""
    try:
        blob = base64.b64decode(key_b64, validate=True)
    except (binascii.Error, ValueError):
        return ""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def _last_block(lines: list[str], begin: str, end: str) -> list[str] | None:
    """The lines between the last complete BEGIN/END pair (None when there is none)."""
    block: list[str] | None = None
    current: list[str] | None = None
    for line in lines:
        if begin in line:
            current = []
        elif end in line:
            if current is not None:
                block = current
            current = None
        elif current is not None:
            current.append(line)
    return block


def parse_console(text: str) -> ConsoleHostKeys:
    """The host key fingerprints and keys a console output shows (empty when it shows none yet)."""
    lines = (text or "").replace("\r\n", "\n").replace("\r", "\n").split("\n")
    fingerprints = []
    for line in _last_block(lines, FINGERPRINTS_BEGIN, FINGERPRINTS_END) or []:
        found = _FINGERPRINT_LINE.search(line.rstrip())
        if found:
            fingerprints.append(Fingerprint(int(found.group(1)), found.group(2), found.group(3).strip(),
                                            found.group(4)))
    keys = []
    for line in _last_block(lines, KEYS_BEGIN, KEYS_END) or []:
        found = _KEY_LINE.search(line.rstrip())
        if found:
            keys.append(f"{found.group(1)} {found.group(2)}")
    return ConsoleHostKeys(tuple(fingerprints), tuple(keys))


def describe(console: ConsoleHostKeys) -> str:
    """The console's fingerprints in one phrase, for a refusal line."""
    return ", ".join(str(f) for f in console.fingerprints) or "no fingerprints"
