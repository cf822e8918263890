"""`fab train`: the training job on a cluster (`fab status`, `fab logs`, `fab stop`: tasks/jobs.py).

`fab train` runs the built-in job (`python -m training`) or, with `--script PATH` / `--module NAME`,
the user's own program (cluster/job/userjob.py decides: the workdir's copy plan, the requirements'
install plan, the command; node_setup/ssh/workdir.py and requirements.py act).

`fab train` in four steps: data inputs (what the job reads, and what must be copied or made on
the nodes first), plan (cluster/job/jobplan.py, pure: printed by --dry-run), launch (prepare the
nodes, distribute SSH, start the job detached on the master) and follow (stream the labelled log
until the job ends, then report). Its exit code is the job's own (training/exit_codes.py: 0 ok,
1 failed, 2 bad input, 75 interrupted by a spot reclaim; when a rank's program failed, that
program's code as its rank wrapper reported it, where the launcher returned another: Intel MPI's
255, torchrun's 1), or node_setup/tasks/common.py's: 2 bad option or cluster, 3 a node cannot be
reached or prepared, 130 after Ctrl-C; or cluster/job/worldcheck.py's TRAINED_ALONE (4) when the ranks of
a user's multi-rank program all ended 0 without ever joining one process group (`--independent-ranks`
says that was meant).

`--launcher torchrun` starts one torchrun per node instead of mpirun (cluster/job/torchrun.py), elastic
with `--min-nodes`; `--grad-comm` and `--ddp-bucket-mb` pass through to the job (cluster/job/job_args.py).
`--compile` passes with the compile figures of the cluster's calibration (`fab bench --compile`), and
without `--ranks-per-node` a layout `fab bench --layouts` measured on this node replaces the rule
(node_setup/calibrations.py reads it; cluster/cost/calibration.py's layout_for decides).

Why this module is longer than the others (about 520 lines): it is the one task that meets two
kinds of program and two launchers, and its options and their help take some 60 lines; every decision
is already in cluster/ (jobplan, job_args, userjob, torchrun, jobreport), and what is left here is
the order of the steps above, one section each.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path

from invoke import Exit

from cluster.job import jobreport, jobsummary
from cluster.job import worldcheck
from cluster.inventory import Inventory, InventoryError
from cluster.job.worldcheck import INDEPENDENT_OPTION
from cluster.cost.calibration import layout_for
from cluster.job.job_args import (COMPILE_CHOICES, GRAD_COMM_CHOICES, SYNTHETIC_BATCH_SIZE, SYNTHETIC_EPOCHS,
                              JobArgsError, compile_choice, synthetic_data, training_arguments)
from cluster.job.torchrun import DEFAULT_MAX_RESTARTS
from cluster.job.jobplan import JobPlan, machine_for, new_job_id, plan_job, shown
from cluster.job.joblog import failure_report, first_failure
from cluster.job.launch import DEFAULT_LAUNCHER, LAUNCHERS, LaunchError, env_pairs, job_dir
from cluster.job.layout import LayoutError
from cluster.node.profiles import get_profile, venv_dir
from cluster.job.userjob import (BUILTIN_ONLY, DEFAULT_NOTICE_SIGNAL, DEFAULT_WORKDIR_LIMIT_MB, NO_SIGNAL,
                             NOTICE_SIGNALS, RequirementsPlan, UserJobError, UserProgram, check_module,
                             conflicting_builtin_options, notice_signal, parse_requirements, script_in_workdir,
                             split_args)
from node_setup import calibrations
from node_setup.controller import project_version
from node_setup.ssh import job as jobs
from node_setup.ssh.fanout import NodeOutcome, each_node, outcome_table
from node_setup.tasks import common
from node_setup.tasks import managed as managed_run
from node_setup.tasks.spend import RunCostClock
from node_setup.tasks.common import (CLUSTER_HELP, CTRL_C, FAILED, INTERRUPTED_BY_RECLAIM, REGION_HELP,
                                     STOPPED, UNREACHABLE, Unset, duration_or_off, fail, given, task)

PIN_CHOICES = {"": None, "on": True, "true": True, "off": False, "false": False}


# ----------------------------------------------------------------------------- 1. data inputs


@dataclass
class JobInputs:
    """What the job reads and what the nodes need before the launch."""

    args: list[str]  # `python -m training` arguments (without --output_dir)
    uploads: dict[str, str] = field(default_factory=dict)  # local file -> path on every node (relative to home)
    prepare: list[str] = field(default_factory=list)  # shell commands every node runs first
    synthetic: bool = False


def _data_inputs(inventory: Inventory, job_id: str, options: dict, *, synthetic_examples: int | None,
                 epochs: int | None, batch_size: int | None, bf16: str, checkpoint_every: float | None,
                 checkpoint_uri: str, max_steps: int | None, resume: bool, extra: str, grad_comm: str = "",
                 ddp_bucket_mb: float | None = None) -> JobInputs:
    """(Options not given are None or falsy.)"""
    """The job's arguments from fab train's data options; a local data file is copied to every node,
    and a local cluster with no model or data gets the synthetic demo."""
    uploads: dict[str, str] = {}
    for key in ("train_file", "validation_file"):
        path = options[key]
        if path and Path(path).expanduser().is_file():
            remote = f"{job_dir(job_id)}/data/{key}-{Path(path).name}"
            uploads[str(Path(path).expanduser())] = remote
            options[key] = remote
    given_data = options["model"] or options["dataset"] or options["train_file"]
    synthetic = given(synthetic_examples) or (inventory.offline and not given_data)
    if synthetic and given_data:
        raise JobArgsError("--synthetic-examples: the offline demo brings its own model and data; leave out "
                           "--model, --dataset and --train-file, or drop --synthetic-examples")
    prepare = []
    if synthetic:
        demo = synthetic_data(options["task_name"], synthetic_examples if given(synthetic_examples) else None,
                              f"{venv_dir(get_profile(inventory.profile))}/bin/python")
        options.update(demo.options)
        prepare.append(demo.prepare)
        epochs = epochs or SYNTHETIC_EPOCHS
        batch_size = batch_size or SYNTHETIC_BATCH_SIZE
        extra = f"{demo.recommended} {extra}".strip()
    args = training_arguments(**options, epochs=epochs or None, batch_size=batch_size or None, bf16=bf16,
                              checkpoint_minutes=checkpoint_minutes(checkpoint_every), checkpoint_uri=checkpoint_uri,
                              max_steps=max_steps or None, resume=resume, extra=extra, grad_comm=grad_comm,
                              ddp_bucket_mb=ddp_bucket_mb if given(ddp_bucket_mb) else None)
    return JobInputs(args, uploads, prepare, synthetic)


@dataclass
class UserInputs:
    """A user's own program: what runs, the workdir to copy, the requirements to install."""

    program: UserProgram
    copy: object  # cluster.job.userjob.CopyPlan
    install: RequirementsPlan | None


