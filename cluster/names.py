"""What a name or address may look like before it reaches a shell, an ssh config or a file on a node.

User names, host names, addresses, node aliases and node paths enter from inventory files, AWS
tags and stack settings, and end up in `~/.ssh/config`, known_hosts, the hostfile, `export
MASTER_ADDR=...` and remote commands. Each is checked here where it enters (cluster/inventory.py,
cluster/stack/spec.py); what leaves for a shell is still quoted (shlex.quote) where it leaves.
Every check raises UnsafeValue naming the setting, the value and what is allowed.
"""

from __future__ import annotations

import ipaddress
import re

# POSIX portable user names as useradd accepts them by default (lower case, digits, '_', '-').
USER_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}\Z")
# A node's alias in ssh config and the hostfile.
ALIAS_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")
# One DNS label (RFC 1123): letters, digits and inner '-'.
_LABEL_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\Z")
# An absolute path on a node, in characters no shell treats specially.
PATH_RE = re.compile(r"/[A-Za-z0-9._/+-]*\Z")
# A cluster's name: it names files on the master (~/.ssh/<cluster>_ed25519) and the controller's key
# directory, and the managed block of ~/.ssh/config; '..' is refused on top (no climbing out of ~/.ssh).
CLUSTER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
# A job's name (`fab train --name`): it is matched against `--job` and shown in `fab jobs`; it starts with a
# letter, so that it is never a job id (which starts with the date).
JOB_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9._-]{0,63}\Z")
# A TCP port as written in `host:port` (ASCII digits only: str.isdigit also takes '²' and '２').
_PORT_RE = re.compile(r"[0-9]{1,5}\Z")


class UnsafeValue(ValueError):
    """A name or address that cannot be used; the message says which setting and what is allowed."""


def _refuse(setting: str, value: object, allowed: str) -> UnsafeValue:
    return UnsafeValue(f"{setting}: {value!r} is not allowed; allowed: {allowed}")


def user(value: object, setting: str = "user") -> str:
    if not isinstance(value, str) or not USER_RE.fullmatch(value):
        raise _refuse(setting, value, "a login name of lower-case letters, digits, '_' and '-' (e.g. ubuntu)")
    return value


def alias(value: object, setting: str = "name") -> str:
    if not isinstance(value, str) or not ALIAS_RE.fullmatch(value):
        raise _refuse(setting, value, "letters, digits, '.', '_' and '-', starting with a letter or digit")
    return value


def cluster(value: object, setting: str = "cluster name") -> str:
    if not isinstance(value, str) or not CLUSTER_RE.fullmatch(value) or ".." in value:
        raise _refuse(setting, value, "letters, digits, '.', '_' and '-' (up to 64, no '..'), "
                                      "starting with a letter or digit")
    return value


def job_name(value: object, setting: str = "--name") -> str:
    if not isinstance(value, str) or not JOB_NAME_RE.fullmatch(value):
        raise _refuse(setting, value, "letters, digits, '.', '_' and '-' (up to 64), starting with a letter, e.g. "
                                      "lr-3e-5")
    return value


def is_ip(value: str) -> bool:
    """Whether `value` is an IPv4 or IPv6 address without a zone id.

    `ipaddress` takes `fe80::1%<anything>` (newlines and quotes included) as an address with a
    scope id; a zone names one machine's interface, no use to other nodes, and is refused.
    """
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return "%" not in value


def host(value: object, setting: str = "address") -> str:
    """An IP address or a DNS host name."""
    if isinstance(value, str) and (is_ip(value) or (
            len(value) <= 253 and all(_LABEL_RE.fullmatch(label) for label in value.rstrip(".").split(".")))):
        return value
    raise _refuse(setting, value, "an IP address (no %zone) or a host name (letters, digits, '-' and '.')")


def endpoint(value: object, setting: str = "address") -> str:
    """`[user@]host[:port]`, as the controller connects to a node or a gateway."""
    if not isinstance(value, str):
        raise _refuse(setting, value, "[user@]host[:port]")
    rest = value
    if "@" in rest:
        login, rest = rest.split("@", 1)
        user(login, f"{setting} (user)")
    if rest.count(":") == 1:  # host:port (IPv6 addresses have more colons and no port here)
        rest, port = rest.split(":")
        if not _PORT_RE.fullmatch(port) or not 0 < int(port) < 65536:
            raise _refuse(f"{setting} (port)", port, "a TCP port, 1 to 65535")
    host(rest, setting)
    return value


def node_path(value: object, setting: str = "path") -> str:
    if not isinstance(value, str) or not PATH_RE.fullmatch(value) or "/../" in f"{value}/":
        raise _refuse(setting, value, "an absolute path of letters, digits, '.', '_', '+', '-' and '/'")
    return value


# What a terminal or a table may show of text read from a node (a job's output folder, a log line, a
# record): ANSI/OSC escape sequences, C0 and C1 controls (tab kept as a space) and the characters that
# reorder what follows them (bidirectional embeddings, overrides and isolates, the marks) are removed.
_ESCAPE_RE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[PX^_][^\x1b]*(?:\x1b\\)?|.?)")
_UNSHOWN_RE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: object) -> str:
    """`text` as one line a terminal shows as written: escape sequences, controls and bidirectional
    formatting characters removed, a tab as a space."""
    return _UNSHOWN_RE.sub("", _ESCAPE_RE.sub("", str(text))).replace("\t", " ")
