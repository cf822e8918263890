"""The backend of the local cluster: network namespaces on this machine (node_setup/local/).

Discovered from the inventory `fab local-up` wrote; a lost node comes back as a new machine in its
slot, recorded by the group keeper on the host (node_setup/local/keeper.py) in the cluster's data
directory, which every node shares; a node's console is a file its start-up writes
(node_setup/local/console.py); nothing is paid; the supervisor is a process in the master's namespace.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from cluster import names
from cluster.cost import spend
from cluster.backend import LOCAL, ConsoleSource, NodePrice, PreflightReport
from cluster.inventory import DOWN, ClusterSelectionError, Inventory, Node
from cluster.run.supervision import Member
from node_setup.backends.members import checked_member
from node_setup.local.console import CONSOLE_FILE
from node_setup.backends.files import load_inventory_file
from node_setup.local import state as local_state
from node_setup.local.state import GROUP_FILE, HANDBACK_PREFIX, KEEPER_LOCK_FILE


class LocalGroup:
    """The local cluster's group: what its keeper on the host records, read from the shared data directory."""

    def __init__(self, data_dir: str):
        self.data_dir = Path(data_dir)

    def _entries(self) -> list[dict]:
        try:
            data = json.loads((self.data_dir / GROUP_FILE).read_text())
        except (OSError, ValueError):
            return []
        entries = data.get("members") if isinstance(data, dict) else None
        return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []

    def members(self) -> dict[str, Member]:
        found = {}
        for entry in self._entries():
            try:
                member = checked_member(entry, f"{GROUP_FILE} member")
            except ValueError:
                continue
            found[member.name] = member
        return found

    def instance_state(self, member: Member) -> str | None:
        for entry in self._entries():
            if entry.get("instance_id") == member.instance_id:
                return str(entry.get("state") or "running")
        return "gone"  # the keeper no longer lists it: replaced

    def replaces_lost(self) -> bool:
        """While the cluster's group keeper runs (`fab local-up --keeper-delay`): without it nothing comes."""
        return keeper_of(self.data_dir) is not None

    def hand_back(self, member: Member) -> str:
        """A request to the keeper, in the data directory it shares with the master: it takes the machine
        down and brings another in its slot after its delay, as a group terminates one and launches another."""
        if not self.replaces_lost():
            return "nothing to hand it back to: no group keeper runs for this cluster; it is left out"
        try:
            (self.data_dir / f"{HANDBACK_PREFIX}{member.instance_id}").write_text(f"{member.name}\n")
        except OSError as exc:
            return f"could not hand it back to the group keeper ({exc}); it is left out"
        return "handed back: the group keeper takes it down and brings a new machine in its place"

    def console(self, member: Member) -> str:
        # the node's directory is its slot's; its console shows the machine there now, which must be this one
        if self.instance_state(member) != "running":
            return ""
        try:
            return (self.data_dir / names.alias(member.name, "node") / CONSOLE_FILE).read_text(errors="replace")
        except (OSError, names.UnsafeValue):
            return ""


def local_inventory(name: str | None = None) -> Inventory:
    """The inventory `fab local-up --name NAME` wrote, while any node of it is up: the nodes that are up (and
    the master, up or not), the others in `down`. `name` None: a bare `--cluster local`, which refuses
    another checkout's cluster (node_setup/local/state.py's owners)."""
    from node_setup.local import cluster as local_cluster

    explicit, name = name is not None, name or local_state.DEFAULT_NAME
    try:
        paths = local_state.paths_for(name)
    except local_state.LocalClusterError as exc:
        raise ClusterSelectionError(f"--cluster local:{name}: {exc}") from None
    state = local_state.load_state(paths)
    flag = "" if name == local_state.DEFAULT_NAME else f" --name {name}"
    if state is None:
        others = local_state.list_clusters()
        found = f" (local clusters here: {', '.join(others)}; pick one with --cluster local:NAME)" if others else ""
        raise ClusterSelectionError(f"no local cluster named {name!r} is up{found}: start it with "
                                    f"`fab local-up --nodes 4{flag}`")
    problem = None if explicit else local_state.implicit_use_problem(state)
    if problem:
        raise ClusterSelectionError(problem)
    names_now = local_cluster.system.namespaces()
    up = {n.name: local_cluster.node_up(n, names_now) for n in state.nodes}
    if not any(up.values()):  # nothing runs, so no run is lost: local-up starts it again
        raise ClusterSelectionError(f"local cluster {name!r} is not running (none of its nodes' sshd processes or "
                                    f"namespaces is left, e.g. after a reboot): start it again with "
                                    f"`fab local-up --nodes {len(state.nodes)}{flag}`")
    inventory = load_inventory_file(paths.inventory_path)
    owner = local_state.owner_note(state)
    inventory = replace(inventory, notes=inventory.notes + ((owner,) if owner else ()))
    return with_down_nodes(inventory, state, up, keeper_of(Path(state.data_dir)))


