"""A training job, decided before anything is touched: nodes, layout, launch, output directory.

`plan_job(inventory, ...)` returns a JobPlan: the inventory cut to the job's nodes, the rank
layout (cluster/job/layout.py), the launch (cluster/job/launch.py), the arguments of the program every
rank runs, and the output directory. The program is the built-in job (`python -m training`), or
the user's own (`user=`, cluster/job/userjob.py: a script or module run from the job's copy of the
workdir, with the copy plan and the install plan printed by the dry run). `fab train --dry-run` prints
`JobPlan.describe()`; node_setup/ssh/job.py carries the plan out on the master.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
import shlex
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from cluster.stack import catalog
from cluster.inventory import Inventory
from cluster.job.launch import (DEFAULT_LAUNCHER, NOTICE_SIGNAL_VARIABLE, OUTPUT_DIR_VARIABLE, PYTHON_VARIABLE,
                            WORKDIR_VARIABLE, LaunchError, LaunchPlan, check_launcher, job_dir, plan_launch)
from cluster.job.layout import Layout, plan_layout
from cluster.node.profiles import get_profile, venv_dir
from cluster.job.torchrun import plan_torchrun_launch
from cluster.job.job_args import BATCH_FLAGS, SYNTHETIC_ARGS, synthetic_data, training_arguments
from cluster.job.request import RunRequest
from cluster.job.userjob import NO_SIGNAL, CopyPlan, RequirementsPlan, UserProgram, workdir_on_node
from cluster.run.recovery import BatchPlan
from cluster.run.supervision import restart_arguments, resume_words

DEFAULT_OUTPUT_ROOT = "xeon-cluster-runs"  # relative to the SSH user's home on every node
# The local cluster's nodes each have their own /root but share the rest of the filesystem: a
# shared output directory lets every rank see rank 0's checkpoints (needed by --resume).
LOCAL_OUTPUT_ROOT = "/var/tmp/xeon-cluster-runs"


def shown(path: str) -> str:
    """A node path as the user reads it: relative paths are relative to the home directory."""
    return path if path.startswith("/") else f"~/{path}"


# What new_job_id makes: UTC date and time, then 4 hex digits. `--job` must look like this too.
JOB_ID_RE = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{4}\Z")


def check_job_id(job_id: str) -> str:
    """`job_id` if it is one new_job_id could have made; ValueError naming --job otherwise."""
    if not JOB_ID_RE.match(job_id or ""):
        raise ValueError(f"--job: {job_id!r} is not a job id; allowed: the id `fab train` printed, "
                         "e.g. 20261123-101500-ab12 (`fab status` shows the newest)")
    return job_id


def new_job_id(now: float | None = None) -> str:
    """Sortable and unique: UTC time plus a random suffix (also seeds MASTER_PORT)."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + "-" + secrets.token_hex(2)



