"""The `fab plan` table: predicted time and cost per node count (pure; the stack and price come in).

    plan_rows(inputs, price)   -> [PlanRow]      the prediction and the whole cost per node count
                                                 (inputs: cluster/cost/plan_options.py's plan_inputs)
    with_on_demand_master(rows, price, ...)      what the master alone on demand adds (its line)
    render_table                                 what `fab plan` prints (PlanRow.as_json: its --json)

The whole cost is three terms, each shown on its own: provisioning (the first `pulumi up`: the image's
build on its own small instance, then every node from its launch; cluster/stack/lifecycle.py's steps, with the
build or, when the stack would boot a kept image, from it; the other way's cost is shown beside it), the run
(start-up plus every epoch, cluster/cost/timemodel.py) and the idle tail (after the run, until the idle
auto-stop powers the nodes off: the stack's autoStopIdle, default cluster/node/autostop.py's).

`price` is a Price the caller looked up (node_setup/aws/pricing.py) or was given; without spot
price history a spot price is `spot_estimate`'s, named as an estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from cluster.cost import timemodel as tm
from cluster.durations import format_duration
from cluster.cost.plan_options import PlanInputs

@dataclass(frozen=True)
class Price:
    usd_per_hour: float
    market: str  # "spot" or "on-demand"
    source: str
    zone: str | None = None
    estimate: bool = False  # not a price AWS quoted: `spot_estimate`'s
    on_demand: Price | None = None  # the on-demand price a spot estimate was made from


# A spot price when AWS's spot price history cannot be read (no credentials, no permission, no
# history): this fraction of the on-demand price, named as an estimate wherever it is shown. It is
# an assumption of this project, not AWS's figure: AWS advertises spot capacity at "up to 90%" off
# on-demand, and the real discount moves with the type, the zone and the time; half is a round,
# cautious value. With credentials `fab plan` reads the real price; `--hourly-usd` gives one.
SPOT_ESTIMATE_FRACTION = 0.5
SPOT_ESTIMATE_SOURCE = ("an assumed discount of this project, not a quote (AWS advertises spot at up to 90% off "
                        "on-demand)")


def spot_estimate(on_demand: Price) -> Price:
    """The stated spot estimate from an on-demand price."""
    return Price(on_demand.usd_per_hour * SPOT_ESTIMATE_FRACTION, "spot",
                 f"spot estimate: {SPOT_ESTIMATE_FRACTION:g} x the on-demand ${on_demand.usd_per_hour:.4f} "
                 f"({on_demand.source}); {SPOT_ESTIMATE_SOURCE}", on_demand.zone, estimate=True,
                 on_demand=on_demand)


def plan_rows(inputs: PlanInputs, price: Price) -> list[PlanRow]:
    """One row per node count: the prediction, and the cost of provisioning, the run and the idle tail."""
    if not inputs.rates and not inputs.networks and not inputs.compiled:
        rows = plan(inputs.workload, inputs.network, inputs.node_counts, inputs.samples_per_s, price.usd_per_hour,
                    ranks_per_node=inputs.ranks_per_node)
    else:
        rows = []
        for nodes in inputs.node_counts:
            pred = tm.predict(inputs.workload, inputs.network_for(nodes), nodes, inputs.rate(nodes),
                              ranks_per_node=inputs.ranks_per_node, single_node_samples_per_s=inputs.rate(1))
            if inputs.compiled and (inputs.compile == "on" or tm.compile_pays(
                    math.ceil(pred.steps * inputs.workload.epochs), inputs.compiled)[0]):
                pred = tm.predict(inputs.workload, inputs.network_for(nodes), nodes, inputs.rate(nodes),
                                  ranks_per_node=inputs.ranks_per_node, single_node_samples_per_s=inputs.rate(1),
                                  compiled=inputs.compiled)
            hourly = nodes * price.usd_per_hour
            rows.append(PlanRow(nodes, pred, hourly, hourly * pred.run_seconds / 3600))
    return [with_lifecycle(row, inputs, price) for row in rows]


def with_lifecycle(row: PlanRow, inputs: PlanInputs, price: Price) -> PlanRow:
    """The row with its provisioning and idle-tail terms, and what it was priced at."""
    up, other, worst, idle = inputs.first_up, inputs.other_up, inputs.worst_up, inputs.idle_tail_s
    return replace(row, instance_type=inputs.instance_type, market=price.market, price_source=price_source(price),
                   provisioning_seconds=up.seconds if up else 0.0,
                   master_provisioning_seconds=up.master_seconds if up else 0.0,
                   provisioning_usd=up.usd(row.nodes, price.usd_per_hour) if up else 0.0,
                   provisioning_from=(f"kept image {inputs.kept_image}" if inputs.kept_image else "bake") if up else "",
                   other_provisioning_seconds=other.seconds if other else None,
                   other_provisioning_usd=other.usd(row.nodes, price.usd_per_hour) if other else None,
                   worst_provisioning_seconds=worst.seconds if worst else None,
                   worst_provisioning_usd=worst.usd(row.nodes, price.usd_per_hour) if worst else None,
                   boot_budget_seconds=worst.worker_seconds if worst else None,
                   idle_tail_seconds=idle, idle_tail_usd=row.hourly_usd * idle / 3600 if idle else 0.0)


ON_DEMAND_MASTER = "on-demand master (recommended for --managed runs)"


def on_demand_master_extra_usd(row: PlanRow, spot_usd_per_hour: float, on_demand_usd_per_hour: float) -> float:
    """What the master alone on demand adds to the row's total: the difference of its two hourly prices
    over the master's hours in the plan (its part of the first `pulumi up`, from its launch: not the image's
    build, the run, the idle tail); the workers stay spot."""
    master_s = row.master_provisioning_seconds + row.prediction.run_seconds + (row.idle_tail_seconds or 0.0)
    return (on_demand_usd_per_hour - spot_usd_per_hour) * master_s / 3600


def with_on_demand_master(rows: list[PlanRow], price: Price, on_demand: Price | None, *, master_spot: bool = True,
                          unknown: str = "") -> tuple[list[PlanRow], str]:
    """The rows with `on_demand_master_usd` (None: not priced) and the line `fab plan` prints about it.

    `price` is the table's (every node); `on_demand` one instance-hour on demand (None: not known,
    `unknown` says why); `master_spot` is the stack's masterSpot (true without a stack)."""
    if price.market != "spot":
        return ([replace(r, on_demand_master_usd=0.0) for r in rows],
                f"{ON_DEMAND_MASTER}: master already on demand (this plan prices every node on demand)")
    already = "master already on demand (the stack's masterSpot false), which the spot prices above leave out"
    if on_demand is None:
        return rows, f"{ON_DEMAND_MASTER}: {already + '; ' if not master_spot else ''}not priced ({unknown})"
    extras = [on_demand_master_extra_usd(r, price.usd_per_hour, on_demand.usd_per_hour) for r in rows]
    figures = ", ".join(f"{'' if len(rows) == 1 else f'{r.nodes} node(s) '}{_signed_usd(extra)} "
                        f"(total ${r.total_usd + extra:.2f})" for r, extra in zip(rows, extras))
    rows = [replace(r, on_demand_master_usd=extra) for r, extra in zip(rows, extras)]
    source = "" if on_demand is price.on_demand else f" ({on_demand.source})"  # the estimate's: in its price line
    basis = (f"the master at ${on_demand.usd_per_hour:.4f}/hour on demand{source} instead of "
             f"${price.usd_per_hour:.4f} spot through provisioning, the run and the idle tail; the workers spot")
    return rows, f"{ON_DEMAND_MASTER}: {already + ': ' if not master_spot else ''}{figures}; {basis}"


