"""Distribution: what the master needs to reach every node by SSH (for mpirun), written by the controller.

    distribute(inventory, ...) -> DistributionResult      (fab distribute; fab train before launch)

1. The cluster key pair (node_setup.ssh.keys: made once per cluster on the controller).
2. Every node, in parallel, over the controller's verified connection: the key's public half
   written to ~/.ssh/authorized_keys, limited to the cluster's own addresses (`from=`) and with
   forwarding refused (cluster/node/render.py authorized_key_line), replacing an older line of that key;
   the host key the controller verified is noted.
3. The master (only when every node succeeded; a hostfile naming a dead node would only fail
   later, inside mpirun): the private half at ~/.ssh/<cluster>_ed25519 (0600, created 0600 before
   the content arrives), ~/.ssh/xeon-cluster-<cluster>.known_hosts with each node's host key as
   the controller saw it, the managed block in ~/.ssh/config (Host alias + private address,
   HostKeyAlias, StrictHostKeyChecking yes), and the hostfile ~/hosts, master first.

Why host keys come from the controller's sessions and not from `ssh-keyscan` on the master: the
controller's session to each node was checked against the host key the toolkit pinned for that
node (connections.py), so the key read from that session is authenticated; a scan from the master
over the cluster network would accept whatever answers (trust on first use, again, from a place
the user cannot watch). The key is taken from the SSH transport itself
(`transport.get_remote_server_key()`), i.e. exactly the key that sshd proved it holds, which also
works when sshd's host key is not in /etc/ssh (the local cluster's nodes keep their own).
"""

from __future__ import annotations

import io
import shlex
import time
from dataclasses import dataclass, field
from typing import Callable

from cluster.inventory import Inventory
from cluster.node.render import (MasterPaths, authorized_key_line, hostfile_text, key_comment, known_hosts_text,
                            replace_managed_block, ssh_config_block, table)
from cluster import shell
from node_setup.ssh import connections, keys
from node_setup.ssh.fanout import each_node


class DistributionError(RuntimeError):
    """Distribution did not reach every node; `result` says which and why."""

    def __init__(self, result: "DistributionResult"):
        self.result = result
        failed = "; ".join(f"{n.node}: {n.detail}" for n in result.failed)
        super().__init__(f"cluster {result.cluster!r}: {failed}. Fix or replace those nodes (or use fewer with "
                         "--nodes) and rerun; nodes already done are left as they are")


@dataclass
class NodeDistribution:
    node: str
    ok: bool
    detail: str
    host_key: str | None = None
    unreachable: bool = False


@dataclass
class DistributionResult:
    cluster: str
    nodes: list[NodeDistribution] = field(default_factory=list)
    master_files: dict[str, str] = field(default_factory=dict)  # absolute path on the master -> "written"/"unchanged"
    hostfile: str | None = None  # absolute path of the hostfile on the master
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.nodes) and all(n.ok for n in self.nodes) and self.hostfile is not None

    @property
    def failed(self) -> list[NodeDistribution]:
        return [n for n in self.nodes if not n.ok]

    def table(self) -> str:
        return table([(n.node, "ok" if n.ok else "failed", n.detail) for n in self.nodes], ("node", "result", "detail"))


def _authorize(conn, line: str, cluster: str) -> tuple[str, str]:
    """Make `line` the cluster key's authorized_keys line; returns (host key seen, "written"/"unchanged")."""
    host_key = connections.seen_host_key(conn)
    script = shell.render("authorize-key.sh", {"FILE": ".ssh/authorized_keys", "LINE": line,
                                               "MARK": key_comment(cluster)})
    out = conn.run(f"sh -c {shlex.quote(script)}", hide=True, in_stream=False)
    return host_key, out.stdout.strip().splitlines()[-1]


def _put_text(conn, path: str, text: str, mode: str) -> None:
    """Upload `text` to `path` (relative to home) with `mode` set before the content arrives."""
    conn.run(f"umask 077; : > {shlex.quote(path)}.xc-new && chmod {mode} {shlex.quote(path)}.xc-new",
             hide=True, in_stream=False)
    conn.put(io.StringIO(text), remote=f"{path}.xc-new")
    conn.run(f"mv -f {shlex.quote(path)}.xc-new {shlex.quote(path)}", hide=True, in_stream=False)