@dataclass(frozen=True)
class JobPlan:
    inventory: Inventory  # cut to the job's nodes, master first
    layout: Layout
    launch: LaunchPlan
    training_args: tuple[str, ...]
    output_dir: str
    prepare: tuple[str, ...] = ()  # commands run on every node before the launch
    notes: tuple[str, ...] = ()
    user: UserProgram | None = None  # the user's own program instead of `python -m training`
    copy: CopyPlan | None = None  # the user's workdir, copied to every node
    install: RequirementsPlan | None = None  # the user's --requirements

    @property
    def job_id(self) -> str:
        return self.launch.job_id

    def metadata(self) -> dict:
        return {
            "job_id": self.job_id, "cluster": self.inventory.name, "kind": self.inventory.kind,
            "hosts": list(self.launch.hosts), "rank_hosts": list(self.launch.rank_hosts),
            "world_size": self.launch.world_size, "ranks_per_node": self.layout.ranks_per_node,
            "threads_per_rank": self.layout.threads_per_rank, "output_dir": self.output_dir,
            "training_args": list(self.training_args), "master_port": self.launch.master_port,
            "flavour": self.launch.flavour, "launcher": self.launch.launcher,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **({"program": list(self.launch.program)} if self.user else {}),
        }

    def _describe_torchrun(self) -> list[str]:
        launch, run = self.launch, self.launch.torchrun
        assert run is not None  # the torchrun flavour carries its plan
        out = [f"torchrun on every node, started over SSH from the master: --nnodes {run.nnodes}, "
               f"--nproc-per-node {run.nproc_per_node}, c10d rendezvous at {run.rdzv_endpoint} (id {run.rdzv_id})"]
        if run.min_nodes is not None:
            out.append(f"  elastic: trains on {run.min_nodes} to {run.nodes} nodes; torchrun restarts the ranks up to "
                       f"{run.max_restarts} time(s) when a node leaves or joins")
        out += ["", "environment of every rank (given to each node's torchrun, which passes it on):"]
        out += [f"  {k}={v}" for k, v in launch.rank_env.items()]
        out += ["", "command on the master (each node runs it with its own --local-addr and XEON_CLUSTER_NODE):",
                f"  {launch.command_line()}",
                "  (<rank-wrapper>: records the program's pid and process group in the job directory, sets",
                "   GLOO_SOCKET_IFNAME towards MASTER_ADDR unless given, labels its lines with node and rank,",
                "   runs the program" + (" under taskset of the local rank's cores" if self.layout.pin else "")
                + " and names it when it fails)"]
        return out

    def describe(self) -> str:
        """The dry-run text: nodes, layout, environment and the full command."""
        inv, launch = self.inventory, self.launch
        out = [f"job {self.job_id} on cluster {inv.name!r} ({inv.kind}, profile {inv.profile}, "
               + (f"MPI {launch.flavour})" if launch.launcher == "mpirun" else "launcher torchrun)"),
               "", "nodes (rank order, master first):"]
        for node in inv.nodes:
            ranks = [str(r) for r, h in enumerate(launch.rank_hosts) if h == node.name]
            out.append(f"  {node.name:<10} {node.address:<16} private {node.private_address:<16} "
                       f"ranks {','.join(ranks)}")
        out += ["", "layout:"] + [f"  {line}" for line in self.layout.describe()]
        out += [f"  world size: {launch.world_size}", ""]
        if self.copy:
            out += self.copy.describe() + [f"  on every node: ~/{workdir_on_node(self.job_id)} (ranks start there)", ""]
        if self.install:
            out += self.install.describe() + [""]
        if self.prepare:
            out += ["on every node first:"] + [f"  {p}" for p in self.prepare] + [""]
        if launch.launcher == "torchrun":
            out += self._describe_torchrun()
        else:
            out += ["environment of mpirun on the master:"]
            out += [f"  {k}={v}" for k, v in launch.env.items()]
            if launch.setup:
                out += ["", "run on the master before mpirun:"] + [f"  {line}" for line in launch.setup]
            out += ["", "environment of every rank:"] + [f"  {k}={v}" for k, v in launch.rank_env.items()]
            out += ["", "hostfile:"] + [f"  {h}" for h in launch.hostfile.splitlines()]
            out += ["", "command (run from the master's home directory):", f"  {launch.command_line()}",
                    "  (<rank-wrapper>: records the rank's pid and process group in the job directory, sets",
                    "   GLOO_SOCKET_IFNAME to the interface towards MASTER_ADDR unless given, then runs the program",
                    "   as its child, forwards signals to it and names the rank when it fails)"]
            if self.user:
                out += ["  (for your program it also exports RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,",
                        "   NODE_RANK, GROUP_RANK and XEON_CLUSTER_NOTICE_FILE, starts from the job's workdir and,",
                        "   on local rank 0, runs the node's spot-notice watcher)"]
        if self.user:
            out += ["", f"output directory ({OUTPUT_DIR_VARIABLE}): {shown(self.output_dir)}"]
        else:
            out += ["", f"output directory (rank 0 writes summary.json there): {shown(self.output_dir)}"]
        out += [f"job directory on every node: ~/{job_dir(self.job_id)}"]
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)


