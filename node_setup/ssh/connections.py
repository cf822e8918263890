"""Fabric connections to the nodes of an Inventory: user, key, gateway, timeouts, host keys.

- User and key from the inventory (`key_path`: only that key is offered; without it paramiko's
  defaults and the agent).
- Gateway rule: when the inventory has a gateway, every node whose address differs from the
  gateway is reached through it (on AWS the master's public address is the gateway and the
  workers have only private addresses). Each such node gets its own gateway Connection, so
  parallel threads never share one paramiko transport while it is being opened.
- Always a connect timeout (CONNECT_TIMEOUT unless given); `in_stream` off (pytest capture, no
  tty); `load_ssh_configs=False` when asked (tests), otherwise ~/.ssh/config applies as with ssh.
- Host keys: verified against a known_hosts the toolkit keeps per cluster
  (`keys.known_hosts_path(cluster)`), never the user's own file and never "accept anything":
    * a host already recorded must present a recorded key, else the connection is refused with
      what to do (paramiko's BadHostKeyException, or ours when the key type differs);
    * a host never seen is trusted on first use and recorded there (TOFU, like ssh's
      `StrictHostKeyChecking accept-new`); the recording is locked, so parallel first
      connections do not lose entries;
    * a local cluster (`fab local-up`) generated its nodes' host keys itself and recorded them in
      its state file: those are pinned before connecting, so nothing is taken on trust there.
  Distribution then copies exactly these verified keys to the master's known_hosts.
"""

from __future__ import annotations

import socket
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

import paramiko
from fabric import Config, Connection

from cluster.inventory import Inventory, Node
from node_setup.ssh import keys

CONNECT_TIMEOUT = 10  # seconds; every connection, also the gateway's

_FILE_LOCK = threading.Lock()


CLUSTER_CONFIG_KEY = "xeon_cluster"  # the cluster a connection belongs to (named in host key messages)


def fabric_config(load_ssh_configs: bool = True, cluster: str = "") -> Config:
    return Config(overrides={"run": {"in_stream": False}, "load_ssh_configs": load_ssh_configs,
                             CLUSTER_CONFIG_KEY: cluster})


def host_key_name(host: str, port: int = 22) -> str:
    """How known_hosts names a host (`[host]:port` off port 22), as paramiko looks it up."""
    return host if int(port) == 22 else f"[{host}]:{port}"


class HostKeyMismatch(paramiko.SSHException):
    """A recorded host presented a key of another type than the ones recorded for it."""


class PinnedHostKeys:
    """One cluster's known_hosts file, shared by every connection to its nodes."""

    def __init__(self, path: Path, cluster: str = ""):
        self.path = Path(path)
        self.cluster = cluster or self.path.parent.name

    def _load(self) -> paramiko.HostKeys:
        host_keys = paramiko.HostKeys()
        if self.path.exists():
            host_keys.load(str(self.path))
        return host_keys

    def lookup(self, name: str) -> dict[str, paramiko.PKey]:
        entry = self._load().lookup(name)
        return dict(entry) if entry else {}

    def pin(self, name: str, key_line: str) -> None:
        """Make `key_line` ("ssh-ed25519 AAAA...") the only recorded key of `name`."""
        keytype, b64 = key_line.split()[:2]
        with _FILE_LOCK:
            lines = self.path.read_text().splitlines() if self.path.exists() else []
            kept = [line for line in lines if name not in line.split(" ", 1)[0].split(",")]
            wanted = f"{name} {keytype} {b64}"
            if kept + [wanted] != lines:
                self.path.write_text("".join(f"{line}\n" for line in kept + [wanted]))
                self.path.chmod(0o600)

    def attach(self, client: paramiko.SSHClient) -> None:
        """Make `client` verify against this file and record first-seen hosts in it."""
        if self.path.exists():
            client.get_host_keys().load(str(self.path))
        client.set_missing_host_key_policy(_TrustOnFirstUse(self))


class _TrustOnFirstUse(paramiko.MissingHostKeyPolicy):
    """Record a never-seen host's key; refuse a recorded host showing an unrecorded key type."""

    def __init__(self, store: PinnedHostKeys):
        self.store = store

    def missing_host_key(self, client, hostname, key):
        with _FILE_LOCK:
            recorded = self.store.lookup(hostname)  # re-read: another thread may have recorded it
            if recorded:
                if recorded.get(key.get_name()) == key:
                    return
                raise HostKeyMismatch(
                    f"host key of {hostname} ({key.get_name()} {key.fingerprint}) is not the one recorded in "
                    f"{self.store.path} ({', '.join(sorted(recorded))}); "
                    + keys.forget_hint(self.store.cluster, hostname))
            with open(self.store.path, "a") as out:
                out.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
            self.store.path.chmod(0o600)
        client.get_host_keys().add(hostname, key.get_name(), key)


def host_keys_for(inventory: Inventory) -> PinnedHostKeys:
    """The cluster's host key store, with a local cluster's recorded host keys pinned first."""
    store = PinnedHostKeys(keys.known_hosts_path(inventory.name), inventory.name)
    if inventory.kind == "local":
        for address, key_line in _local_cluster_host_keys(inventory).items():
            store.pin(host_key_name(address), key_line)
    return store


def _local_cluster_host_keys(inventory: Inventory) -> dict[str, str]:
    """address -> "type base64" from the state file `fab local-up` wrote next to the cluster key."""
    from node_setup.local.state import ClusterState

    if not inventory.key_path:
        return {}
    state_path = Path(inventory.key_path).expanduser().parent / "state.json"
    if not state_path.exists():
        return {}
    state = ClusterState.from_json(state_path.read_text())
    return {n.address: n.host_key for n in state.nodes if getattr(n, "host_key", None)}


