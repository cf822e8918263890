"""`fab bench`: measure the cluster (all-reduce and compute) and keep a calibration for `fab plan`.

Plan (cluster/benchplan.py, pure), launch `python -m training.bench` on one rank per node the way
`fab train` launches the job (node_setup/ssh/job.py), read its figures back from the master, print
them and write `<config dir>/calibration/<cluster>.json` (cluster/calibration.py).
"""

from __future__ import annotations

import json

from cluster import benchplan
from cluster import calibration as calib
from cluster.inventory import InventoryError
from cluster.launch import LaunchError
from cluster.layout import LayoutError
from node_setup.controller import config_root
from node_setup.ssh import job as jobs
from node_setup.ssh.fanout import outcome_table
from node_setup.tasks import common
from node_setup.tasks.common import CLUSTER_HELP, FAILED, REGION_HELP, UNREACHABLE, fail, task


def _local_link(inventory) -> str:
    """The local cluster's recorded link limit, as text ("" elsewhere or when not limited)."""
    if inventory.kind != "local":
        return ""
    from node_setup.local import state as local_state

    try:
        state = local_state.load_state(local_state.paths_for(inventory.name))
    except local_state.LocalClusterError:
        return ""
    if state is None or not state.link_mbit:
        return ""
    return local_state.describe_link(state.link_mbit, state.link_delay_ms)


@task(help={
    "nodes": "measure across 2..N nodes, master first (default: every node)",
    "cluster": CLUSTER_HELP,
    "region": REGION_HELP,
    "model": f"{benchplan.SYNTHETIC_MODEL} (default: the offline demo's tiny model, built on the nodes) or the "
             "absolute path of a model directory on the nodes; nothing is downloaded",
    "batch": f"batch per rank for the compute steps (default {benchplan.DEFAULT_BATCH})",
    "seq_len": f"tokens per sample (default {benchplan.SYNTHETIC_SEQ_LEN})",
    "steps": f"timed training steps per node count (default {benchplan.DEFAULT_STEPS})",
    "repeats": f"timed all-reduces per size and dtype, the median kept (default {benchplan.DEFAULT_REPEATS})",
    "ddp_bucket_mb": "DDP's gradient bucket size in MB the gradient is cut into (default 25)",
    "output": "write the calibration here instead of <config dir>/calibration/<cluster>.json",
    "dry_run": "print the launch; connect to nothing",
})
def bench(c, nodes=0, cluster="", region="", model=benchplan.SYNTHETIC_MODEL, batch=benchplan.DEFAULT_BATCH,
          seq_len=benchplan.SYNTHETIC_SEQ_LEN, steps=benchplan.DEFAULT_STEPS, repeats=benchplan.DEFAULT_REPEATS,
          ddp_bucket_mb=25.0, output="", dry_run=False):
    """Measure all-reduce bandwidth and latency, and compute speed, and keep them for `fab plan`."""
    options = benchplan.BenchOptions(nodes=nodes, model=model, batch=batch, seq_len=seq_len, steps=steps,
                                     repeats=repeats, bucket_mb=ddp_bucket_mb)
    try:
        benchplan.check_options(options)
    except ValueError as exc:
        raise fail(str(exc)) from None
    inventory = common.inventory(cluster, region)
    try:
        target = output or str(calib.path_for(config_root(), inventory.name))
        plan = benchplan.plan_bench(inventory, options)
    except (InventoryError, LayoutError, LaunchError, ValueError) as exc:
        raise fail(str(exc)) from None
    if dry_run:
        print(plan.describe())
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
        cal = benchplan.calibration_from(json.loads(text), plan.inventory, link=_local_link(inventory))
    except (ValueError, calib.CalibrationError) as exc:
        raise fail(f"bench {plan.job_id}: unusable figures ({exc})", FAILED) from None
    from pathlib import Path

    path = Path(target).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(cal.to_json())
    print()
    print(benchplan.render_table(cal))
    print(f"calibration: {path} (`fab plan --cluster {cluster or inventory.name}` uses it)")


TASKS = [bench]
