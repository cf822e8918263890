"""A training job on a cluster: plan it, start it detached on the master, follow, inspect, stop.

Thin: the layout and the mpirun command come from cluster/layout.py and cluster/launch.py; this
module moves files, runs the job script and reads back what it wrote.

On every node a job owns ``~/.xeon-cluster/jobs/<job id>/`` (cluster.launch.JOBS_DIR). On the
master it holds ``run.sh`` (the job script), ``hosts``, ``job.json`` (what was launched), ``log``
(mpirun's output, every rank's lines prefixed with its rank), ``pid`` (the job script, leader of
its own session), ``exit_code`` once mpirun returned and ``stopped`` if `fab stop` ended it. On
every node ``ranks/rank-<r>`` holds "pid pgid hostname" of each rank that ran there. The job
script runs under ``setsid nohup``, so it survives the controller's disconnect; `fab logs
--follow` reattaches. `fab stop` ends the script's session on the master, then on every node the
recorded rank process groups, then any process still marked with the job's id
(cluster.launch.JOB_MARKER in its environment), and reports what it found.
"""

from __future__ import annotations

import io
import json
import re
import secrets
import shlex
import sys
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence, TextIO

from cluster import catalog
from cluster.inventory import Inventory
from cluster.launch import JOBS_DIR, LaunchPlan, job_dir, plan_launch
from cluster.layout import Layout, plan_layout
from cluster.profiles import get_profile, venv_dir

CURRENT = f"{JOBS_DIR}/current"  # symlink on the master to the newest job's directory
DEFAULT_OUTPUT_ROOT = "xeon-cluster-runs"  # relative to the SSH user's home on every node
# The local cluster's nodes each have their own /root but share the rest of the filesystem: a
# shared output directory lets every rank see rank 0's checkpoints (needed by --resume).
LOCAL_OUTPUT_ROOT = "/var/tmp/xeon-cluster-runs"
STOP_GRACE_SECONDS = 10
POLL_SECONDS = 0.2  # how often the log stream checks for its end (and lets Ctrl-C in)


def shown(path: str) -> str:
    """A node path as the user reads it: relative paths are relative to the home directory."""
    return path if path.startswith("/") else f"~/{path}"


class JobError(RuntimeError):
    """A job could not be started, found or stopped; the message says what to do."""