def _connect_kwargs(inventory: Inventory) -> dict:
    if inventory.key_path:
        return {"key_filename": [str(Path(inventory.key_path).expanduser())], "look_for_keys": False,
                "allow_agent": False}
    return {}


class NodeConnection(Connection):
    """A Connection whose failure to open names it: the exception carries the connection (`opening`),
    so a task that did not expect it can still say which host failed (`explain_opening`)."""

    def open(self):
        try:
            return super().open()
        except Exception as exc:
            if not hasattr(exc, OPENING):  # a gateway's own failure keeps naming the gateway
                setattr(exc, OPENING, self)
            raise


OPENING = "xc_opening"


def explain_opening(exc: BaseException) -> str | None:
    """One line for a failure to open a node's connection (`explain`), or None for any other error."""
    conn = getattr(exc, OPENING, None)
    return explain(exc, conn) if conn is not None else None


def _connection(host: str, inventory: Inventory, store: PinnedHostKeys, config: Config, timeout: float,
                gateway: Connection | None = None) -> Connection:
    user, port = inventory.user, 22
    if "@" in host:
        user, host = host.split("@", 1)
    if host.count(":") == 1:  # host:port (IPv6 addresses have more colons and no port here)
        host, port_text = host.split(":")
        port = int(port_text)
    conn = NodeConnection(host, user=user, port=port, config=config, connect_timeout=int(timeout),
                      connect_kwargs=_connect_kwargs(inventory), gateway=gateway)
    store.attach(conn.client)
    return conn


def connection(inventory: Inventory, node: Node, *, connect_timeout: float = CONNECT_TIMEOUT,
               load_ssh_configs: bool = True, store: PinnedHostKeys | None = None) -> Connection:
    """A Connection to `node`, through the inventory's gateway when the node's address differs."""
    store = store or host_keys_for(inventory)
    config = fabric_config(load_ssh_configs, inventory.name)
    gateway = None
    if inventory.gateway and node.address != inventory.gateway.split("@")[-1].split(":")[0]:
        gateway = _connection(inventory.gateway, inventory, store, config, connect_timeout)
    return _connection(node.address, inventory, store, config, connect_timeout, gateway=gateway)


def connections_for(inventory: Inventory, nodes: Iterable[Node] | None = None, *,
                    connect_timeout: float = CONNECT_TIMEOUT, load_ssh_configs: bool = True) -> dict[str, Connection]:
    """node name -> Connection, master first (rank order); nothing is opened yet."""
    store = host_keys_for(inventory)
    chosen = sorted(nodes if nodes is not None else inventory.nodes, key=lambda n: n.rank)
    return {n.name: connection(inventory, n, connect_timeout=connect_timeout, load_ssh_configs=load_ssh_configs,
                               store=store) for n in chosen}


@contextmanager
def node_connections(inventory: Inventory, conns: dict | None = None, *,
                     connect_timeout: float = CONNECT_TIMEOUT) -> Iterator[dict[str, Connection]]:
    """`conns` as given (the caller closes them), or new connections to every node, closed afterwards."""
    if conns is not None:
        yield conns
        return
    conns = connections_for(inventory, connect_timeout=connect_timeout)
    try:
        yield conns
    finally:
        close_all(conns)


def close_all(conns) -> None:
    """Close connections and the gateway connections they opened (a dict or an iterable)."""
    for conn in (conns.values() if isinstance(conns, dict) else conns):
        conn.close()
        if isinstance(conn.gateway, Connection):
            conn.gateway.close()


def seen_host_key(conn: Connection) -> str:
    """The host key the (open) connection verified: "ssh-ed25519 AAAA..."."""
    conn.open()
    key = conn.transport.get_remote_server_key()
    return f"{key.get_name()} {key.get_base64()}"


def explain(exc: BaseException, conn: Connection | None = None) -> str:
    """One line saying why a node could not be used, and what to do."""
    where = f"{conn.user}@{conn.host}:{conn.port}" if conn is not None else "the node"
    via = f" via gateway {conn.gateway.host}" if conn is not None and isinstance(conn.gateway, Connection) else ""
    if isinstance(exc, paramiko.BadHostKeyException):
        cluster = (conn.config.get(CLUSTER_CONFIG_KEY) if conn is not None else "") or "<cluster>"
        return (f"host key mismatch for {exc.hostname}: got {exc.key.get_name()} {exc.key.fingerprint}, recorded "
                f"{exc.expected_key.fingerprint}; " + keys.forget_hint(cluster, exc.hostname))
    if isinstance(exc, HostKeyMismatch):
        return str(exc)
    if isinstance(exc, paramiko.AuthenticationException):
        return (f"authentication failed for {where}{via}: {exc}. Check the inventory's user and key "
                "(the key's public half must be in the node's authorized_keys)")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        reasons = "; ".join(sorted({e.strerror or str(e) for e in exc.errors.values()}))
        return f"unreachable: {where}{via}: {reasons} (is sshd running and port {conn.port if conn else 22} open?)"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        timeout = conn.connect_timeout if conn is not None else CONNECT_TIMEOUT
        return f"unreachable: {where}{via}: no answer within the connect timeout ({timeout} s)"
    if isinstance(exc, paramiko.ChannelException):
        return f"unreachable: {where}{via}: the gateway could not open a channel to it ({exc})"
    if isinstance(exc, (OSError, EOFError, paramiko.SSHException)):
        return f"unreachable: {where}{via}: {type(exc).__name__}: {exc}"
    return f"{type(exc).__name__}: {exc}"


def is_unreachable(exc: BaseException) -> bool:
    """Whether `exc` means "could not get an SSH session" (as opposed to a failing remote command)."""
    return isinstance(exc, (OSError, EOFError, paramiko.SSHException, socket.timeout))
