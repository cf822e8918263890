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
    * a host never seen, on an AWS or a local cluster, is verified from its console before it is
      recorded: the SSH host key fingerprints the node printed there at boot (cloud-init's
      blocks, cluster/node/console.py), read from outside the node: EC2 GetConsoleOutput
      (node_setup/aws/console.py) or a local node's console file (node_setup/local/console.py), the
      source the cluster's backend gives (node_setup/backends/).
      Before connecting, the console is read until it shows fingerprints (bounded wait, then
      refused with a line); the presented key must be one of them, else refused with a line. The
      record carries the instance id, so a record of an instance that is gone (a new machine at
      the same address, e.g. a node `fab local-up` brought back) is dropped and the new one verified;
    * only an inventory file's machines have no console to read: a host never seen there is
      trusted on first use and recorded (like ssh's `StrictHostKeyChecking accept-new`).
  The recording is locked, so parallel first connections do not lose entries. Distribution
  then copies exactly these verified keys to the master's known_hosts.
"""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

import paramiko
from fabric import Config, Connection

from cluster.backend import ConsoleSource
from cluster.node.console import ConsoleHostKeys, ConsoleUnreadable, parse_console
from cluster.node.console import describe as describe_console
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


class HostKeyRefused(HostKeyMismatch):
    """A never-seen host's key is not one its console shows: refused, never recorded."""


class HostKeyUnverified(HostKeyMismatch):
    """A never-seen host's key cannot be verified (no fingerprints on its console in time, no console)."""


def console_source_for(inventory: Inventory) -> ConsoleSource | None:
    """The console host keys source of the inventory's kind (its backend's); None for an inventory file."""
    from node_setup.backends import backend_for  # an AWS cluster's source imports boto3: only for one

    return backend_for(inventory.kind).console_source(inventory)


def _address(name: str) -> str:
    """The address in a known_hosts name (`host` or `[host]:port`)."""
    return name[1:].split("]:", 1)[0] if name.startswith("[") else name


class PinnedHostKeys:
    """One cluster's known_hosts file, shared by every connection to its nodes; with a console
    source, never-seen hosts are verified from their consoles (else trusted on first use)."""

    def __init__(self, path: Path, cluster: str = "", console: ConsoleSource | None = None, *,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self.path = Path(path)
        self.cluster = cluster or self.path.parent.name
        self.console = console
        self._clock, self._sleep = clock, sleep
        self._consoles: dict[str, ConsoleHostKeys] = {}
        self._console_lock = threading.Lock()

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

    def record(self, name: str, key: paramiko.PKey, instance: str | None = None) -> None:
        """Append `name`'s key (with the instance id it was verified for, when there is one)."""
        with open(self.path, "a") as out:
            out.write(f"{name} {key.get_name()} {key.get_base64()}" + (f" {instance}" if instance else "") + "\n")
        self.path.chmod(0o600)

    def forget_replaced(self) -> int:
        """Drop the records made for an instance that no longer holds that address (the console
        source names another one there): that machine is gone, the new one is verified afresh."""
        if self.console is None or not self.path.exists():
            return 0
        with _FILE_LOCK:
            lines = self.path.read_text().splitlines()
            kept = []
            for line in lines:
                fields = line.split()
                now = self.console.instance(_address(fields[0])) if len(fields) > 3 else None
                if not (now and fields[3] != now):
                    kept.append(line)
            if kept != lines:
                self.path.write_text("".join(f"{line}\n" for line in kept))
            return len(lines) - len(kept)

    def prepare(self, name: str) -> None:
        """Before connecting to `name`: when it is not recorded and there is a console source, read
        its console until it shows host key fingerprints (bounded), so the handshake need not wait."""
        if self.console is not None and not self.lookup(name):
            self.console_keys(name)

    def console_keys(self, name: str) -> ConsoleHostKeys:
        """The host keys `name`'s console shows, read until it shows fingerprints; HostKeyUnverified
        when it shows none within the source's wait (or cannot be read, or knows no such node)."""
        address = _address(name)
        with self._console_lock:
            if address in self._consoles:
                return self._consoles[address]
        source = self.console
        instance = source.instance(address) if source is not None else None
        if source is None or not instance:
            raise HostKeyUnverified(
                f"host key of {name} not verified: cluster {self.cluster!r} has no node at that address whose "
                "console could show its host key; refused (rerun after the cluster's nodes are listed again)")
        label = f"{name} (instance {instance})"
        deadline = self._clock() + source.wait_s
        while True:
            try:
                shown = parse_console(source.read(address))
            except ConsoleUnreadable as exc:
                raise HostKeyUnverified(f"host key of {label} not verified: {exc}; refused") from None
            if shown.fingerprints:
                with self._console_lock:
                    self._consoles[address] = shown
                return shown
            if self._clock() >= deadline:
                raise HostKeyUnverified(
                    f"host key of {label} not verified: its {source.where(address)} shows no SSH host key "
                    f"fingerprints after {source.wait_s:g} s; refused (a new {source.kind} node is never trusted "
                    "on first use). If it is still booting (cloud-init prints them at the end of boot), wait and "
                    f"rerun; {source.advice(address)}")
            self._sleep(source.poll_s)

    def attach(self, client: paramiko.SSHClient) -> None:
        """Make `client` verify against this file and record verified first-seen hosts in it."""
        if self.path.exists():
            client.get_host_keys().load(str(self.path))
        client.set_missing_host_key_policy(_FirstConnection(self))


class _FirstConnection(paramiko.MissingHostKeyPolicy):
    """A never-seen host: verified from its console when the store has a console source (else
    trusted on first use) and recorded; a recorded host showing an unrecorded key type is refused."""

    def __init__(self, store: PinnedHostKeys):
        self.store = store

    def missing_host_key(self, client, hostname, key):
        store = self.store
        shown = store.console_keys(hostname) if store.console is not None else None  # may wait: outside the lock
        with _FILE_LOCK:
            recorded = store.lookup(hostname)  # re-read: another thread may have recorded it
            if recorded:
                if recorded.get(key.get_name()) == key:
                    return
                raise HostKeyMismatch(
                    f"host key of {hostname} ({key.get_name()} {key.fingerprint}) is not the one recorded in "
                    f"{store.path} ({', '.join(sorted(recorded))}); "
                    + keys.forget_hint(store.cluster, hostname))
            instance = None
            if shown is not None:
                source, address = store.console, _address(hostname)
                if shown.match(key.get_name(), key.get_base64()) is None:
                    raise HostKeyRefused(
                        f"host key of {hostname} (instance {source.instance(address)}) refused: it presents "
                        f"{key.get_name()} {key.fingerprint}, but its {source.where(address)} shows "
                        f"{describe_console(shown)}; someone may be between you and the node, or its address now "
                        f"belongs to another machine: do not connect. {source.advice(address)}; rerun when "
                        "they agree")
                instance = source.instance(address)
            store.record(hostname, key, instance)
        client.get_host_keys().add(hostname, key.get_name(), key)


def host_keys_for(inventory: Inventory) -> PinnedHostKeys:
    """The cluster's host key store: never-seen hosts verified from the console of the inventory's
    kind (trusted on first use for an inventory file); records of replaced instances dropped."""
    store = PinnedHostKeys(keys.known_hosts_path(inventory.name), inventory.name, console_source_for(inventory))
    store.forget_replaced()
    return store


def _connect_kwargs(inventory: Inventory) -> dict:
    if inventory.key_path:
        return {"key_filename": [str(Path(inventory.key_path).expanduser())], "look_for_keys": False,
                "allow_agent": False}
    return {}


class NodeConnection(Connection):
    """A Connection whose failure to open names it: the exception carries the connection (`opening`),
    so a task that did not expect it can still say which host failed (`explain_opening`)."""

    store: "PinnedHostKeys | None" = None  # set by _connection: a never-seen host's console is read first

    def open(self):
        try:
            if self.store is not None and not self.is_connected:
                self.store.prepare(host_key_name(self.host, self.port))
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
    conn.store = store
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
