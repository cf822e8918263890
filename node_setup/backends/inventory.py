"""The backend of an inventory file's machines (any SSH hosts; cluster/inventory.py's format).

Nothing comes back: no group replaces a lost machine, there is no console to verify a host key
from (a never-seen host is trusted on first use), and nothing is priced.
"""

from __future__ import annotations

from typing import Any

from cluster.cost import spend
from cluster.backend import FILE, ConsoleSource, NodePrice, PreflightReport
from cluster.inventory import Inventory, Node
from cluster.run.supervision import Member
from node_setup.backends.files import load_inventory_file


class StaticGroup:
    """An inventory file's machines: the same ones always; no replacement, no console."""

    def __init__(self, members: list[Member]):
        self._members = {m.name: m for m in members}

    def members(self) -> dict[str, Member]:
        return dict(self._members)

    def instance_state(self, member: Member) -> str | None:
        return None  # unknown: a silent machine of an inventory file counts as gone

    def console(self, member: Member) -> str:
        return ""

    def replaces_lost(self) -> bool:
        return False  # nothing brings a machine of yours back

    def hand_back(self, member: Member) -> str:
        return "nothing to hand it back to: no group replaces a machine of an inventory file; it is left out"


class InventoryFileBackend:
    kind = FILE

    def discover(self, target: str | None, region: str | None = None) -> Inventory:
        return load_inventory_file(str(target))

    def console_source(self, inventory: Inventory) -> ConsoleSource | None:
        return None

    def price_book(self, inventory: Inventory) -> Any:
        return None

    def node_price(self, book: Any, node: Node, instance_type: str | None) -> NodePrice:
        return None, spend.NO_PRICE_FOR_FILE

    def run_context(self, inventory: Inventory) -> dict[str, Any]:
        return {}

    def machine_group(self, spec: dict[str, Any], members: list[Member]) -> tuple[StaticGroup, list[Member]]:
        return StaticGroup(members), members

    def supervisor_as_service(self) -> bool:
        return False

    def preflight_for_run(self, inventory: Inventory) -> PreflightReport | None:
        return None

    def default_idle_stop(self, inventory: Inventory) -> int | None:
        return None  # your own machines: only `fab setup --auto-stop` or `fab autostop` arm it

    def idle_stop_files(self, inventory: Inventory) -> dict[str, str]:
        return {}

    def group_status(self, inventory: Inventory) -> tuple[str, str | None] | None:
        return None

    def compiles_bytecode(self) -> bool:
        return True  # the jobs run as the SSH user, the venv is root's

    def copies_wheelhouse(self) -> bool:
        return True

    def market(self, node: Node) -> str | None:
        return None

    def link_limit(self, inventory: Inventory) -> str:
        return ""

    def measured_type(self, inventory: Inventory) -> str:
        return ""  # your own machines: their CPU model and cores say which they are

    def history_identity(self, inventory: Inventory) -> str:
        return ""

    def planned_machine(self) -> tuple[str, int] | None:
        return None

    def run_store(self, cluster: str, *, data_dir: str = "", region: str | None = None) -> Any:
        return None  # nothing brings a new master: `fab train --managed --resume` continues a lost master's run

    def cluster_network(self, inventory: Inventory) -> tuple[str, tuple[str, ...]] | None:
        return None
