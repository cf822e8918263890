"""A job's start and its inspection on the master, as text: the files, the commands and the scripts.

Built once for the two that start jobs: fab (node_setup/ssh/job.py, over Fabric) and the run
supervisor on the master (node_setup/supervisor/onmaster.py, plain `ssh` and a local shell in the
node venv). Each moves the text its own way; what is run is the same. Pure: no I/O.

The job's directory is cluster.job.launch.job_dir(job id) under the home; the master's link to the
newest job is CURRENT. The scripts are cluster/shell/job-*.sh, run as `sh -c SCRIPT xeon-cluster
JOB [GRACE]` (`sh_command`).
"""

from __future__ import annotations

import json
import shlex

from cluster import shell
from cluster.job.jobplan import JobPlan
from cluster.job.launch import JOBS_DIR, job_dir
from cluster.job.torchrun import AGENT_FILE

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


def sh_command(script: str, *args: object) -> str:
    """`script` run by sh with `args` as its positional parameters, every one quoted."""
    return "sh -c " + shlex.quote(script) + " xeon-cluster " + " ".join(shlex.quote(str(a)) for a in args)


def job_files(plan: JobPlan, **metadata: object) -> dict[str, str]:
    """The files a job's directory on the master holds before its start (name -> text): the hostfile,
    the job script and job.json (the plan's metadata, with `metadata` added)."""
    return {"hosts": plan.launch.hostfile, "run.sh": plan.launch.script(),
            "job.json": json.dumps({**plan.metadata(), **metadata}, indent=2) + "\n"}


def start_command(plan: JobPlan) -> str:
    """On the master, from any directory: the newest-job link set, the job script started detached
    (`setsid nohup`, its own session, so it outlives the caller's connection), then its pid printed
    once the script has written it (nothing printed when it did not within PID_WAIT_TENTHS / 10 s)."""
    qd = shlex.quote(job_dir(plan.job_id))
    runner = "bash" if shell.is_bash(plan.launch.script()) else "sh"
    return (f"cd && ln -sfn {shlex.quote(plan.job_id)} {shlex.quote(CURRENT)} && "
            f"(setsid nohup {runner} {qd}/run.sh </dev/null >/dev/null 2>&1 &) && "
            f"i=0; while [ ! -s {qd}/pid ] && [ $i -lt {PID_WAIT_TENTHS} ]; do sleep 0.1; i=$((i + 1)); done; "
            f"cat {qd}/pid")
