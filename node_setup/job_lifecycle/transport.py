"""What the job lifecycle needs of the place it runs from (node_setup/job_lifecycle/steps.py).

Two implementations: Fabric on the controller (node_setup/ssh/transport.py) and plain ssh and bash on
the master (node_setup/supervisor/onmaster.py's ShellTransport). Neither raises for a node: an
unreachable node is an Answer with no code and the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from cluster.job.jobplan import JobPlan
from cluster.inventory import Inventory


@dataclass(frozen=True)
class Answer:
    """One node's answer to a command: its exit code (None: not reached) and its output (or why not)."""

    node: str
    code: int | None
    out: str = ""

    @property
    def ok(self) -> bool:
        return self.code == 0


class Transport(Protocol):
    master: str  # the master's node name

    def run(self, nodes: Sequence[str], command: str, *, timeout: float | None = None) -> list[Answer]:
        """`command` (a shell line, run from the home directory) on every node of `nodes` at once; answers
        in their order."""
        ...

    def put(self, node: str, path: str, data: bytes, *, mode: int = 0o644) -> None:
        """Write `data` at `path` (relative to the home) on `node`, whole (a reader never sees half of it)."""
        ...

    def trust(self, inventory: Inventory) -> dict[str, str] | None:
        """The host keys ("type base64" by node name) the master's ssh is to accept for these nodes; None when
        trusting them wrote the master's ssh files itself (fab's distribution: the cluster key with them)."""
        ...

    def copy_workdir(self, plan: JobPlan) -> list[Answer]:
        """Your program's workdir into the job's directory on every node of the plan."""
        ...

    def install_requirements(self, plan: JobPlan) -> list[Answer]:
        """The plan's --requirements into every node's venv."""
        ...
