"""`fab clusters`: every cluster this checkout knows, one row each (pure).

The local clusters (`fab local-up`: their state files) with how many of their nodes are up, and the AWS
stacks (a `Pulumi.<stack>.yaml` beside the project: the cluster its settings name, its node count)
with what EC2 says when asked (`--aws`; otherwise not queried: nothing leaves this machine). Spend so
far is cluster/cost/spend.py's ClusterSpend of the nodes running now (a local cluster has no price).
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster.cost.spend import usd
from cluster.names import printable

LOCAL, AWS = "local", "aws"
NOT_QUERIED = "not queried (--aws asks EC2)"


@dataclass(frozen=True)
class ClusterRow:
    name: str  # as --cluster takes it: local:NAME, or the AWS cluster's name
    kind: str  # LOCAL or AWS
    state: str  # "up", "3 of 4 up", "down", "none running", NOT_QUERIED, "unreadable"
    nodes: int | None  # the nodes it has (local) or its settings make (AWS)
    spent_usd: float | None = None  # spend so far of the nodes running now (None: unknown)
    note: str = ""  # whose it is, its stack file, why a figure is missing


def local_state(up: int, nodes: int) -> str:
    """A local cluster's state from how many of its nodes are up."""
    return "up" if up == nodes and nodes else "down" if up == 0 else f"{up} of {nodes} up"


def table(rows: list[ClusterRow]) -> str:
    if not rows:
        return "no cluster known here: `fab local-up` makes a local one, `pulumi stack init` and `fab up` an AWS one"
    width = max(len(printable(r.name)) for r in rows)
    lines = [f"  {'cluster':<{width}}  {'kind':<5}  {'state':<28}  {'nodes':>5}  {'spent so far':>12}  note"]
    for r in rows:
        spent = "-" if r.spent_usd is None else usd(r.spent_usd)
        lines.append(f"  {printable(r.name):<{width}}  {r.kind:<5}  {printable(r.state):<28}  "
                     f"{'-' if r.nodes is None else r.nodes:>5}  {spent:>12}  {printable(r.note)}".rstrip())
    return "\n".join(["clusters this checkout knows:", *lines])
