"""`fab train`: the options become one run request (or, with --managed --resume, the request of the run's
signed spec), the plan is made from it (--dry-run prints it) and node_setup/tasks/job_run.py runs it.
The exit code is the job's (cluster/exit_codes.py) or common.py's: 2 bad input, 3 unreachable, 130 Ctrl-C;
4 (worldcheck.TRAINED_ALONE) when a multi-rank program's ranks never joined one process group.
"""

from __future__ import annotations

from invoke import Exit

from cluster.inventory import InventoryError
from cluster.job import jobreport, worldcheck
from cluster.job.job_args import JobArgsError
from cluster.job.jobplan import new_job_id, plan
from cluster.job.launch import DEFAULT_LAUNCHER, LAUNCHERS, LaunchError
from cluster.job.layout import LayoutError
from cluster.job.request import RequestError
from cluster.job.userjob import (DEFAULT_NOTICE_SIGNAL, DEFAULT_WORKDIR_LIMIT_MB, NO_SIGNAL, NOTICE_SIGNALS,
                                 UserJobError)
from cluster.run.supervision import SupervisionError
from node_setup.tasks import common, job_options, job_run
from node_setup.tasks import managed as managed_run
from node_setup.tasks.common import CLUSTER_HELP, REGION_HELP, Unset, duration_or_off, fail, task
from node_setup.tasks.job_options import DEFAULTS as D

REFUSED = (RequestError, UserJobError, SupervisionError, InventoryError, LayoutError, LaunchError, JobArgsError,
           ValueError)


