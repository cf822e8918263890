"""The mpirun command line and environment of a training job, for each MPI flavour.

Pure: this module returns data (argv, environment, the job script text) and runs nothing.
`node_setup/job.py` puts the script on the master and starts it.

Flavours (`Profile.launcher` names one):

- `intel-mpi`: Intel MPI from the `impi-rt` wheel inside the node's venv (stock profile). Hydra
  starts the ranks over ssh once I_MPI_ROOT, PATH, LD_LIBRARY_PATH and FI_PROVIDER_PATH point
  into the venv (DESIGN.md section 6); it forwards the launcher's environment to every rank.
- `intel-mpi-oneccl`: the Intel MPI shipped inside the oneCCL bindings (intel profile), made
  active by sourcing the bindings' `env/setvars.sh`; plus oneCCL's own settings.
- `openmpi`: Open MPI's `mpirun`, which forwards nothing by itself: every variable goes with `-x`;
  ranks yield when idle (`--mca mpi_yield_when_idle 1`) so small machines do not busy-wait.

Every rank runs through a small `sh` wrapper (RANK_WRAPPER) that records its pid and process
group on its node, under the job directory, so `fab stop` can end exactly this job's processes
on every node, and that finds the network interface towards MASTER_ADDR for gloo.
"""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from cluster.layout import Layout

FLAVOURS = ("intel-mpi", "intel-mpi-oneccl", "openmpi")
# Where jobs live on every node, relative to the SSH user's home directory.
JOBS_DIR = ".xeon-cluster/jobs"
# The variable that marks every process of a job (ranks and the launcher), for status and stop.
JOB_MARKER = "XEON_CLUSTER_JOB"
MASTER_PORT_BASE = 29500
MASTER_PORT_SPAN = 2000

# Runs as `sh -c RANK_WRAPPER xeon-rank PROGRAM ARGS...` on every node: records "pid pgid host"
# in ~/.xeon-cluster/jobs/<job>/ranks/rank-<rank>, picks GLOO_SOCKET_IFNAME (the interface that
# holds MASTER_ADDR on the master, the one routing to it elsewhere) unless it is set, then becomes
# the program (exec: the recorded pid is the rank's).
RANK_WRAPPER = r"""d="$HOME/JOBS_DIR/$XEON_CLUSTER_JOB/ranks"
r="${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-0}}"
mkdir -p "$d" && echo "$$ $(awk '{print $5}' /proc/$$/stat) $(hostname)" > "$d/rank-$r"
if [ -z "${GLOO_SOCKET_IFNAME:-}" ] && command -v ip >/dev/null 2>&1; then
  GLOO_SOCKET_IFNAME=$(ip -o -4 addr show | awk -v a="$MASTER_ADDR" '{split($4, p, "/"); if (p[1] == a) {print $2; exit}}')
  [ -n "$GLOO_SOCKET_IFNAME" ] || GLOO_SOCKET_IFNAME=$(ip -o route get "$MASTER_ADDR" | sed -n 's/.* dev \([^ ]*\).*/\1/p')
  export GLOO_SOCKET_IFNAME
fi
exec "$@"
""".replace("JOBS_DIR", JOBS_DIR)


# On the master, before mpirun: Hydra's remote proxies call the launching node back by its host
# name, which other nodes may not resolve (the local cluster's nodes only know themselves);
# naming the interface that holds MASTER_ADDR makes Hydra hand out that address instead.
HYDRA_IFACE_SETUP = (
    'if [ -z "${I_MPI_HYDRA_IFACE:-}" ] && command -v ip >/dev/null 2>&1; then '
    'I_MPI_HYDRA_IFACE=$(ip -o -4 addr show | awk -v a="$MASTER_ADDR" '
    '\'{split($4, p, "/"); if (p[1] == a) {print $2; exit}}\'); '
    '[ -n "$I_MPI_HYDRA_IFACE" ] && export I_MPI_HYDRA_IFACE || unset I_MPI_HYDRA_IFACE; fi')


