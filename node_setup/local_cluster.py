"""The local cluster: N "nodes" on one Linux machine, each a network namespace with its own sshd.

What one node is (DESIGN.md section 6)::

    ip netns add xc-<name>-n<i>                      # own network stack
    veth xcv-<tag>-<i> (host, on bridge xcb-<tag>) <-> eth0 (node), 10.x.y.(i+2)/24
    ip netns exec NS unshare --uts --mount --propagation private sh -c '
        hostname node<i>; mount --bind <node dir>/root /root; mount --bind <node dir>/etc/hosts /etc/hosts
        exec sshd -D -f <node dir>/etc/sshd_config'

The bridge holds 10.x.y.1, so the controller on the host reaches every node directly. Nodes share
the host's filesystem except /root and /etc/hosts. Every name, address, PID and directory made is
recorded in a state file, and `destroy` removes exactly those (by recorded PID and name), so it is
safe to run twice and never touches anything it did not make.

Files (``config dir`` = ``${XDG_CONFIG_HOME:-~/.config}/xeon-cluster``)::

    <config dir>/local/<name>/inventory.yaml   what `--cluster local` reads (cluster/inventory.py format)
    <config dir>/local/<name>/state.json       what `fab local-down` removes
    <config dir>/local/<name>/id_ed25519       the controller's key for this cluster (authorized on every node)
    <data root>/<name>/node<i>/                one node: root/ (its /root), etc/ (sshd config, host key, hosts)

The data root (``/var/lib/xeon-cluster/local`` or ``$XEON_CLUSTER_LOCAL_DATA``) must lie outside
/root: a node's sshd reads its config after /root has been replaced by the node's own home.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import yaml

from cluster.inventory import Inventory, Node
from cluster.tags import ROLE_MASTER, ROLE_WORKER

DEFAULT_NAME = "local"
MAX_NODES = 64
DEFAULT_WHEELHOUSE = "/var/cache/xeon-cluster/wheels"
DEFAULT_DATA_ROOT = "/var/lib/xeon-cluster/local"
DATA_ROOT_ENV = "XEON_CLUSTER_LOCAL_DATA"
SSHD = "/usr/sbin/sshd"
# Held while a subnet is chosen and its bridge made, so concurrent local-ups pick different subnets.
LOCK_PATH = "/run/xeon-cluster-local.lock"
STATE_VERSION = 1
# Where subnets are looked for: 10.200.0.0/24 .. 10.239.255.0/24, starting at a spot derived from the name.
SUBNET_FIRST_OCTET_RANGE = (200, 240)
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9-]{0,23}$")
SSHD_START_TIMEOUT = 30.0
STOP_TIMEOUT = 5.0

Progress = Callable[[str], None]


class LocalClusterError(RuntimeError):
    """Something local-up/local-down cannot do; the message says what to do."""


def _quiet(_: str) -> None:
    pass


# ---------------------------------------------------------------- paths and names (pure)


def config_dir() -> Path:
    """The user's xeon-cluster config directory: ``${XDG_CONFIG_HOME:-~/.config}/xeon-cluster``."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "xeon-cluster"


def data_root() -> Path:
    return Path(os.environ.get(DATA_ROOT_ENV) or DEFAULT_DATA_ROOT)


@dataclass(frozen=True)
class ClusterPaths:
    """Where one local cluster keeps its files."""

    name: str
    cluster_dir: Path  # under the config dir: inventory, state, controller key
    data_dir: Path  # node directories (outside /root)

    @property
    def state_path(self) -> Path:
        return self.cluster_dir / "state.json"

    @property
    def inventory_path(self) -> Path:
        return self.cluster_dir / "inventory.yaml"

    @property
    def key_path(self) -> Path:
        return self.cluster_dir / "id_ed25519"


def paths_for(name: str = DEFAULT_NAME, *, config: Path | str | None = None,
              data: Path | str | None = None) -> ClusterPaths:
    validate_name(name)
    return ClusterPaths(name=name, cluster_dir=Path(config or config_dir()) / "local" / name,
                        data_dir=Path(data or data_root()) / name)


def validate_name(name: str) -> None:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise LocalClusterError(
            f"--name: {name!r} is not a valid local cluster name; allowed: 1-24 characters, lower-case "
            "letters, digits and '-', starting with a letter (e.g. local, demo-4)")


