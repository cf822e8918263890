"""torchrun's command line and every rank's environment, from the rank layout (pure).

One `torchrun` runs per node (or per Kubernetes pod) and starts `--nproc-per-node` ranks there;
the agents meet at a c10d rendezvous on the first node (`--rdzv-endpoint HOST:PORT`, the same
`--rdzv-id` everywhere) and torchrun gives each rank its RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT. With a minimum node count the node range becomes `MIN:MAX` and
torchrun's elastic agent restarts the ranks (up to `--max-restarts` times) when membership
changes.

The environment every rank gets is the layout's (cluster/job/layout.py: threads, allocator, oneCCL
workers) and accelerate's CPU world (cluster/job/launch.py base_rank_env), without what only an MPI
launcher can do:

- Intel MPI's variables (`I_MPI_*`: pinning domains, wait mode) are left out: no MPI runs.
- torchrun gives a rank no CPU domain, so core ids cannot be handed out: `CCL_WORKER_AFFINITY`
  is left out (oneCCL then places its workers itself), and `KMP_AFFINITY` (pack the threads from
  the first core of the process's CPUs) is set only with one rank per node, where that is right;
  with several ranks it would pack them all onto the same cores. `KMP_BLOCKTIME` is set always.
- the ccl backend gets oneCCL's transport (cluster/job/launch.py CCL_TRANSPORT_ENV).
- torchrun itself gets AGENT_ENV: a new store for each rendezvous round, so that ranks restarted by
  the elastic agent never read their peers' addresses from the round before.

Used by `fab k8s-job` (the PyTorchJob's command; a TrainJob's pods take the rendezvous from Trainer's
torch policy instead, cluster/job/trainjob.py); the program is the
built-in job (`-m training ARGS`, cluster/job/job_args.py) or a user's script (`path.py ARGS`).

`fab train --launcher torchrun` (plan_torchrun_launch) runs the same command on bare metal: one
torchrun per node, started over SSH from the job script on the master (cluster/shell/job-torchrun.sh),
each with `--local-addr` (its private address: the nodes need not resolve each other's names) and
`--no-python` around the rank wrapper (cluster/shell/rank-wrapper.sh: pid records for fab stop,
labelled lines, the failed rank's exit code, and with pinning on, `taskset` of the local rank's
cores from XEON_CLUSTER_CPUS). The rendezvous is on the master, at the job's own port.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from cluster.job.launch import (CCL_TRANSPORT_ENV, INTEL_MPI_PREFIX, JOB_MARKER, RANK_WRAPPER,
                            RESERVED_VARIABLES, TORCHRUN_FLAVOUR, LaunchError, LaunchPlan, base_rank_env,
                            is_variable_name, job_dir, master_port_for)
from cluster.job.layout import KMP_AFFINITY, KMP_BLOCKTIME, Layout

# Under `fab train --launcher torchrun`: the node's inventory name (the rank wrapper labels lines
# with it) and, with pinning on, each local rank's cores (space-separated lists, local rank order).
NODE_VARIABLE = "XEON_CLUSTER_NODE"
CPUS_VARIABLE = "XEON_CLUSTER_CPUS"
AGENT_FILE = "agent"  # in the job directory on every node: "pid" of the node's torchrun (fab stop ends it first)

RDZV_BACKEND = "c10d"
# For torchrun itself (it passes its environment on to the ranks): each rendezvous round gets a store
# of its own, served by that round's rank 0. torch's default shares the agent's store across rounds,
# where the ranks' keys outlive them: after a restart a rank that comes first reads the address its
# peer had in the round before and fails with "Connection refused" (tests/training/test_torchrun_restart.py).
AGENT_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
RDZV_PORT = 29400  # torchrun's own default for the c10d rendezvous
DEFAULT_MAX_RESTARTS = 3  # elastic runs only (a minimum node count given)
# What may name the rendezvous host: a DNS name or an IPv4 address.
_HOST = re.compile(r"^(?=.{1,253}\Z)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
                   r"[A-Za-z0-9])?)*\Z")
_RDZV_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


class TorchrunError(ValueError):
    """A torchrun setting that cannot work; the message names it, the value and what is allowed."""


@dataclass(frozen=True)
class TorchrunPlan:
    argv: tuple[str, ...]  # torchrun OPTIONS PROGRAM ARGS
    env: dict[str, str]  # every rank's environment (torchrun passes its own on to the ranks)
    nodes: int  # the most nodes
    min_nodes: int | None  # None: a fixed node count
    nproc_per_node: int
    rdzv_endpoint: str
    rdzv_id: str
    max_restarts: int

    @property
    def nnodes(self) -> str:
        """`--nnodes`: N, or MIN:MAX for an elastic run."""
        return f"{self.min_nodes}:{self.nodes}" if self.min_nodes is not None else str(self.nodes)

    @property
    def world_size(self) -> int:
        """Ranks when every node takes part."""
        return self.nodes * self.nproc_per_node


def torchrun_env(layout: Layout, extra_env: Mapping[str, str] | None = None, *,
                 bound: bool = False) -> dict[str, str]:
    """Every rank's environment under torchrun, from `layout` (see the module's docstring).

    `bound`: each rank runs inside its own cores (the rank wrapper's taskset), so packing its
    threads from the first of them (KMP_AFFINITY) is right however many ranks a node has.
    """
    env = {key: value for key, value in base_rank_env(layout).items()
           if not key.startswith(INTEL_MPI_PREFIX) and key not in ("CCL_WORKER_AFFINITY", "KMP_AFFINITY")}
    env["KMP_BLOCKTIME"] = KMP_BLOCKTIME
    env.update(AGENT_ENV)
    if layout.ranks_per_node == 1 or bound:
        env["KMP_AFFINITY"] = KMP_AFFINITY
    if layout.backend == "ccl":
        for key, value in CCL_TRANSPORT_ENV.items():
            env.setdefault(key, value)
    for key, value in (extra_env or {}).items():
        if not is_variable_name(key):
            raise TorchrunError(f"--env: {key!r} is not a valid variable name; allowed: letters, digits and '_', "
                                "not starting with a digit")
        env[key] = value
    return env


def check_program(program: Sequence[str]) -> tuple[str, ...]:
    """`program` if torchrun can run it: `-m MODULE ARGS...` or `SCRIPT ARGS...`."""
    program = tuple(program)
    if not program:
        raise TorchrunError("program: empty; allowed: -m MODULE [ARGS] or SCRIPT.py [ARGS]")
    if program[0] == "-m":
        if len(program) < 2 or not _MODULE.match(program[1]):
            raise TorchrunError(f"program: {' '.join(program[:2])!r} does not name a module; allowed: -m MODULE "
                                "(e.g. -m training)")
    elif program[0].startswith("-") or not program[0].strip():
        raise TorchrunError(f"program: {program[0]!r} is not a script; allowed: -m MODULE [ARGS] or SCRIPT.py [ARGS]")
    return program


def plan_torchrun(*, layout: Layout, nodes: int, program: Sequence[str], rdzv_host: str, rdzv_id: str,
                  rdzv_port: int = RDZV_PORT, min_nodes: int | None = None, max_restarts: int | None = None,
                  torchrun: str = "torchrun", extra_env: Mapping[str, str] | None = None,
                  no_python: bool = False, bound: bool = False) -> TorchrunPlan:
    """The torchrun command every node runs and the environment of its ranks.

    `nodes` is the node count (the most, with `min_nodes`); `rdzv_host` is where the first node's
    agent is reached by the others; `max_restarts` applies to elastic runs (default
    DEFAULT_MAX_RESTARTS) and must be unset otherwise.
    """
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise TorchrunError(f"--nodes: {nodes!r} is not allowed; give 1 or more")
    if min_nodes is not None and (isinstance(min_nodes, bool) or not isinstance(min_nodes, int)
                                  or not 1 <= min_nodes <= nodes):
        raise TorchrunError(f"--min-nodes: {min_nodes!r} is not allowed; allowed 1 to {nodes} (--nodes)")
    if max_restarts is not None and min_nodes is None:
        raise TorchrunError(f"--max-restarts: {max_restarts} is only for an elastic run; give --min-nodes too")
    if max_restarts is not None and (isinstance(max_restarts, bool) or not isinstance(max_restarts, int)
                                     or max_restarts < 0):
        raise TorchrunError(f"--max-restarts: {max_restarts!r} is not allowed; give 0 or more")
    if not _HOST.match(rdzv_host or ""):
        raise TorchrunError(f"rendezvous host: {rdzv_host!r} is not a host name or address")
    if isinstance(rdzv_port, bool) or not isinstance(rdzv_port, int) or not 1024 <= rdzv_port <= 65535:
        raise TorchrunError(f"rendezvous port: {rdzv_port!r} is out of range; allowed 1024 to 65535")
    if not _RDZV_ID.match(rdzv_id or ""):
        raise TorchrunError(f"rendezvous id: {rdzv_id!r} is not allowed; allowed: letters, digits, '.', '_' and '-' "
                            "(up to 128, starting with a letter or digit)")
    program = check_program(program)
    restarts = 0 if min_nodes is None else (DEFAULT_MAX_RESTARTS if max_restarts is None else max_restarts)
    endpoint = f"{rdzv_host}:{rdzv_port}"
    plan = TorchrunPlan(argv=(), env=torchrun_env(layout, extra_env, bound=bound), nodes=nodes, min_nodes=min_nodes,
                        nproc_per_node=layout.ranks_per_node, rdzv_endpoint=endpoint, rdzv_id=rdzv_id,
                        max_restarts=restarts)
    argv = [torchrun, "--nnodes", plan.nnodes, "--nproc-per-node", str(layout.ranks_per_node),
            "--rdzv-backend", RDZV_BACKEND, "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id]
    if min_nodes is not None:
        argv += ["--max-restarts", str(restarts)]
    if no_python:
        argv.append("--no-python")
    return replace(plan, argv=(*argv, *program))


def node_argv(plan: TorchrunPlan, local_addr: str) -> tuple[str, ...]:
    """`plan.argv` for one node: `--local-addr` (the address the other agents reach it at) added after the
    torchrun executable, `plan.argv[0]`."""
    if not _HOST.match(local_addr or ""):
        raise TorchrunError(f"node address: {local_addr!r} is not a host name or address")
    return (plan.argv[0], "--local-addr", local_addr, *plan.argv[1:])


def plan_torchrun_launch(*, job_id: str, hosts: Sequence[str], addresses: Sequence[str], layout: Layout,
                         program: Sequence[str], venv: str, min_nodes: int | None = None,
                         max_restarts: int | None = None, extra_env: Mapping[str, str] | None = None,
                         job_env: Mapping[str, str] | None = None, rdzv_port: int | None = None) -> LaunchPlan:
    """`fab train --launcher torchrun`: one torchrun per node (`hosts`, master first, at the private
    `addresses`), the rendezvous on the master, every rank through the rank wrapper.

    Returns a LaunchPlan (flavour TORCHRUN_FLAVOUR) whose script() starts every node's command
    (node_commands) from the master; `extra_env` is the user's --env (RESERVED_VARIABLES refused),
    `job_env` the launch's own rank variables (a user's program).
    """
    if not hosts or len(hosts) != len(addresses):
        raise LaunchError("hosts: one private address per node is needed, master first")
    if len(set(hosts)) != len(hosts):
        raise LaunchError(f"hosts: node names repeat: {list(hosts)}")
    reserved = sorted(set(extra_env or {}) & (set(RESERVED_VARIABLES) | {NODE_VARIABLE, CPUS_VARIABLE}))
    if reserved:
        raise LaunchError(f"--env: {reserved[0]} is set by the launch itself; allowed: any other variable")
    port = master_port_for(job_id) if rdzv_port is None else rdzv_port
    bound = layout.pin
    try:
        plan = plan_torchrun(layout=layout, nodes=len(hosts), program=("sh", "-c", RANK_WRAPPER, "xeon-rank", *program),
                             rdzv_host=addresses[0], rdzv_id=job_id, rdzv_port=port,
                             min_nodes=min_nodes, max_restarts=max_restarts, torchrun=f"{venv}/bin/torchrun",
                             extra_env=job_env, no_python=True, bound=bound)
    except TorchrunError as exc:
        raise LaunchError(str(exc)) from None
    user_env = dict(extra_env or {})
    for key in user_env:
        if not is_variable_name(key):
            raise LaunchError(f"--env: {key!r} is not a valid variable name; allowed: letters, digits and '_', "
                              "not starting with a digit")
    env = {JOB_MARKER: job_id, **plan.env, **user_env}
    if bound:
        env[CPUS_VARIABLE] = " ".join(",".join(str(c) for c in slot.cores) for slot in layout.slots)
    agent = shlex.quote(f"{job_dir(job_id)}/{AGENT_FILE}")
    commands = {}
    for host, address in zip(hosts, addresses):
        assignments = shlex.join(f"{k}={v}" for k, v in {**env, NODE_VARIABLE: host}.items() if k not in user_env)
        # the user's --env from stdin (the job script gives each node the job's ENV_FILE there), then torchrun
        commands[host] = (f"cd && echo $$ > {agent} && . /dev/stdin && exec env {assignments} "
                          f"{shlex.join(node_argv(plan, address))} </dev/null")
    exports = {JOB_MARKER: job_id, "MASTER_ADDR": addresses[0], "MASTER_PORT": str(port)}
    return LaunchPlan(flavour=TORCHRUN_FLAVOUR, job_id=job_id, hosts=tuple(hosts), master_addr=addresses[0],
                      master_port=port, layout=layout, argv=node_argv(plan, addresses[0]), exports=exports,
                      rank_env=env, hostfile="".join(f"{h}\n" for h in hosts), program=tuple(program), venv=venv,
                      node_commands=commands, torchrun=plan,
                      stop_command=f"cd && kill -TERM \"$(cat {agent})\"", user_env=user_env)
