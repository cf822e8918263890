"""`fab bench`: measure the cluster (all-reduce and compute) and keep a calibration for `fab plan`.

Plan (cluster/cost/benchplan.py, pure), launch `python -m training.bench` on one rank per node the way
`fab train` launches the job (node_setup/ssh/job.py), read its figures back from the master, print
them and write `<config dir>/calibration/<cluster>.json` (cluster/cost/calibration.py). `--compile` adds the
job's step eager and compiled and the compile time; `--layouts` then runs the real job once per
candidate layout (cluster/cost/benchplan.py's plan_layout_runs) and keeps each one's step and the fastest.
"""

from __future__ import annotations

import io
import json
from dataclasses import replace

from cluster.cost import benchplan
from cluster.cost import calibration as calib
from cluster.inventory import InventoryError
from cluster.job.launch import LaunchError
from cluster.job.layout import LayoutError
from node_setup.backends import backend_for
from node_setup.controller import config_root
from node_setup.ssh import job as jobs
from node_setup.ssh.fanout import outcome_table
from node_setup.tasks import common
from node_setup.tasks.common import CLUSTER_HELP, FAILED, REGION_HELP, UNREACHABLE, Unset, fail, task


@task(help={
    "nodes": "measure across 2..N nodes, master first (default: every node)",
    "cluster": CLUSTER_HELP,
    "region": REGION_HELP,
    "model": f"{benchplan.SYNTHETIC_MODEL} (default: the offline demo's tiny model, built on the nodes) or the "
             "absolute path of a model directory on the nodes; nothing is downloaded",
    "batch_size": f"batch size per rank for the compute steps (default {benchplan.DEFAULT_BATCH})",
    "seq_len": f"tokens per sample (default {benchplan.SYNTHETIC_SEQ_LEN})",
    "steps": f"timed training steps per node count (default {benchplan.DEFAULT_STEPS})",
    "repeats": f"timed all-reduces per size and dtype, the median kept (default {benchplan.DEFAULT_REPEATS})",
    "ddp_bucket_mb": "DDP's gradient bucket size in MB the gradient is cut into (default 25)",
    "output": "write the calibration here instead of <config dir>/calibration/<cluster>.json",
    "dry_run": "print the launch; connect to nothing",
    "compile": "also time the job eager and compiled on one node, and the compile (about a minute on a small "
               "machine); `fab train --compile auto` and `fab plan` use the figures",
    "layouts": "also run the job for a few steps in each layout the node allows (1 rank per node, one per socket, "
               "2 and 4 per socket) and keep the fastest, which `fab train` and `fab plan` then use "
               "(--nodes 1 allowed)",
})
def bench(c, nodes=Unset(int, "every node"), cluster="", region="", model=benchplan.SYNTHETIC_MODEL,
          batch_size=benchplan.DEFAULT_BATCH,
          seq_len=benchplan.SYNTHETIC_SEQ_LEN, steps=benchplan.DEFAULT_STEPS, repeats=benchplan.DEFAULT_REPEATS,
          ddp_bucket_mb=25.0, output="", dry_run=False, compile=False, layouts=False):  # noqa: A002
    """Measure all-reduce bandwidth and latency, and compute speed, and keep them for `fab plan`."""
    options = benchplan.BenchOptions(nodes=nodes or 0, model=model, batch=batch_size, seq_len=seq_len, steps=steps,
                                     repeats=repeats, bucket_mb=ddp_bucket_mb, compile=compile, layouts=layouts)
    try:
        benchplan.check_options(options)
    except ValueError as exc:
        raise fail(str(exc)) from None
    inventory = common.inventory(cluster, region)
    try:
        target = output or str(calib.path_for(config_root(), inventory.name))
        plan = benchplan.plan_bench(inventory, options)
        machine, layout_runs = benchplan.plan_layout_runs(inventory, options) if layouts else ("", [])
    except (InventoryError, LayoutError, LaunchError, ValueError) as exc:
        raise fail(str(exc)) from None
    if dry_run:
        print(plan.describe())
        if layout_runs:
            print(f"\nthen the job in each layout of {machine}: "
                  + ", ".join(f"{p.layout.ranks_per_node} rank(s) per node" for p in layout_runs))
        print(f"\ncalibration would be written to {target}")
        print("dry run: nothing was started")
        return
    conns = common.connect(plan.inventory)
    master = conns[plan.inventory.master.name]
    outcomes = jobs.prepare_nodes(conns, plan)
    if not all(o.ok for o in outcomes):
        print(outcome_table(outcomes))
        raise fail("cannot bench: a node is not ready (reason above)", UNREACHABLE)
    from node_setup.ssh.distribute import DistributionError, distribute

    try:
        distribute(plan.inventory, conns=conns)
    except DistributionError as exc:
        print(exc.result.table())
        raise fail(f"cannot bench: {exc}", UNREACHABLE) from None
    jobs.start(master, plan)
    print(f"bench {plan.job_id}: {len(plan.launch.hosts)} node(s), one rank each, on {', '.join(plan.launch.hosts)}",
          flush=True)
    jobs.follow(master, plan.job_id, list(plan.launch.rank_hosts))
    state, detail = jobs.job_state(master, plan.job_id)
    text = jobs.read_remote_file(master, f"{plan.output_dir}/bench.json")
    if state != "exited" or detail.strip() != "0" or text is None:
        raise fail(f"bench {plan.job_id} failed ({state} {detail}); its log: `fab logs --job {plan.job_id}`", FAILED)
    try:
        backend = backend_for(inventory.kind)
        cal = benchplan.calibration_from(json.loads(text), plan.inventory, link=backend.link_limit(inventory),
                                         measured_type=backend.measured_type(inventory))
    except (ValueError, calib.CalibrationError) as exc:
        raise fail(f"bench {plan.job_id}: unusable figures ({exc})", FAILED) from None
    if layout_runs:
        cal = replace(cal, layout=_measure_layouts(conns, master, machine, layout_runs, options.batch, cal.created))
    from pathlib import Path

    path = Path(target).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(cal.to_json())
    print()
    print(benchplan.render_table(cal))
    print(f"calibration: {path} (`fab plan --cluster {cluster or inventory.name}` uses it)")