def machine_for(inventory: Inventory, nodes: int) -> tuple[catalog.InstanceType, bool, list[str]]:
    """What one node looks like, whether to pin, and notes.

    Nodes that share one machine's cores (the local cluster's) each get an equal share, unpinned.
    """
    machine = inventory.machine()
    if not inventory.shared_cores:
        return machine, True, []
    share = max(1, machine.physical_cores // nodes)
    note = (f"{nodes} node(s) share one machine's {machine.physical_cores} physical "
            f"core(s); each node gets {share} and ranks are not pinned")
    return catalog.custom(f"local node (a 1/{nodes} share of this machine)", 1, share), False, [note]


def _plan_launch(inv: Inventory, launcher: str, *, job_id: str, layout: Layout, program: Sequence[str], venv: str,
                 master_port: int | None, extra_env: Mapping[str, str] | None, job_env: Mapping[str, str] | None = None,
                 min_nodes: int | None = None, max_restarts: int | None = None) -> LaunchPlan:
    hosts = [n.name for n in inv.nodes]
    if launcher == "torchrun":
        return plan_torchrun_launch(job_id=job_id, hosts=hosts, addresses=[n.private_address for n in inv.nodes],
                                    layout=layout, program=program, venv=venv, min_nodes=min_nodes,
                                    max_restarts=max_restarts, extra_env=extra_env, job_env=job_env,
                                    rdzv_port=master_port)
    return plan_launch(flavour=get_profile(inv.profile).launcher, job_id=job_id, hosts=hosts,
                       master_addr=inv.master.private_address, layout=layout, program=program, venv=venv,
                       master_port=master_port, extra_env=extra_env, run_as_root=inv.user == "root", job_env=job_env)


def default_output_dir(inventory: Inventory, run_id: str) -> str:
    """A run's output directory when none is given: under the nodes' shared output root (every node sees
    it), else DEFAULT_OUTPUT_ROOT in each node's home."""
    return f"{inventory.shared_output_root or DEFAULT_OUTPUT_ROOT}/{run_id}"


def plan_job(inventory: Inventory, *, nodes: int, training_args: Sequence[str], job_id: str | None = None,
             ranks_per_node: int | None = None, threads_per_rank: int | None = None,
             ccl_workers: int | None = None, pin: bool | None = None, extra_env: Mapping[str, str] | None = None,
             output_dir: str | None = None, prepare: Sequence[str] = (), preload: Sequence[str] | None = None,
             master_port: int | None = None, user: UserProgram | None = None, copy: CopyPlan | None = None,
             install: RequirementsPlan | None = None, launcher: str = DEFAULT_LAUNCHER,
             min_nodes: int | None = None, max_restarts: int | None = None) -> JobPlan:
    """A job of a program given as its arguments (`fab bench`'s programs, the tests): the built-in job with
    `training_args` as they are, completed with --instance_type (the catalog's type, unless they name
    one), --output_dir (unless they name one, which is then the output directory) and, elastic under
    torchrun, --resume. Every run of `fab train` is planned from its request instead (`plan`).

    With `user`, every rank runs the user's program (its arguments are its own; `training_args`
    is ignored) from the job's copy of the workdir, and the output directory reaches it as
    XEON_CLUSTER_OUTPUT_DIR.
    """
    job_id = job_id or new_job_id()
    output_dir = output_dir or default_output_dir(inventory, job_id)
    args = list(training_args)
    if user is None:
        instance_type = inventory.instance_type or ""
        if catalog.lookup(instance_type) and not any(a.split("=", 1)[0] == "--instance_type" for a in args):
            args += ["--instance_type", instance_type]
        given = [a.split("=", 1)[1] if "=" in a else (args[i + 1] if i + 1 < len(args) else "")
                 for i, a in enumerate(args) if a == "--output_dir" or a.startswith("--output_dir=")]
        if given:  # the caller's own wins
            output_dir = given[-1]
        else:
            args += ["--output_dir", output_dir]
        if min_nodes is not None and "--resume" not in args:
            args.append("--resume")
    return _plan(inventory, nodes=nodes, job_id=job_id, output_dir=output_dir, args=args, user=user,
                 layout=dict(ranks_per_node=ranks_per_node, threads_per_rank=threads_per_rank, ccl_workers=ccl_workers,
                             pin=pin, preload=preload),
                 launcher=launcher, min_nodes=min_nodes, max_restarts=max_restarts, extra_env=extra_env,
                 prepare=prepare, master_port=master_port, copy=copy, install=install)


def _plan(inventory: Inventory, *, nodes: int, job_id: str, output_dir: str, args: Sequence[str],
          user: UserProgram | None, layout: Mapping, launcher: str, min_nodes: int | None, max_restarts: int | None,
          extra_env: Mapping[str, str] | None, prepare: Sequence[str], master_port: int | None = None,
          copy: CopyPlan | None = None, install: RequirementsPlan | None = None) -> JobPlan:
    """The job of `args` (the built-in job's, complete) or of `user`'s program, decided (no I/O).

    `launcher` "torchrun" starts one torchrun per node instead of mpirun (cluster/job/torchrun.py);
    `min_nodes` makes that elastic (torchrun's MIN:N, `max_restarts`).
    """
    check_launcher(launcher)
    if launcher != "torchrun" and (min_nodes is not None or max_restarts is not None):
        raise LaunchError(f"{'--min-nodes' if min_nodes is not None else '--max-restarts'}: only with "
                          "--launcher torchrun (its elastic agent handles a node that leaves)")
    inv = inventory.first(nodes)
    profile = get_profile(inv.profile)
    machine, default_pin, notes = machine_for(inventory, nodes)
    kwargs = {} if layout.get("preload") is None else {"preload": tuple(layout["preload"])}
    pin = layout.get("pin")
    planned = plan_layout(machine, backend=profile.backend, ranks_per_node=layout.get("ranks_per_node"),
                          threads_per_rank=layout.get("threads_per_rank"), ccl_workers=layout.get("ccl_workers"),
                          pin=default_pin if pin is None else pin, **kwargs)
    venv = venv_dir(profile)
    launch_options: dict[str, Any] = dict(job_id=job_id, layout=planned, venv=venv, master_port=master_port,
                                          extra_env=extra_env, min_nodes=min_nodes, max_restarts=max_restarts)
    if user is not None:
        python = f"{venv}/bin/python"
        job_env = {WORKDIR_VARIABLE: workdir_on_node(job_id), OUTPUT_DIR_VARIABLE: output_dir, PYTHON_VARIABLE: python,
                   NOTICE_SIGNAL_VARIABLE: user.signal or NO_SIGNAL, "PYTHONUNBUFFERED": "1"}
        launch = _plan_launch(inv, launcher, program=user.argv(python), job_env=job_env, **launch_options)
        return JobPlan(inventory=inv, layout=planned, launch=launch, training_args=user.args, output_dir=output_dir,
                       prepare=tuple(prepare), notes=tuple(notes) + planned.notes, user=user, copy=copy,
                       install=install)
    launch = _plan_launch(inv, launcher, program=[f"{venv}/bin/python", "-m", "training", *args], **launch_options)
    return JobPlan(inventory=inv, layout=planned, launch=launch, training_args=tuple(args),
                   output_dir=output_dir, prepare=tuple(prepare), notes=tuple(notes) + planned.notes)


# ------------------------------------------------------------------------------ a run's job, from its request


@dataclass(frozen=True)
class Restart:
    """What a supervised relaunch changes in the run's request (node_setup/supervisor/): it resumes (the
    built-in job's --resume), with `batch` (cluster/run/recovery.py's BatchPlan: per-rank batch and
    accumulation that keep the global batch) and, for your own program, the newest `checkpoint` folder
    (absolute) filled into --resume-arg's words and XEON_CLUSTER_RESUME_FROM."""

    resume: bool = True
    batch: BatchPlan | None = None
    checkpoint: str | None = None


def builtin_arguments(request: RunRequest, *, output_dir: str, instance_type: str | None,
                      restart: Restart | None = None) -> list[str]:
    """`python -m training`'s arguments of the request's built-in job: its typed settings, the offline demo's
    data and settings, its other arguments, then what the plan adds (the instance type, the output
    directory, --resume). A `restart`'s batch replaces the per-rank batch and the accumulation."""
    job = request.builtin
    assert job is not None  # the caller asked for the built-in job's arguments
    batch = restart.batch if restart else None
    demo = synthetic_data(job.demo.task, job.demo.examples, "python") if job.demo else None
    options: dict[str, Any] = dict(task_name=job.task, model=job.model, dataset=job.dataset,
                                   dataset_config=job.dataset_config, train_file=job.train_file,
                                   validation_file=job.validation_file)
    if demo is not None:
        options.update(demo.options)
    extra = [*(SYNTHETIC_ARGS[job.demo.task] if job.demo else ())]
    extra += [w for arg in job.extra if not (batch and arg.flag in BATCH_FLAGS) for w in arg.words()]
    args = training_arguments(**options, epochs=f"{job.epochs:g}" if job.epochs is not None else None,
                              batch_size=batch.per_rank if batch else job.batch_size, bf16=job.bf16,
                              checkpoint_minutes=(f"{round(request.checkpoint_every_s / 60, 4):g}"
                                                  if request.checkpoint_every_s is not None else None),
                              checkpoint_uri=request.checkpoint_uri, max_steps=job.max_steps,
                              grad_comm=job.grad_comm, ddp_bucket_mb=job.ddp_bucket_mb, extra_args=extra)
    if job.compile is not None:
        args += ["--compile", job.compile]
    if job.compile_estimate is not None:
        args += ["--compile_estimate", ",".join(f"{v:.4f}" if i < 2 else f"{v:.1f}"
                                                for i, v in enumerate(job.compile_estimate))]
    if batch:
        args += ["--gradient_accumulation_steps", str(batch.accumulation)]
    if catalog.lookup(instance_type or "") and not any(arg.flag == "--instance_type" for arg in job.extra):
        args += ["--instance_type", str(instance_type)]
    args += ["--output_dir", output_dir]
    if request.resume or (restart is not None and restart.resume) or request.launcher.min_nodes is not None:
        args.append("--resume")  # elastic: a restarted rank continues the newest checkpoint (a first start finds none)
    return args


def plan(request: RunRequest, inventory: Inventory, *, job_id: str | None = None, nodes: int | None = None,
         restart: Restart | None = None, python: str | None = None) -> JobPlan:
    """The job of the run `request` on `inventory` (its first `nodes`, default the request's): every command
    line made here, from the typed request, the last step before the job's files. `job_id`: the run's first
    job is the run's id; a supervised relaunch gets a new one with its `restart`."""
    job_id = job_id or request.run_id
    nodes = nodes or request.nodes
    output_dir = request.output_dir or default_output_dir(inventory, request.run_id)
    layout = dataclasses.asdict(request.layout)
    launcher = request.launcher
    common: dict[str, Any] = dict(nodes=nodes, job_id=job_id, output_dir=output_dir, launcher=launcher.name,
                  min_nodes=launcher.min_nodes, max_restarts=launcher.max_restarts, layout=layout)
    own = request.own
    if own is not None:
        words: tuple[str, ...] = own.args
        env: dict[str, str] = {}
        if restart is not None:
            resume = resume_words(own.resume_arg) if own.resume_arg else ()
            words, env = restart_arguments(own.args, resume, restart.checkpoint)
        return _plan(inventory, args=(), user=dataclasses.replace(own.program, args=words),
                     extra_env={**request.env_map(), **env}, prepare=[f"mkdir -p {shlex.quote(output_dir)}"],
                     copy=own.copy, install=own.install, **common)
    job = request.builtin
    assert job is not None
    args = builtin_arguments(request, output_dir=output_dir, instance_type=inventory.instance_type, restart=restart)
    venv_python = python or f"{venv_dir(get_profile(inventory.profile))}/bin/python"
    prepare = [synthetic_data(job.demo.task, job.demo.examples, venv_python).prepare] if job.demo else []
    return _plan(inventory, args=args, user=None, extra_env=request.env_map(), prepare=prepare, **common)