def new_job_id(now: float | None = None) -> str:
    """Sortable and unique: UTC time plus a random suffix (also seeds MASTER_PORT)."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + "-" + secrets.token_hex(2)


# ------------------------------------------------------------------------------------------ plan


@dataclass(frozen=True)
class JobPlan:
    inventory: Inventory  # cut to the job's nodes, master first
    layout: Layout
    launch: LaunchPlan
    training_args: tuple[str, ...]
    output_dir: str
    prepare: tuple[str, ...] = ()  # commands run on every node before the launch
    notes: tuple[str, ...] = ()

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
            "flavour": self.launch.flavour, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }

    def describe(self) -> str:
        """The dry-run text: nodes, layout, environment and the full command."""
        inv, launch = self.inventory, self.launch
        out = [f"job {self.job_id} on cluster {inv.name!r} ({inv.kind}, profile {inv.profile}, "
               f"MPI {launch.flavour})", "", "nodes (rank order, master first):"]
        for node in inv.nodes:
            ranks = [str(r) for r, h in enumerate(launch.rank_hosts) if h == node.name]
            out.append(f"  {node.name:<10} {node.address:<16} private {node.private_address:<16} "
                       f"ranks {','.join(ranks)}")
        out += ["", "layout:"] + [f"  {line}" for line in self.layout.describe()]
        out += [f"  world size: {launch.world_size}", ""]
        if self.prepare:
            out += ["on every node first:"] + [f"  {p}" for p in self.prepare] + [""]
        out += ["environment of mpirun on the master:"]
        out += [f"  {k}={v}" for k, v in launch.env.items()]
        if launch.setup:
            out += ["", "run on the master before mpirun:"] + [f"  {line}" for line in launch.setup]
        out += ["", "environment of every rank:"] + [f"  {k}={v}" for k, v in launch.rank_env.items()]
        out += ["", "hostfile:"] + [f"  {h}" for h in launch.hostfile.splitlines()]
        out += ["", "command (run from the master's home directory):", f"  {launch.command_line()}",
                "  (<rank-wrapper>: records the rank's pid and process group in the job directory, sets",
                "   GLOO_SOCKET_IFNAME to the interface towards MASTER_ADDR unless given, then execs the program)"]
        out += ["", f"output directory (rank 0 writes summary.json there): {shown(self.output_dir)}"]
        out += [f"job directory on every node: ~/{job_dir(self.job_id)}"]
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)


def machine_for(inventory: Inventory, nodes: int) -> tuple[catalog.InstanceType, bool, list[str]]:
    """What one node looks like, whether to pin, and notes.

    A local cluster's nodes share this machine's cores: each gets an equal share, unpinned.
    """
    machine = inventory.machine()
    if inventory.kind != "local":
        return machine, True, []
    share = max(1, machine.physical_cores // nodes)
    note = (f"local cluster: {nodes} node(s) share this machine's {machine.physical_cores} physical "
            f"core(s); each node gets {share} and ranks are not pinned")
    return catalog.custom(f"local node (a 1/{nodes} share of this machine)", 1, share), False, [note]


def plan_job(inventory: Inventory, *, nodes: int, training_args: Sequence[str], job_id: str | None = None,
             ranks_per_node: int | None = None, threads_per_rank: int | None = None,
             ccl_workers: int | None = None, pin: bool | None = None, extra_env: Mapping[str, str] | None = None,
             output_dir: str | None = None, prepare: Sequence[str] = (), preload: Sequence[str] | None = None,
             master_port: int | None = None) -> JobPlan:
    """Everything `fab train` will do, decided before anything is touched (no I/O)."""
    inv = inventory.first(nodes)
    profile = get_profile(inv.profile)
    machine, default_pin, notes = machine_for(inventory, nodes)
    kwargs = {} if preload is None else {"preload": tuple(preload)}
    layout = plan_layout(machine, backend=profile.backend, ranks_per_node=ranks_per_node,
                         threads_per_rank=threads_per_rank, ccl_workers=ccl_workers,
                         pin=default_pin if pin is None else pin, **kwargs)
    job_id = job_id or new_job_id()
    root = f"{LOCAL_OUTPUT_ROOT}/{inventory.name}" if inventory.kind == "local" else DEFAULT_OUTPUT_ROOT
    output_dir = output_dir or f"{root}/{job_id}"
    args = list(training_args)
    given = [a.split("=", 1)[1] if "=" in a else (args[i + 1] if i + 1 < len(args) else "")
             for i, a in enumerate(args) if a == "--output_dir" or a.startswith("--output_dir=")]
    if given:  # the user's own (e.g. through --extra) wins
        output_dir = given[-1]
    else:
        args += ["--output_dir", output_dir]
    venv = venv_dir(profile)
    program = [f"{venv}/bin/python", "-m", "training", *args]
    launch = plan_launch(flavour=profile.launcher, job_id=job_id, hosts=[n.name for n in inv.nodes],
                         master_addr=inv.master.private_address, layout=layout, program=program, venv=venv,
                         master_port=master_port, extra_env=extra_env, run_as_root=inv.user == "root")
    return JobPlan(inventory=inv, layout=layout, launch=launch, training_args=tuple(args),
                   output_dir=output_dir, prepare=tuple(prepare), notes=tuple(notes) + layout.notes)


# ------------------------------------------------------------------------------ output prefixing

_INTEL_RANK = re.compile(r"^\[(\d+)\] ?(.*)$", re.S)
_OPENMPI_RANK = re.compile(r"^\[\d+,(\d+)\]<std(?:out|err)>: ?(.*)$", re.S)
# mpirun's own lines: Hydra's `[mpiexec@host]`, `[bstrap:...]`, `[proxy:...]` and its `===` banners
_HYDRA_LINE = re.compile(r"^(\[(mpiexec|bstrap|proxy)[@:]|=|\s*$)")


class RankPrefixer:
    """A text sink that rewrites mpirun's rank prefixes (`[3] ...`, `[1,3]<stdout>: ...`) into
    `[node1 r3] ...` and marks mpirun's own lines, writing whole lines to `out`."""

    def __init__(self, rank_hosts: Sequence[str], out: TextIO):
        self.rank_hosts = list(rank_hosts)
        self.out = out
        self._partial = ""
        self._last_rank: int | None = None
        self.width = max([len(h) for h in self.rank_hosts] + [4]) + len(str(len(self.rank_hosts))) + 2

    def label(self, rank: int) -> str:
        host = self.rank_hosts[rank] if 0 <= rank < len(self.rank_hosts) else "?"
        return f"{host} r{rank}"

    def line(self, text: str) -> str:
        for pattern in (_INTEL_RANK, _OPENMPI_RANK):
            match = pattern.match(text)
            if match:
                self._last_rank = int(match.group(1))
                return f"[{self.label(self._last_rank):<{self.width}}] {match.group(2)}"
        if text.startswith("[xeon-cluster]") or not text.strip():
            return text
        if _HYDRA_LINE.match(text):
            self._last_rank = None
        elif self._last_rank is not None:
            # the rest of a rank's line that mpirun forwarded in two pieces
            return f"[{self.label(self._last_rank):<{self.width}}] {text}"
        return f"[{'mpirun':<{self.width}}] {text}"

    def write(self, data: str) -> int:
        self._partial += data.replace("\r\n", "\n").replace("\r", "\n")
        *lines, self._partial = self._partial.split("\n")
        for text in lines:
            if any((m := p.match(text)) and not m.group(2).strip() for p in (_INTEL_RANK, _OPENMPI_RANK)):
                continue  # a rank's empty line (progress bars end in \r): noise once prefixed
            self.out.write(self.line(text) + "\n")
        self.out.flush()
        return len(data)

    def flush(self) -> None:
        if self._partial:
            self.out.write(self.line(self._partial) + "\n")
            self._partial = ""
        self.out.flush()


