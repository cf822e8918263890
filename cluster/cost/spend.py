"""What a cluster has cost so far and what a run cost (pure: times and prices come in).

    node_spend(...)  -> NodeSpend       one node: uptime x hourly price
    ClusterSpend                        every node and the cluster's total (`fab status`, `--json`)
    planned_seconds(prediction, ...)    the planner's run time for the job's epochs or --max-steps
    RunCost                             planned and actual time and money of one `fab train` run,
                                        its two printed lines and the record in summary.json

Times are Unix seconds (UTC); prices are USD per instance-hour, looked up by the caller
(node_setup/tasks/spend.py, node_setup/aws/pricing.py). The spend so far is the node's uptime
times the price known now: a spot price that moved during the uptime is not integrated.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

from cluster.cost import timemodel as tm
from cluster.durations import format_duration

# How a node is paid for: its kind's backend says which (node_setup/backends/, `market`).
SPOT = "spot"
ON_DEMAND = "on-demand"
LOCAL_MARKET = "local"  # the local cluster's: nothing is paid
LOCAL_NO_PRICE = "local cluster: no price"
NO_PRICE_FOR_FILE = "no price: machines of an inventory file"
COST_KEY = "cost"  # summary.json's cost record
# A user's program writes what it likes to its own output folder; the toolkit's record of such a
# run (the built-in job's summary fields fab reads: cost, wall time, nodes, recoveries) lives in
# the job's own directory on the master instead, under this name.
RUN_RECORD_NAME = "summary.json"
UNKNOWN = "-"


def uptime_seconds(launched_at: float | None, now: float) -> float | None:
    return None if launched_at is None else max(0.0, now - launched_at)


def cost_usd(seconds: float | None, usd_per_hour: float | None) -> float | None:
    if seconds is None or usd_per_hour is None:
        return None
    return seconds * usd_per_hour / 3600


@dataclass(frozen=True)
class NodeSpend:
    name: str
    market: str | None
    launched_at: float | None
    uptime_s: float | None
    usd_per_hour: float | None  # None: no price known
    spent_usd: float | None
    price_source: str

    def as_json(self) -> dict[str, Any]:
        return {"market": self.market, "launched_at": iso_utc(self.launched_at),
                "uptime_seconds": _rounded(self.uptime_s, 0), "usd_per_hour": _rounded(self.usd_per_hour, 4),
                "spent_usd": _rounded(self.spent_usd, 4), "price_source": self.price_source}


def node_spend(name: str, market_: str | None, launched_at: float | None, now: float, usd_per_hour: float | None,
               price_source: str) -> NodeSpend:
    uptime = uptime_seconds(launched_at, now)
    return NodeSpend(name, market_, launched_at, uptime, usd_per_hour, cost_usd(uptime, usd_per_hour), price_source)


@dataclass(frozen=True)
class ClusterSpend:
    nodes: tuple[NodeSpend, ...]

    @property
    def usd_per_hour(self) -> float:
        """The priced nodes' hourly price together."""
        return sum(n.usd_per_hour for n in self.nodes if n.usd_per_hour is not None)

    @property
    def spent_usd(self) -> float:
        return sum(n.spent_usd for n in self.nodes if n.spent_usd is not None)

    @property
    def unpriced(self) -> list[str]:
        """Nodes whose spend is not known (no price or no launch time): the total leaves them out."""
        return [n.name for n in self.nodes if n.spent_usd is None]

    def node(self, name: str) -> NodeSpend | None:
        return next((n for n in self.nodes if n.name == name), None)

    def total_json(self) -> dict[str, Any]:
        return {"nodes": len(self.nodes), "usd_per_hour": round(self.usd_per_hour, 4),
                "spent_usd": round(self.spent_usd, 4), "unpriced": self.unpriced}

    def total_line(self) -> str:
        line = (f"total: {len(self.nodes)} node(s), {usd(self.usd_per_hour, 4)}/hour, "
                f"{usd(self.spent_usd)} spent so far")
        if self.nodes and all(n.market == LOCAL_MARKET for n in self.nodes):
            return f"{line} ({LOCAL_NO_PRICE})"
        if self.unpriced:
            line += f" (not counted: {', '.join(self.unpriced)}, spend unknown)"
        return line

    def source_lines(self) -> list[str]:
        """Where each price came from, once per source."""
        sources = sorted({n.price_source for n in self.nodes if n.price_source})
        return [f"price: {s}" for s in sources]


# ---------------------------------------------------------------- formatting