def _user_inputs(inventory: Inventory, *, script: str, module: str, args: str, workdir: str, requirements: str,
                 signal: str, limit_mb: int, builtin: dict) -> UserInputs:
    """--script/--module and their options, checked on this machine before any node is touched."""
    from node_setup.ssh.workdir import scan

    if script and module:
        raise UserJobError(f"--module: {module!r} given with --script {script!r}; allowed: one of them")
    conflicting_builtin_options(builtin)
    words = split_args(args)
    sig = notice_signal(signal)
    if script:
        path = Path(script).expanduser()
        if not path.is_file():
            raise UserJobError(f"--script: {script!r} is not a file on this machine; allowed: the path of your "
                               "training script")
        root = Path(workdir).expanduser() if workdir else path.parent
    else:
        check_module(module)
        root = Path(workdir).expanduser() if workdir else Path.cwd()
    if not root.is_dir():
        raise UserJobError(f"--workdir: {workdir!r} is not a folder on this machine")
    rel = script_in_workdir(str(path.resolve()), str(root.resolve())) if script else None
    if limit_mb < 1:
        raise UserJobError(f"--workdir-limit-mb: {limit_mb} is not allowed; give 1 or more")
    copy = scan(root, limit_mb * 1024 * 1024)
    install = None
    if requirements:
        req_path = Path(requirements).expanduser()
        if not req_path.is_file():
            raise UserJobError(f"--requirements: {requirements!r} is not a file on this machine")
        install = parse_requirements(req_path.read_text(errors="replace"), requirements, get_profile(inventory.profile))
    return UserInputs(UserProgram(rel, module or None, tuple(words), sig), copy, install)


# ----------------------------------------------------------------------------- 2. plan


def checkpoint_minutes(every: float | None) -> str | None:
    """`--checkpoint-every` (seconds; 0: only at the end) as the job's --checkpoint_minutes, written as
    briefly as it reads (30m -> '30', 90s -> '1.5'; None: not given)."""
    return None if every is None or not given(every) else f"{round(every / 60, 4):g}"


