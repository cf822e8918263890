"""`fab jobs --costs`: what each job cost and each supervised run with its recoveries (pure).

A job's cost is what `fab train` recorded at its end (its summary's cost record: cluster/cost/spend.py's
RunCost), else an estimate: its nodes x its duration x the cluster's price per node-hour now (a
supervised run's jobs, started by its supervisor, record none). A supervised run (`fab train --managed`)
costs its jobs together, one per recovery; the time between them (waiting for a replacement node) is
the cluster's, in `fab status`'s spend so far.
"""

from __future__ import annotations

from collections.abc import Sequence

from cluster.cost.spend import usd
from cluster.job.joblist import JobRow
from cluster.names import printable

RECORDED, ESTIMATED = "recorded", "estimated"


def job_cost(row: JobRow, usd_per_node_hour: float | None) -> tuple[float | None, str]:
    """(its cost, RECORDED or ESTIMATED), or (None, "") when neither is known."""
    if row.cost_usd is not None:
        return row.cost_usd, RECORDED
    if usd_per_node_hour is not None and row.duration_s is not None and row.nodes:
        return row.nodes * row.duration_s / 3600 * usd_per_node_hour, ESTIMATED
    return None, ""


def cost_table(rows: Sequence[JobRow], usd_per_node_hour: float | None, cluster: str) -> str:
    """Each job's cost, then each supervised run's total over its jobs (its recoveries), then all jobs'."""
    if not rows:
        return f"no job on cluster {printable(cluster)} yet (fab train starts one)"
    lines = [f"cost of the jobs on cluster {printable(cluster)}, newest first:",
             f"  {'job':<20} {'name':<16} {'state':<12} {'nodes':>5} {'duration':>9} {'cost':>10}  how"]
    runs: dict[str, list[float | None]] = {}
    total, unknown = 0.0, 0
    for r in rows:
        cost, how = job_cost(r, usd_per_node_hour)
        if r.run:
            runs.setdefault(r.run, []).append(cost)
        total += cost or 0.0
        unknown += cost is None
        shown = "-" if cost is None else usd(cost, 4)
        duration = "-" if r.duration_s is None else f"{r.duration_s}s"
        lines.append(f"  {r.id:<20} {printable(r.name or '-'):<16} {r.state:<12} {r.nodes if r.nodes else '-':>5} "
                     f"{duration:>9} {shown:>10}  {how}".rstrip())
    for run, costs in runs.items():
        known = [c for c in costs if c is not None]
        lines.append(f"supervised run {printable(run)}: {len(costs)} job(s), {len(costs) - 1} recovery(ies), "
                     f"{usd(sum(known), 4)}" + (f" ({len(costs) - len(known)} job(s) of unknown cost)"
                                                 if len(known) < len(costs) else ""))
    price = "no price known" if usd_per_node_hour is None else f"{usd(usd_per_node_hour, 4)} per node-hour now"
    lines.append(f"all jobs: {usd(total, 4)}" + (f" ({unknown} of unknown cost)" if unknown else "")
                 + f"; estimates at the cluster's {price}")
    return "\n".join(lines)