def _measure_layouts(conns, master, machine: str, runs, batch: int, created: str) -> calib.LayoutChoice:
    """Each layout run of the real job, one after another; its mean step from its summary.json."""
    steps = []
    for plan in runs:
        ranks = plan.layout.ranks_per_node
        outcomes = jobs.prepare_nodes(conns, plan)
        if not all(o.ok for o in outcomes):
            print(outcome_table(outcomes))
            raise fail("cannot time the layouts: a node is not ready (reason above)", UNREACHABLE)
        jobs.start(master, plan)
        print(f"layout {ranks} rank(s) per node: job {plan.job_id} ...", flush=True)
        log = io.StringIO()
        jobs.follow(master, plan.job_id, list(plan.launch.rank_hosts), out=log, launcher=plan.launch.launcher)
        state, detail = jobs.job_state(master, plan.job_id)
        text = jobs.read_remote_file(master, f"{plan.output_dir}/summary.json")
        try:
            step = float(json.loads(text)["step_time_seconds"]["mean"]) if text else 0.0
        except (ValueError, KeyError, TypeError):
            step = 0.0
        if state != "exited" or detail.strip() != "0" or not step > 0:
            print("\n".join(log.getvalue().splitlines()[-20:]))
            raise fail(f"layout {ranks} rank(s) per node: job {plan.job_id} failed ({state} {detail}); its log: "
                       f"`fab logs --job {plan.job_id}`", FAILED)
        print(f"  {step * 1e3:.1f} ms per step, {ranks * batch / step:.1f} samples/s per node", flush=True)
        steps.append(step)
    return benchplan.layout_choice(machine, runs, steps, batch, created)


TASKS = [bench]
