"""A training job, decided before anything is touched: nodes, layout, launch, output directory.

`plan(request, inventory, ...)` returns the JobPlan of a run request (cluster/job/request.py): the
inventory cut to the job's nodes, the rank layout (cluster/job/layout.py), the launch
(cluster/job/launch.py, or cluster/job/torchrun.py), the arguments of the program every rank runs, and
the output directory. Every command line is made here, from the typed request, and never read back.
The program is the built-in job (`python -m training`), or your own (cluster/job/userjob.py: a script
or module run from the job's copy of the workdir, with the copy plan and the install plan printed by
the dry run). `fab train --dry-run` prints `JobPlan.describe()`; node_setup/job_lifecycle/ carries the
plan out.
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
from cluster.job.launch import (NOTICE_SIGNAL_VARIABLE, OUTPUT_DIR_VARIABLE, PYTHON_VARIABLE, WORKDIR_VARIABLE,
                                LaunchPlan, job_dir, plan_launch)
from cluster.job.layout import Layout, plan_layout
from cluster.node.profiles import get_profile, venv_dir
from cluster.job.torchrun import plan_torchrun_launch
from cluster.job.demo import SYNTHETIC_ARGS, synthetic_data
from cluster.job.job_args import BATCH_FLAGS, typed_arguments
from cluster.job.request import Launcher, RunRequest
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
    request: RunRequest | None = None  # the run's request (None: a program of its own, fab bench's)

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
            **({"program": list(self.launch.program)} if self.user else {}), **self._what_runs(),
        }

    def _what_runs(self) -> dict:
        """What `fab jobs` shows of the job, from its request (never read back from a command line): its name
        (`--name`), the built-in job's task ("" when not given) and checkpoint URI, or your script or module."""
        request = self.request
        if request is None:
            return {}
        name = {"name": request.name} if request.name else {}
        own = request.own
        if own is not None:
            return {**name, **({"script": own.script} if own.script else {"module": own.module})}
        job = request.builtin
        assert job is not None  # a request runs the built-in job or your own program
        uri = {"checkpoint_uri": request.checkpoint_uri} if request.checkpoint_uri else {}
        return {**name, "task": job.task or "", **uri}

    def _describe_torchrun(self) -> list[str]:
        launch, run = self.launch, self.launch.torchrun
        assert run is not None  # the torchrun flavour carries its plan
        out = [f"torchrun on every node, started over SSH from the master: --nnodes {run.nnodes}, "
               f"--nproc-per-node {run.nproc_per_node}, c10d rendezvous at {run.rdzv_endpoint} (id {run.rdzv_id})"]
        if run.min_nodes is not None:
            out.append(f"  elastic: trains on {run.min_nodes} to {run.nodes} nodes; torchrun restarts the ranks up to "
                       f"{run.max_restarts} time(s) when a node leaves or joins")
        out += ["", "environment of every rank (given to each node's torchrun, which passes it on):"]
        out += self._describe_rank_env()
        out += ["", "command on the master (each node runs it with its own --local-addr and XEON_CLUSTER_NODE):",
                f"  {launch.command_line()}",
                "  (<rank-wrapper>: records the program's pid and process group in the job directory, sets",
                "   GLOO_SOCKET_IFNAME towards MASTER_ADDR unless given, labels its lines with node and rank,",
                "   runs the program" + (" under taskset of the local rank's cores" if self.layout.pin else "")
                + " and names it when it fails)"]
        return out

    def _describe_rank_env(self) -> list[str]:
        """Every rank's environment, the user's --env by name: its values stay in the job's 0600 env file
        (cluster/job/launch.py ENV_FILE)."""
        user = self.launch.user_env
        return [f"  {k}=<--env, from the job's 0600 env file>" if k in user else f"  {k}={v}"
                for k, v in self.launch.rank_env.items()]

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
            out += ["", "environment of every rank:"] + self._describe_rank_env()
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


def _plan_launch(inv: Inventory, launcher: Launcher, *, job_id: str, layout: Layout, program: Sequence[str],
                 venv: str, extra_env: Mapping[str, str], job_env: Mapping[str, str] | None = None) -> LaunchPlan:
    hosts = [n.name for n in inv.nodes]
    if launcher.name == "torchrun":
        return plan_torchrun_launch(job_id=job_id, hosts=hosts, addresses=[n.private_address for n in inv.nodes],
                                    layout=layout, program=program, venv=venv, min_nodes=launcher.min_nodes,
                                    max_restarts=launcher.max_restarts, extra_env=extra_env, job_env=job_env)
    return plan_launch(flavour=get_profile(inv.profile).launcher, job_id=job_id, hosts=hosts,
                       master_addr=inv.master.private_address, layout=layout, program=program, venv=venv,
                       extra_env=extra_env, run_as_root=inv.user == "root", job_env=job_env)