def with_down_nodes(inventory: Inventory, state: local_state.ClusterState, up: dict[str, bool],
                    keeper: dict | None, now: float | None = None) -> Inventory:
    """The inventory the tasks work with while nodes are down: the nodes that are up, and the master even
    when it is down (a task that needs it says it cannot reach it), each down node's state `down`; the down
    workers in `down`, for `fab status`; one note saying what brings them back (never `--replace`, which
    would end a run on the nodes that are up)."""
    down = [n for n in inventory.nodes if not up.get(n.name, False)]
    if not down:
        return inventory
    now = time.time() if now is None else now
    shown = {n.name: replace(n, state=DOWN, launched_at=None) for n in down}
    kept = tuple(shown.get(n.name, n) for n in inventory.nodes if n.name not in shown or n is inventory.master)
    lost = ", ".join(n.name for n in down)
    if keeper is not None:
        since = {n.name: n.reclaimed_at for n in state.nodes}
        due = [f"{n.name} in about {max(0, round(since[n.name] + keeper['delay_s'] - now))} s"
               for n in down if since.get(n.name) is not None]
        back = (f"the group keeper (pid {keeper['pid']}) brings each back as a new machine "
                f"{keeper['delay_s']:g} s after it went down" + (f" ({', '.join(due)})" if due else ""))
    else:
        flag = "" if state.name == local_state.DEFAULT_NAME else f" --name {state.name}"
        back = (f"no group keeper runs, so nothing brings a down node back by itself: `fab local-up --nodes "
                f"{len(state.nodes)}{flag}` does, as a new machine, and leaves the nodes that are up (and a run "
                "on them) alone")
    using = ", ".join(n.name for n in kept if n.state != DOWN) or "none"
    note = f"local cluster {state.name!r}: {lost} down; {back}; working with the nodes that are up: {using}"
    return replace(inventory, nodes=kept, down=tuple(d for d in shown.values() if d.name != inventory.master.name),
                   notes=inventory.notes + (note,))


def keeper_of(data_dir: Path) -> dict | None:
    """The group keeper of the cluster whose data directory this is, while it runs ({"pid", "delay_s"}, from
    its record there, which the master sees too), else None: no lost node comes back by itself. It runs when
    its pid is this cluster's keeper or, where that pid cannot be seen (on a node, in its own PID namespace),
    while its lock there is held."""
    from node_setup.local import system

    try:
        record = json.loads((data_dir / GROUP_FILE).read_text())
        cluster, pid, delay = str(record["cluster"]), int(record["keeper"]["pid"]), float(record["keeper"]["delay_s"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    running = system.is_keeper(pid, cluster) or system.lock_held(data_dir / KEEPER_LOCK_FILE)
    return {"pid": pid, "delay_s": delay} if running else None


class LocalBackend:
    kind = LOCAL

    def discover(self, target: str | None, region: str | None = None) -> Inventory:
        return local_inventory(target)  # None: a bare `--cluster local`

    def console_source(self, inventory: Inventory) -> ConsoleSource | None:
        from node_setup.local.console import LocalConsole

        return LocalConsole(inventory)

    def price_book(self, inventory: Inventory) -> Any:
        return None

    def node_price(self, book: Any, node: Node, instance_type: str | None) -> NodePrice:
        return 0.0, spend.LOCAL_NO_PRICE

    def run_context(self, inventory: Inventory) -> dict[str, Any]:
        from node_setup.local.state import load_state, paths_for

        state = load_state(paths_for(inventory.name))
        return {"local_data_dir": state.data_dir if state else ""}

    def machine_group(self, spec: dict[str, Any], members: list[Member]) -> tuple[LocalGroup, list[Member]]:
        group = LocalGroup(spec["local_data_dir"])
        # the machines in the slots now, as the group records them (a local inventory has no instance ids)
        recorded = group.members()
        given = dict(spec.get("instance_ids") or {})
        return group, [m if m.name in given or m.name not in recorded
                       else Member(m.name, m.address, recorded[m.name].instance_id) for m in members]

    def supervisor_as_service(self) -> bool:
        return False  # a process inside the master's namespace

    def preflight_for_run(self, inventory: Inventory) -> PreflightReport | None:
        return None

    def default_idle_stop(self, inventory: Inventory) -> int | None:
        return None  # nothing is paid: only `fab setup --auto-stop` or `fab autostop` arm it

    def idle_stop_files(self, inventory: Inventory) -> dict[str, str]:
        return {}

    def group_status(self, inventory: Inventory) -> tuple[str, str | None] | None:
        return None

    def compiles_bytecode(self) -> bool:
        return False  # root runs the jobs in the shared venv: their imports write it

    def copies_wheelhouse(self) -> bool:
        return False  # the nodes' namespaces see this machine's disk: they read its wheelhouse

    def market(self, node: Node) -> str | None:
        return spend.LOCAL_MARKET

    def link_limit(self, inventory: Inventory) -> str:
        """The link limit `fab local-up --link-mbit` recorded in the cluster's state ("" when none)."""
        try:
            state = local_state.load_state(local_state.paths_for(inventory.name))
        except local_state.LocalClusterError:
            return ""
        if state is None or not state.link_mbit:
            return ""
        return local_state.describe_link(state.link_mbit, state.link_delay_ms)

    def measured_type(self, inventory: Inventory) -> str:
        return ""  # the nodes are this machine: its CPU model and cores say which

    def history_identity(self, inventory: Inventory) -> str:
        """When `fab local-up` made the cluster (its state file): a new cluster of the same name starts its own."""
        try:
            state = local_state.load_state(local_state.paths_for(inventory.name))
        except (local_state.LocalClusterError, OSError, ValueError):
            state = None
        return str(int(state.created_at)) if state is not None and state.created_at > 0 else ""

    def planned_machine(self) -> tuple[str, int] | None:
        from node_setup.local.system import machine_cpu

        return machine_cpu()

    def run_store(self, cluster: str, *, data_dir: str = "", region: str | None = None) -> Any:
        from node_setup.local.run_store_double import LocalStoreDouble

        return LocalStoreDouble(data_dir, cluster) if data_dir else None

    def cluster_network(self, inventory: Inventory) -> tuple[str, tuple[str, ...]] | None:
        """The cluster's subnet (its state), where the keeper brings a lost master back at a new address, less the
        bridge's address: this machine, the controller, gets no login with the cluster key."""
        try:
            state = local_state.load_state(local_state.paths_for(inventory.name))
        except local_state.LocalClusterError:
            return None
        return (state.subnet, (state.bridge_address,)) if state is not None else None