def _layout(*, ranks_per_node: int, threads: int, ccl_workers: int, pin: str, env: str, launch_options: dict) -> dict:
    """plan_job's layout and launcher options from fab train's (LaunchError, or exit 2, naming the option)."""
    return dict(ranks_per_node=ranks_per_node or None, threads_per_rank=threads or None,
                ccl_workers=ccl_workers if given(ccl_workers) else None, pin=PIN_CHOICES[pin.lower()],
                extra_env=env_pairs(env), **launch_options)


# ----------------------------------------------------------------------------- 3. launch


def _newest_output_dir(master) -> str | None:
    """The output directory of the newest job on the master (what --resume continues)."""
    try:
        job_id = jobs.resolve_job_id(master, None)
        return jobs.read_metadata(master, job_id).get("output_dir")
    except jobs.JobError:
        return None


def _aws_preflight(inventory: Inventory) -> None:
    """Before launching on an AWS cluster: credentials, every node still running, no spot notice."""
    from node_setup.aws.train_checks import preflight_for_train

    report = preflight_for_train(inventory)
    if report is not None and not report.ok:
        print(report.render())
        raise fail("preflight failed; fix the findings above and rerun")


def _upload(conns, uploads: dict[str, str]) -> list[NodeOutcome]:
    """Copy the user's local data files to every node, in parallel."""
    folders = sorted({os.path.dirname(remote) for remote in uploads.values()})
    mkdir = "mkdir -p " + " ".join(shlex.quote(f) for f in folders)

    def one(name: str, conn) -> NodeOutcome:
        from node_setup.ssh.connections import explain

        try:
            conn.run(mkdir, hide=True, in_stream=False)  # one round trip per node, not one per file
            for local, remote in uploads.items():
                conn.put(local, remote=remote)
        except Exception as exc:  # noqa: BLE001 - reported per node
            return NodeOutcome(name, False, explain(exc, conn))
        return NodeOutcome(name, True, f"copied {len(uploads)} file(s)")

    return each_node(conns, one)


def _refuse_busy(conns, plan: JobPlan, outcomes: list[NodeOutcome]) -> None:
    """Stop before the launch when a chosen node still runs another job (prepare_nodes found it)."""
    busy = jobs.busy_jobs(outcomes)
    if not busy:
        return
    jobs.remove_job_dir(conns, plan.job_id)  # the nodes that were not busy made this job's directory
    other = max(busy)  # the newest running job (ids begin with their start time)
    more = f" (and {len(busy) - 1} other job(s))" if len(busy) > 1 else ""
    # FAILED, not BAD_INPUT: the options were fine, it is the cluster's state that stops the launch.
    raise fail(f"cannot launch: job {other} still runs on {', '.join(busy[other])}{more}; follow it with "
               f"`fab logs --follow --job {other}`, end it with `fab stop --job {other}`, or pass --allow-busy "
               "to start this job beside it", FAILED)


def _prepare(conns, plan: JobPlan, inputs: JobInputs, *, allow_busy: bool = True) -> None:
    """Job directory (also proves every node answers; a node with another xeon-cluster than this
    checkout is named; unless `allow_busy`, a node that still runs another job stops the launch),
    synthetic data and uploads on every node."""
    print(f"preparing {len(conns)} node(s): job directory"
          + (", synthetic model and data" if inputs.synthetic else "") + " ...", flush=True)
    outcomes = jobs.prepare_nodes(conns, plan, refuse_busy=not allow_busy)
    _refuse_busy(conns, plan, outcomes)
    warning = jobreport.software_warning({o.node: jobs.installed_version(o) for o in outcomes if o.ok},
                                         project_version())
    if warning:
        print(warning, flush=True)
    if all(o.ok for o in outcomes) and inputs.uploads:
        outcomes = _upload(conns, inputs.uploads)
    failed = [o.node for o in outcomes if not o.ok]
    if failed:
        print("node preparation:")
        print(outcome_table(outcomes))
        names = ", ".join(failed)
        raise fail(f"cannot launch: {names} not ready (reason above); the other nodes are fine. "
                   f"Fix or replace {names}, or use fewer nodes (--nodes), then rerun", UNREACHABLE)


