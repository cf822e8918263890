"""The mpirun command line and environment of a training job, for each MPI flavour.

Pure: this module returns data (argv, environment, the job script text) and runs nothing.
`node_setup/ssh/job.py` puts the script on the master and starts it. The shell itself lives in
cluster/shell/ (`job.sh`, `rank-wrapper.sh`); this module only fills in its values.

Flavours (`Profile.launcher` names one):

- `intel-mpi`: Intel MPI from the `impi-rt` wheel inside the node's venv (stock profile). Hydra
  starts the ranks over ssh once I_MPI_ROOT, PATH, LD_LIBRARY_PATH and FI_PROVIDER_PATH point
  into the venv (docs/design.md, "The local cluster"); it forwards the launcher's environment to
  every rank.
- `intel-mpi-oneccl`: the Intel MPI shipped inside the oneCCL bindings (intel profile), made
  active by sourcing the bindings' `env/setvars.sh`; plus oneCCL's own settings.
- `openmpi`: Open MPI's `mpirun`, which forwards nothing by itself: every variable goes with `-x`;
  ranks yield when idle (`--mca mpi_yield_when_idle 1`) so small machines do not busy-wait.

Every rank runs through a small `sh` wrapper (RANK_WRAPPER) that records its pid and process
group on its node, under the job directory, so `fab stop` can end exactly this job's processes
on every node, and that finds the network interface towards MASTER_ADDR for gloo.

Every value reaches the job script single-quoted (cluster.shell.render): a MASTER_ADDR or job id
holding `$(...)` or backticks stays a literal string. The only expansion is the node's own PATH and
LD_LIBRARY_PATH, which the script extends with the venv's directories (`LaunchPlan.prepends`). The
user's `--env` values are in neither the script nor any command line: the job's 0600 ENV_FILE holds
them (quoted the same way) and the launcher passes them on from its environment.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Sequence

from cluster import exit_codes, names, shell
from cluster.job.layout import Layout
from xeon_cluster import NOTICE_FILE_VARIABLE, NOTICE_SIGNAL_VARIABLE, OUTPUT_DIR_VARIABLE
from xeon_cluster.run import ACCELERATE_CPU_VARIABLE, OUTCOME_RECORD_PREFIX, RANK_DIR_VARIABLE

if TYPE_CHECKING:  # cluster/job/torchrun.py imports this module
    from cluster.job.torchrun import TorchrunPlan

FLAVOURS = ("intel-mpi", "intel-mpi-oneccl", "openmpi")
# What starts the ranks (`fab train --launcher`): the profile's MPI (above), or one torchrun per node
# started over SSH (cluster/job/torchrun.py plan_torchrun_launch).
LAUNCHERS = ("mpirun", "torchrun")
DEFAULT_LAUNCHER = LAUNCHERS[0]
TORCHRUN_FLAVOUR = "torchrun"  # LaunchPlan.flavour of a torchrun launch
# After a torchrun job's end, how long the job script waits for the other nodes' torchrun before it
# sends them TERM, and as long again before it closes their SSH sessions (cluster/shell/job-torchrun.sh).
TORCHRUN_END_WAIT_SECONDS = 20
# Where jobs live on every node, relative to the SSH user's home directory.
JOBS_DIR = ".xeon-cluster/jobs"
# The variable that marks every process of a job (ranks and the launcher), for status and stop.
JOB_MARKER = "XEON_CLUSTER_JOB"
# What the rank wrapper exports on every rank (PyTorch's own launcher sets the same names), and the
# variables of a user's program (`fab train --script`) that the wrapper reads or sets (the ones the
# program itself reads are named in xeon_cluster/__init__.py, which the program imports).
TORCH_LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
                          "MASTER_ADDR", "MASTER_PORT")
WORKDIR_VARIABLE = "XEON_CLUSTER_WORKDIR"
PYTHON_VARIABLE = "XEON_CLUSTER_PYTHON"
# In the job directory on the master, mode 0600 (cluster/job/jobcommands.py file_mode): the user's
# `--env` values as `export NAME='value'` lines. The job script reads it just before the launcher, which
# passes them on (Intel MPI `-genvall`, Open MPI `-x NAME`; torchrun's node command reads it on its stdin),
# so no value is on a command line (/proc/<pid>/cmdline is world-readable) nor in the 0644 run.sh.
ENV_FILE = "env"
# Set by the launch itself: `--env` may not set them.
RESERVED_VARIABLES = (*TORCH_LAUNCH_VARIABLES, JOB_MARKER, OUTPUT_DIR_VARIABLE, NOTICE_FILE_VARIABLE,
                      WORKDIR_VARIABLE, PYTHON_VARIABLE, NOTICE_SIGNAL_VARIABLE, RANK_DIR_VARIABLE)
# Every rank, under every launcher, runs on CPUs: accelerate (and Trainer, which uses it) forms its
# multi-CPU world from RANK/WORLD_SIZE (or MPI's variables) only when told it runs on CPU; without
# this, on a machine with no GPU, `Accelerator()` gives DistributedType.NO and each rank trains
# alone. It is what `accelerate launch --cpu` sets; the rank runner (xeon_cluster/run.py) makes a bare
# PartialState() read it too. `--env ACCELERATE_USE_CPU=false` still overrides it.
CPU_WORLD_ENV = {ACCELERATE_CPU_VARIABLE: "true"}
MASTER_PORT_BASE = 29500
MASTER_PORT_SPAN = 2000

# Runs as `sh -c RANK_WRAPPER xeon-rank PROGRAM ARGS...` on every node (cluster/shell/rank-wrapper.sh):
# records "pid pgid host" ("-" for a pgid it could not read) in ~/.xeon-cluster/jobs/<job>/ranks/rank-<rank>,
# picks GLOO_SOCKET_IFNAME (the interface that holds MASTER_ADDR on the master, the one routing to it
# elsewhere) unless it is set, then runs the program (the recorded pid is the program's).
RANK_WRAPPER = shell.render("rank-wrapper.sh", {"JOBS_DIR": JOBS_DIR})

# What the job script does on the master before mpirun (LaunchPlan.setup; job.sh does it).
ONECCL_ENV_SETUP = "source env/setvars.sh of the oneCCL bindings in the venv (their Intel MPI and oneCCL)"
HYDRA_IFACE_SETUP = ("I_MPI_HYDRA_IFACE=<the interface holding MASTER_ADDR> unless set "
                     "(Hydra's proxies call the master back at that address)")
SETUP_STEPS = (ONECCL_ENV_SETUP, HYDRA_IFACE_SETUP)
# PATH-like variables the job script extends (directories in front of the node's own value).
PREPENDED = ("PATH", "LD_LIBRARY_PATH")
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Rank variables that only Intel MPI reads (the layout's pinning, the wait mode below): another
# launcher (cluster/job/torchrun.py) leaves them out.
INTEL_MPI_PREFIX = "I_MPI_"
# oneCCL's transport for the ccl backend (intel profile), whichever launcher starts the ranks.
CCL_TRANSPORT_ENV = {"CCL_ATL_TRANSPORT": "ofi"}
# Small nodes' MPI ranks sleep instead of busy-polling (cluster/job/layout.py SMALL_NODE_CORES).
SMALL_NODE_MPI_ENV = {"I_MPI_WAIT_MODE": "1"}


def base_rank_env(layout: Layout) -> dict[str, str]:
    """What every rank gets before the launcher's own choices: the layout's variables and CPU_WORLD_ENV."""
    return {**layout.rank_env(), **CPU_WORLD_ENV}


def is_variable_name(key: str) -> bool:
    """True when `key` can be an environment variable's name (letters, digits, '_'; no leading digit)."""
    return bool(_VARIABLE_NAME.fullmatch(key))