def types_range_line(priced: Mapping[str, tuple[Price, list[PlanRow]]]) -> str:
    """instanceTypes: each listed type's price (the first is the table's) and, per node count, the total from the
    cheapest type's to the dearest's: the workers' group launches any of them."""
    first = next(iter(priced))
    per_type = ", ".join(f"{t} ${p.usd_per_hour:.4f}" for t, (p, _) in priced.items())
    counts = [r.nodes for r in priced[first][1]]
    ranges = []
    for i, nodes in enumerate(counts):
        totals = [rows[i].total_usd for _, rows in priced.values()]
        ranges.append(f"{'' if len(counts) == 1 else f'{nodes} node(s) '}${min(totals):.2f} to ${max(totals):.2f}")
    return (f"instanceTypes: the workers may be any of {per_type} per instance-hour (the table prices {first}, the "
            f"master's type); with every node at one listed type's price the total is {', '.join(ranges)}")


def on_demand_workers_extra_usd(row: PlanRow, spot_usd_per_hour: float, on_demand_usd_per_hour: float) -> float:
    """What the workers on demand add to the row's total: the price difference over each worker's hours (the
    run and the idle tail; its boot in provisioning is left out, as the fallback starts after a wait)."""
    workers = row.nodes - 1
    return (on_demand_usd_per_hour - spot_usd_per_hour) * workers * (
        row.prediction.run_seconds + (row.idle_tail_seconds or 0.0)) / 3600


