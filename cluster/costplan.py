"""The `fab plan` table: predicted time and cost per node count (pure; prices come in as numbers)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from cluster import timemodel as tm


@dataclass(frozen=True)
class PlanRow:
    nodes: int
    prediction: tm.Prediction
    hourly_usd: float  # the whole cluster
    total_usd: float  # the whole run: start-up plus every epoch

    def as_json(self) -> dict:
        return {"nodes": self.nodes, "epoch_seconds": round(self.prediction.epoch_seconds, 1),
                "efficiency": round(self.prediction.efficiency, 4), "hourly_usd": round(self.hourly_usd, 4),
                "total_usd": round(self.total_usd, 4)}


def parse_node_counts(text: str | int) -> list[int]:
    """`1,2,4,8` -> [1, 2, 4, 8] (sorted, unique)."""
    try:
        counts = sorted({int(part) for part in str(text).split(",") if part.strip()})
    except ValueError:
        raise ValueError(f"--nodes: {text!r} is not a list of node counts; allowed: e.g. 1,2,4,8") from None
    if not counts or counts[0] < 1:
        raise ValueError(f"--nodes: {text!r} needs node counts of 1 or more, e.g. 1,2,4,8")
    return counts


def plan(workload: tm.Workload, network: tm.Network, node_counts: list[int], node_samples_per_s: float,
         instance_usd_per_hour: float, *, ranks_per_node: int = 1,
         overlap: float = tm.DEFAULT_OVERLAP) -> list[PlanRow]:
    rows = []
    for nodes in node_counts:
        pred = tm.predict(workload, network, nodes, node_samples_per_s, ranks_per_node=ranks_per_node,
                          overlap=overlap)
        hourly = nodes * instance_usd_per_hour
        rows.append(PlanRow(nodes, pred, hourly, hourly * pred.run_seconds / 3600))
    return rows


def cheapest(rows: list[PlanRow]) -> PlanRow:
    return min(rows, key=lambda r: (r.total_usd, r.prediction.run_seconds))


def fastest(rows: list[PlanRow]) -> PlanRow:
    return min(rows, key=lambda r: (r.prediction.run_seconds, r.total_usd))


def render_table(rows: list[PlanRow], *, header: str = "", price_source: str = "", notes: list[str] = ()) -> str:
    lines = [header] if header else []
    lines.append(f"{'nodes':>5}  {'epoch time':>11}  {'run time':>11}  {'efficiency':>10}  {'$/hour':>8}  {'total $':>8}")
    for row in rows:
        p = row.prediction
        lines.append(f"{row.nodes:>5}  {tm.format_duration(p.epoch_seconds):>11}  {tm.format_duration(p.run_seconds):>11}  "
                     f"{p.efficiency:>10.0%}  {row.hourly_usd:>8.2f}  {row.total_usd:>8.2f}")
    if price_source:
        lines.append(f"price: {price_source}")
    lines.extend(notes)
    cheap, fast = cheapest(rows), fastest(rows)
    lines.append(f"cheapest: {cheap.nodes} node(s), ${cheap.total_usd:.2f} in {tm.format_duration(cheap.prediction.run_seconds)}")
    lines.append(f"fastest:  {fast.nodes} node(s), {tm.format_duration(fast.prediction.run_seconds)} for ${fast.total_usd:.2f}")
    return "\n".join(lines)


def render_json(rows: list[PlanRow]) -> str:
    return json.dumps([row.as_json() for row in rows], indent=2)