_BAD_TERMINATION = re.compile(
    r"RANK (\d+) PID (\d+) RUNNING AT (\S+)\s*\n=\s*(KILLED BY SIGNAL: .*?|EXIT STATUS: .*?)\s*\n", re.S)


def failure_report(log: str, rank_hosts: Sequence[str], exit_code: int | None) -> list[str]:
    """Which node and rank made the job fail, from mpirun's log (pure)."""
    found = []
    for rank, pid, host, how in _BAD_TERMINATION.findall(log):
        rank = int(rank)
        node = rank_hosts[rank] if rank < len(rank_hosts) else "?"
        found.append(f"rank {rank} on node {node} (host {host}, pid {pid}): {how.strip().lower()}")
    seen = set()
    unique = [f for f in found if not (f in seen or seen.add(f))]
    if unique or exit_code in (None, 0):
        return unique
    # no hydra report: name the ranks that printed a traceback or an error line last
    ranks = sorted({int(m.group(1)) for m in re.finditer(r"^\[(\d+)\] (?:Traceback|.*Error\b|error:)", log, re.M)})
    return [f"rank {r} on node {rank_hosts[r] if r < len(rank_hosts) else '?'} reported an error (see its lines above)"
            for r in ranks]


# ------------------------------------------------------------------------------ remote actions

# Per node: the job's recorded ranks and whether each still runs ("<rank> <pid> running|gone").
RANKS_SH = r"""job="$1"; d="$HOME/JOBS/$job/ranks"
for f in "$d"/rank-*; do
  [ -f "$f" ] || continue
  read pid pgid host < "$f"
  if grep -qxzF "XEON_CLUSTER_JOB=$job" "/proc/$pid/environ" 2>/dev/null; then s=running; else s=gone; fi
  echo "${f##*/rank-} $pid $s"
done
""".replace("JOBS", JOBS_DIR)

# Per node: end the job's recorded rank process groups, then anything still marked with the job id.
STOP_NODE_SH = r"""job="$1"; grace="$2"; d="$HOME/JOBS/$job/ranks"; me=$$
marked() { grep -lxzF "XEON_CLUSTER_JOB=$job" /proc/[0-9]*/environ 2>/dev/null | sed -n 's#^/proc/\([0-9]*\)/environ$#\1#p' | grep -vx "$me"; }
for f in "$d"/rank-*; do
  [ -f "$f" ] || continue
  read pid pgid host < "$f"
  grep -qxzF "XEON_CLUSTER_JOB=$job" "/proc/$pid/environ" 2>/dev/null || continue
  if [ "${pgid:-0}" -gt 1 ] 2>/dev/null; then kill -TERM -- "-$pgid" 2>/dev/null; fi
  kill -TERM "$pid" 2>/dev/null
  echo "rank ${f##*/rank-}: sent TERM to pid $pid (group $pgid)"
done
left=$(marked); [ -n "$left" ] && kill -TERM $left 2>/dev/null
i=0; while [ -n "$(marked)" ] && [ $i -lt $((grace * 5)) ]; do sleep 0.2; i=$((i + 1)); done
left=$(marked)
if [ -n "$left" ]; then kill -KILL $left 2>/dev/null; echo "sent KILL to:" $left; sleep 0.5; fi
left=$(marked)
if [ -n "$left" ]; then echo "still running:" $left; exit 1; fi
echo "no process of job $job left"
""".replace("JOBS", JOBS_DIR)