def fallback_line(rows: list[PlanRow], price: Price, on_demand: Price) -> str:
    """onDemandFallback: what the table's totals become if every worker ends up on demand."""
    extras = [on_demand_workers_extra_usd(r, price.usd_per_hour, on_demand.usd_per_hour) for r in rows]
    figures = ", ".join(f"{'' if len(rows) == 1 else f'{r.nodes} node(s) '}{_signed_usd(extra)} "
                        f"(total ${r.total_usd + extra:.2f})" for r, extra in zip(rows, extras))
    return (f"onDemandFallback: if every worker runs on demand (${on_demand.usd_per_hour:.4f}/hour instead of "
            f"${price.usd_per_hour:.4f} spot, through the run and the idle tail): {figures}")


def _signed_usd(usd: float) -> str:
    return f"{'-' if usd < 0 else '+'}${abs(usd):.2f}"


def price_source(price: Price) -> str:
    return f"{price.market} ${price.usd_per_hour:.4f}/instance-hour, {price.source}"


@dataclass(frozen=True)
class PlanRow:
    nodes: int
    prediction: tm.Prediction
    hourly_usd: float  # the whole cluster
    run_usd: float  # the run: start-up plus every epoch
    provisioning_seconds: float = 0.0  # the first `pulumi up` (wall time; 0: not counted)
    provisioning_usd: float = 0.0  # the master from its launch, each worker its boot, the image's build instance
    master_provisioning_seconds: float = 0.0  # the master's part of it (from its launch)
    provisioning_from: str = ""  # "bake", or "kept image <id>" ("": not counted)
    other_provisioning_seconds: float | None = None  # the first `pulumi up` the other way (None: not counted)
    other_provisioning_usd: float | None = None
    worst_provisioning_seconds: float | None = None  # every boot its whole wait budget (None: not counted)
    worst_provisioning_usd: float | None = None
    boot_budget_seconds: float | None = None  # a node's boot wait budget (the worst case's boot)
    idle_tail_seconds: float | None = 0.0  # after the run until the idle auto-stop (None: auto-stop off)
    idle_tail_usd: float = 0.0
    instance_type: str = ""
    market: str = ""
    price_source: str = ""
    on_demand_master_usd: float | None = None  # what the master alone on demand adds (None: not priced)

    @property
    def total_usd(self) -> float:
        """The whole cost: provisioning, the run and the idle tail."""
        return self.provisioning_usd + self.run_usd + self.idle_tail_usd

    @property
    def total_seconds(self) -> float:
        """Wall time from `pulumi up` to the auto-stop (without an idle tail when auto-stop is off)."""
        return self.provisioning_seconds + self.prediction.run_seconds + (self.idle_tail_seconds or 0.0)

    def as_json(self) -> dict:
        idle, extra = self.idle_tail_seconds, self.on_demand_master_usd
        return {"nodes": self.nodes, "instance_type": self.instance_type, "market": self.market,
                "price_source": self.price_source, "epoch_seconds": round(self.prediction.epoch_seconds, 1),
                "step_seconds": round(self.prediction.step_seconds, 4),
                "comm_seconds_per_step": round(self.prediction.comm_s / self.prediction.steps, 4),
                "efficiency": round(self.prediction.efficiency, 4), "hourly_usd": round(self.hourly_usd, 4),
                "provisioning_seconds": round(self.provisioning_seconds, 1),
                "provisioning_usd": round(self.provisioning_usd, 4), "provisioning_from": self.provisioning_from,
                "other_provisioning_seconds": _rounded(self.other_provisioning_seconds, 1),
                "other_provisioning_usd": _rounded(self.other_provisioning_usd, 4),
                "worst_provisioning_seconds": _rounded(self.worst_provisioning_seconds, 1),
                "worst_provisioning_usd": _rounded(self.worst_provisioning_usd, 4),
                "run_seconds": round(self.prediction.run_seconds, 1), "run_usd": round(self.run_usd, 4),
                "idle_tail_seconds": None if idle is None else round(idle, 1),
                "idle_tail_usd": round(self.idle_tail_usd, 4), "total_usd": round(self.total_usd, 4),
                "compile_seconds": round(self.prediction.compile_s, 1),
                "on_demand_master_extra_usd": None if extra is None else round(extra, 4),
                "on_demand_master_total_usd": None if extra is None else round(self.total_usd + extra, 4)}


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


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