@task(help={
    **job_options.HELP,
    **job_options.TRAIN_HELP,
    "nodes": "how many nodes to use, master first (1 to the nodes available; left out: all)",
    "cluster": CLUSTER_HELP,
    "region": REGION_HELP,
    "model": "model id or a directory on the nodes (--model_name_or_path)",
    "train-file": "training data (.json/.jsonl): a file on this machine is copied to every node, "
                  "else the path on the nodes",
    "validation-file": "evaluation data, like --train-file",
    "checkpoint-uri": "s3://bucket/prefix every checkpoint is uploaded to (and --resume reads)",
    "output-dir": "output directory on the nodes, relative to the home directory (default "
                  "xeon-cluster-runs/<job id>; local cluster: /var/tmp/xeon-cluster-runs/<cluster>/<job id>, "
                  "which its nodes share; with --resume: the newest job's)",
    "resume": "continue from the newest complete checkpoint (after a spot reclaim); with --managed: the run of the "
              "spec beside --checkpoint-uri (or in --output-dir), checked against this controller's signature",
    "pin": "pin ranks to their cores: on or off (default on; off on the local cluster)",
    "synthetic-examples": "train the offline demo (a tiny model and data made on every node) with N examples; "
                          "the default on a local cluster without --model/--dataset/--train-file (2000 examples)",
    "dry-run": "print nodes, layout, full command and environment (and for --script: the copy and install "
               "plans); connect to nothing",
    "all-ranks": "the log shows the metrics every rank prints, not rank 0's only (as `fab logs --all-ranks`)",
    "script": "run your own training script (a .py file in --workdir) on every rank instead of the built-in job",
    "module": "run `python -m MODULE` (found in --workdir or the node venv) on every rank instead of the built-in job",
    "args": "arguments of your --script/--module, split like a shell would (arguments after `--` are added)",
    "workdir": "folder copied to every node, where the ranks start (default: the script's folder; with --module "
               "the current folder); .git, __pycache__, virtual environments and what its .gitignore lists stay here",
    "workdir-limit-mb": f"refuse a workdir over this many MB to copy (default {DEFAULT_WORKDIR_LIMIT_MB})",
    "requirements": "a requirements file installed into the node venv before the launch (once per content); "
                    "a requirement that would change a pinned package of the profile is refused",
    "launcher": f"what starts the ranks: {' or '.join(LAUNCHERS)} (default {DEFAULT_LAUNCHER}; torchrun: one per node, "
                "started over SSH, c10d rendezvous on the master)",
    "independent-ranks": "with --script/--module: the ranks are meant to run alone (no process group); without it a "
                         f"multi-rank job whose ranks never joined one exits {worldcheck.TRAINED_ALONE} (each rank "
                         "trained alone)",
    "notice-signal": f"signal every rank gets on a spot interruption notice: {', '.join(NOTICE_SIGNALS)} or "
                     f"{NO_SIGNAL} (default {DEFAULT_NOTICE_SIGNAL})",
    "allow-busy": "launch even when a chosen node still runs a rank of another job (or the master its job "
                  "script); without it such a launch stops before anything starts, naming the running job",
    "name": "a name for the job (a supervised run's every job): letters, digits, '.', '_' and '-', starting with a "
            "letter; `fab jobs` shows it and --job takes it wherever it takes a job id (the newest job of that name)",
    "file": "a YAML job file holding any of these options (`nodes: 4`, `batch-size: 16`, `script: train.py`); "
            "options on the command line win; paths in it are relative to its folder",
    **managed_run.MANAGED_HELP,
})
def train(c, nodes=Unset(int, "all nodes"), cluster="", region="", task="", model="", dataset="", dataset_config="",
          train_file="", validation_file="", epochs=D["epochs"], batch_size=D["batch_size"], bf16=D["bf16"],
          checkpoint_every=D["checkpoint_every"], checkpoint_uri="", max_steps=D["max_steps"], output_dir="",
          extra=D["extra"], resume=False, ranks_per_node=D["ranks_per_node"], threads=D["threads"],
          ccl_workers=D["ccl_workers"], pin="", env=D["env"], allow_env=D["allow_env"],
          synthetic_examples=D["synthetic_examples"], dry_run=False, script="", module="", args="", workdir="",
          workdir_limit_mb=DEFAULT_WORKDIR_LIMIT_MB, requirements="", notice_signal=DEFAULT_NOTICE_SIGNAL,
          launcher=DEFAULT_LAUNCHER, min_nodes=D["min_nodes"], max_restarts=D["max_restarts"], grad_comm="",
          ddp_bucket_mb=Unset(float), compile="", peft="", managed=False, max_recoveries=Unset(int),
          wait_for_capacity=Unset(duration_or_off), independent_ranks=False, allow_busy=False, resume_arg="",
          workdir_changed_ok=False, detach=False, all_ranks=False, name="", file=""):  # noqa: A002 - `file`: the job file, applied by node_setup/tasks/executor.py; `compile`
    """Launch distributed training (mpirun, or torchrun per node) on N nodes and stream its output."""
    options = job_options.plain({k: v for k, v in locals().items() if k not in ("c", "file", "dry_run", "all_ranks",
                                                                                 "cluster", "region")})
    inventory = common.inventory(cluster, region)
    try:
        if resume and managed:  # a supervised run continued from the spec it left beside its checkpoints
            request, lines = managed_run.resumed_request(inventory, options, run_id=new_job_id()), []
        else:
            request, lines = job_options.train_request(options, inventory, run_id=new_job_id())
        job = plan(request, inventory)
    except REFUSED as exc:  # a RequestError, or the plan's (layout, launch, inventory): one line naming the option
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


# The job file's paths (node_setup/tasks/executor.py, cluster/job/jobfile.py): files of this machine, read
# relative to the job file's folder; the data files and --cluster only when such a file exists there.
train.job_file_paths = ("script", "workdir", "requirements")
train.job_file_maybe_paths = ("train_file", "validation_file", "cluster")
# `fab --help train` in these groups (node_setup/tasks/parsing.py), each sorted.
train.option_groups = job_options.groups(
    cluster=("nodes", "cluster", "region", "file", "dry-run", "allow-busy"),
    program=("script", "module", "args", "workdir", "workdir-limit-mb", "requirements", "independent-ranks",
             "launcher", "pin"),
    spot_and_recovery=("managed", "detach", "resume-arg", "max-recoveries", "wait-for-capacity", "notice-signal",
                       "resume", "workdir-changed-ok"),
    output=("output-dir", "all-ranks", "name"),
)

TASKS = [train]