class LaunchError(ValueError):
    """A launch setting that cannot work; the message says what is allowed."""


def env_pairs(text: str, example: str = "FI_PROVIDER=tcp CCL_LOG_LEVEL=info") -> dict[str, str]:
    """`--env 'K=V K2=V2'` as a mapping (split like a shell would); LaunchError naming --env otherwise."""
    try:
        items = shlex.split(text or "")
    except ValueError as exc:
        raise LaunchError(f"--env: cannot split {text!r} like a shell would ({exc}); check its quotes") from None
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise LaunchError(f"--env: {item!r} is not KEY=VALUE (e.g. --env '{example}')")
        pairs[key] = value
    return pairs


def job_dir(job_id: str) -> str:
    """The job's directory relative to the SSH user's home (the same path on every node)."""
    return f"{JOBS_DIR}/{job_id}"


def master_port_for(job_id: str) -> int:
    """A MASTER_PORT derived from the job id, so that concurrent or orphaned jobs differ."""
    digest = int(hashlib.sha256(job_id.encode()).hexdigest(), 16)
    return MASTER_PORT_BASE + digest % MASTER_PORT_SPAN


def rank_hosts(hosts: Sequence[str], ranks_per_node: int) -> tuple[str, ...]:
    """The node of each rank, in rank order: ranks are placed in blocks of ranks_per_node."""
    return tuple(host for host in hosts for _ in range(ranks_per_node))