def _prepare_user_job(conns, plan: JobPlan, inventory: Inventory) -> None:
    """The workdir's copy and the requirements on every node, in parallel (before the launch)."""
    from node_setup.ssh import requirements as reqs
    from node_setup.ssh import workdir
    from node_setup.ssh.wheels import InstallError

    print(f"copying the workdir to {len(conns)} node(s) ({len(plan.copy.files)} file(s)) ...", flush=True)
    steps = [("workdir", workdir.push(conns, plan.copy, plan.job_id))]
    if plan.install:
        print(f"installing {len(plan.install.requirements)} requirement(s) on {len(conns)} node(s) ...", flush=True)
        try:
            steps.append(("requirements", reqs.install(inventory, conns, plan.install)))
        except InstallError as exc:
            raise fail(str(exc), FAILED) from None
    for what, outcomes in steps:
        print(outcome_table(outcomes))
        failed = [o.node for o in outcomes if not o.ok]
        if failed:
            raise fail(f"cannot launch: {what} failed on {', '.join(failed)} (reason above)",
                       UNREACHABLE if what == "workdir" else FAILED)


def _distribute(inventory: Inventory, conns) -> None:
    """Keys, ssh config, known_hosts and hostfile on the master, so mpirun reaches every node."""
    from node_setup.ssh.distribute import DistributionError, distribute

    try:
        distribute(inventory, conns=conns)
    except DistributionError as exc:
        print("distribution:")
        print(exc.result.table())
        raise fail(f"cannot launch: {exc}", UNREACHABLE) from None


# ----------------------------------------------------------------------------- 4. follow


def _read_summary(master, plan: JobPlan) -> tuple[dict | None, str | None]:
    """(summary.json of the job on the master, checked: cluster/job/jobsummary.py, None), or (None, why there is
    none to read)."""
    path = f"{plan.output_dir}/summary.json"
    text = jobs.read_remote_file(master, path)
    if text is None:
        return None, f"(no {path} on the master)"
    summary, warnings = jobsummary.parse(text, path)
    for line in warnings:
        print(line)
    return (summary, None) if summary is not None else (None, f"summary ({path}): unreadable")


def _print_summary(master, plan: JobPlan) -> None:
    """The run's figures from summary.json on the master, and its failed checkpoint uploads."""
    summary, problem = _read_summary(master, plan)
    lines = [problem] if summary is None else jobreport.summary_lines(
        summary, shown(f"{plan.output_dir}/summary.json"), plan.inventory.master.name)
    print("\n".join(lines))


def _follow_to_end(master, conns, plan: JobPlan, *, managed: bool = False) -> int:
    """Stream the job until it ends; Ctrl-C asks whether to stop it. Returns fab's exit code."""
    job_id, rank_hosts = plan.job_id, list(plan.launch.rank_hosts)
    try:
        jobs.follow(master, job_id, rank_hosts, launcher=plan.launch.launcher)
    except KeyboardInterrupt:
        return _on_interrupt(conns, job_id)
    state, detail = jobs.job_state(master, job_id)
    if state == "running":  # the stream broke (connection lost) while the job goes on
        print(f"\nlost the log stream; job {job_id} is still running: reattach with `fab logs --follow`")
        return 1
    if state == "stopped":
        print(f"\njob {job_id} was stopped (fab stop, {detail})")
        return STOPPED
    code = int(detail) if state == "exited" and detail.strip().lstrip("-").isdigit() else None
    if code == 0:
        print(f"\njob {job_id} finished: exit code 0")
        if plan.user:
            print(f"output: {shown(plan.output_dir)} on {plan.inventory.master.name} (`fab get` copies it here)")
        else:
            _print_summary(master, plan)
        return 0
    print(f"\njob {job_id} " + (f"failed: exit code {code}" if code is not None else f"ended without an exit code "
                                                                                     f"({state})"))
    log = jobs.log_text(master, job_id)
    for line in failure_report(log, rank_hosts, code):
        print(f"  {line}")
    first = first_failure(log, rank_hosts)
    if first is not None and first.code != code:
        # the launcher's own code (Intel MPI: 255, torchrun: 1) says less than the program's
        print(f"  exit code {first.code}: rank {first.rank}'s program's own (the launcher returned {code})")
        code = first.code
    if code == INTERRUPTED_BY_RECLAIM and not plan.user:
        try:  # whatever the master's summary holds, the cleanup below still runs
            summary = _read_summary(master, plan)[0]
            for line in jobreport.reclaim_report(summary, plan.inventory.master.name, managed=managed):
                print(f"  {line}")
        except Exception as exc:  # noqa: BLE001 - e.g. the master went with the reclaim
            print(f"  what was saved cannot be read from {plan.inventory.master.name} ({type(exc).__name__}: {exc})")
    cleanup = jobs.stop(master, conns, job_id, grace=5)
    if any(not o.ok for o in cleanup):
        print("could not clean up every node:")
        print(outcome_table(cleanup))
    else:
        print("  no rank of the job is left on any node")
    return code if code is not None else 1


