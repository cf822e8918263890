"""A local cluster as data: its names, addresses, files and the state file that records them.

Pure except for reading and writing the state file: everything `fab local-up` makes is named
here first (namespace, bridge, veth, subnet, node directories) and recorded in `state.json`, so
`fab local-down` removes exactly that. Files (``config dir`` =
``${XDG_CONFIG_HOME:-~/.config}/xeon-cluster``)::

    <config dir>/local/<name>/inventory.yaml   what `--cluster local` reads (cluster/inventory.py format)
    <config dir>/local/<name>/state.json       what `fab local-down` removes
    <config dir>/local/<name>/id_ed25519       the controller's key for this cluster (authorized on every node)
    <data root>/<name>/node<i>/                one node: root/ (its /root), etc/ (sshd config, host key, hosts)

Clusters are machine-wide (their namespaces and bridge), and every checkout run by the same user
shares the config dir, so the state records its owner: the checkout whose `fab local-up` made it
(node_setup/controller.py's PROJECT_ROOT) and the user who ran it. Another checkout's cluster is
used only when named explicitly (`--cluster local:NAME`), and removed only with `--force`.

The data root (``/var/lib/xeon-cluster/local`` or ``$XEON_CLUSTER_LOCAL_DATA``) must lie outside
/root: a node's sshd reads its config after /root has been replaced by the node's own home.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import pwd
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from cluster import names
from cluster.inventory import Inventory, Node
from cluster.stack.tags import ROLE_MASTER, ROLE_WORKER
from node_setup.controller import LOCAL_CLUSTERS_DIR, PROJECT_ROOT, config_root

DEFAULT_NAME = "local"
MAX_NODES = 64
DEFAULT_WHEELHOUSE = "/var/cache/xeon-cluster/wheels"
DEFAULT_DATA_ROOT = "/var/lib/xeon-cluster/local"
DATA_ROOT_ENV = "XEON_CLUSTER_LOCAL_DATA"
STATE_VERSION = 1
# Where subnets are looked for: 10.200.0.0/24 .. 10.239.255.0/24, starting at a spot derived from the name.
SUBNET_FIRST_OCTET_RANGE = (200, 240)
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9-]{0,23}\Z")
# Link shaping (`--link-mbit`, `--link-delay-ms`): what tc can shape a veth to and still be meaningful.
LINK_MBIT_RANGE = (1.0, 100_000.0)
LINK_DELAY_MS_RANGE = (0.0, 1_000.0)
# The spot rehearsal: each node's metadata service (node_setup/local/imds_server.py) answers as an
# instance of this type in this zone; `fab local-reclaim --notice` gives this many seconds by default
# (EC2's two-minute warning), at most NOTICE_SECONDS_MAX.
LOCAL_INSTANCE_TYPE = "local.node"
LOCAL_ZONE = "local-1a"
DEFAULT_NOTICE_SECONDS = 120
NOTICE_SECONDS_MAX = 3600
IMDS_DIR = "imds"  # in the node's directory: the service's control files (notices) and its log
# A shaped node's veth sends one frame per packet (no 64 KiB GSO segments), so tbf's bucket can be
# small: a few frames, or a few ms of traffic at the rate. A bucket as big as a GSO segment would let
# every all-reduce after a compute pause go out at full speed for its first 64 KiB (26 ms at 20 Mbit/s).
LINK_SEGMENT_BYTES = 1500  # the veth's MTU
LINK_MIN_BURST_BYTES = 4 * (LINK_SEGMENT_BYTES + 14)  # four Ethernet frames
LINK_BURST_SECONDS = 0.004
LINK_QUEUE_LATENCY_MS = 200  # how long a packet may wait in the bucket before tbf drops it
LINK_NETEM_LIMIT = 100_000  # packets netem may hold while they wait out the delay
NODE_INTERFACE = "eth0"  # the node's end of its veth, inside its namespace
# The group keeper's files (node_setup/local/keeper.py): its record of the group, in the data directory
# (node_setup/backends/local.py reads it on the master), and its pid, in the cluster's config directory.
GROUP_FILE = "group.json"
# Held (flock) by the running keeper, beside GROUP_FILE: a node, in its own PID namespace, cannot see the
# keeper's pid, but it can see that this lock is held (node_setup/backends/local.py's keeper_of).
KEEPER_LOCK_FILE = "keeper.lock"
HANDBACK_PREFIX = "handback-"  # + an instance id: a worker the supervisor hands back to the keeper
KEEPER_PID_FILE = "keeper.pid"
KEEPER_LOG_FILE = "keeper.log"  # what it did, beside its pid; `fab local-down` removes both


Progress = Callable[[str], None]


class LocalClusterError(RuntimeError):
    """Something local-up/local-down cannot do; the message says what to do."""


def quiet(_: str) -> None:
    pass


# ---------------------------------------------------------------- paths and names (pure)


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
    return ClusterPaths(name=name, cluster_dir=Path(config or config_root()) / LOCAL_CLUSTERS_DIR / name,
                        data_dir=Path(data or data_root()) / name)


def validate_name(name: str) -> None:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise LocalClusterError(
            f"--name: {name!r} is not a valid local cluster name; allowed: 1-24 characters, lower-case "
            "letters, digits and '-', starting with a letter (e.g. local, demo-4)")


def validate_node_count(nodes: int) -> None:
    if not isinstance(nodes, int) or not 1 <= nodes <= MAX_NODES:
        raise LocalClusterError(f"--nodes: {nodes!r} is not possible; allowed 1 to {MAX_NODES} local nodes")


def validate_notice(seconds: float) -> float:
    """`fab local-reclaim --notice`: seconds between the notice and the node going down."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds <= NOTICE_SECONDS_MAX:
        raise LocalClusterError(f"--notice: {seconds!r} is not possible; allowed 0 to {NOTICE_SECONDS_MAX} seconds "
                                f"(EC2 gives {DEFAULT_NOTICE_SECONDS})")
    return float(seconds)


