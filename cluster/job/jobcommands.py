"""A job's start and its inspection on the master, as text: the files, the commands and the scripts.

Built once for the one job lifecycle (node_setup/job_lifecycle/), which fab runs over Fabric and the
run supervisor on the master over plain `ssh` and a local shell: each moves the text its own way;
what is run is the same. Pure: no I/O.

- `prepare_command(plan, refuse_busy=...)`: on every node before a launch: which xeon-cluster its venv
  holds (`installed_version` reads it back), with `refuse_busy` the other jobs still running there
  (`busy_jobs`), the job's directory, the plan's preparation (the offline demo's data).

The job's directory is cluster.job.launch.job_dir(job id) under the home; the master's link to the
newest job is CURRENT. The scripts are cluster/shell/job-*.sh, run as `sh -c SCRIPT xeon-cluster
JOB [GRACE]` (`sh_command`).
"""

from __future__ import annotations

import json
import shlex

from typing import Iterable

from cluster import shell
from cluster.job.jobplan import JOB_ID_RE, JobPlan
from cluster.job.launch import ENV_FILE, JOBS_DIR, job_dir
from cluster.job.torchrun import AGENT_FILE
from cluster.node.profiles import get_profile, venv_dir
from cluster.node.setup_script import PROJECT_MARKER

CURRENT = f"{JOBS_DIR}/current"  # symlink on the master to the newest job's directory
PID_WAIT_TENTHS = 100  # how long the start command waits for the job script's pid file (0.1 s each)

# Per node: the job's recorded ranks and whether each still runs ("<rank> <pid> running|gone").
RANKS_SH = shell.render("job-ranks.sh", {"JOBS_DIR": JOBS_DIR})
# Per node: end the job's recorded rank process groups, then anything still marked with the job id.
STOP_NODE_SH = shell.render("job-stop-node.sh", {"JOBS_DIR": JOBS_DIR, "AGENT_FILE": AGENT_FILE})
# On the master: end the job script's session (mpirun and its local children) first.
STOP_MASTER_SH = shell.render("job-stop-master.sh", {"JOBS_DIR": JOBS_DIR})
# On the master: what a job is doing (one line: running, stopped, exited CODE, ...).
STATE_SH = shell.render("job-state.sh", {"JOBS_DIR": JOBS_DIR})
# On every node before a launch: the other jobs still running there (read by busy_jobs()).
BUSY_SH = shell.render("job-busy.sh", {"JOBS_DIR": JOBS_DIR})
BUSY = "xeon-cluster busy: "  # the lines BUSY_SH prints, one per running job script or rank
LAUNCHING = "launching"  # CLAIM_SH's busy line: "xeon-cluster busy: <job> launching"
# On the master before a launch: the cluster's next launch claimed for the job (read by busy_jobs() too).
CLAIM_SH = shell.render("job-claim.sh", {"JOBS_DIR": JOBS_DIR})
CLAIM_TTL_S = 3600  # a launch's claim holds this long at most (its fab gone before its start, say)
INSTALLED = "xeon-cluster installed: "  # the line prepare_command starts each node's output with


def sh_command(script: str, *args: object) -> str:
    """`script` run by sh with `args` as its positional parameters, every one quoted."""
    return "sh -c " + shlex.quote(script) + " xeon-cluster " + " ".join(shlex.quote(str(a)) for a in args)


def job_files(plan: JobPlan, **metadata: object) -> dict[str, str]:
    """The files a job's directory on the master holds before its start (name -> text): the hostfile,
    the job script, job.json (the plan's metadata, with `metadata` added) and the user's --env values
    (ENV_FILE, written with `file_mode`'s 0600)."""
    return {"hosts": plan.launch.hostfile, "run.sh": plan.launch.script(),
            "job.json": json.dumps({**plan.metadata(), **metadata}, indent=2) + "\n",
            ENV_FILE: plan.launch.env_file()}


def file_mode(name: str) -> int:
    """The mode a job file (job_files) is written with: 0600 for the --env values, 0644 for the others."""
    return 0o600 if name == ENV_FILE else 0o644


