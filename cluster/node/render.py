"""The text of the files `fab distribute` writes on the master: hostfile, ssh config, known_hosts.

Everything here is pure and deterministic: the same nodes give the same bytes, in rank order
(master first), so the hostfile, the ssh config and `mpirun -n/-ppn` agree on who is who.

Names used on the master (``~`` is the SSH user's home there):

    ~/hosts                               the hostfile: one node alias per line, master first
    ~/.ssh/<cluster>_ed25519              the cluster's private key (node-to-node SSH)
    ~/.ssh/xeon-cluster-<cluster>.known_hosts   every node's host key, as the controller saw it
    ~/.ssh/config                         a managed block (between BEGIN/END lines) naming every node

Host keys are looked up under the node's alias (`HostKeyAlias`), and the known_hosts lines carry
both the alias and the private address, so `ssh node2` and `ssh 10.0.0.12` are both verified
strictly; `StrictHostKeyChecking yes` is written explicitly, never `no`.

Every value written into these files is checked again here, whole-value (cluster/names.py), however
the nodes were made: a line break, space or quote in a name, an address, the user or a key would
add a line or an option to a file that sshd or ssh reads (a `ProxyCommand`, a `command=`).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from cluster import names
from cluster.inventory import Node

HOSTFILE_NAME = "hosts"
KEY_COMMENT_PREFIX = "xeon-cluster:"
_BLOCK_BEGIN = "# BEGIN xeon-cluster {cluster}"
_BLOCK_END = "# END xeon-cluster {cluster}"
_KEY_LINE = re.compile(r"[A-Za-z0-9@._+-]+ [A-Za-z0-9+/=]+\Z")
# The cluster key's public half: `type base64 xeon-cluster:<cluster>` (keys.py writes it).
_PUBLIC_KEY = re.compile(r"[A-Za-z0-9@._+-]+ [A-Za-z0-9+/=]+ [A-Za-z0-9@._:+-]+\Z")


class RenderError(ValueError):
    """The nodes or keys cannot be rendered; the message says which and why."""


def _checked(check, value: object, setting: str) -> str:
    """`value` if `check` (one of cluster/names.py's) passes it, else RenderError with its message."""
    try:
        return check(value, setting)
    except names.UnsafeValue as exc:
        raise RenderError(str(exc)) from None


@dataclass(frozen=True)
class MasterPaths:
    """Where distribution puts things on the master, relative to the SSH user's home (`~`)."""

    cluster: str

    def __post_init__(self) -> None:
        _checked(names.cluster, self.cluster, "cluster name")

    @property
    def private_key(self) -> str:
        return f"~/.ssh/{self.cluster}_ed25519"

    @property
    def known_hosts(self) -> str:
        return f"~/.ssh/xeon-cluster-{self.cluster}.known_hosts"

    @property
    def ssh_config(self) -> str:
        return "~/.ssh/config"

    @property
    def hostfile(self) -> str:
        return f"~/{HOSTFILE_NAME}"


def ordered(nodes: Iterable[Node]) -> list[Node]:
    """Nodes in rank order; refuses repeated ranks or aliases (they would make files ambiguous)."""
    nodes = sorted(nodes, key=lambda n: n.rank)
    if not nodes:
        raise RenderError("nodes: none given; a cluster has at least its master")
    for attr in ("rank", "name"):
        values = [getattr(n, attr) for n in nodes]
        if len(set(values)) != len(values):
            raise RenderError(f"nodes: {attr}s repeat ({values}); every node needs its own {attr}")
    for node in nodes:  # checked when the nodes were made too; these end up in files on the master
        _checked(names.alias, node.name, f"node {node.rank} name")
        _checked(names.host, node.private_address, f"node {node.rank} private_address")
    return nodes


def hostfile_text(nodes: Iterable[Node], slots: int | None = None) -> str:
    """The MPI hostfile: one alias per line, master first; `slots` adds `:N` (ranks per node)."""
    if slots is not None and (isinstance(slots, bool) or not isinstance(slots, int) or slots < 1):
        raise RenderError(f"slots: {slots!r} is not allowed; allowed: a whole number of ranks per node, 1 or more")
    suffix = f":{slots}" if slots else ""
    return "".join(f"{n.name}{suffix}\n" for n in ordered(nodes))


def ssh_config_block(cluster: str, nodes: Iterable[Node], user: str, paths: MasterPaths | None = None) -> str:
    """The managed `~/.ssh/config` block: every node by alias and by private address."""
    paths = paths or MasterPaths(cluster)
    _checked(names.cluster, cluster, "cluster name")
    _checked(names.user, user, "user")
    lines = [_BLOCK_BEGIN.format(cluster=cluster) + " (written by `fab distribute`; edits inside are replaced)"]
    for node in ordered(nodes):
        patterns = node.name if node.private_address == node.name else f"{node.name} {node.private_address}"
        lines += [
            f"Host {patterns}",
            f"    HostName {node.private_address}",
            f"    User {user}",
            f"    IdentityFile {paths.private_key}",
            "    IdentitiesOnly yes",
            f"    HostKeyAlias {node.name}",
            f"    UserKnownHostsFile {paths.known_hosts}",
            "    StrictHostKeyChecking yes",
            "    BatchMode yes",
            "    ConnectTimeout 10",
        ]
    lines.append(_BLOCK_END.format(cluster=cluster))
    return "\n".join(lines) + "\n"


def replace_managed_block(existing: str, block: str, cluster: str) -> str:
    """`existing` ssh config with the cluster's block replaced, or prepended if absent.

    Prepended, because ssh takes the first value it finds for each option: a user's later
    `Host *` section must not override the cluster's settings. Text outside the block is kept.
    """
    _checked(names.cluster, cluster, "cluster name")
    begin, end = _BLOCK_BEGIN.format(cluster=cluster), _BLOCK_END.format(cluster=cluster)
    lines = existing.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.startswith(begin)), None)
    if start is not None:
        stop = next((i for i in range(start, len(lines)) if lines[i].rstrip("\n") == end), None)
        if stop is None:
            raise RenderError(f"~/.ssh/config: the block {begin!r} has no {end!r} line; fix or remove it by hand")
        return "".join(lines[:start]) + block + "".join(lines[stop + 1:])
    rest = existing if not existing or existing.endswith("\n") else existing + "\n"
    return block + ("\n" + rest if rest else "")