def _read(conn, path: str) -> str | None:
    result = conn.run(f"cat {shlex.quote(path)} 2>/dev/null", hide=True, warn=True, in_stream=False)
    return result.stdout if result.ok else None


def _write_master_files(master, inventory: Inventory, key: keys.ClusterKey,
                        host_keys: dict[str, str]) -> tuple[str, dict[str, str]]:
    paths = MasterPaths(inventory.name)
    home = master.run("mkdir -p .ssh && chmod 700 .ssh && echo $HOME", hide=True, in_stream=False).stdout.strip()
    rel = lambda p: p[2:] if p.startswith("~/") else p  # noqa: E731 - sftp paths are relative to home
    wanted = {
        paths.private_key: (key.private_key, "600"),
        paths.known_hosts: (known_hosts_text(inventory.nodes, host_keys), "600"),
        paths.hostfile: (hostfile_text(inventory.nodes), "644"),
    }
    existing_config = _read(master, rel(paths.ssh_config)) or ""
    block = ssh_config_block(inventory.name, inventory.nodes, inventory.user, paths)
    wanted[paths.ssh_config] = (replace_managed_block(existing_config, block, inventory.name), "600")
    done = {}
    modes_kept = []  # unchanged files only get their mode reasserted, all in one round trip
    for path, (text, mode) in wanted.items():
        current = existing_config if path == paths.ssh_config else _read(master, rel(path))
        if current == text:
            modes_kept.append(f"chmod {mode} {shlex.quote(rel(path))}")
            done[f"{home}/{rel(path)}"] = "unchanged"
        else:
            _put_text(master, rel(path), text, mode)
            done[f"{home}/{rel(path)}"] = "written"
    if modes_kept:
        master.run(" && ".join(modes_kept), hide=True, in_stream=False)
    return f"{home}/{rel(paths.hostfile)}", done


def distribute(inventory: Inventory, *, conns: dict | None = None, connect_timeout: float = connections.CONNECT_TIMEOUT,
               progress: Callable[[str, str], None] = lambda node, msg: None,
               raise_on_failure: bool = True) -> DistributionResult:
    """Set up node-to-node SSH for the inventory's nodes (see the module docstring).

    Raises DistributionError (its `result` lists every node) when a node failed, unless
    `raise_on_failure` is False. Idempotent: a second run changes no file and no authorized_keys.
    """
    start = time.monotonic()
    key = keys.ensure_cluster_key(inventory.name)
    with connections.node_connections(inventory, conns, connect_timeout=connect_timeout) as conns:
        result = _distribute(inventory, conns, key, progress)
    result.seconds = time.monotonic() - start
    if raise_on_failure and not result.ok:
        raise DistributionError(result)
    return result


def _distribute(inventory: Inventory, conns: dict, key: keys.ClusterKey,
                progress: Callable[[str, str], None]) -> DistributionResult:
    from node_setup.backends import backend_for

    line = authorized_key_line(key.public_key, inventory.nodes, backend_for(inventory.kind).cluster_network(inventory))
    result = DistributionResult(inventory.name)

    def one(name: str, conn) -> NodeDistribution:
        try:
            host_key, change = _authorize(conn, line, inventory.name)
        except Exception as exc:  # noqa: BLE001 - every node's failure is reported, the others go on
            return NodeDistribution(name, False, connections.explain(exc, conn),
                                    unreachable=connections.is_unreachable(exc))
        progress(name, f"cluster key {change} in authorized_keys")
        return NodeDistribution(name, True, f"key {change}", host_key=host_key)

    names = [n.name for n in sorted(inventory.nodes, key=lambda n: n.rank)]
    result.nodes = each_node({name: conns[name] for name in names}, one)

    if not result.failed:
        master = conns[inventory.master.name]
        try:
            result.hostfile, result.master_files = _write_master_files(
                master, inventory, key, {n.node: n.host_key for n in result.nodes if n.host_key})
            written = [p for p, state in result.master_files.items() if state == "written"]
            result.nodes[0].detail += "; master files " + (f"written: {', '.join(written)}" if written else "unchanged")
            progress(inventory.master.name, f"hostfile {result.hostfile}; ssh config, known_hosts, key "
                                            + ("updated" if written else "unchanged"))
        except Exception as exc:  # noqa: BLE001
            result.nodes[0] = NodeDistribution(names[0], False, "writing the master's files failed: "
                                               + connections.explain(exc, master))
    return result