def start_command(plan: JobPlan) -> str:
    """On the master, from any directory: the newest-job link set, the job directory's `output` link to the
    output folder (where `fab jobs` reads the job's summary and progress), the job script started detached
    (`setsid nohup`, its own session, so it outlives the caller's connection), then its pid printed
    once the script has written it (nothing printed when it did not within PID_WAIT_TENTHS / 10 s)."""
    qd = shlex.quote(job_dir(plan.job_id))
    runner = "bash" if shell.is_bash(plan.launch.script()) else "sh"
    output = shlex.quote(plan.output_dir)  # a relative one is the home directory's, as the ranks read it
    target = output if plan.output_dir.startswith("/") else '"$HOME"/' + output
    return (f"cd && ln -sfn {shlex.quote(plan.job_id)} {shlex.quote(CURRENT)} && ln -sfn {target} {qd}/output && "
            f"(setsid nohup {runner} {qd}/run.sh </dev/null >/dev/null 2>&1 &) && "
            f"i=0; while [ ! -s {qd}/pid ] && [ $i -lt {PID_WAIT_TENTHS} ]; do sleep 0.1; i=$((i + 1)); done; "
            f"cat {qd}/pid; {release_command(plan.job_id)} >/dev/null 2>&1 || :")


def claim_command(job_id: str) -> str:
    """On the master: the next launch claimed for `job_id`, or one BUSY line and exit 4 when another launch
    holds the claim (cluster/shell/job-claim.sh)."""
    return sh_command(CLAIM_SH, job_id, CLAIM_TTL_S)


def release_command(job_id: str) -> str:
    """On the master: `job_id`'s launch claim given up (another job's is left)."""
    return sh_command(CLAIM_SH, job_id, "release")


def prepare_command(plan: JobPlan, *, refuse_busy: bool) -> str:
    """On every node before a launch (one round trip; see the module docstring). A node that runs another
    job stops before the job's directory is made (BUSY_SH exits 4)."""
    marker = f"{venv_dir(get_profile(plan.inventory.profile))}/{PROJECT_MARKER}"
    steps = [f'echo "{INSTALLED}$(cat {shlex.quote(marker)} 2>/dev/null)"',
             *([sh_command(BUSY_SH, plan.job_id)] if refuse_busy else []),
             f"mkdir -p {shlex.quote(job_dir(plan.job_id))}/ranks", *plan.prepare]
    return "cd && " + " && ".join(f"( {s} )" for s in steps)


def installed_version(output: str) -> str:
    """The xeon-cluster version a prepared node's venv holds ("" for none), from its prepare_command output."""
    for line in output.splitlines():
        if line.startswith(INSTALLED):
            return line[len(INSTALLED):].strip()
    return ""


def busy_jobs(outputs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """{other job id: ["node0 (job script)", "node1 (rank 1)", ...]} from the (node, output) of every node's
    prepare_command with refuse_busy."""
    found: dict[str, list[str]] = {}
    for node, output in outputs:
        for line in output.splitlines():
            if BUSY not in line:
                continue
            job_id, _, what = line.split(BUSY, 1)[1].strip().partition(" ")
            if JOB_ID_RE.match(job_id):
                found.setdefault(job_id, []).append(f"{node} ({'job script' if what == 'script' else what})")
    return found


def busy_line(busy: dict[str, list[str]]) -> str:
    """Why a launch stops when a chosen node still runs another job (busy_jobs' answer, not empty)."""
    other = max(busy)  # the newest running job (ids begin with their start time)
    more = f" (and {len(busy) - 1} other job(s))" if len(busy) > 1 else ""
    if busy[other][0].endswith(f"({LAUNCHING})"):
        return (f"cannot launch: another fab train is launching job {other} on {busy[other][0].split(' ')[0]} (it "
                f"holds the launch claim until its start); wait for it and see `fab status`, or pass --allow-busy to "
                "start this job beside it")
    return (f"cannot launch: job {other} still runs on {', '.join(busy[other])}{more}; follow it with "
            f"`fab logs --follow --job {other}`, end it with `fab stop --job {other}`, or pass --allow-busy to "
            "start this job beside it")
