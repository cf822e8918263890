"""`fab train`: the options (or with --managed --resume the run's signed spec) become one run request, planned
(--dry-run prints it) and run by node_setup/tasks/job_run.py; the exit code is the job's or common.py's."""

from __future__ import annotations

from invoke import Exit

from cluster.job import jobreport
from cluster.job.jobplan import new_job_id, plan
from cluster.job.train_options import CLUSTER, OUTPUT, Cli, JobOptions
from node_setup.tasks import common, job_options, job_run
from node_setup.tasks import managed as managed_run
from node_setup.tasks.common import CLUSTER_HELP, REGION_HELP, fail


@job_options.job_task(job_options.TRAIN, own={
    "cluster": ("", Cli(CLUSTER, CLUSTER_HELP, path="maybe")),
    "region": ("", Cli(CLUSTER, REGION_HELP)),
    "dry_run": (False, Cli(CLUSTER, "print nodes, layout, full command and environment (and for --script: "
                           "the copy and install plans); connect to nothing")),
    "all_ranks": (False, Cli(OUTPUT, "the log shows the metrics every rank prints, not rank 0's only (as "
                             "`fab logs --all-ranks`)")),
    "file": ("", Cli(CLUSTER, "a YAML job file holding any of these options (`nodes: 4`, `batch-size: 16`, "
                     "`script: train.py`); options on the command line win; paths in it are relative to its "
                     "folder")),
})
def train(c, options: JobOptions, cluster: str, region: str, dry_run: bool, all_ranks: bool,
          file: str):  # noqa: A002 - the job file, applied by node_setup/tasks/executor.py
    """Launch distributed training (mpirun, or torchrun per node) on N nodes and stream its output."""
    inventory = common.inventory(cluster, region)
    lines: list[str] = []
    try:
        if options.resume and options.managed:  # a supervised run continued from the spec beside its checkpoints
            request = managed_run.resumed_request(inventory, options, run_id=new_job_id())
        else:
            request, lines = job_options.train_request(options, inventory, run_id=new_job_id())
        job = plan(request, inventory)
    except ValueError as exc:  # cluster/'s refusals (RequestError, the plan's LayoutError ...): one line each
        raise fail(str(exc)) from None
    warning = jobreport.spot_warning(job.inventory, request.checkpoint_uri)
    print("\n".join(line for line in (warning, *lines) if line))
    if dry_run:
        print(job.describe())
        for data in request.data_files:
            print(f"would copy {data.local} to ~/{data.node} on every node")
        if request.resume and request.output_dir is None:
            print("note: --resume continues in the newest job's output directory (read from the master at launch)")
        print("\ndry run: nothing was started")
        return
    raise Exit(code=job_run.run(request, inventory, job, all_ranks=all_ranks))


TASKS = [train]
