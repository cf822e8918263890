"""The nodes of a cluster, however they were found (AWS tags, the local cluster, an inventory file).

Discovery (node_setup/discovery.py) produces an `Inventory`; every task after it (setup,
distribute, train, status) reads only this. Node order is rank order: master first.

Inventory file format (YAML, for on-premise machines and the local cluster)::

    name: lab                      # cluster name (default: the file's stem)
    user: ubuntu                   # SSH user on every node
    key: ~/.ssh/lab_ed25519        # private key the controller uses (optional: agent/defaults)
    gateway: bastion.example.org   # optional jump host for reaching the nodes
    profile: stock                 # software profile (default stock)
    instance_type: r7iz.metal-16xl # optional: catalog type, for the rank layout
    sockets: 2                     # or describe the machines directly
    physical_cores: 32             # physical cores per node (all sockets)
    wheelhouse: /srv/wheels        # optional: nodes install from here with no index (offline)
    shared_output_root: /mnt/runs  # optional: a folder every node sees on one shared disk; jobs write under it
    shared_cores: false            # optional: true when the nodes are shares of one machine's cores
    offline: false                 # optional: true when the nodes cannot reach the internet
    hosts:                         # master first
      - name: node0
        address: 192.0.2.10        # what the controller connects to
        private_address: 10.0.0.10 # what the nodes use among themselves (default: address)
      - 192.0.2.11                 # a bare address is fine too
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from typing import Any, Mapping

from cluster.stack import catalog
from cluster import names
from cluster.stack.catalog import InstanceType
from cluster.node.profiles import DEFAULT_PROFILE, PROFILES
from cluster.stack.tags import ROLE_MASTER, ROLE_WORKER

FILE_KEYS = ("name", "kind", "user", "key", "gateway", "profile", "instance_type", "sockets", "physical_cores",
             "wheelhouse", "shared_output_root", "shared_cores", "offline", "hosts")
FACT_FLAGS = ("shared_cores", "offline")  # the facts that are true or false
HOST_KEYS = ("name", "address", "private_address")


class InventoryError(ValueError):
    pass


# The SSH key for nodes whose inventory names none (an AWS cluster, an inventory file without `key`).
KEY_ENV = "XEON_CLUSTER_SSH_KEY"
DOWN = "down"  # a node's state while it is down and not yet replaced (a local node reclaimed)


class ClusterSelectionError(ValueError):
    """`--cluster` cannot be resolved to an inventory (any kind: AWS, local, a file); the message says what
    to do. Raised by node_setup/discovery.py and node_setup/aws/discovery.py."""


def _unknown_keys(found: Mapping[str, Any], known: tuple[str, ...], where: str) -> list[str]:
    """One line per key that is not in `known`, with the closest known key as a suggestion."""
    problems = []
    for key in sorted(set(map(str, found)) - set(known)):
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        problems.append(f"{where}: key {key!r} is unknown; {hint}allowed: {', '.join(known)}")
    return problems


def _count(value: Any, setting: str) -> int | None:
    """A positive whole number from the file (None when absent)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InventoryError(f"{setting}: {value!r} is not allowed; allowed: a whole number of 1 or more")
    return value


@dataclass(frozen=True)
class Node:
    name: str  # alias used in ssh config and the hostfile
    address: str  # what the controller connects to
    private_address: str  # what nodes use among themselves
    rank: int
    role: str = ROLE_WORKER
    instance_type: str | None = None
    spot: bool | None = None
    instance_id: str | None = None
    state: str = "running"
    launched_at: float | None = None  # Unix seconds: EC2's LaunchTime, a local node's start; None: not known
    zone: str | None = None  # availability zone (what a spot price depends on)

    def __post_init__(self) -> None:
        where = f"host {self.rank} ({self.name!r})"
        try:
            names.alias(self.name, f"{where} name")
            names.endpoint(self.address, f"{where} address")
            names.host(self.private_address, f"{where} private_address")
        except names.UnsafeValue as exc:
            raise InventoryError(str(exc)) from None