def hostfile_text(hosts: Sequence[str], flavour: str, ranks_per_node: int) -> str:
    """The job's hostfile: one node per line, master first (Open MPI also wants the slots)."""
    for host in hosts:  # checked where the nodes were made; a line break here would add a host
        try:
            names.alias(host, "hostfile host")
        except names.UnsafeValue as exc:
            raise LaunchError(str(exc)) from None
    if flavour == "openmpi":
        return "".join(f"{h} slots={ranks_per_node}\n" for h in hosts)
    return "".join(f"{h}\n" for h in hosts)


@dataclass(frozen=True)
class LaunchPlan:
    flavour: str
    job_id: str
    hosts: tuple[str, ...]  # node names (ssh aliases on the master), master first
    master_addr: str
    master_port: int
    layout: Layout
    argv: tuple[str, ...]  # mpirun ... sh -c WRAPPER xeon-rank PROGRAM...
    exports: dict[str, str]  # exported on the master before mpirun, literally (never expanded)
    rank_env: dict[str, str]  # what every rank gets on top (inside argv, but for user_env's values)
    prepends: dict[str, str] = field(default_factory=dict)  # PATH-like (PREPENDED): dirs put in front
    setup: tuple[str, ...] = ()  # steps of SETUP_STEPS the job script takes before mpirun
    hostfile: str = ""
    program: tuple[str, ...] = field(default_factory=tuple)
    venv: str = ""  # the node's venv (the oneCCL setup finds the bindings with its Python)
    # torchrun (flavour TORCHRUN_FLAVOUR): node name -> the shell command that node runs (its torchrun),
    # and the cluster.job.torchrun.TorchrunPlan they come from
    node_commands: dict[str, str] = field(default_factory=dict)
    stop_command: str = ""  # what ends one node's torchrun
    torchrun: TorchrunPlan | None = None
    user_env: dict[str, str] = field(default_factory=dict)  # the user's --env: its values in ENV_FILE only

    @property
    def launcher(self) -> str:
        return "torchrun" if self.flavour == TORCHRUN_FLAVOUR else "mpirun"
    @property
    def env(self) -> dict[str, str]:
        """mpirun's environment on the master, for reading: PATH-like values show what they extend."""
        return {**self.exports, **{key: f"{dirs}:${key}" for key, dirs in self.prepends.items()}}

    @property
    def world_size(self) -> int:
        return len(self.hosts) * self.layout.ranks_per_node

    @property
    def rank_hosts(self) -> tuple[str, ...]:
        return rank_hosts(self.hosts, self.layout.ranks_per_node)

    @property
    def job_dir(self) -> str:
        return job_dir(self.job_id)

    def env_file(self) -> str:
        """ENV_FILE's text: the user's --env as `export NAME='value'` lines (cluster.shell quoting)."""
        return "".join(f"{line}\n" for line in shell.header(self.user_env, bash=False, exported=self.user_env))

    def command_line(self, argv: Sequence[str] | None = None) -> str:
        """argv as one shell-quoted line (the wrapper shown as `<rank-wrapper>` for reading)."""
        return " ".join("<rank-wrapper>" if a == RANK_WRAPPER else shlex.quote(a) for a in (argv or self.argv))

    def script(self) -> str:
        """The job script the master runs detached (cluster/shell/job.sh with this plan's values).

        It logs, records its pid and mpirun's exit code in the job directory; see job.sh.
        """
        if self.flavour == TORCHRUN_FLAVOUR:
            return self._torchrun_script()
        unknown = (set(self.prepends) - set(PREPENDED)) | (set(self.setup) - set(SETUP_STEPS))
        if unknown:
            raise LaunchError(f"the job script cannot do {sorted(unknown)}; it knows {PREPENDED + SETUP_STEPS}")
        values: dict[str, str | Sequence[str]] = {
            "JOB_DIR": self.job_dir,
            "WORLD_SIZE": str(self.world_size),
            "RANKS_PER_NODE": str(self.layout.ranks_per_node),
            **{f"{key}_PREPEND": self.prepends.get(key, "") for key in PREPENDED},
            "ONECCL_PYTHON": f"{self.venv}/bin/python" if ONECCL_ENV_SETUP in self.setup else "",
            "HYDRA_IFACE": "yes" if HYDRA_IFACE_SETUP in self.setup else "no",
            "INTERRUPTED": str(exit_codes.INTERRUPTED),
            "OUTCOME_PREFIX": OUTCOME_RECORD_PREFIX,
            "ENV_FILE": f"{self.job_dir}/{ENV_FILE}",
            "MPIRUN": self.argv,  # the positional parameters
        }
        clash = set(values) & set(self.exports)
        if clash:
            raise LaunchError(f"environment: {sorted(clash)} are names the job script uses itself")
        return shell.render("job.sh", {**self.exports, **values}, exported=self.exports)

    def _torchrun_script(self) -> str:
        """cluster/shell/job-torchrun.sh: every node's torchrun started from the master (see there)."""
        plan = self.torchrun
        assert plan is not None  # the torchrun flavour carries its plan
        values: dict[str, str | Sequence[str]] = {
            "JOB_DIR": self.job_dir, "WORLD_SIZE": str(self.world_size),
            "RANKS_PER_NODE": str(self.layout.ranks_per_node), "NNODES": plan.nnodes,
            "ELASTIC": "yes" if plan.min_nodes is not None else "no",
            "NODES": list(self.node_commands), "COMMANDS": list(self.node_commands.values()),
            "STOP_COMMAND": self.stop_command, "END_WAIT": str(TORCHRUN_END_WAIT_SECONDS),
            "ENV_FILE": f"{self.job_dir}/{ENV_FILE}",
            "INTERRUPTED": str(exit_codes.INTERRUPTED), "OUTCOME_PREFIX": OUTCOME_RECORD_PREFIX,
        }
        clash = set(values) & set(self.exports)
        if clash:
            raise LaunchError(f"environment: {sorted(clash)} are names the job script uses itself")
        return shell.render("job-torchrun.sh", {**self.exports, **values}, exported=self.exports)