class LaunchError(ValueError):
    """A launch setting that cannot work; the message says what is allowed."""


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
    env: dict[str, str]  # exported on the master before mpirun; values are shell words
    rank_env: dict[str, str]  # what every rank gets on top (also inside argv)
    setup: tuple[str, ...] = ()  # shell lines run on the master before mpirun
    hostfile: str = ""
    program: tuple[str, ...] = field(default_factory=tuple)

    @property
    def world_size(self) -> int:
        return len(self.hosts) * self.layout.ranks_per_node

    @property
    def rank_hosts(self) -> tuple[str, ...]:
        return rank_hosts(self.hosts, self.layout.ranks_per_node)

    @property
    def job_dir(self) -> str:
        return job_dir(self.job_id)

    def command_line(self) -> str:
        """argv as one shell-quoted line (the wrapper shown as `<rank-wrapper>` for reading)."""
        return " ".join("<rank-wrapper>" if a == RANK_WRAPPER else shlex.quote(a) for a in self.argv)

    def script(self) -> str:
        """The job script the master runs detached: log, pid and exit code in the job directory.

        It runs from $HOME so that every rank's working directory exists on every node.
        """
        d = '"$HOME/' + self.job_dir + '"'
        lines = [
            "#!/bin/sh",
            f"# xeon-cluster job {self.job_id}: {self.world_size} ranks on {', '.join(self.hosts)}",
            "cd \"$HOME\" || exit 1",
            f"echo $$ > {d}/pid",
            f"exec >> {d}/log 2>&1",
        ]
        lines += [f"export {k}={_shell_value(v)}" for k, v in self.env.items()]
        lines += list(self.setup)
        lines += [
            f"echo \"[xeon-cluster] job {self.job_id} started $(date -u +%Y-%m-%dT%H:%M:%SZ): "
            f"{self.world_size} ranks, {self.layout.ranks_per_node} per node, MASTER_ADDR=$MASTER_ADDR "
            f"MASTER_PORT=$MASTER_PORT\"",
            " ".join(shlex.quote(a) for a in self.argv),
            "code=$?",
            f"echo \"[xeon-cluster] job {self.job_id} exited with code $code\"",
            f"echo $code > {d}/exit_code.tmp && mv {d}/exit_code.tmp {d}/exit_code",
            "exit $code",
        ]
        return "\n".join(lines) + "\n"


def _shell_value(value: str) -> str:
    """Double-quote a value so that `$PATH`-style references expand and nothing else does."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`")
    return f'"{escaped}"'


def plan_launch(*, flavour: str, job_id: str, hosts: Sequence[str], master_addr: str, layout: Layout,
                program: Sequence[str], venv: str, master_port: int | None = None,
                extra_env: Mapping[str, str] | None = None, run_as_root: bool = False) -> LaunchPlan:
    """The full launch of `program` (argv run by every rank) on `hosts` (master first).

    `venv` is the node's Python environment (cluster.profiles.venv_dir); `extra_env` adds or
    overrides rank variables (the user's `--env`).
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

    env: dict[str, str] = {JOB_MARKER: job_id, "MASTER_ADDR": master_addr, "MASTER_PORT": str(port)}
    setup: list[str] = []
    rank_env = dict(layout.rank_env())
    if flavour == "intel-mpi":
        env.update({
            "I_MPI_ROOT": venv,
            "PATH": f"{venv}/bin:{venv}/bin/libfabric:$PATH",
            "LD_LIBRARY_PATH": f"{venv}/lib:${{LD_LIBRARY_PATH:-}}",
            "FI_PROVIDER_PATH": f"{venv}/lib",
        })
    elif flavour == "intel-mpi-oneccl":
        env["PATH"] = f"{venv}/bin:$PATH"
        setup += [
            # find_spec locates the bindings without importing torch
            f'ccl_dir=$("{venv}/bin/python" -c "import importlib.util as u; '
            f"print(u.find_spec('oneccl_bindings_for_pytorch').submodule_search_locations[0])\") "
            "|| { echo \"oneccl_bindings_for_pytorch is not installed in the node's venv: run fab setup\"; exit 2; }",
            '. "$ccl_dir/env/setvars.sh"',
        ]
        rank_env.setdefault("CCL_ATL_TRANSPORT", "ofi")
    else:
        env["PATH"] = f"{venv}/bin:$PATH"
    if flavour != "openmpi":
        setup.append(HYDRA_IFACE_SETUP)
    if layout.small_node and flavour != "openmpi":
        rank_env["I_MPI_WAIT_MODE"] = "1"
    rank_env.update(extra_env or {})
    for key in rank_env:
        if not key.replace("_", "").isalnum() or key[0].isdigit():
            raise LaunchError(f"environment: {key!r} is not a valid variable name")

    wrapper = ("sh", "-c", RANK_WRAPPER, "xeon-rank", *program)
    if flavour == "openmpi":
        argv = ["mpirun", "--hostfile", hostfile, "-np", str(world),
                "--map-by", f"ppr:{layout.ranks_per_node}:node", "--bind-to", "none",
                "--tag-output", "--mca", "mpi_yield_when_idle", "1"]
        if run_as_root:
            argv.append("--allow-run-as-root")
        for key in env:
            argv += ["-x", key]
        for key, value in rank_env.items():
            argv += ["-x", f"{key}={value}"]
    else:
        argv = ["mpirun", "-f", hostfile, "-n", str(world), "-ppn", str(layout.ranks_per_node),
                "-prepend-rank"]
        for key, value in rank_env.items():
            argv += ["-genv", key, value]
    argv += wrapper
    return LaunchPlan(flavour=flavour, job_id=job_id, hosts=tuple(hosts), master_addr=master_addr,
                      master_port=port, layout=layout, argv=tuple(argv),
                      env=env, rank_env=rank_env, setup=tuple(setup),
                      hostfile=hostfile_text(hosts, flavour, layout.ranks_per_node),
                      program=tuple(program))