def _on_interrupt(conns, job_id: str) -> int:
    print("\ninterrupted.", flush=True)
    try:
        answer = input(f"Stop job {job_id} on every node? [y/N] ").strip().lower()
    except (EOFError, KeyboardInterrupt):
        answer = ""
    for conn in conns.values():  # the interrupted stream may have left a half-closed channel
        try:
            conn.close()
        except Exception:  # noqa: BLE001 - closing is best effort; stop reconnects
            pass
    master = next(iter(conns.values()))
    if answer in ("y", "yes"):
        print(f"stopped job {job_id}:")
        print(outcome_table(jobs.stop(master, conns, job_id)))
    else:
        print(f"job {job_id} keeps running on the cluster: `fab logs --follow` reattaches, `fab stop` ends it")
    return CTRL_C


# ----------------------------------------------------------------------------- the task


@task(help={
    "nodes": "how many nodes to use, master first (1 to the nodes available; left out: all)",
    "cluster": CLUSTER_HELP,
    "region": REGION_HELP,
    "task": "training task: qa or classification (training default qa)",
    "model": "model id or a directory on the nodes (--model_name_or_path)",
    "dataset": "hub dataset name (default squad for qa, glue/mrpc for classification)",
    "dataset-config": "hub dataset configuration (e.g. mrpc)",
    "train-file": "training data (.json/.jsonl): a file on this machine is copied to every node, "
                  "else the path on the nodes",
    "validation-file": "evaluation data, like --train-file",
    "epochs": "number of training epochs, a whole number (--num_train_epochs; for part of one: --max-steps)",
    "batch-size": "batch size per rank (--per_device_train_batch_size)",
    "bf16": "auto (on when the CPU has AMX/AVX512-BF16), on or off",
    "checkpoint-every": "save a checkpoint this often, e.g. 30m or 1h (off: only at the end)",
    "checkpoint-uri": "s3://bucket/prefix every checkpoint is uploaded to (and --resume reads)",
    "max-steps": "stop after N optimizer steps",
    "output-dir": "output directory on the nodes, relative to the home directory (default "
                  "xeon-cluster-runs/<job id>; local cluster: /var/tmp/xeon-cluster-runs/<cluster>/<job id>, "
                  "which its nodes share; with --resume: the newest job's)",
    "extra": "more `python -m training` arguments, verbatim, e.g. --extra '--learning_rate 3e-5 --max_seq_length 256' "
             "(arguments after `--` are added here)",
    "resume": "continue from the newest complete checkpoint (after a spot reclaim)",
    "ranks-per-node": "override ranks per node (default one per socket)",
    "threads": "override OpenMP threads per rank (default the rank's physical cores minus CCL workers)",
    "ccl-workers": "override oneCCL workers per rank (intel profile only)",
    "pin": "pin ranks to their cores: on or off (default on; off on the local cluster)",
    "env": "extra environment for every rank, e.g. --env 'FI_PROVIDER=tcp CCL_LOG_LEVEL=info'",
    "synthetic-examples": "train the offline demo (a tiny model and data made on every node) with N examples; "
                          "the default on a local cluster without --model/--dataset/--train-file (2000 examples)",
    "dry-run": "print nodes, layout, full command and environment (and for --script: the copy and install "
               "plans); connect to nothing",
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
    "min-nodes": "torchrun only: elastic, train on as few as M nodes (torchrun's M:N range; a node that leaves "
                 "restarts the ranks on the others, which resume from the newest checkpoint)",
    "max-restarts": f"torchrun with --min-nodes: restarts of the ranks before the job fails (default "
                    f"{DEFAULT_MAX_RESTARTS})",
    "grad-comm": f"gradients on the wire: {' or '.join(GRAD_COMM_CHOICES)} (the job's --grad_comm; bf16 compresses "
                 "DDP's buckets)",
    "ddp-bucket-mb": "DDP's gradient bucket size in MB, a positive number (the job's --ddp_bucket_mb; "
                     "DDP's default 25)",
    "compile": f"torch.compile the model: {', '.join(COMPILE_CHOICES)} (default auto: compiled when the saving "
               "`fab bench --compile` measured, over the run's steps, exceeds the compile time; the job's --compile)",
    "independent-ranks": "with --script/--module: the ranks are meant to run alone (no process group); without it a "
                         f"multi-rank job whose ranks never joined one exits {worldcheck.TRAINED_ALONE} (each rank "
                         "trained alone)",
    "notice-signal": f"signal every rank gets on a spot interruption notice: {', '.join(NOTICE_SIGNALS)} or "
                     f"{NO_SIGNAL} (default {DEFAULT_NOTICE_SIGNAL})",
    "allow-busy": "launch even when a chosen node still runs a rank of another job (or the master its job "
                  "script); without it such a launch stops before anything starts, naming the running job",
    "file": "a YAML job file holding any of these options (`nodes: 4`, `batch-size: 16`, `script: train.py`); "
            "options on the command line win; paths in it are relative to its folder",
    **managed_run.MANAGED_HELP,
})
def train(c, nodes=Unset(int, "all nodes"), cluster="", region="", task="", model="", dataset="", dataset_config="",
          train_file="", validation_file="", epochs=Unset(int, "the job's"), batch_size=Unset(int, "the job's"),
          bf16="auto", checkpoint_every=Unset(duration_or_off), checkpoint_uri="", max_steps=Unset(int), output_dir="",
          extra="", resume=False, ranks_per_node=Unset(int, "one per socket"),
          threads=Unset(int, "the rank's cores"), ccl_workers=Unset(int), pin="", env="",
          synthetic_examples=Unset(int), dry_run=False, script="", module="", args="", workdir="",
          workdir_limit_mb=DEFAULT_WORKDIR_LIMIT_MB, requirements="", notice_signal=DEFAULT_NOTICE_SIGNAL,
          launcher=DEFAULT_LAUNCHER, min_nodes=Unset(int), max_restarts=Unset(int), grad_comm="",
          ddp_bucket_mb=Unset(float), compile="", managed=False, max_recoveries=Unset(int),
          wait_for_capacity=Unset(duration_or_off), independent_ranks=False, allow_busy=False, resume_arg="",
          detach=False, file=""):  # noqa: A002 - `file`: the job file, applied by node_setup/tasks/executor.py; `compile`
    """Launch distributed training (mpirun, or torchrun per node) on N nodes and stream its output."""
    if pin.lower() not in PIN_CHOICES:
        raise fail(f"--pin: {pin!r} is not allowed; choose on or off")
    if launcher not in LAUNCHERS:
        raise fail(f"--launcher: {launcher!r} is not allowed; choose {' or '.join(LAUNCHERS)}")
    launch_options = dict(launcher=launcher, min_nodes=min_nodes if given(min_nodes) else None,
                          max_restarts=max_restarts if given(max_restarts) else None)
    user_options = dict(script=script, module=module, workdir=workdir, requirements=requirements)
    if not (script or module):
        used = ([f"--{k}" for k, v in user_options.items() if v] + (["--args"] if args else [])
                + ([INDEPENDENT_OPTION] if independent_ranks else []))
        if used:
            raise fail(f"{used[0]}: only with --script or --module (your own program)")
    inventory = common.inventory(cluster, region)
    supervision = None
    if managed or given(max_recoveries) or given(wait_for_capacity) or detach or resume_arg:  # tasks/managed.py
        supervision = managed_run.options(managed=managed, inventory=inventory, nodes=nodes, launcher=launcher,
                                          own_program=bool(script or module),
                                          max_recoveries=max_recoveries if given(max_recoveries) else None,
                                          min_nodes=min_nodes if given(min_nodes) else None,
                                          wait=f"{wait_for_capacity:g}s" if given(wait_for_capacity) else None,
                                          detach=detach, resume_arg=resume_arg, requirements=requirements)
        launch_options["min_nodes"] = None  # --min-nodes is the supervisor's, not torchrun's
        if resume:  # a supervised run continued from the spec it left beside its checkpoints
            raise Exit(code=managed_run.resume(inventory, checkpoint_uri=checkpoint_uri, output_dir=output_dir,
                                               env=env, detach=detach, prepare_nodes=_distribute,
                                               preflight=_aws_preflight))
    job_id = new_job_id()
    try:
        layout = _layout(ranks_per_node=ranks_per_node, threads=threads, ccl_workers=ccl_workers, pin=pin, env=env,
                         launch_options=launch_options)
    except (LaunchError, ValueError) as exc:
        raise fail(str(exc)) from None
    if script or module:
        builtin = dict(zip(BUILTIN_ONLY, (task, model, dataset, dataset_config, train_file, validation_file, epochs,
                                          batch_size, max_steps, bf16 != "auto", given(checkpoint_every),
                                          checkpoint_uri, resume, given(synthetic_examples))))
        _own_program(inventory, job_id, layout, nodes=nodes, output_dir=output_dir, dry_run=dry_run,
                     builtin=builtin, builtin_comm={"grad-comm": grad_comm, "ddp-bucket-mb": ddp_bucket_mb,
                                                       "compile": compile},
                     script=script, module=module, args=f"{args} {extra}".strip(), workdir=workdir,
                     requirements=requirements, signal=notice_signal, limit_mb=workdir_limit_mb,
                     independent_ranks=independent_ranks, allow_busy=allow_busy,
                     managed=dict(opts=supervision, detach=detach, resume_arg=resume_arg) if supervision else None)
        return
    options = dict(task_name=task, model=model, dataset=dataset, dataset_config=dataset_config,
                   train_file=train_file, validation_file=validation_file)
    try:
        inputs = _data_inputs(inventory, job_id, options, synthetic_examples=synthetic_examples, epochs=epochs,
                              batch_size=batch_size, bf16=bf16, checkpoint_every=checkpoint_every,
                              checkpoint_uri=checkpoint_uri, max_steps=max_steps, resume=resume, extra=extra,
                              grad_comm=grad_comm, ddp_bucket_mb=ddp_bucket_mb)
        cal, cal_note = calibrations.for_cluster(inventory.name)
        compile_args, compile_line = compile_choice(compile, cal.compile_cost() if cal else None,
                                                    max_steps or None)
        inputs.args += compile_args
        layout_line = ""
        if not layout["ranks_per_node"]:  # no --ranks-per-node: a measured layout, else the rule
            measured, layout_line = layout_for(cal, machine_for(inventory, nodes or len(inventory.nodes))[0].name)
            layout["ranks_per_node"] = measured

        def make_plan(out_dir: str | None) -> JobPlan:
            return plan_job(inventory, nodes=nodes or len(inventory.nodes), training_args=inputs.args, job_id=job_id,
                            output_dir=out_dir or None, prepare=inputs.prepare, **layout)

        plan = make_plan(output_dir)
    except (InventoryError, LayoutError, LaunchError, JobArgsError, ValueError) as exc:
        raise fail(str(exc)) from None
    warning = jobreport.spot_warning(plan.inventory, inputs.args)
    if warning:
        print(warning)
    print("\n".join(line for line in (cal_note, layout_line, compile_line) if line))

    if dry_run:
        print(plan.describe())
        for local, remote in inputs.uploads.items():
            print(f"would copy {local} to ~/{remote} on every node")
        if resume and not output_dir:
            print("note: --resume continues in the newest job's output directory (read from the master at launch)")
        print("\ndry run: nothing was started")
        return

    if inventory.kind == "aws":
        _aws_preflight(plan.inventory)  # only the nodes this job uses (--nodes)
    conns = common.connect(plan.inventory)
    master = conns[plan.inventory.master.name]
    if resume and not output_dir:
        previous = _newest_output_dir(master)
        if previous:
            plan = make_plan(previous)
            print(f"resuming in {previous} (the newest job's output directory)")
    if supervision:
        _distribute(plan.inventory, conns)  # the master reaches every node with the cluster key
        if inputs.uploads:
            _upload(conns, inputs.uploads)
        raise Exit(code=managed_run.hand_off(supervision, inventory=inventory, plan=plan, inputs=inputs, conns=conns,
                                             layout=layout, detach=detach))
    raise Exit(code=_launch(inventory, plan, inputs=inputs, conns=conns, allow_busy=allow_busy))