def plan_launch(*, flavour: str, job_id: str, hosts: Sequence[str], master_addr: str, layout: Layout,
                program: Sequence[str], venv: str, master_port: int | None = None,
                extra_env: Mapping[str, str] | None = None, run_as_root: bool = False,
                job_env: Mapping[str, str] | None = None) -> LaunchPlan:
    """The full launch of `program` (argv run by every rank) on `hosts` (master first).

    `venv` is the node's Python environment (cluster.node.profiles.venv_dir); `extra_env` adds or
    overrides rank variables (the user's `--env`; the RESERVED_VARIABLES are refused); `job_env`
    holds the launch's own rank variables (a user's program: its workdir, output dir, notice signal).
    """
    if flavour not in FLAVOURS:
        raise LaunchError(f"MPI flavour: {flavour!r} is unknown; allowed: {', '.join(FLAVOURS)}")
    if not hosts:
        raise LaunchError("hosts: at least one node is needed (the master)")
    if len(set(hosts)) != len(hosts):
        raise LaunchError(f"hosts: node names repeat: {list(hosts)}")
    if not program:
        raise LaunchError("program: the command every rank runs is empty")
    port = master_port_for(job_id) if master_port is None else master_port
    if not 1024 <= port <= 65535:
        raise LaunchError(f"MASTER_PORT: {port} is out of range; allowed 1024 to 65535")
    world = len(hosts) * layout.ranks_per_node
    hostfile = f"{job_dir(job_id)}/hosts"  # relative: the job script runs from $HOME

    exports: dict[str, str] = {JOB_MARKER: job_id, "MASTER_ADDR": master_addr, "MASTER_PORT": str(port)}
    prepends = {"PATH": f"{venv}/bin"}
    setup: list[str] = []
    rank_env = base_rank_env(layout)
    if flavour == "intel-mpi":
        exports.update({"I_MPI_ROOT": venv, "FI_PROVIDER_PATH": f"{venv}/lib"})
        prepends.update({"PATH": f"{venv}/bin:{venv}/bin/libfabric", "LD_LIBRARY_PATH": f"{venv}/lib"})
    elif flavour == "intel-mpi-oneccl":
        setup.append(ONECCL_ENV_SETUP)
        for key, value in CCL_TRANSPORT_ENV.items():
            rank_env.setdefault(key, value)
    if flavour != "openmpi":
        setup.append(HYDRA_IFACE_SETUP)
    if layout.small_node and flavour != "openmpi":
        rank_env.update(SMALL_NODE_MPI_ENV)
    reserved = sorted(set(extra_env or {}) & set(RESERVED_VARIABLES))
    if reserved:
        raise LaunchError(f"--env: {reserved[0]} is set by the launch itself; allowed: any other variable")
    rank_env.update(job_env or {})
    user_env = dict(extra_env or {})
    rank_env.update(user_env)
    for key in rank_env:
        if not is_variable_name(key):
            raise LaunchError(f"environment: {key!r} is not a valid variable name")
    on_line = {key: value for key, value in rank_env.items() if key not in user_env}

    wrapper = ("sh", "-c", RANK_WRAPPER, "xeon-rank", *program)
    if flavour == "openmpi":
        argv = ["mpirun", "--hostfile", hostfile, "-np", str(world),
                "--map-by", f"ppr:{layout.ranks_per_node}:node", "--bind-to", "none",
                "--tag-output", "--mca", "mpi_yield_when_idle", "1"]
        if run_as_root:
            argv.append("--allow-run-as-root")
        for key in [*exports, *prepends]:
            argv += ["-x", key]
        for key, value in on_line.items():
            argv += ["-x", f"{key}={value}"]
        for key in user_env:  # the value from mpirun's environment: the job script read ENV_FILE
            argv += ["-x", key]
    else:
        argv = ["mpirun", "-f", hostfile, "-n", str(world), "-ppn", str(layout.ranks_per_node),
                "-prepend-rank"]
        for key, value in on_line.items():
            argv += ["-genv", key, value]
        if user_env:  # the values from mpirun's environment (the job script read ENV_FILE): all of it, as by
            argv.append("-genvall")  # default (a -genvlist would pass only the names it lists)
    argv += wrapper
    return LaunchPlan(flavour=flavour, job_id=job_id, hosts=tuple(hosts), master_addr=master_addr,
                      master_port=port, layout=layout, argv=tuple(argv),
                      exports=exports, rank_env=rank_env, prepends=prepends, setup=tuple(setup),
                      hostfile=hostfile_text(hosts, flavour, layout.ranks_per_node),
                      program=tuple(program), venv=venv, user_env=user_env)