@dataclass(frozen=True)
class Inventory:
    name: str
    kind: str  # "aws", "local" or "file"
    user: str
    nodes: tuple[Node, ...]
    key_path: str | None = None
    gateway: str | None = None
    profile: str = DEFAULT_PROFILE
    instance_type: str | None = None
    sockets: int | None = None
    physical_cores: int | None = None
    wheelhouse: str | None = None
    region: str | None = None
    # Facts of where the nodes are, which planning reads instead of the kind of cluster: set by the
    # kind's backend at discovery (the local cluster's: node_setup/backends/files.py) or by an inventory
    # file, and carried with the inventory (to_mapping) into a supervised run's spec.
    shared_output_root: str | None = None  # a folder on one disk every node shares; None: each node's home
    shared_cores: bool = False  # the nodes are shares of one machine's cores (each gets an equal share, unpinned)
    offline: bool = False  # the nodes cannot reach the internet: a job given no model or data runs the offline demo
    # Nodes the backend knows are down now, left out of `nodes` (a down master stays there: tasks that need it
    # say they cannot reach it), and lines every task says on using the inventory (whose cluster it is,
    # what brings a down node back). Set at discovery; not part of the file format.
    down: tuple[Node, ...] = ()
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        try:
            names.cluster(self.name, "name")
            names.user(self.user, f"cluster {self.name!r} user")
            if self.gateway:
                names.endpoint(self.gateway, f"cluster {self.name!r} gateway")
            if self.wheelhouse:
                names.node_path(self.wheelhouse, f"cluster {self.name!r} wheelhouse")
            if self.shared_output_root is not None:
                names.node_path(self.shared_output_root, f"cluster {self.name!r} shared_output_root")
        except names.UnsafeValue as exc:
            raise InventoryError(str(exc)) from None
        for flag in FACT_FLAGS:
            if not isinstance(getattr(self, flag), bool):
                raise InventoryError(f"cluster {self.name!r} {flag}: {getattr(self, flag)!r} is not allowed; "
                                     "allowed: true or false")

    @property
    def master(self) -> Node:
        return self.nodes[0]

    def on_shared_disk(self, path: str) -> bool:
        """Whether `path` on the nodes is in the shared output root (every node, and the master's
        replacement, sees the same files there)."""
        root = (self.shared_output_root or "").rstrip("/")
        return bool(root) and (path == root or path.startswith(root + "/"))

    def first(self, count: int) -> "Inventory":
        """The inventory cut to its first `count` nodes (master first), with a clear error."""
        if not 1 <= count <= len(self.nodes):
            raise InventoryError(
                f"--nodes: {count} is not possible on cluster {self.name!r}; allowed 1 to {len(self.nodes)} "
                f"(nodes available: {', '.join(n.name for n in self.nodes)}"
                + (f"; down now: {', '.join(n.name for n in self.down)}" if self.down else "") + ")")
        return replace(self, nodes=self.nodes[:count])

    def machine(self) -> InstanceType:
        """What one node looks like, for the rank layout."""
        known = catalog.lookup(self.instance_type or "")
        if known and not (self.sockets or self.physical_cores):
            return known
        if not self.physical_cores:
            raise InventoryError(
                f"cluster {self.name!r}: instance type {self.instance_type!r} is not in the catalog; "
                "give sockets and physical_cores in the inventory")
        return catalog.custom(self.instance_type or "custom", self.sockets or 1, self.physical_cores)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, default_name: str, kind: str = "file") -> "Inventory":
        if not isinstance(data, Mapping):
            raise InventoryError(f"inventory {default_name!r}: expected a mapping with 'hosts', got "
                                 f"{type(data).__name__}")
        where = f"inventory {default_name!r}"
        problems = _unknown_keys(data, FILE_KEYS, where)
        problems += [p for i, h in enumerate(data.get("hosts") or []) if isinstance(h, Mapping)
                     for p in _unknown_keys(h, HOST_KEYS, f"{where} hosts[{i}]")]
        if problems:
            raise InventoryError("; ".join(problems))
        hosts = data.get("hosts")
        if not hosts or not isinstance(hosts, list):
            raise InventoryError(f"{where}: 'hosts' must be a non-empty list, master first")
        profile = data.get("profile", DEFAULT_PROFILE)
        if not isinstance(profile, str) or profile not in PROFILES:
            raise InventoryError(f"inventory {default_name!r}: profile {profile!r} is unknown; "
                                 f"allowed: {', '.join(sorted(PROFILES))}")
        if data.get("instance_type") is not None:
            try:
                names.alias(data["instance_type"], f"{where} instance_type")
            except names.UnsafeValue as exc:
                raise InventoryError(str(exc)) from None
        if data.get("key") is not None and not isinstance(data["key"], str):
            raise InventoryError(f"{where} key: {data['key']!r} is not allowed; allowed: the path of a private key "
                                 "on this machine")
        nodes = []
        for rank, host in enumerate(hosts):
            if isinstance(host, str):
                host = {"address": host}
            if not isinstance(host, Mapping) or not host.get("address"):
                raise InventoryError(f"inventory {default_name!r}: hosts[{rank}] needs an 'address'")
            try:
                nodes.append(Node(
                    name=str(host.get("name") or f"node{rank}"),
                    address=str(host["address"]),
                    private_address=str(host.get("private_address") or host["address"]),
                    rank=rank,
                    role=ROLE_MASTER if rank == 0 else ROLE_WORKER,
                    instance_type=data.get("instance_type"),
                ))
            except InventoryError as exc:
                raise InventoryError(f"{where}: {exc}") from None
        aliases = [n.name for n in nodes]
        if len(set(aliases)) != len(aliases):
            raise InventoryError(f"inventory {default_name!r}: host names repeat: {aliases}")
        sockets = _count(data.get("sockets"), f"{where} sockets")
        physical_cores = _count(data.get("physical_cores"), f"{where} physical_cores")
        try:
            inventory = cls(
                name=str(data.get("name") or default_name), kind=kind, user=str(data.get("user") or "root"),
                nodes=tuple(nodes), key_path=data.get("key"), gateway=data.get("gateway"), profile=profile,
                instance_type=data.get("instance_type"), sockets=sockets,
                physical_cores=physical_cores, wheelhouse=data.get("wheelhouse"),
                shared_output_root=data.get("shared_output_root"),
                **{flag: data.get(flag, False) for flag in FACT_FLAGS},
            )
        except InventoryError as exc:
            raise InventoryError(f"{where}: {exc}") from None
        return inventory

    def to_mapping(self) -> dict[str, Any]:
        """The inventory as the YAML file format (round-trips through from_mapping)."""
        out: dict[str, Any] = {"name": self.name, "user": self.user, "profile": self.profile}
        for key, value in (("key", self.key_path), ("gateway", self.gateway),
                           ("instance_type", self.instance_type), ("sockets", self.sockets),
                           ("physical_cores", self.physical_cores), ("wheelhouse", self.wheelhouse),
                           ("shared_output_root", self.shared_output_root),
                           *((flag, getattr(self, flag) or None) for flag in FACT_FLAGS)):
            if value is not None:
                out[key] = value
        out["hosts"] = [{"name": n.name, "address": n.address, "private_address": n.private_address}
                        for n in self.nodes]
        return out