# On the master: end the job script's session (mpirun and its local children) first.
STOP_MASTER_SH = r"""job="$1"; d="$HOME/JOBS/$job"
[ -d "$d" ] || { echo "no job $job here"; exit 3; }
[ -f "$d/exit_code" ] || date -u +%Y-%m-%dT%H:%M:%SZ > "$d/stopped"
pid=$(cat "$d/pid" 2>/dev/null)
if [ -n "$pid" ] && grep -qF "$job" "/proc/$pid/cmdline" 2>/dev/null; then
  kill -TERM -- "-$pid" 2>/dev/null; echo "job script (session $pid): sent TERM"
fi
""".replace("JOBS", JOBS_DIR)

# On the master: what a job is doing (JSON-ish lines read by job_state()).
STATE_SH = r"""job="$1"; d="$HOME/JOBS/$job"
[ -d "$d" ] || { echo "missing"; exit 0; }
pid=$(cat "$d/pid" 2>/dev/null)
if [ -n "$pid" ] && grep -qF "$job" "/proc/$pid/cmdline" 2>/dev/null; then echo "running $pid"
elif [ -f "$d/stopped" ]; then echo "stopped $(cat "$d/stopped")"
elif [ -f "$d/exit_code" ]; then echo "exited $(cat "$d/exit_code")"
else echo "lost"; fi
""".replace("JOBS", JOBS_DIR)


def explain_failure(exc: BaseException, conn) -> str:
    try:
        from node_setup.connections import explain
    except ImportError:
        return f"{type(exc).__name__}: {exc}"
    return explain(exc, conn)


def _sh(script: str, *args: object) -> str:
    return "sh -c " + shlex.quote(script) + " xeon-cluster " + " ".join(shlex.quote(str(a)) for a in args)


@dataclass
class NodeOutcome:
    node: str
    ok: bool
    detail: str


def on_every_node(conns: Mapping[str, object], command: Callable[[str], str], *,
                  timeout: float | None = None) -> list[NodeOutcome]:
    """Run a command on every node in parallel (one thread per node); never raises per node.

    `conns` maps node name to a Fabric Connection; `command(node)` gives the shell command.
    """
    from concurrent.futures import ThreadPoolExecutor

    def one(item):
        name, conn = item
        try:
            result = conn.run(command(name), hide=True, warn=True, in_stream=False, timeout=timeout)
        except Exception as exc:  # unreachable, auth refused, timeout: name the node and the reason
            return NodeOutcome(name, False, explain_failure(exc, conn))
        text = (result.stdout + result.stderr).strip()
        return NodeOutcome(name, result.ok, (text or "done") if result.ok else f"exit {result.exited}: {text}")

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(conns)))) as pool:
        return list(pool.map(one, conns.items()))


def prepare_nodes(conns: Mapping[str, object], plan: JobPlan) -> list[NodeOutcome]:
    """Make the job directory on every node (also proves each node is reachable), run `prepare`."""
    d = job_dir(plan.job_id)
    steps = [f"mkdir -p {shlex.quote(d)}/ranks"] + list(plan.prepare)
    return on_every_node(conns, lambda _: " && ".join(f"( {s} )" for s in steps))


def start(master, plan: JobPlan) -> int:
    """Put the job's files on the master and start the job script detached; returns its pid."""
    d = job_dir(plan.job_id)
    master.put(io.StringIO(plan.launch.hostfile), remote=f"{d}/hosts")
    master.put(io.StringIO(plan.launch.script()), remote=f"{d}/run.sh")
    master.put(io.StringIO(json.dumps(plan.metadata(), indent=2) + "\n"), remote=f"{d}/job.json")
    qd = shlex.quote(d)
    result = master.run(
        f"cd && ln -sfn {shlex.quote(plan.job_id)} {shlex.quote(CURRENT)} && "
        f"(setsid nohup sh {qd}/run.sh </dev/null >/dev/null 2>&1 &) && "
        f"i=0; while [ ! -s {qd}/pid ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done; cat {qd}/pid",
        hide=True, warn=True, in_stream=False)
    pid = result.stdout.strip()
    if not result.ok or not pid.isdigit():
        raise JobError(f"the job script did not start on the master {plan.inventory.master.name}: "
                       f"{(result.stdout + result.stderr).strip() or 'no pid written'}; "
                       f"look at ~/{d}/log there")
    return int(pid)


def resolve_job_id(master, job_id: str | None) -> str:
    """The given job id, or the newest job on the master."""
    if job_id:
        return job_id
    result = master.run(f"readlink {shlex.quote(CURRENT)}", hide=True, warn=True, in_stream=False)
    current = result.stdout.strip()
    if not result.ok or not current:
        raise JobError("no job has been started on this cluster yet; start one with `fab train`")
    return current.rsplit("/", 1)[-1]