def _launch(inventory: Inventory, plan: JobPlan, *, inputs: JobInputs | None = None, conns: dict | None = None,
            user_job: bool = False, independent_ranks: bool = False, allow_busy: bool = True) -> int:
    """Prepare the nodes, distribute SSH, start the job detached on the master and follow it
    (`fab train` passes allow_busy=False unless --allow-busy: a node running another job stops it)."""
    if conns is None:
        if inventory.kind == "aws":
            _aws_preflight(plan.inventory)
        conns = common.connect(plan.inventory)
    master = conns[plan.inventory.master.name]
    _prepare(conns, plan, inputs or JobInputs([]), allow_busy=allow_busy)
    if user_job:
        _prepare_user_job(conns, plan, plan.inventory)
    _distribute(plan.inventory, conns)
    pid = jobs.start(master, plan)
    print(f"layout: {plan.layout.describe()[1]}")
    print(f"job {plan.job_id} started on {plan.inventory.master.name} (pid {pid}): {plan.launch.world_size} ranks "
          f"on {', '.join(plan.launch.hosts)}; output {shown(plan.output_dir)}", flush=True)
    cost = RunCostClock.at_launch(plan)  # prints the planned time and cost
    code = _follow_to_end(master, conns, plan)
    if user_job and code == 0:
        code = _world_check(conns, plan, independent_ranks)
    cost.at_end(master, plan, code)  # prints the actual ones, records both in summary.json
    return code


