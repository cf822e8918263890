"""Spend in sight: the prices and plan behind `fab status`'s spend columns and `fab train`'s
planned and actual cost lines (the arithmetic is cluster/cost/spend.py's).

    cluster_spend(inventory)        every node's uptime, market, hourly price and spend so far
    status_json(...)                `fab status --json`
    RunCostClock.at_launch(plan)    prints the planned time and cost of a `fab train` run
    cost.at_end(master, plan, code) prints the actual ones and records both in summary.json

Prices are the cluster's backend's (node_setup/backends/): AWS's from node_setup/aws/pricing.py
(imported only for an AWS cluster, so a local cluster never loads boto3); the local cluster costs
nothing; an inventory file's machines have no price.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from cluster.stack import catalog
from cluster.cost import costplan, models, plan_options
from cluster.cost import spend
from cluster.cost.costplan import Price
from cluster.cost.plan_options import PlanOptions
from cluster.inventory import Inventory
from cluster.job.jobplan import JobPlan
from node_setup.tasks.common import CTRL_C

clock: Callable[[], float] = time.time  # what "now" is for the spend so far


def cluster_spend(inventory: Inventory, *, now: float | None = None, book=None) -> spend.ClusterSpend:
    """Every node's spend so far; `book` answers `price(instance_type, spot=, zone=)` (default: AWS's prices)."""
    from node_setup.backends import backend_for

    now = clock() if now is None else now
    backend = backend_for(inventory.kind)
    book = backend.price_book(inventory) if book is None else book
    rows = []
    for node in inventory.nodes:
        usd, source = backend.node_price(book, node, node.instance_type or inventory.instance_type)
        rows.append(spend.node_spend(node.name, backend.market(node), node.launched_at, now, usd, source))
    return spend.ClusterSpend(tuple(rows))


def status_json(inventory: Inventory, spent: spend.ClusterSpend, nodes: list[dict[str, Any]],
                job: dict[str, Any] | None, problems: list[str]) -> str:
    """`fab status --json`: the cluster, every node (its status row and spend), the total, the job."""
    rows = [{**row, **(node.as_json() if (node := spent.node(row["name"])) else {})} for row in nodes]
    return json.dumps({"cluster": inventory.name, "kind": inventory.kind, "profile": inventory.profile,
                       "nodes": rows, "total": spent.total_json(), "job": job, "problems": problems}, indent=2)


# ---------------------------------------------------------------- fab train: planned and actual


def plan_seconds(plan: JobPlan, calibration_for: Callable[[str], Any] | None = None) -> tuple[float | None, str]:
    """(the planner's run time of this job, "") or (None, why it cannot be planned), from the typed settings of
    its run request (cluster/job/request.py)."""
    inventory = plan.inventory
    job = plan.request.builtin if plan.request is not None else None
    if job is None:
        return None, "the planner knows the built-in job only, not your own --script/--module"
    itype = inventory.instance_type or inventory.master.instance_type or ""
    if not catalog.lookup(itype):
        if itype:
            return None, f"instance type {itype!r} is not in the planner's catalog"
        return None, f"the machines of cluster {inventory.name!r} have no instance type from the planner's catalog"
    if job.demo is not None:
        return None, "the planner does not know the offline demo's size"
    if job.train_file:
        return None, "the planner does not know the size of your own --train-file"
    defaults = PlanOptions()
    task = job.task or "qa"
    dataset = job.dataset or (plan_options.DEFAULT_DATASET if task == "qa" else "")
    if not dataset:
        return None, f"the planner needs --dataset for the {task} task"
    config = job.dataset_config
    model = job.model or plan_options.DEFAULT_MODEL
    for name, known, lookup in ((model, models.MODELS, models.lookup_model),
                                (f"{dataset}-{config}" if config else dataset, models.DATASETS, models.lookup_dataset)):
        try:
            lookup(name)
        except ValueError:
            return None, f"{name!r} has no known size (the planner knows {', '.join(sorted(known))})"
    epochs = job.epochs or defaults.epochs
    try:
        options = replace(defaults, nodes=str(len(inventory.nodes)), instance_type=itype, model=model,
                          dataset=f"{dataset}-{config}" if config else dataset, epochs=epochs,
                          batch=job.batch_size or defaults.batch, profile=inventory.profile,
                          ranks_per_node=plan.layout.ranks_per_node, grad_comm=job.grad_comm or "",
                          bucket_mb=job.ddp_bucket_mb or 0.0)
        calibration = calibration_for(inventory.name) if calibration_for else _calibration(inventory.name)
        inputs = plan_options.plan_inputs(None, options, calibration)
        row = costplan.plan_rows(inputs, Price(0.0, spend.SPOT, "not used"))[0]
    except (ValueError, LookupError) as exc:
        return None, str(exc)
    return spend.planned_seconds(row.prediction, epochs, job.max_steps), ""


def _calibration(cluster: str):
    from node_setup.tasks.costs import load_calibration

    return load_calibration("", cluster)[0]


@dataclass
class RunCostClock:
    """One run's cost: the plan and the price at launch, the clock from the launch to the end."""

    cost: spend.RunCost
    started: float
    clock: Callable[[], float] = time.time

    @classmethod
    def at_launch(cls, plan: JobPlan, *, book=None, clock: Callable[[], float] = time.time) -> "RunCostClock":
        """Start the clock (the job has just started) and print the planned time and cost."""
        started = clock()
        usd, source = spend.run_price(cluster_spend(plan.inventory, book=book))
        seconds, why = plan_seconds(plan)
        cost = spend.RunCost(len(plan.inventory.nodes), usd, source, seconds, why)
        print(cost.planned_line(), flush=True)
        return cls(cost, started, clock)

    def at_end(self, master, plan: JobPlan, code: int) -> spend.RunCost | None:
        """Print the actual time and cost and add both to the run's summary.json (when the job wrote one).
        Nothing when the job goes on (detached with Ctrl-C, or the log stream was lost)."""
        from node_setup.ssh import job as jobs

        ended = self.clock()
        try:
            if code == CTRL_C or jobs.job_state(master, plan.job_id)[0] == "running":
                return None
        except Exception as exc:  # noqa: BLE001 - e.g. a reclaimed master: the job's own outcome is printed
            print(f"cost: the master cannot say whether job {plan.job_id} has ended ({type(exc).__name__}: {exc})")
            return None
        self.cost = replace(self.cost, actual_s=ended - self.started)
        print(self.cost.actual_line())
        if not plan.user:  # the built-in job writes summary.json; a user's program has its own outputs
            record_cost(master, f"{plan.output_dir}/summary.json", self.cost)
        else:
            record_run(master, plan, code, self.cost)
        return self.cost


def record_run(master, plan: JobPlan, code: int, cost: spend.RunCost) -> str | None:
    """Write the toolkit's summary of a user program's run into the job's directory on the master
    (cluster/cost/spend.py run_record); its path, or None (said in one line) when it could not be written."""
    from cluster.job.launch import job_dir
    from node_setup.ssh import job as jobs

    path = f"{job_dir(plan.job_id)}/{spend.RUN_RECORD_NAME}"
    record = spend.run_record(plan.job_id, code, list(plan.launch.hosts), plan.launch.world_size, cost)
    try:
        jobs.write_remote_json(master, path, record)
    except Exception as exc:  # noqa: BLE001 - the run is over; say the record is missing, do not fail it
        print(f"summary: not recorded in ~/{path} ({type(exc).__name__}: {exc})")
        return None
    print(f"summary: ~/{path} on {plan.inventory.master.name}")
    return path


def record_cost(master, path: str, cost: spend.RunCost) -> bool:
    """Add the cost record to the summary.json at `path` on the master; False when there is none to add to."""
    from node_setup.ssh import job as jobs

    try:
        summary = jobs.read_remote_summary(master, path)
        if summary is None:
            return False
        summary[spend.COST_KEY] = cost.record()
        jobs.write_remote_json(master, path, summary)
    except Exception as exc:  # noqa: BLE001 - the run is over; say the record is missing, do not fail it
        print(f"cost: not recorded in {path} ({type(exc).__name__}: {exc})")
        return False
    return True