def default_output_dir(inventory: Inventory, run_id: str) -> str:
    """A run's output directory when none is given: under the nodes' shared output root (every node sees
    it), else DEFAULT_OUTPUT_ROOT in each node's home."""
    return f"{inventory.shared_output_root or DEFAULT_OUTPUT_ROOT}/{run_id}"


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
                      restart: Restart | None = None, shared_root: str | None = None) -> list[str]:
    """`python -m training`'s arguments of the request's built-in job: its typed settings, the offline demo's
    data and settings, its other arguments, then what the plan adds (the instance type, the output
    directory, --resume). A `restart`'s batch replaces the per-rank batch and the accumulation. `shared_root`:
    the nodes' shared output root, where the demo's model is (demo.synthetic_data)."""
    job = request.builtin
    assert job is not None  # the caller asked for the built-in job's arguments
    batch = restart.batch if restart else None
    demo = synthetic_data(job.demo.task, job.demo.examples, "python", shared_root) if job.demo else None
    values: dict[str, Any] = {f.name: getattr(job, f.name) for f in dataclasses.fields(job)}
    values.update(demo.options if demo else {}, checkpoint_uri=request.checkpoint_uri,
                  batch_size=batch.per_rank if batch else job.batch_size,
                  checkpoint_minutes=(None if request.checkpoint_every_s is None
                                      else round(request.checkpoint_every_s / 60, 4)))
    args = typed_arguments(values) + [*(SYNTHETIC_ARGS[job.demo.task] if job.demo else ())]
    args += [w for arg in job.extra if not (batch and arg.flag in BATCH_FLAGS) for w in arg.words()]
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
    job is the run's id; a supervised relaunch gets a new one with its `restart`. `python`: the interpreter
    that writes the offline demo's data (default the profile's venv)."""
    job_id = job_id or request.run_id
    nodes = nodes or request.nodes
    output_dir = request.output_dir or default_output_dir(inventory, request.run_id)
    inv = inventory.first(nodes)
    profile = get_profile(inv.profile)
    machine, default_pin, notes = machine_for(inventory, nodes)
    asked = request.layout
    layout = plan_layout(machine, backend=profile.backend, ranks_per_node=asked.ranks_per_node,
                         threads_per_rank=asked.threads_per_rank, ccl_workers=asked.ccl_workers,
                         pin=default_pin if asked.pin is None else asked.pin)
    venv = venv_dir(profile)
    venv_python = f"{venv}/bin/python"
    common: dict[str, Any] = dict(inventory=inv, layout=layout, output_dir=output_dir, request=request,
                                  notes=tuple(notes) + layout.notes)
    own = request.own
    if own is not None:
        words: tuple[str, ...] = own.args
        env: dict[str, str] = {}
        if restart is not None:
            resume = resume_words(own.resume_arg) if own.resume_arg else ()
            words, env = restart_arguments(own.args, resume, restart.checkpoint)
        user = dataclasses.replace(own.program, args=words)
        job_env = {WORKDIR_VARIABLE: workdir_on_node(job_id), OUTPUT_DIR_VARIABLE: output_dir,
                   PYTHON_VARIABLE: venv_python, NOTICE_SIGNAL_VARIABLE: user.signal or NO_SIGNAL,
                   "PYTHONUNBUFFERED": "1"}
        launch = _plan_launch(inv, request.launcher, job_id=job_id, layout=layout, program=user.argv(venv_python),
                              venv=venv, extra_env={**request.env_map(), **env}, job_env=job_env)
        return JobPlan(launch=launch, training_args=user.args, prepare=(f"mkdir -p {shlex.quote(output_dir)}",),
                       user=user, copy=own.copy, install=own.install, **common)
    job = request.builtin
    assert job is not None  # a request runs the built-in job or your own program
    shared = inventory.shared_output_root
    args = builtin_arguments(request, output_dir=output_dir, instance_type=inventory.instance_type, restart=restart,
                             shared_root=shared)
    prepare = (synthetic_data(job.demo.task, job.demo.examples, python or venv_python, shared).prepare,) \
        if job.demo else ()
    launch = _plan_launch(inv, request.launcher, job_id=job_id, layout=layout,
                          program=[venv_python, "-m", "training", *args], venv=venv, extra_env=request.env_map())
    return JobPlan(launch=launch, training_args=tuple(args), prepare=prepare, **common)