def _world_check(conns, plan: JobPlan, independent: bool) -> int:
    """After a user's program ended 0 on every rank: did its ranks form one world (cluster/job/worldcheck.py)?"""
    from node_setup.ssh.world import read_records

    records, problems = read_records(conns, plan.job_id)
    found = worldcheck.verdict(records, plan.launch.world_size, independent=independent)
    print("\n".join([*problems, *found.lines]))
    return found.code


def _own_program(inventory: Inventory, job_id: str, layout: dict, *, nodes: int, output_dir: str, dry_run: bool,
                 builtin: dict, builtin_comm: dict, limit_mb, independent_ranks: bool = False, allow_busy: bool = False,
                 managed: dict | None = None, **program) -> None:
    """--script/--module: the user's own program checked and planned (printed by --dry-run), then launched
    (Exit with the job's code); `program` is _user_inputs' script, module, args, workdir, requirements, signal."""
    for name, value in builtin_comm.items():
        if value:
            raise fail(f"--{name}: an option of the built-in job, not allowed with --script/--module; pass your "
                       "program's own arguments with --args (or after `--`)")
    try:
        user = _user_inputs(inventory, **program, limit_mb=int(limit_mb), builtin=builtin)
        plan = plan_job(inventory, nodes=nodes or len(inventory.nodes), training_args=(), job_id=job_id,
                        output_dir=output_dir or None, prepare=[], user=user.program, copy=user.copy,
                        install=user.install, **layout)
    except (InventoryError, LayoutError, LaunchError, ValueError) as exc:
        raise fail(str(exc)) from None
    plan = replace(plan, prepare=(f"mkdir -p {shlex.quote(plan.output_dir)}",))
    if dry_run:
        print(plan.describe())
        print("\ndry run: nothing was started")
        return
    if managed:  # --managed: the workdir pushed once into the run's first job directory, then the supervisor's
        if inventory.kind == "aws":
            _aws_preflight(plan.inventory)
        conns = common.connect(plan.inventory)
        _prepare_user_job(conns, plan, plan.inventory)
        _distribute(plan.inventory, conns)  # the master reaches every node with the cluster key
        raise Exit(code=managed_run.hand_off(managed["opts"], inventory=inventory, plan=plan, inputs=JobInputs([]),
                                             conns=conns, layout=layout, detach=managed["detach"],
                                             resume_arg=managed["resume_arg"]))
    raise Exit(code=_launch(inventory, plan, user_job=True, independent_ranks=independent_ranks, allow_busy=allow_busy))


# The job file's paths (node_setup/tasks/executor.py, cluster/job/jobfile.py): files of this machine, read
# relative to the job file's folder; the data files and --cluster only when such a file exists there.
train.job_file_paths = ("script", "workdir", "requirements")
# `fab --help train` in these groups (node_setup/tasks/parsing.py), each sorted.
train.option_groups = {
    "cluster": ("nodes", "cluster", "region", "file", "dry-run", "allow-busy"),
    "program": ("script", "module", "args", "workdir", "workdir-limit-mb", "requirements", "independent-ranks",
                "launcher", "ranks-per-node", "threads", "ccl-workers", "pin", "env"),
    "training": ("task", "model", "dataset", "dataset-config", "train-file", "validation-file", "epochs", "batch-size",
                 "max-steps", "bf16", "grad-comm", "ddp-bucket-mb", "compile", "synthetic-examples", "extra"),
    "spot and recovery": ("managed", "detach", "resume-arg", "max-recoveries", "wait-for-capacity", "min-nodes",
                          "max-restarts", "notice-signal", "resume"),
    "output": ("output-dir", "checkpoint-every", "checkpoint-uri"),
}
train.job_file_maybe_paths = ("train_file", "validation_file", "cluster")

TASKS = [train]