def known_hosts_text(nodes: Iterable[Node], host_keys: Mapping[str, str]) -> str:
    """known_hosts lines `alias,private_address type base64`, one per node, rank order.

    `host_keys` maps node alias -> "ssh-ed25519 AAAA..." (the key the controller verified).
    """
    out = []
    for node in ordered(nodes):
        key = host_keys.get(node.name)
        if not key:
            raise RenderError(f"node {node.name}: no host key recorded; it must be reached once by the controller")
        key = " ".join(key.split()[:2])
        if not _KEY_LINE.match(key):
            raise RenderError(f"node {node.name}: host key {key[:40]!r} is not 'type base64'")
        hosts = node.name if node.private_address == node.name else f"{node.name},{node.private_address}"
        out.append(f"{hosts} {key}\n")
    return "".join(out)


def key_comment(cluster: str) -> str:
    """The comment of the cluster key's public half: how authorized_keys lines are recognised."""
    return f"{KEY_COMMENT_PREFIX}{_checked(names.cluster, cluster, 'cluster name')}"


# What the cluster key may not do on a node: it only starts commands (mpirun's proxies, the job).
KEY_RESTRICTIONS = "no-agent-forwarding,no-port-forwarding,no-X11-forwarding"


# An IPv4 or IPv6 network as `address/length`, in the characters such a network is written with.
_CIDR = re.compile(r"[0-9A-Fa-f.:]+/[0-9]{1,3}\Z")


def checked_cidr(cidr: object, setting: str = "cluster subnet CIDR") -> str:
    """`cidr` when it is a network in its canonical form (`10.0.16.0/20`, no host bits set)."""
    try:
        if not isinstance(cidr, str) or not _CIDR.match(cidr) or str(ipaddress.ip_network(cidr)) != cidr:
            raise ValueError
    except ValueError:
        raise RenderError(f"{setting}: {cidr!r} is not allowed; allowed: a network as address/length with no "
                          "host bits set (e.g. 172.31.16.0/20)") from None
    return cidr


def authorized_key_line(public_key: str, nodes: Iterable[Node],
                        network: tuple[str, tuple[str, ...]] | None = None) -> str:
    """The cluster key's authorized_keys line on every node.

    `from="<every node's private address>"` limits it to the cluster's own nodes when those are IP
    addresses (sshd compares host names only with `UseDNS yes`, so a cluster of host names gets no
    `from=`); with `network` (the cluster's subnet, where a new master comes up at an address of its own,
    and the addresses in it that are not the cluster's, such as a local cluster's bridge on the host),
    `from="!<each of those>,<subnet>"`; forwarding is refused either way.
    """
    addresses = [n.private_address for n in ordered(nodes)]
    key = checked_public_key(public_key)
    if network is not None:
        subnet, outside = network
        addresses = [f"!{names.host(a, 'address outside the cluster')}" for a in outside] + [checked_cidr(subnet)]
    source = (f'from="{",".join(addresses)}",' if all(names.is_ip(a.lstrip("!")) or "/" in a for a in addresses)
              else "")
    return f"{source}{KEY_RESTRICTIONS} {key}"


def checked_public_key(public_key: str) -> str:
    """The cluster key's public half without surrounding white space, when it is one line
    `type base64 comment` (RenderError naming it otherwise)."""
    key = public_key.strip()
    if not _PUBLIC_KEY.match(key):
        raise RenderError(f"cluster key: {key[:60]!r} is not allowed; allowed: one line "
                          f"'type base64 {KEY_COMMENT_PREFIX}<cluster>'")
    return key


def table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    """A plain-text table with columns padded to their widest cell (for the per-node summaries)."""
    cells = [list(map(str, header))] + [list(map(str, r)) for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    fmt = lambda row: "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(cells[0]), fmt(["-" * w for w in widths])] + [fmt(r) for r in cells[1:]]) + "\n"