def render_table(rows: list[PlanRow], *, header: str = "", price_source: str = "", notes: Sequence[str] = ()) -> str:
    lines = [header] if header else []
    lines.append(f"{'nodes':>5}  {'epoch time':>11}  {'run time':>11}  {'efficiency':>10}  {'$/hour':>8}  "
                 f"{'provision $':>11}  {'run $':>8}  {'idle $':>8}  {'total $':>8}  {'step s':>7}  {'comm s':>7}")
    for row in rows:
        p = row.prediction
        idle = "-" if row.idle_tail_seconds is None else f"{row.idle_tail_usd:.2f}"
        lines.append(f"{row.nodes:>5}  {format_duration(p.epoch_seconds):>11}  "
                     f"{format_duration(p.run_seconds):>11}  "
                     f"{p.efficiency:>10.0%}  {row.hourly_usd:>8.2f}  {row.provisioning_usd:>11.2f}  "
                     f"{row.run_usd:>8.2f}  {idle:>8}  {row.total_usd:>8.2f}"
                     f"  {p.step_seconds:>7.3f}  {p.comm_s / p.steps:>7.3f}")
    if rows:
        lines.append(lifecycle_line(rows))
    if any(row.prediction.compile_s for row in rows):
        lines.append(compile_line(rows))
    if price_source:
        lines.append(f"price: {price_source}")
    lines.extend(notes)
    cheap, fast = cheapest(rows), fastest(rows)
    lines.append(f"cheapest: {cheap.nodes} node(s), ${cheap.total_usd:.2f} in "
                 f"{format_duration(cheap.prediction.run_seconds)}")
    lines.append(f"fastest:  {fast.nodes} node(s), {format_duration(fast.prediction.run_seconds)} "
                 f"for ${fast.total_usd:.2f}")
    return "\n".join(lines)


BUILT = "with the image built apart"


def lifecycle_line(rows: Sequence[PlanRow]) -> str:
    """What the provisioning and idle-tail columns count, in words, with the provisioning the other way (from a
    kept image, or with a bake) and what it would cost."""
    row = rows[0]
    how = "from " + row.provisioning_from if row.provisioning_from != "bake" else BUILT
    up = (f"provision $: the first `pulumi up` {how}, {format_duration(row.provisioning_seconds)} (every node "
          "from its launch; the image's build on its own small instance)" if row.provisioning_seconds else
          "provision $: not counted")
    if row.other_provisioning_seconds is not None:
        other = (BUILT if row.provisioning_from != "bake" else
                 "from a kept image (keepImage: true keeps a stack's image for the next one)")
        figures = ", ".join(f"{r.nodes} node(s) ${r.other_provisioning_usd:.2f}" for r in rows)
        up += f"; {other}: {format_duration(row.other_provisioning_seconds)}, {figures}"
    if row.worst_provisioning_seconds is not None and row.boot_budget_seconds is not None:
        figures = ", ".join(f"{'' if len(rows) == 1 else f'{r.nodes} node(s) '}${r.worst_provisioning_usd:.2f}"
                            for r in rows)
        up += (f"; at most {figures} ({format_duration(row.worst_provisioning_seconds)}) if every boot takes its "
               f"wait budget (a node's {format_duration(row.boot_budget_seconds)})")
    idle = ("idle $: auto-stop off, not counted (the nodes bill until `pulumi destroy`)"
            if row.idle_tail_seconds is None else
            f"idle $: {format_duration(row.idle_tail_seconds)} idle after the run until the auto-stop")
    return f"{up}; run $: start-up and every epoch; {idle}"


def compile_line(rows: list[PlanRow]) -> str:
    """Which rows train compiled, and what that adds to their start-up."""
    compiled = [row for row in rows if row.prediction.compile_s]
    eager = [row.nodes for row in rows if not row.prediction.compile_s]
    return (f"compiled: {', '.join(str(r.nodes) for r in compiled)} node(s): run time includes "
            f"{compiled[0].prediction.compile_s:.0f} s of compile in the start-up, step s is the compiled step"
            + (f"; eager: {', '.join(map(str, eager))} node(s) (too few steps for the compile to pay)"
               if eager else ""))