def read_metadata(master, job_id: str) -> dict:
    out = io.BytesIO()
    try:
        master.get(f"{job_dir(job_id)}/job.json", local=out)
    except (OSError, IOError) as exc:
        raise JobError(f"job {job_id!r} not found on the master ({exc}); `fab status` lists the newest job") from None
    return json.loads(out.getvalue().decode())


def job_state(master, job_id: str) -> tuple[str, str]:
    """("running", pid) / ("stopped", when) / ("exited", code) / ("lost", "") / ("missing", "").

    A job that `fab stop` ended counts as stopped even though mpirun then returned a code.
    """
    result = master.run(_sh(STATE_SH, job_id), hide=True, warn=True, in_stream=False)
    state, _, detail = result.stdout.strip().partition(" ")
    return state or "lost", detail


def follow(master, job_id: str, rank_hosts: Sequence[str], out: TextIO = sys.stdout, *,
           last_lines: int | None = None, follow_: bool = True) -> None:
    """Stream the job's log with node/rank prefixes until the job script ends (or once, unfollowed).

    KeyboardInterrupt propagates to the caller (Fabric re-raises it when no pty is used).
    """
    d = job_dir(job_id)
    start_at = f"-n {int(last_lines)}" if last_lines is not None else "-c +1"
    if follow_:
        command = (f"cd && pid=$(cat {d}/pid 2>/dev/null); "
                   f"if [ -n \"$pid\" ] && grep -qF {shlex.quote(job_id)} /proc/$pid/cmdline 2>/dev/null; "
                   f"then exec tail {start_at} -F --pid=$pid {d}/log 2>/dev/null; "
                   f"else exec tail {start_at} {d}/log; fi")
    else:
        command = f"cd && tail {start_at} {d}/log"
    sink = RankPrefixer(rank_hosts, out)
    # Asynchronous, so that Ctrl-C lands here rather than in invoke's thread joins (which would
    # wait for the remote `tail` to end); on Ctrl-C the connection is closed to end the stream.
    promise = master.run(command, out_stream=sink, err_stream=sink, hide=False, warn=True, pty=False,
                         in_stream=False, asynchronous=True)
    runner = promise.runner
    try:
        while not (runner.process_is_finished or runner.has_dead_threads):
            time.sleep(POLL_SECONDS)
        promise.join()
    except KeyboardInterrupt:
        master.close()
        raise
    finally:
        sink.flush()


def read_remote_file(conn, path: str) -> str | None:
    out = io.BytesIO()
    try:
        conn.get(path, local=out)
    except (OSError, IOError):
        return None
    return out.getvalue().decode(errors="replace")


def log_text(master, job_id: str) -> str:
    return read_remote_file(master, f"{job_dir(job_id)}/log") or ""


def log_tail(master, job_id: str, lines: int = 20) -> str:
    """The last lines of the job's log, read on the master (a long run's log stays there)."""
    result = master.run(f"tail -n {int(lines)} {shlex.quote(job_dir(job_id) + '/log')}",
                        hide=True, warn=True, in_stream=False)
    return result.stdout if result.ok else ""


def rank_states(conns: Mapping[str, object], job_id: str) -> dict[str, NodeOutcome]:
    return {o.node: o for o in on_every_node(conns, lambda _: _sh(RANKS_SH, job_id), timeout=30)}


def stop(master, conns: Mapping[str, object], job_id: str, *, grace: int = STOP_GRACE_SECONDS) -> list[NodeOutcome]:
    """End the job everywhere: the job script's session on the master, then every node's ranks.

    Returns one outcome per node (plus the master's job script first); ok means nothing of the
    job is left on that node.
    """
    outcomes = []
    try:
        result = master.run(_sh(STOP_MASTER_SH, job_id), hide=True, warn=True, in_stream=False)
        outcomes.append(NodeOutcome("job script", result.exited in (0, 3), (result.stdout + result.stderr).strip()))
    except Exception as exc:
        outcomes.append(NodeOutcome("job script", False, explain_failure(exc, master)))
    outcomes += on_every_node(conns, lambda _: _sh(STOP_NODE_SH, job_id, grace), timeout=grace + 30)
    return outcomes


def outcome_table(outcomes: Iterable[NodeOutcome]) -> str:
    rows = list(outcomes)
    width = max([len(o.node) for o in rows] + [4])
    lines = []
    for o in rows:
        detail = o.detail.splitlines() or [""]
        lines.append(f"  {o.node:<{width}}  {'ok    ' if o.ok else 'FAILED'}  {detail[-1]}")
        if not o.ok and len(detail) > 1:
            lines += [f"  {'':<{width}}          {d}" for d in detail[-4:-1]]
    return "\n".join(lines)