def find_node(state: "ClusterState", name: str) -> "NodeState":
    """The recorded node called `name` (as `fab local-up` printed it)."""
    for node in state.nodes:
        if node.name == name:
            return node
    raise LocalClusterError(f"NODE: {name!r} is not a node of local cluster {state.name!r}; allowed: "
                            + ", ".join(n.name for n in state.nodes))


def instance_action_text(at: float) -> str:
    """EC2's spot/instance-action body for a termination at Unix time `at`."""
    return json.dumps({"action": "terminate", "time": _iso_utc(at)})


def rebalance_text(at: float) -> str:
    """EC2's events/recommendations/rebalance body, noticed at Unix time `at`."""
    return json.dumps({"noticeTime": _iso_utc(at)})


def _iso_utc(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def validate_link(mbit: float, delay_ms: float) -> tuple[float | None, float | None]:
    """(rate in Mbit/s, delay in ms) of `--link-mbit`/`--link-delay-ms`; 0 means "not limited" (None)."""
    low, high = LINK_MBIT_RANGE
    dlow, dhigh = LINK_DELAY_MS_RANGE
    for option, value in (("--link-mbit", mbit), ("--link-delay-ms", delay_ms)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise LocalClusterError(f"{option}: {value!r} is not a number")
    if mbit and not low <= mbit <= high:
        raise LocalClusterError(f"--link-mbit: {mbit:g} is not allowed; allowed {low:g} to {high:g} "
                                "Mbit/s per node (0: not limited)")
    if not dlow <= delay_ms <= dhigh:
        raise LocalClusterError(f"--link-delay-ms: {delay_ms:g} is not allowed; allowed {dlow:g} to {dhigh:g} ms")
    if delay_ms and not mbit:
        raise LocalClusterError(f"--link-delay-ms: {delay_ms:g} given without --link-mbit; allowed only with "
                                "a link rate, e.g. --link-mbit 1000 --link-delay-ms 1")
    return (float(mbit) if mbit else None), (float(delay_ms) if mbit and delay_ms else None)


def link_shaping_commands(namespace: str, mbit: float, delay_ms: float | None) -> list[list[str]]:
    """The commands that limit what a node sends to `mbit` (tbf) after `delay_ms` (netem under it),
    with packets of one frame each so that the bucket can stay small.

    They act on the node's own end of its veth, inside its namespace, so nothing on the host changes;
    every node sends at most `mbit`, so every node also receives at most what its peers send.
    """
    rate_bytes = mbit * 1e6 / 8
    burst = max(LINK_MIN_BURST_BYTES, int(rate_bytes * LINK_BURST_SECONDS))
    tc = ["ip", "netns", "exec", namespace, "tc", "qdisc"]
    commands = [["ip", "-n", namespace, "link", "set", "dev", NODE_INTERFACE, "gso_max_size", str(LINK_SEGMENT_BYTES)],
                [*tc, "replace", "dev", NODE_INTERFACE, "root", "handle", "1:", "tbf", "rate", f"{mbit:g}mbit",
                 "burst", str(burst), "latency", f"{LINK_QUEUE_LATENCY_MS}ms"]]
    if delay_ms:
        commands.append([*tc, "replace", "dev", NODE_INTERFACE, "parent", "1:1", "handle", "10:", "netem",
                         "delay", f"{delay_ms:g}ms", "limit", str(LINK_NETEM_LIMIT)])
    return commands


def link_unshaping_command(namespace: str) -> list[str]:
    return ["ip", "netns", "exec", namespace, "tc", "qdisc", "del", "dev", NODE_INTERFACE, "root"]


def describe_link(mbit: float | None, delay_ms: float | None) -> str:
    if not mbit:
        return "not limited"
    return f"{mbit:g} Mbit/s per node" + (f", {delay_ms:g} ms delay" if delay_ms else "")


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
    raise LocalClusterError(f"no free 10.{first}-{last - 1}.x.0/24 subnet on this machine for the local cluster "
                            f"bridge; "
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
    names.alias(hostname, "local node name")  # whole values: a space or line break would add a name or a line
    names.host(address, "local node address")
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
    imds_pid: int | None = None  # the node's metadata service (169.254.169.254 inside its namespace)
    instance_id: str | None = None  # what that service answers; new for every machine local-up makes
    reclaimed_at: float | None = None  # set by `fab local-reclaim` when it took the node down

    @property
    def imds_dir(self) -> str:
        return str(Path(self.dir) / IMDS_DIR)


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
    link_mbit: float | None = None  # each node's sending rate, limited with tc (None: not limited)
    link_delay_ms: float | None = None
    owner_checkout: str = ""  # the checkout whose `fab local-up` made it ("": a state file older than owners)
    owner_user: str = ""  # who ran that local-up

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


def save_state(paths: ClusterPaths, state: ClusterState) -> None:
    paths.cluster_dir.mkdir(parents=True, exist_ok=True)
    tmp = paths.state_path.with_suffix(".tmp")
    tmp.write_text(state.to_json())
    os.replace(tmp, paths.state_path)


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


# ---------------------------------------------------------------- owners


def this_checkout() -> str:
    return str(PROJECT_ROOT)


def this_user() -> str:
    """Who runs this controller: the user behind sudo where there is one (local clusters need root)."""
    try:
        own = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        own = str(os.geteuid())
    behind = os.environ.get("SUDO_USER")
    return f"{behind} (as {own})" if behind and behind != own else own


def stamp_owner(state: ClusterState) -> None:
    state.owner_checkout, state.owner_user = this_checkout(), this_user()


def is_ours(state: ClusterState) -> bool:
    """Made by this checkout (a state file without an owner counts as anyone's)."""
    return not state.owner_checkout or state.owner_checkout == this_checkout()


def owner_text(state: ClusterState) -> str:
    return f"checkout {names.printable(state.owner_checkout)} (user {names.printable(state.owner_user or '?')})"


def implicit_use_problem(state: ClusterState) -> str | None:
    """The line that refuses a bare `--cluster local` resolving to another checkout's cluster (None: go on):
    a job on it would end when its owner tears it down."""
    if is_ours(state):
        return None
    return (f"--cluster local: local cluster {state.name!r} is not this checkout's: {owner_text(state)} made it; "
            f"to use it anyway name it: --cluster local:{state.name}; for a cluster of your own: "
            f"`fab local-up --nodes {len(state.nodes) or 4} --name NAME`, then --cluster local:NAME")


def owner_note(state: ClusterState) -> str | None:
    """Said whenever a task uses another checkout's cluster (named explicitly)."""
    if is_ours(state):
        return None
    return f"local cluster {state.name!r} is not this checkout's: {owner_text(state)} made it"


def list_clusters(config: Path | str | None = None) -> list[str]:
    """Names of the local clusters that have a state file under the config dir."""
    base = Path(config or config_root()) / LOCAL_CLUSTERS_DIR
    return sorted(p.parent.name for p in base.glob("*/state.json"))
