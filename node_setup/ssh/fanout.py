"""One fan-out over the nodes: the same work on every node at once, one result per node, rank order.

    on_nodes(conns, command, timeout=...)   one shell command on every node, through Fabric's
                                            ThreadingGroup; a NodeOutcome per node
    each_node(conns, work)                  `work(name, conn)` per node, for work of several SSH
                                            steps (uploads, installs); one thread per node
    unopened(conns)                         the nodes whose connection does not open, each with why

Neither raises for a node: an unreachable node, a refused login or a failing command becomes that
node's result with the reason (connections.explain), and the other nodes go on.
`conns` maps node name to a Fabric Connection, master first (connections.connections_for).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, TypeVar

from fabric import ThreadingGroup
from fabric.exceptions import GroupException

from node_setup.ssh import connections

MAX_THREADS = 64
T = TypeVar("T")


@dataclass
class NodeOutcome:
    node: str
    ok: bool
    detail: str


def each_node(conns: Mapping[str, object], work: Callable[[str, object], T]) -> list[T]:
    """`work(name, conn)` on every node at once; results in the order of `conns`.

    `work` owns its error handling (it returns a per-node result); an exception it lets through
    propagates, because that is a bug, not a node's failure.
    """
    items = list(conns.items())
    with ThreadPoolExecutor(max_workers=max(1, min(MAX_THREADS, len(items))), thread_name_prefix="xc-node") as pool:
        return list(pool.map(lambda item: work(*item), items))


def unopened(conns: Mapping[str, object]) -> dict[str, str]:
    """The nodes whose connection does not open (unreachable, reclaimed, a never-seen host key its console does not
    show in time or refutes), each with why in one line (connections.explain); every node tried at once."""
    def one(name: str, conn) -> tuple[str, str | None]:
        try:
            conn.open()
        except Exception as exc:  # noqa: BLE001 - that node's failure, said; the others go on
            return name, connections.explain(exc, conn)
        return name, None

    return {name: why for name, why in each_node(conns, one) if why}


def on_nodes(conns: Mapping[str, object], command: str, *, timeout: float | None = None) -> list[NodeOutcome]:
    """Run `command` on every node (Fabric ThreadingGroup); ok means exit 0."""
    names = {id(conn): name for name, conn in conns.items()}
    group = ThreadingGroup.from_connections(list(conns.values()))
    try:
        results = group.run(command, hide=True, warn=True, in_stream=False, timeout=timeout)
    except GroupException as exc:
        results = exc.result
    by_name = {names[id(conn)]: value for conn, value in results.items()}
    outcomes = []
    for name, conn in conns.items():
        value = by_name.get(name)
        if isinstance(value, BaseException) or value is None:
            outcomes.append(NodeOutcome(name, False, connections.explain(value, conn) if value else "no result"))
            continue
        text = (value.stdout + value.stderr).strip()
        outcomes.append(NodeOutcome(name, value.ok, (text or "done") if value.ok else f"exit {value.exited}: {text}"))
    return outcomes


def outcome_table(outcomes: Iterable[NodeOutcome]) -> str:
    """Per-node results as indented lines: name, ok/FAILED, the last line of the detail."""
    rows = list(outcomes)
    width = max([len(o.node) for o in rows] + [4])
    lines = []
    for o in rows:
        detail = o.detail.splitlines() or [""]
        lines.append(f"  {o.node:<{width}}  {'ok    ' if o.ok else 'FAILED'}  {detail[-1]}")
        if not o.ok and len(detail) > 1:
            lines += [f"  {'':<{width}}          {d}" for d in detail[-4:-1]]
    return "\n".join(lines)