def validate_node_count(nodes: int) -> None:
    if not isinstance(nodes, int) or not 1 <= nodes <= MAX_NODES:
        raise LocalClusterError(f"--nodes: {nodes!r} is not possible; allowed 1 to {MAX_NODES} local nodes")


def interface_tag(name: str) -> str:
    """6 hex characters from the cluster name; keeps interface names within Linux's 15 characters."""
    return hashlib.sha1(name.encode()).hexdigest()[:6]


def namespace_name(name: str, index: int) -> str:
    return f"xc-{name}-n{index}"


def bridge_name(name: str) -> str:
    return f"xcb-{interface_tag(name)}"  # 10 characters


def veth_name(name: str, index: int) -> str:
    return f"xcv-{interface_tag(name)}-{index}"  # at most 13 characters for index < 100


def node_name(index: int) -> str:
    return f"node{index}"


def pick_subnet(name: str, taken: list[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """A 10.x.y.0/24 that overlaps nothing in `taken`, starting at a spot derived from the name."""
    first, last = SUBNET_FIRST_OCTET_RANGE
    count = (last - first) * 256
    start = int(hashlib.sha1(b"subnet:" + name.encode()).hexdigest(), 16) % count
    for step in range(count):
        slot = (start + step) % count
        candidate = ipaddress.IPv4Network(f"10.{first + slot // 256}.{slot % 256}.0/24")
        if not any(candidate.overlaps(net) for net in taken):
            return candidate
    raise LocalClusterError(f"no free 10.{first}-{last - 1}.x.0/24 subnet on this machine for the local cluster bridge; "
                            "remove unused routes or local clusters (`fab local-down --name NAME`)")


def sshd_config_text(node_dir: Path) -> str:
    """The node's sshd_config: key auth only, root by key, no PAM, sftp in-process."""
    etc = node_dir / "etc"
    return "\n".join([
        "# written by xeon-cluster local-up; this node's sshd only",
        "Port 22",
        "ListenAddress 0.0.0.0",
        f"HostKey {etc / 'ssh_host_ed25519_key'}",
        f"PidFile {node_dir / 'sshd.pid'}",
        "UsePAM no",
        "StrictModes no",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "AuthorizedKeysFile .ssh/authorized_keys",
        "Subsystem sftp internal-sftp",
        "PrintMotd no",
        "UseDNS no",
        "MaxStartups 64:30:256",
        "MaxSessions 64",
        "LogLevel INFO",
        "",
    ])


def hosts_text(hostname: str, address: str) -> str:
    """The node's /etc/hosts: like a cloud VM, a node resolves its own name, not the others'."""
    return (f"127.0.0.1\tlocalhost\n{address}\t{hostname}\n"
            "::1\tlocalhost ip6-localhost ip6-loopback\n")


# ---------------------------------------------------------------- the state file


@dataclass
class NodeState:
    name: str  # alias and hostname
    namespace: str
    veth: str  # host side; the node side is eth0 inside the namespace
    address: str
    dir: str
    sshd_config: str
    sshd_pid: int | None = None
    host_key: str | None = None  # "ssh-ed25519 AAAA..." as the node's sshd presents it


@dataclass
class ClusterState:
    name: str
    bridge: str
    subnet: str
    bridge_address: str
    data_dir: str
    cluster_dir: str
    key_path: str
    inventory_path: str
    nodes: list[NodeState] = field(default_factory=list)
    created_at: float = 0.0
    version: int = STATE_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "ClusterState":
        data = json.loads(text)
        nodes = [NodeState(**n) for n in data.pop("nodes", [])]
        return cls(nodes=nodes, **data)

    def known_hosts_text(self) -> str:
        """known_hosts lines for every node (by address and alias), from the recorded host keys."""
        return "".join(f"{n.address},{n.name} {n.host_key}\n" for n in self.nodes if n.host_key)


def load_state(paths: ClusterPaths) -> ClusterState | None:
    try:
        return ClusterState.from_json(paths.state_path.read_text())
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as exc:
        raise LocalClusterError(f"local cluster state {paths.state_path} is unreadable ({exc}); "
                                "remove what it lists by hand, then delete the file") from exc


def _save_state(paths: ClusterPaths, state: ClusterState) -> None:
    paths.cluster_dir.mkdir(parents=True, exist_ok=True)
    tmp = paths.state_path.with_suffix(".tmp")
    tmp.write_text(state.to_json())
    os.replace(tmp, paths.state_path)


# ---------------------------------------------------------------- the machine


def check_host() -> None:
    """Linux, root and the tools local-up runs; a clear error otherwise."""
    if not sys.platform.startswith("linux"):
        raise LocalClusterError(f"the local cluster needs Linux network namespaces; this is {sys.platform}. "
                                "Use an AWS cluster (`pulumi up`) or an inventory file (--cluster path.yaml)")
    if os.geteuid() != 0:
        raise LocalClusterError("the local cluster creates network namespaces and needs root: "
                                "run `sudo fab local-up ...` (or as root)")
    missing = [tool for tool, package in (("ip", "iproute2"), ("unshare", "util-linux"),
                                          ("ssh-keygen", "openssh-client"), ("mount", "mount"))
               if not shutil.which(tool)]
    if missing:
        raise LocalClusterError(f"missing tools for the local cluster: {', '.join(missing)}; "
                                "install iproute2, util-linux and openssh-client")
    if not os.access(SSHD, os.X_OK):
        raise LocalClusterError(f"{SSHD} not found: install openssh-server (apt-get install openssh-server)")


def machine_topology() -> tuple[int, int]:
    """(sockets, physical cores in all sockets) of this machine, from sysfs."""
    cpus = Path("/sys/devices/system/cpu")
    cores: set[tuple[str, str]] = set()
    for topo in cpus.glob("cpu[0-9]*/topology"):
        try:
            cores.add(((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip()))
        except OSError:
            continue
    if not cores:
        return 1, os.cpu_count() or 1
    return len({pkg for pkg, _ in cores}), len(cores)


def _run(argv: list[str], *, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, env=env)
    if check and result.returncode != 0:
        raise LocalClusterError(f"`{' '.join(argv)}` failed (exit {result.returncode}): "
                                f"{(result.stderr or result.stdout).strip()}")
    return result


def _ip_json(*args: str) -> list[dict]:
    out = _run(["ip", "-j", *args]).stdout.strip()
    return json.loads(out) if out else []


def _taken_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network routed or addressed on the host, except the default route."""
    taken = []
    for route in _ip_json("-4", "route", "show", "table", "all"):
        dst = route.get("dst", "")
        if dst in ("default", "") or route.get("type") in ("broadcast",):
            continue
        try:
            taken.append(ipaddress.IPv4Network(dst if "/" in dst else f"{dst}/32", strict=False))
        except ValueError:
            continue
    for link in _ip_json("-4", "addr", "show"):
        for info in link.get("addr_info", []):
            try:
                taken.append(ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False))
            except (KeyError, ValueError):
                continue
    return taken


def _namespaces() -> set[str]:
    return {entry["name"] for entry in _ip_json("netns", "list")}


def _link_exists(name: str) -> bool:
    return _run(["ip", "link", "show", "dev", name], check=False).returncode == 0


@contextmanager
def _host_lock() -> Iterator[None]:
    with open(LOCK_PATH, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _keygen(path: Path, comment: str) -> str:
    """An ed25519 key pair at `path` (made if missing); returns the public key text."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    return Path(f"{path}.pub").read_text().strip()


# ---------------------------------------------------------------- processes


def _process_alive(pid: int) -> bool:
    """True if `pid` runs and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _is_our_sshd(pid: int, node: NodeState) -> bool:
    """The recorded PID still belongs to this node's sshd (not a recycled PID)."""
    try:
        # sshd rewrites its title ("sshd: /usr/sbin/sshd -D -e -f CONFIG [listener] ..."): match a substring
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return node.sshd_config.encode() in cmdline


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _stop_pids(pids: list[int], timeout: float = STOP_TIMEOUT) -> list[int]:
    """SIGTERM, then SIGKILL after `timeout`; returns the PIDs that were still running."""
    live = [pid for pid in pids if _process_alive(pid)]
    for pid in live:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while True:
        for pid in live:
            _reap(pid)
        left = [pid for pid in live if _process_alive(pid)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _reap(pid)
    return live


def _namespace_pids(namespace: str) -> list[int]:
    result = _run(["ip", "netns", "pids", namespace], check=False)
    return [int(p) for p in result.stdout.split()] if result.returncode == 0 else []


# The node's init: own hostname, own /root and /etc/hosts (mount namespace), then sshd in the
# foreground. Every step execs, so the PID that the launcher prints is sshd's.
_NODE_SCRIPT = ('set -e; hostname "$XC_HOSTNAME"; mount --bind "$XC_HOME" /root; '
                'mount --bind "$XC_HOSTS" /etc/hosts; exec "$XC_SSHD" -D -e -f "$XC_CONFIG"')
# Started in a new session, the launcher puts the node in the background and exits, so the node's
# sshd is re-parented away from fab and survives it (no SIGHUP: the session has no terminal).
_LAUNCHER = ('ip netns exec "$XC_NS" unshare --uts --mount --propagation private /bin/sh -c "$XC_NODE_SCRIPT" '
             '</dev/null >>"$XC_LOG" 2>&1 & echo $!')


def _start_sshd(node: NodeState) -> int:
    node_dir = Path(node.dir)
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
           "XC_NS": node.namespace, "XC_NODE_SCRIPT": _NODE_SCRIPT, "XC_LOG": str(node_dir / "sshd.log"),
           "XC_HOSTNAME": node.name, "XC_HOME": str(node_dir / "root"), "XC_HOSTS": str(node_dir / "etc" / "hosts"),
           "XC_SSHD": SSHD, "XC_CONFIG": node.sshd_config}
    launcher = subprocess.run(["/bin/sh", "-c", _LAUNCHER], env=env, capture_output=True, text=True,
                              start_new_session=True, timeout=30)
    if launcher.returncode != 0 or not launcher.stdout.strip().isdigit():
        raise LocalClusterError(f"{node.name}: could not start sshd in namespace {node.namespace}: "
                                f"{launcher.stderr.strip() or launcher.stdout.strip()}")
    return int(launcher.stdout.strip())


def _port_open(address: str, port: int = 22) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1) as sock:
            sock.settimeout(2)
            return sock.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def _log_tail(node: NodeState, lines: int = 5) -> str:
    try:
        return " | ".join(Path(node.dir, "sshd.log").read_text().strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait_for_sshd(nodes: list[NodeState], timeout: float, progress: Progress) -> None:
    """Until every node's sshd answers on port 22 (bounded); names the nodes that did not."""
    waiting = {n.name: n for n in nodes}
    deadline = time.monotonic() + timeout
    while waiting:
        for name, node in list(waiting.items()):
            if node.sshd_pid is None or not _process_alive(node.sshd_pid):
                raise LocalClusterError(f"{name}: sshd (pid {node.sshd_pid}) exited at start: {_log_tail(node)}")
            if _port_open(node.address):
                progress(f"  {name}: sshd up on {node.address}:22 (pid {node.sshd_pid}, namespace {node.namespace})")
                del waiting[name]
        if waiting and time.monotonic() > deadline:
            raise LocalClusterError(f"sshd did not answer within {timeout:.0f} s on: "
                                    + ", ".join(f"{n} ({waiting[n].address}): {_log_tail(waiting[n])}" for n in waiting))
        if waiting:
            time.sleep(0.05)


# ---------------------------------------------------------------- inventory


def build_inventory(state: ClusterState, *, sockets: int, physical_cores: int,
                    wheelhouse: str | None = DEFAULT_WHEELHOUSE) -> Inventory:
    nodes = tuple(Node(name=n.name, address=n.address, private_address=n.address, rank=i,
                       role=ROLE_MASTER if i == 0 else ROLE_WORKER)
                  for i, n in enumerate(state.nodes))
    return Inventory(name=state.name, kind="local", user="root", nodes=nodes, key_path=state.key_path,
                     profile="stock", sockets=sockets, physical_cores=physical_cores, wheelhouse=wheelhouse)


def inventory_mapping(inventory: Inventory) -> dict:
    """The inventory file content; `kind: local` lets discovery tell a local cluster from a plain file."""
    return {"kind": "local", **inventory.to_mapping()}


# ---------------------------------------------------------------- up and down


def is_running(state: ClusterState) -> bool:
    """Every recorded node's namespace exists and its sshd runs."""
    names = _namespaces()
    return bool(state.nodes) and all(
        n.namespace in names and n.sshd_pid is not None and _process_alive(n.sshd_pid) and _is_our_sshd(n.sshd_pid, n)
        for n in state.nodes)


def create(nodes: int, name: str = DEFAULT_NAME, *, paths: ClusterPaths | None = None, replace: bool = False,
           wheelhouse: str | None = DEFAULT_WHEELHOUSE, progress: Progress = _quiet,
           timeout: float = SSHD_START_TIMEOUT) -> ClusterState:
    """Start a local cluster of `nodes` nodes; returns its state (also saved, with the inventory).

    An existing cluster of that name is an error unless `replace` (then it is torn down first);
    leftovers of one that is no longer running are cleaned up. If anything fails, what was made
    so far is removed again before the error is raised.
    """
    validate_node_count(nodes)
    paths = paths or paths_for(name)
    validate_name(paths.name)
    check_host()
    existing = load_state(paths)
    if existing is not None:
        if is_running(existing) and not replace:
            flag = "" if paths.name == DEFAULT_NAME else f" --name {paths.name}"
            raise LocalClusterError(
                f"local cluster {paths.name!r} is already up with {len(existing.nodes)} nodes "
                f"(inventory {paths.inventory_path}); run `fab local-down{flag}` first, "
                f"or `fab local-up --replace --nodes {nodes}{flag}` to replace it")
        progress(f"removing the previous local cluster {paths.name!r}")
        destroy(paths, progress=progress)

    state = ClusterState(name=paths.name, bridge=bridge_name(paths.name), subnet="", bridge_address="",
                         data_dir=str(paths.data_dir), cluster_dir=str(paths.cluster_dir),
                         key_path=str(paths.key_path), inventory_path=str(paths.inventory_path),
                         created_at=time.time())
    try:
        _make(state, nodes, paths, progress, timeout)
        sockets, cores = machine_topology()
        inventory = build_inventory(state, sockets=sockets, physical_cores=cores, wheelhouse=wheelhouse)
        paths.inventory_path.write_text(yaml.safe_dump(inventory_mapping(inventory), sort_keys=False))
        _save_state(paths, state)
    except BaseException:
        progress(f"local-up failed; removing what was made for {paths.name!r}")
        try:
            destroy(paths, progress=progress)
        except LocalClusterError as cleanup_error:  # pragma: no cover - reported with the original error
            progress(f"cleanup incomplete: {cleanup_error}")
        raise
    progress(f"local cluster {paths.name!r}: {nodes} node(s) on {state.subnet}; inventory {paths.inventory_path}")
    return state


def _make(state: ClusterState, count: int, paths: ClusterPaths, progress: Progress, timeout: float) -> None:
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory (shared, kept)
    paths.data_dir.mkdir(parents=True, exist_ok=True)
    paths.data_dir.chmod(0o700)
    controller_key = _keygen(paths.key_path, f"xeon-cluster local {paths.name}")
    _save_state(paths, state)  # from here on every step is recorded before the next one

    with _host_lock():
        if _link_exists(state.bridge):
            raise LocalClusterError(f"bridge {state.bridge} already exists but is not recorded for {paths.name!r}; "
                                    f"another local cluster uses it: choose another --name")
        subnet = pick_subnet(paths.name, _taken_networks())
        hosts = list(subnet.hosts())
        state.subnet, state.bridge_address = str(subnet), str(hosts[0])
        _save_state(paths, state)
        _run(["ip", "link", "add", state.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{state.bridge_address}/{subnet.prefixlen}", "dev", state.bridge])
        _run(["ip", "link", "set", state.bridge, "up"])
    progress(f"bridge {state.bridge} {state.bridge_address}/{subnet.prefixlen}")

    taken_namespaces = _namespaces()
    for i in range(count):
        node = NodeState(name=node_name(i), namespace=namespace_name(paths.name, i), veth=veth_name(paths.name, i),
                         address=str(hosts[i + 1]), dir=str(paths.data_dir / node_name(i)),
                         sshd_config=str(paths.data_dir / node_name(i) / "etc" / "sshd_config"))
        if node.namespace in taken_namespaces:
            raise LocalClusterError(f"network namespace {node.namespace} already exists and is not recorded for "
                                    f"{paths.name!r}; choose another --name or remove it (`ip netns del {node.namespace}`)")
        _prepare_node_dir(node, controller_key)
        state.nodes.append(node)
        _save_state(paths, state)
        _run(["ip", "netns", "add", node.namespace])
        _run(["ip", "link", "add", node.veth, "type", "veth", "peer", "name", "eth0", "netns", node.namespace])
        _run(["ip", "link", "set", node.veth, "master", state.bridge, "up"])
        _run(["ip", "-n", node.namespace, "addr", "add", f"{node.address}/{subnet.prefixlen}", "dev", "eth0"])
        _run(["ip", "-n", node.namespace, "link", "set", "lo", "up"])
        _run(["ip", "-n", node.namespace, "link", "set", "eth0", "up"])
        node.sshd_pid = _start_sshd(node)
        _save_state(paths, state)
        progress(f"  {node.name}: namespace {node.namespace}, {node.address}, hostname {node.name}")
    _wait_for_sshd(state.nodes, timeout, progress)


def _prepare_node_dir(node: NodeState, controller_key: str) -> None:
    node_dir = Path(node.dir)
    if node_dir.exists():
        shutil.rmtree(node_dir)
    home, etc = node_dir / "root", node_dir / "etc"
    etc.mkdir(parents=True)
    # a fresh machine's root home: the skeleton dotfiles and the controller's key
    if Path("/etc/skel").is_dir():
        shutil.copytree("/etc/skel", home)
    else:
        home.mkdir()
    home.chmod(0o700)
    (home / ".ssh").mkdir(mode=0o700)
    (home / ".ssh" / "authorized_keys").write_text(controller_key + "\n")
    (home / ".ssh" / "authorized_keys").chmod(0o600)
    node.host_key = " ".join(_keygen(etc / "ssh_host_ed25519_key", f"root@{node.name}").split()[:2])
    Path(node.sshd_config).write_text(sshd_config_text(node_dir))
    (etc / "hosts").write_text(hosts_text(node.name, node.address))


def destroy(paths: ClusterPaths, progress: Progress = _quiet) -> bool:
    """Remove exactly what the state file lists; False if there was no such cluster (safe twice).

    Every step checks first and goes on after a failure; if anything is left, the state file is
    kept (a rerun finishes the job) and the error lists what could not be removed.
    """
    state = load_state(paths)
    if state is None:
        progress(f"no local cluster {paths.name!r} (no state at {paths.state_path}); nothing to remove")
        return False
    check_host()
    problems: list[str] = []
    namespaces = _namespaces()
    for node in state.nodes:
        pids = []
        if node.sshd_pid is not None and _is_our_sshd(node.sshd_pid, node):
            pids.append(node.sshd_pid)
        if node.namespace in namespaces:
            # whatever still runs inside the node (ssh sessions, training ranks) goes with it
            pids += [p for p in _namespace_pids(node.namespace) if p not in pids and p != os.getpid()]
        stopped = _stop_pids(pids)
        if node.namespace in namespaces:
            _remove(["ip", "netns", "del", node.namespace], lambda ns=node.namespace: ns in _namespaces(), problems)
        # deleting the namespace takes its veth pair along, asynchronously: delete only what is still there
        if _link_exists(node.veth):
            _remove(["ip", "link", "del", node.veth], lambda veth=node.veth: _link_exists(veth), problems)
        progress(f"  {node.name}: stopped {len(stopped)} process(es), removed namespace {node.namespace}")
    if state.bridge and state.subnet and _link_exists(state.bridge):
        _remove(["ip", "link", "del", state.bridge], lambda: _link_exists(state.bridge), problems)
        progress(f"  removed bridge {state.bridge} ({state.subnet})")
    if problems:
        raise LocalClusterError(f"local-down {paths.name!r} left: {'; '.join(problems)}; "
                                f"fix that and rerun `fab local-down --name {paths.name}` (state kept in {paths.state_path})")
    for node in state.nodes:
        shutil.rmtree(node.dir, ignore_errors=True)
    _remove_empty_dir(Path(state.data_dir))
    for path in (Path(state.inventory_path), Path(state.key_path), Path(f"{state.key_path}.pub"), paths.state_path):
        try:
            path.unlink()
        except FileNotFoundError:
            pass
    _remove_empty_dir(Path(state.cluster_dir))
    progress(f"local cluster {paths.name!r} removed")
    return True


def _remove(argv: list[str], still_there: Callable[[], bool], problems: list[str]) -> None:
    """Run a delete command; a failure counts only if the thing is still there afterwards."""
    result = _run(argv, check=False)
    if result.returncode != 0 and still_there():
        problems.append(f"`{' '.join(argv)}`: {result.stderr.strip()}")


def _remove_empty_dir(path: Path) -> None:
    try:
        path.rmdir()
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTEMPTY):
            raise


def list_clusters(config: Path | str | None = None) -> list[str]:
    """Names of the local clusters that have a state file under the config dir."""
    base = Path(config or config_dir()) / "local"
    return sorted(p.parent.name for p in base.glob("*/state.json"))
