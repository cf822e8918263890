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

A console may hold several boots (an instance rebooted) and text that is not cloud-init's (kernel
messages, and anything root on the node writes to the console). Rules:

- This boot: only the text after the console's last boot line counts (BOOT_LINE: cloud-init's own
  mark of a boot, `Cloud-init v. ... running 'init-local' at ...`, which every boot prints before the
  blocks); a console without one is one boot. The kernel's `[    0.000000] Linux version ...` banner
  is no boot line: one such line written after cloud-init's block (by anything that may write to the
  console) would otherwise make a forged block the only one that counts.
- The block: a marker counts wherever it stands in a line (behind any prefix); only a complete
  block (BEGIN ... END) counts, and of this boot's the FIRST, the one cloud-init printed at the end of
  boot: a block printed after it is never the one that counts. Inside a block only lines of the
  block's own shape count, and only behind the BEGIN line's own prefix (the syslog tag cloud-init
  logs with, its digits and spaces aside), so kernel messages printed in between, or a
  fingerprint-shaped line written to the console by something else, are skipped.
- Two blocks of this boot (or one block) that list different fingerprints for one key type are a
  conflict (`ConsoleHostKeys.conflicts`): no key is verified, and `describe` says so.

A presented key is verified when its SHA256 fingerprint is one the block lists and there is no
conflict. Pure: no I/O.
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
_FINGERPRINT_LINE = re.compile(r"(?:^|(?<=\s))(\d{3,5}) (SHA256:[A-Za-z0-9+/]{43}) (.*?) ?\(([A-Z0-9-]+)\)\s*\Z")
_KEY_LINE = re.compile(r"(?:^|(?<=\s))(" + "|".join(re.escape(t) for t in TYPE_LABELS)
                       + r") (AAAA[A-Za-z0-9+/]+={0,2})(?: .*)?\Z")
# How cloud-init marks the start of every boot on the console: its first stage's line.
BOOT_LINE = re.compile(r"Cloud-init v\. \S+ running 'init-local' at ")


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
    fingerprints: tuple[Fingerprint, ...] = ()  # this boot's first complete fingerprint block
    keys: tuple[str, ...] = ()  # "type base64", from this boot's first complete keys block
    conflicts: tuple[str, ...] = ()  # "LABEL SHA256:a, SHA256:b": a key type this boot lists differently

    def match(self, key_type: str, key_b64: str) -> Fingerprint | None:
        """The listed fingerprint of the presented key, or None when the console does not list it (or
        lists conflicting fingerprints for a key type)."""
        if self.conflicts:
            return None
        wanted = fingerprint(key_b64)
        return next((f for f in self.fingerprints if f.sha256 == wanted), None)


def fingerprint(key_b64: str) -> str:
    """`SHA256:...` of a public key's base64 blob, as `ssh-keygen -l` prints it; "" when not base64."""
    try:
        blob = base64.b64decode(key_b64, validate=True)
    except (binascii.Error, ValueError):
        return ""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def _this_boot(lines: list[str]) -> list[str]:
    """The lines after the last boot line (all of them when the console shows none)."""
    starts = [i for i, line in enumerate(lines) if BOOT_LINE.search(line)]
    return lines[starts[-1] + 1:] if starts else lines


def _shape(prefix: str) -> str:
    """A line's prefix with its digits and spaces aside (a syslog tag's time and day change)."""
    return re.sub(r"\s+", " ", re.sub(r"\d+", "0", prefix)).strip()


def _blocks(lines: list[str], begin: str, end: str, shape: re.Pattern) -> list[list[re.Match]]:
    """Every complete BEGIN/END block: its lines of `shape` that stand behind the BEGIN line's prefix."""
    blocks: list[list[re.Match]] = []
    current: list[re.Match] | None = None
    prefix = ""
    for line in lines:
        if begin in line:
            current, prefix = [], _shape(line[:line.index(begin)])
        elif end in line:
            if current is not None:
                blocks.append(current)
            current = None
        elif current is not None:
            found = shape.search(line.rstrip())
            if found and _shape(line[:found.start()]) == prefix:
                current.append(found)
    return blocks


def parse_console(text: str) -> ConsoleHostKeys:
    """The host key fingerprints and keys a console output shows for this boot (empty when it shows none
    yet), with the key types this boot lists differently (see the module's docstring)."""
    lines = _this_boot((text or "").replace("\r\n", "\n").replace("\r", "\n").split("\n"))
    blocks = [[Fingerprint(int(m.group(1)), m.group(2), m.group(3).strip(), m.group(4)) for m in block]
              for block in _blocks(lines, FINGERPRINTS_BEGIN, FINGERPRINTS_END, _FINGERPRINT_LINE)]
    by_label: dict[str, list[str]] = {}
    for block in blocks:
        for found in block:
            if found.sha256 not in by_label.setdefault(found.label, []):
                by_label[found.label].append(found.sha256)
    conflicts = tuple(f"{label} {', '.join(listed)}" for label, listed in by_label.items() if len(listed) > 1)
    keys = _blocks(lines, KEYS_BEGIN, KEYS_END, _KEY_LINE)
    return ConsoleHostKeys(tuple(blocks[0]) if blocks else (),
                           tuple(f"{m.group(1)} {m.group(2)}" for m in keys[0]) if keys else (), conflicts)


def describe(console: ConsoleHostKeys) -> str:
    """The console's fingerprints in one phrase, for a refusal line."""
    listed = ", ".join(str(f) for f in console.fingerprints) or "no fingerprints"
    if console.conflicts:
        return (f"conflicting fingerprints for one key type ({'; '.join(console.conflicts)}: a second block "
                f"not cloud-init's, or text written to the console), so none is trusted; first block: {listed}")
    return listed
