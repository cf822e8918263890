"""What differs between the kinds of cluster, as one interface (pure: the protocols and their names).

A cluster is one of three kinds, each with one backend in node_setup/backends/ (`backend_for(kind)`
there picks it; nothing else asks an inventory's kind for these concerns):

- `local` (node_setup/backends/local.py): network namespaces on this machine (node_setup/local/);
- `aws` (node_setup/backends/aws.py): EC2 instances found by their tags (node_setup/aws/);
- `file` (node_setup/backends/inventory.py): the machines an inventory file lists, any SSH hosts.

`ClusterBackend` is what a kind answers on the controller (discover the inventory, a new node's
console host keys, prices, what the run supervisor needs to follow the group, how it is started,
the checks before a run, the idle auto-stop's default and group, the wheelhouse, the market);
`MachineGroup` is what the run supervisor on the master asks while a run goes on (the group's
members now: a replacement's arrival; an instance's state: is a silent node lost; its console:
the host keys it printed). tests/unit/test_supervisor.py drives the supervisor with a test double
of `MachineGroup`.
"""

from __future__ import annotations

from typing import Any, Protocol

from cluster.inventory import Inventory, Node
from cluster.run.supervision import Member

LOCAL = "local"  # network namespaces on this machine (`fab local-up`)
AWS = "aws"  # EC2 instances found by their tags
FILE = "file"  # an inventory file's machines
KINDS = (LOCAL, AWS, FILE)


class BackendError(Exception):
    """A backend could not answer: the message says what and what to do; `unreachable` when an account or
    a machine could not be read (exit 3), else a value was refused (exit 2)."""

    def __init__(self, message: str, *, unreachable: bool = False):
        super().__init__(message)
        self.unreachable = unreachable


NodePrice = tuple[float | None, str]  # USD per hour (None: not known) and where it came from, or why none


class ConsoleSource(Protocol):
    """Where a new node's console host keys are read (cluster/node/console.py parses the text)."""

    kind: str  # the cluster kind whose nodes' consoles these are (named in a refusal)
    wait_s: float  # how long to wait for the fingerprints to appear
    poll_s: float

    def instance(self, address: str) -> str | None: ...  # the machine at `address` now (None: no such node)

    def read(self, address: str) -> str: ...  # its console's text so far; ConsoleUnreadable when it cannot be read

    def where(self, address: str) -> str: ...

    def advice(self, address: str) -> str: ...


class PreflightReport(Protocol):
    """What a backend's checks before a run found (node_setup/aws/findings.py's Report)."""

    @property
    def ok(self) -> bool: ...  # nothing failed

    def render(self) -> str: ...  # every finding, one a line, with its fix


class MachineGroup(Protocol):
    """The run's machines as the supervisor on the master sees them (node_setup/supervisor/loop.py)."""

    def members(self) -> dict[str, Member]: ...  # slot name -> the machine there now (a replacement's arrival)

    def instance_state(self, member: Member) -> str | None: ...  # EC2's state names, "gone", None: not known

    def console(self, member: Member) -> str: ...  # its console's text ("" when there is none)

    def replaces_lost(self) -> bool: ...  # whether a lost machine can be replaced at all (False: go on at once)

    # A replacement the supervisor cannot admit (no host key its console lists in time, another key, its
    # software not ready), handed back so that the group launches another rather than keep it, billed and
    # idle; what was done, in words for the run's log (never raises).
    def hand_back(self, member: Member) -> str: ...