def usd(value: float | None, digits: int = 2) -> str:
    return UNKNOWN if value is None else f"${value:,.{digits}f}"


def duration(seconds: float | None) -> str:
    return UNKNOWN if seconds is None else format_duration(seconds)


def iso_utc(at: float | None) -> str | None:
    if at is None:
        return None
    return dt.datetime.fromtimestamp(at, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


SPEND_HEADER = f"{'market':<10} {'uptime':>11} {'$/hour':>9} {'spent':>9}"


def spend_columns(node: NodeSpend | None) -> str:
    """`fab status`'s market, uptime, price and spend columns for one node (SPEND_HEADER's widths)."""
    if node is None:
        return f"{UNKNOWN:<10} {UNKNOWN:>11} {UNKNOWN:>9} {UNKNOWN:>9}"
    return (f"{node.market or UNKNOWN:<10} {duration(node.uptime_s):>11} {usd(node.usd_per_hour, 4):>9} "
            f"{usd(node.spent_usd):>9}")


# ---------------------------------------------------------------- one run: planned and actual


def planned_seconds(prediction: tm.Prediction, epochs: float, max_steps: int | None = None) -> float:
    """Start-up plus the steps the job will take: its epochs, or --max-steps when that comes first."""
    steps = math.ceil(epochs * prediction.steps)
    if max_steps:
        steps = min(steps, max_steps)
    return prediction.startup_s + steps * prediction.step_seconds


@dataclass(frozen=True)
class RunCost:
    """One run's time and money: planned at launch (when the planner can), actual at the end."""

    nodes: int
    usd_per_hour: float | None  # the job's nodes together; None when a node has no price
    price_source: str
    planned_s: float | None = None
    why_not_planned: str = ""  # set when planned_s is None
    actual_s: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def planned_usd(self) -> float | None:
        return cost_usd(self.planned_s, self.usd_per_hour)

    @property
    def actual_usd(self) -> float | None:
        return cost_usd(self.actual_s, self.usd_per_hour)

    def _price(self) -> str:
        if self.price_source == LOCAL_NO_PRICE:
            return LOCAL_NO_PRICE
        if self.usd_per_hour is None:
            return f"no price: {self.price_source}"
        return f"{self.nodes} node(s) at {usd(self.usd_per_hour, 4)}/hour, {self.price_source}"

    def planned_line(self) -> str:
        if self.planned_s is None:
            return f"planned: cannot plan this run: {self.why_not_planned} ({self._price()})"
        return f"planned: {duration(self.planned_s)}, {usd(self.planned_usd)} ({self._price()})"

    def actual_line(self) -> str:
        line = f"actual: {duration(self.actual_s)}, {usd(self.actual_usd)}"
        if self.planned_s and self.actual_s is not None:
            line += f" ({self.actual_s / self.planned_s:.0%} of the planned time)"
        return line + (f" ({LOCAL_NO_PRICE})" if self.price_source == LOCAL_NO_PRICE else "")

    def record(self) -> dict[str, Any]:
        """summary.json's cost record."""
        return {"planned_seconds": _rounded(self.planned_s, 1), "planned_usd": _rounded(self.planned_usd, 4),
                "actual_seconds": _rounded(self.actual_s, 1), "actual_usd": _rounded(self.actual_usd, 4),
                "hourly_usd": _rounded(self.usd_per_hour, 4), "nodes": self.nodes, "price_source": self.price_source,
                **({"not_planned": self.why_not_planned} if self.planned_s is None else {})}


def run_record(job_id: str, exit_code: int, hosts: list[str], world_size: int, cost: RunCost) -> dict[str, Any]:
    """The toolkit's summary of a user program's run: what the built-in job's summary.json holds
    for fab (cost, wall time, nodes, recoveries: a user's program is never recovered)."""
    return {"job_id": job_id, "exit_code": exit_code, "nodes": list(hosts), "world_size": world_size,
            "wall_seconds": _rounded(cost.actual_s, 1), "recoveries": [], COST_KEY: cost.record()}


def run_price(spend: ClusterSpend) -> tuple[float | None, str]:
    """(the nodes' hourly price together, or None when one has none; where the prices came from)."""
    if spend.nodes and all(n.market == LOCAL_MARKET for n in spend.nodes):
        return 0.0, LOCAL_NO_PRICE
    sources = "; ".join(sorted({n.price_source for n in spend.nodes if n.price_source}))
    if any(n.usd_per_hour is None for n in spend.nodes):
        return None, sources
    return spend.usd_per_hour, sources
