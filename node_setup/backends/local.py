"""The backend of the local cluster: network namespaces on this machine (node_setup/local/).

Discovered from the inventory `fab local-up` wrote; a lost node comes back as a new machine in its
slot, recorded by the group keeper on the host (node_setup/local/keeper.py) in the cluster's data
directory, which every node shares; a node's console is a file its start-up writes
(node_setup/local/console.py); nothing is paid; the supervisor is a process in the master's namespace.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cluster import names
from cluster.cost import spend
from cluster.backend import LOCAL, ConsoleSource, NodePrice, PreflightReport
from cluster.inventory import ClusterSelectionError, Inventory, Node
from cluster.run.supervision import Member
from node_setup.backends.members import checked_member
from node_setup.local.console import CONSOLE_FILE
from node_setup.backends.files import load_inventory_file
from node_setup.local import state as local_state
from node_setup.local.state import GROUP_FILE


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

    def console(self, member: Member) -> str:
        # the node's directory is its slot's; its console shows the machine there now, which must be this one
        if self.instance_state(member) != "running":
            return ""
        try:
            return (self.data_dir / names.alias(member.name, "node") / CONSOLE_FILE).read_text(errors="replace")
        except (OSError, names.UnsafeValue):
            return ""


def local_inventory(name: str = local_state.DEFAULT_NAME) -> Inventory:
    """The inventory `fab local-up --name NAME` wrote, if that cluster is running."""
    from node_setup.local import cluster as local_cluster

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
    if not local_cluster.is_running(state):
        raise ClusterSelectionError(f"local cluster {name!r} is not running (its sshd processes or namespaces are "
                                    f"gone, "
                                    f"e.g. after a reboot): restart it with `fab local-up --replace --nodes "
                                    f"{len(state.nodes)}{flag}`")
    return load_inventory_file(paths.inventory_path)


class LocalBackend:
    kind = LOCAL

    def discover(self, target: str | None, region: str | None = None) -> Inventory:
        return local_inventory(target or local_state.DEFAULT_NAME)

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

    def replaces_lost_master(self) -> bool:
        return False  # the keeper replaces workers only