class ClusterBackend(Protocol):
    """One kind of cluster: everything that differs between local, AWS and an inventory file."""

    kind: str

    def discover(self, target: str | None, region: str | None = None) -> Inventory:
        """The inventory `--cluster` names (master first); ClusterSelectionError saying what to do."""
        ...

    def console_source(self, inventory: Inventory) -> ConsoleSource | None:
        """Where a never-seen node's host keys are verified; None: trusted on first use."""
        ...

    def price_book(self, inventory: Inventory) -> Any:
        """What `node_price` looks prices up in (AWS's price book, or the reason there is none)."""
        ...

    def node_price(self, book: Any, node: Node, instance_type: str | None) -> NodePrice:
        """One node's hourly price and its source (zero on the local cluster, none for an inventory file)."""
        ...

    def run_context(self, inventory: Inventory) -> dict[str, Any]:
        """The entries of a supervised run's spec that its `machine_group` reads back on the master
        (BackendError when they cannot be read or a value is refused)."""
        ...

    def machine_group(self, spec: dict[str, Any], members: list[Member]) -> tuple[MachineGroup, list[Member]]:
        """The run's group on the master, from the run's spec (its `run_context` entries), and the run's
        members as the group knows them (a local inventory has no instance ids: the keeper's record has)."""
        ...

    def supervisor_as_service(self) -> bool:
        """Whether the master is a machine of its own (a systemd unit runs the supervisor), not a namespace."""
        ...

    # What else differs, each asked of the backend where it acts (docs/design.md's table). What pure
    # planning needs (the shared output root, shared cores, no internet) is the Inventory's facts instead,
    # which `discover` fills in.

    def preflight_for_run(self, inventory: Inventory) -> PreflightReport | None:
        """The checks before a job or a supervised run starts on these nodes (AWS: credentials, every node
        still running, no spot notice); None: nothing to check. An account's answer is a finding, never raised."""
        ...

    def default_idle_stop(self, inventory: Inventory) -> int | None:
        """The idle auto-stop armed without being asked (by `fab setup` and at a job's start), in seconds: AWS's
        is the stack's autoStopIdle; None: none (only `--auto-stop` or `fab autostop` arm one). A bad value
        in the stack raises cluster/node/autostop.py's AutostopError."""
        ...

    def idle_stop_files(self, inventory: Inventory) -> dict[str, str]:
        """What the auto-stop's power-off needs on the master besides the node list, path -> text (AWS: the
        workers' group, set to 0 first, or it would launch the powered-off workers again)."""
        ...

    def group_status(self, inventory: Inventory) -> tuple[str, str | None] | None:
        """`fab status`'s line on the group that keeps the workers (AWS's: set to 0 by the auto-stop, short
        of workers, and why) and the problem to list (None: none); None: there is no such group."""
        ...

    def copies_wheelhouse(self) -> bool:
        """Whether an inventory's wheelhouse (a folder on this machine) is copied to each node before an
        install; False: the nodes read this machine's folder itself (a local cluster's share its disk)."""
        ...

    def compiles_bytecode(self) -> bool:
        """Whether an install compiles the venv's bytecode (pip's default); False: the nodes' jobs run as the venv's
        owner, so their first imports write the bytecode of what they use (a local cluster: about 3,500 of the
        venv's 12,400 modules, not all of them on the setup's time)."""
        ...

    def market(self, node: Node) -> str | None:
        """How a node is paid for (cluster/cost/spend.py's SPOT, ON_DEMAND, LOCAL_MARKET); None: not known."""
        ...

    def link_limit(self, inventory: Inventory) -> str:
        """What limits the nodes' link, as a calibration records it (a local cluster's `--link-mbit`); "": nothing."""
        ...

    def measured_type(self, inventory: Inventory) -> str:
        """The instance type a calibration of this cluster measured, recorded so that `fab plan` applies it only to
        that type (AWS's: the nodes' EC2 type); "": the machine is known by its CPU model and cores instead."""
        ...

    def history_identity(self, inventory: Inventory) -> str:
        """What tells this cluster from an earlier one of its name in the controller's job history (a local
        cluster's creation time, epoch seconds); "": the name alone."""
        ...

    def planned_machine(self) -> tuple[str, int] | None:
        """What `fab plan --cluster` plans without --instance-type: this machine's (CPU model, physical cores)
        where the cluster's nodes are this machine (a local cluster's, with no price); None: the catalog's type."""
        ...

    def run_store(self, cluster: str, *, data_dir: str = "", region: str | None = None) -> Any:
        """The run's secret store, where a new master finds the cluster key and the unfinished run (get, put, names,
        delete, where; read and write: a spec's or mirrored state's text beside the checkpoints): SSM Parameter
        Store on AWS, the state in S3 (node_setup/aws/run_secrets.py),
        a double of it in the cluster's data directory `data_dir` locally; None: an inventory file's machines."""
        ...

    def cluster_network(self, inventory: Inventory) -> tuple[str, tuple[str, ...]] | None:
        """(the subnet a new master comes up in at an address of its own, the addresses in it that are not the
        cluster's): what the cluster key's `from=` names on every node (a local cluster's subnet less its bridge on
        the host; on AWS the master's subnet, from EC2); None: `from=` the nodes' addresses (an inventory file's
        machines, or EC2 not saying)."""
        ...
