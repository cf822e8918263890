"""Draw `fab plan`'s predicted run time and cost against node count (matplotlib, no display)."""

from __future__ import annotations

import textwrap

from cluster.cost.costplan import PlanRow


def plot_plan(rows: list[PlanRow], path: str, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nodes = [r.nodes for r in rows]
    fig, time_ax = plt.subplots(figsize=(7, 4.2))
    time_ax.plot(nodes, [r.prediction.run_seconds / 60 for r in rows], "o-", color="tab:blue", label="run time")
    time_ax.set_xlabel("nodes")
    time_ax.set_ylabel("predicted run time (min)", color="tab:blue")
    time_ax.set_xticks(nodes)
    cost_ax = time_ax.twinx()
    cost_ax.plot(nodes, [r.total_usd for r in rows], "s--", color="tab:red", label="total cost")
    cost_ax.set_ylabel("total cost (USD)", color="tab:red")
    time_ax.set_title(textwrap.fill(title, 95), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
