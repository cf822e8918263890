"""The job lifecycle's transport on the controller (node_setup/job_lifecycle/transport.py): Fabric.

Commands go to every node at once (node_setup/ssh/fanout.py's threads); files go through SFTP to a
partial name, then are moved into place (node_setup/ssh/job.py's write_remote_text). Trusting the nodes
is `fab distribute`'s distribution (the cluster key on every node, the host keys the controller verified
in the master's ssh files); the workdir and the requirements are node_setup/ssh/workdir.py's and
requirements.py's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

from cluster.inventory import Inventory
from cluster.job.jobplan import JobPlan
from node_setup.job_lifecycle.transport import Answer
from node_setup.ssh import connections
from node_setup.ssh.fanout import NodeOutcome, each_node

if TYPE_CHECKING:
    from fabric import Connection


def _answer(outcome: NodeOutcome) -> Answer:
    return Answer(outcome.node, 0 if outcome.ok else 1, outcome.detail)


class DistributionFailed(RuntimeError):
    """fab's distribution did not reach every node; `result` is node_setup/ssh/distribute.py's."""

    def __init__(self, error):
        super().__init__(str(error))
        self.result = error.result


class FabricTransport:
    def __init__(self, inventory: Inventory, conns: Mapping[str, Connection]):
        self.inventory, self.conns = inventory, dict(conns)
        self.master = inventory.master.name

    def run(self, nodes: Sequence[str], command: str, *, timeout: float | None = None) -> list[Answer]:
        def one(name: str, conn) -> Answer:
            try:
                result = conn.run(command, hide=True, warn=True, in_stream=False, timeout=timeout)
            except Exception as exc:  # noqa: BLE001 - the node's answer: not reached, and why
                return Answer(name, None, connections.explain(exc, conn))
            return Answer(name, result.exited, result.stdout + result.stderr)

        return each_node({n: self.conns[n] for n in nodes}, one)

    def put(self, node: str, path: str, data: bytes, *, mode: int = 0o644) -> None:
        from node_setup.ssh.job import write_remote_text

        write_remote_text(self.conns[node], path, data, mode=mode)

    def trust(self, inventory: Inventory) -> None:
        from node_setup.ssh.distribute import DistributionError, distribute

        try:
            distribute(inventory, conns={n.name: self.conns[n.name] for n in inventory.nodes})
        except DistributionError as exc:
            raise DistributionFailed(exc) from None
        return None

    def copy_workdir(self, plan: JobPlan) -> list[Answer]:
        from node_setup.ssh import workdir

        assert plan.copy is not None  # the lifecycle copies a plan's workdir only
        return [_answer(o) for o in workdir.push(self._of(plan), plan.copy, plan.job_id)]

    def install_requirements(self, plan: JobPlan) -> list[Answer]:
        from node_setup.ssh import requirements
        from node_setup.ssh.wheels import InstallError

        assert plan.install is not None  # the lifecycle installs a plan's requirements only
        try:
            return [_answer(o) for o in requirements.install(plan.inventory, self._of(plan), plan.install)]
        except InstallError as exc:
            return [Answer(n.name, 1, str(exc)) for n in plan.inventory.nodes]

    def _of(self, plan: JobPlan) -> dict:
        return {n.name: self.conns[n.name] for n in plan.inventory.nodes}

    def close(self) -> None:
        """After an interrupted stream: the connections closed (a half-closed channel may be left)."""
        for conn in self.conns.values():
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing is best effort; the next command reconnects
                pass

