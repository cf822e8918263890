"""A training job on a cluster: start it detached on the master, follow, inspect, stop.

Thin: the plan comes from cluster/job/jobplan.py (layout, mpirun command, job script); this module
moves files, runs the job script and reads back what it wrote.

On every node a job owns ``~/.xeon-cluster/jobs/<job id>/`` (cluster.job.launch.JOBS_DIR). On the
master it holds ``run.sh`` (the job script), ``hosts``, ``job.json`` (what was launched), ``log``
(the launcher's output, every rank's lines prefixed with its rank), ``pid`` (the job script, leader
of its own session), ``exit_code`` once the launcher returned and ``stopped`` if `fab stop` ended
it. On every node ``ranks/rank-<r>`` holds "pid pgid hostname" of each rank's program that ran
there, and under torchrun ``agent`` the pid of the node's torchrun (ended first by `fab stop`). The job
script runs under ``setsid nohup``, so it survives the controller's disconnect; `fab logs
--follow` reattaches. `fab stop` ends the script's session on the master, then on every node the
recorded rank process groups, then any process still marked with the job's id
(cluster.job.launch.JOB_MARKER in its environment), and reports what it found.
"""

from __future__ import annotations

import io
import json
import shlex
import sys
import time
from typing import Mapping, Sequence, TextIO

from cluster.job import joblist, jobsummary
from cluster import records, shell
from cluster.job.jobplan import JOB_ID_RE, JobPlan, check_job_id
from cluster.job.jobcommands import (CURRENT, RANKS_SH, STATE_SH, STOP_MASTER_SH, STOP_NODE_SH, file_mode, job_files,
                                  prepare_command, start_command)
from cluster.job.jobcommands import sh_command as _sh
from cluster.job.logstream import LogAssembler, LogSink
from cluster.job.launch import DEFAULT_LAUNCHER, JOBS_DIR, job_dir
from cluster.names import JOB_NAME_RE, printable
from node_setup.ssh import autostop, connections
from node_setup.ssh.fanout import NodeOutcome, on_nodes

STOP_GRACE_SECONDS = 10
POLL_SECONDS = 0.2  # how often the log stream checks for its end (and lets Ctrl-C in)
# `--lines N` reads this many raw lines of the log's end per line shown, and this many more: a rank's line may
# come in pieces, progress bars and hidden lines take raw lines, and the run's summary folds into one line.
RAW_LINES_PER_SHOWN, RAW_LINES_EXTRA = 4, 400


class JobError(RuntimeError):
    """A job could not be started, found or stopped; the message says what to do."""


# ------------------------------------------------------------------------------ remote actions

# The scripts are cluster/shell/job-*.sh, run as `sh -c SCRIPT xeon-cluster JOB [GRACE]`; those the
# run supervisor runs too (ranks, stop, state) are cluster/job/jobcommands.py's.
# On the master: every job's records in one answer (cluster/job/joblist.py reads it).
LIST_SH = shell.render("job-list.sh", {"JOBS_DIR": JOBS_DIR})


def prepare_nodes(conns: Mapping[str, object], plan: JobPlan) -> list[NodeOutcome]:
    """`fab bench`'s preparation: the job directory on every node (also proves each node is reachable) and the
    plan's `prepare` (cluster/job/jobcommands.py's prepare_command; fab train's jobs: node_setup/job_lifecycle/)."""
    return on_nodes(conns, prepare_command(plan, refuse_busy=False))


def list_jobs(master) -> str:
    """Every job's records on the master in one round (cluster/shell/job-list.sh; cluster/job/joblist.py parses)."""
    result = master.run(_sh(LIST_SH), hide=True, warn=True, in_stream=False)
    if not result.ok:
        raise JobError(f"cannot list the jobs on the master: {(result.stdout + result.stderr).strip() or 'no answer'}")
    return result.stdout


def start(master, plan: JobPlan) -> int:
    """Put the job's files on the master and start the job script detached; returns its pid."""
    d = job_dir(plan.job_id)
    for name, text in job_files(plan).items():
        write_remote_text(master, f"{d}/{name}", text, mode=file_mode(name))
    result = master.run(start_command(plan), hide=True, warn=True, in_stream=False)
    pid = result.stdout.strip()
    if not result.ok or not pid.isdigit():
        raise JobError(f"the job script did not start on the master {plan.inventory.master.name}: "
                       f"{(result.stdout + result.stderr).strip() or 'no pid written'}; "
                       f"look at ~/{d}/log there")
    autostop.arm_default(master, plan.inventory)
    return int(pid)


def resolve_job_id(master, job_id: str | None) -> str:
    """The given job id (checked: it reaches remote commands), the newest job of that name (`fab train
    --name`) on the master, or the newest job on the master."""
    if job_id and not JOB_ID_RE.match(job_id) and JOB_NAME_RE.fullmatch(job_id):
        rows, _ = joblist.parse(list_jobs(master), getattr(master, "host", "the master"))
        found = joblist.newest_named(rows, job_id)
        if found is None:
            raise JobError(f"--job: no job named {job_id!r} on this cluster (`fab jobs` lists each job's name)")
        return found
    if job_id:
        try:
            return check_job_id(job_id)
        except ValueError as exc:
            raise JobError(str(exc)) from None
    result = master.run(f"readlink {shlex.quote(CURRENT)}", hide=True, warn=True, in_stream=False)
    current = result.stdout.strip().rsplit("/", 1)[-1]
    if not result.ok or not current:
        raise JobError("no job has been started on this cluster yet; start one with `fab train`")
    if not JOB_ID_RE.match(current):
        raise JobError(f"the master's newest job link ~/{CURRENT} points to {current!r}, which is no job id; "
                       "pass --job with the id `fab train` printed")
    return current


def read_metadata(master, job_id: str) -> dict:
    """The job's job.json on the master, checked (cluster/job/joblist.py `job_record`: a field fab reads that is
    malformed is left out); JobError with one line naming the node and the file when it is not a JSON object."""
    text = read_remote_record(master, f"{job_dir(job_id)}/job.json")
    if text is None:
        raise JobError(f"job {job_id!r} not found on the master (no {joblist.job_file(job_id)}); `fab status` lists "
                       "the newest job")
    record, problem = joblist.job_record(text, f"{getattr(master, 'host', 'the master')}: {joblist.job_file(job_id)}")
    if problem and not record:
        raise JobError(printable(problem))
    return record


def job_state(master, job_id: str) -> tuple[str, str]:
    """("running", pid) / ("stopped", when) / ("exited", code) / ("lost", "") / ("missing", "").

    A job that `fab stop` ended counts as stopped even though mpirun then returned a code.
    """
    result = master.run(_sh(STATE_SH, job_id), hide=True, warn=True, in_stream=False)
    state, _, detail = result.stdout.strip().partition(" ")
    return state or "lost", detail


def follow(master, job_id: str, rank_hosts: Sequence[str], out: TextIO = sys.stdout, *,
           last_lines: int | None = None, follow_: bool = True, launcher: str = DEFAULT_LAUNCHER,
           all_ranks: bool = False) -> None:
    """Show the job's log as cluster/job/logstream.py assembles it (whole lines, labelled with node and rank),
    until the job script ends (or what is there, unfollowed). `last_lines`: only the last N lines a person
    sees of what is there now (then, followed, everything after it). Colour stays when `out` is a terminal.

    KeyboardInterrupt propagates to the caller (Fabric re-raises it when no pty is used).
    """
    d = shlex.quote(job_dir(job_id))
    assembler = LogAssembler(rank_hosts, launcher, all_ranks=all_ranks, colour=_terminal(out))
    start = "-c +1"
    if last_lines is not None:
        # what is there now: its size (where the follow goes on), and enough of its end for N lines once assembled
        now = master.run(f"cd && size=$(wc -c < {d}/log) && echo \"$size\" && head -c \"$size\" {d}/log | "
                         f"tail -n {RAW_LINES_PER_SHOWN * int(last_lines) + RAW_LINES_EXTRA}",
                         hide=True, warn=True, in_stream=False)
        if not now.ok:
            out.write(printable((now.stderr or now.stdout).strip()) + "\n")
            return
        size, _, text = now.stdout.partition("\n")
        lines = assembler.feed(text) + ([] if follow_ else assembler.finish())
        for line in lines[-int(last_lines):] if last_lines else []:
            out.write(line + "\n")
        out.flush()
        if not follow_:
            return
        assembler.hidden.clear()  # the count lines at the end speak of what followed
        start = f"-c +{int(size.strip() or 0) + 1}"
    if follow_:
        command = (f"cd && pid=$(cat {d}/pid 2>/dev/null); "
                   f"if [ -n \"$pid\" ] && grep -qF {shlex.quote(job_id)} /proc/$pid/cmdline 2>/dev/null; "
                   f"then exec tail {start} -F --pid=$pid {d}/log 2>/dev/null; "
                   f"else exec tail {start} {d}/log; fi")
    else:
        command = f"cd && tail {start} {d}/log"
    sink, errors = LogSink(assembler, out), io.StringIO()
    # Asynchronous, so that Ctrl-C lands here rather than in invoke's thread joins (which would
    # wait for the remote `tail` to end); on Ctrl-C the connection is closed to end the stream.
    promise = master.run(command, out_stream=sink, err_stream=errors, hide=False, warn=True, pty=False,
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
        sink.close()
        for line in errors.getvalue().splitlines():  # tail's own complaint (no log yet, say)
            out.write(printable(line) + "\n")


def _terminal(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


def read_remote_file(conn, path: str) -> str | None:
    out = io.BytesIO()
    try:
        conn.get(path, local=out)
    except (OSError, IOError):
        return None
    return out.getvalue().decode(errors="replace")


def read_job_records(conn, output_dir: str) -> dict[str, str | None]:
    """The texts of the records `fab report` reads in a job's output folder (cluster/job/runreport.py FILES;
    None for one that is not there): its trainer_state.json, else its newest checkpoint's."""
    from cluster.job.runreport import FILES, STATE_MAX_BYTES

    def read(path: str) -> str | None:
        return read_remote_record(conn, path, limit=STATE_MAX_BYTES)

    texts = {name: read(f"{output_dir}/{name}") for name in FILES}
    if texts["trainer_state.json"] is None:
        found = conn.run(f"ls -d {shlex.quote(output_dir)}/checkpoint-*/trainer_state.json 2>/dev/null | "
                         "sort -V | tail -n 1", hide=True, warn=True, in_stream=False)
        newest = found.stdout.strip() if found.ok else ""
        if newest:
            texts["trainer_state.json"] = read(newest)
    return texts


def read_remote_record(conn, path: str, limit: int = records.MAX_BYTES) -> str | None:
    """A record's text on the node (cluster/records.py read_command: at most `limit` + 1 bytes of a regular
    file that is not a link, records.REFUSED for another; records.load reads both), None when there is none."""
    result = conn.run(records.read_command(path, limit), hide=True, warn=True, in_stream=False)
    return result.stdout if result.ok else None


def read_remote_summary(conn, path: str, say=print) -> dict | None:
    """The job's summary.json at `path` on the node, checked (cluster/job/jobsummary.py): None when it is
    missing, not JSON or not an object; each malformed field left out is one warning line to `say`."""
    summary, warnings = jobsummary.parse(read_remote_record(conn, path), path)
    for line in warnings:
        say(line)
    return summary


def write_remote_json(conn, path: str, data, *, mode: int = 0o644) -> None:
    """Write JSON to `path` on the node atomically (a reader never sees half a file)."""
    write_remote_text(conn, path, json.dumps(data, indent=2) + "\n", mode=mode)


def write_remote_text(conn, path: str, text: str | bytes, *, mode: int = 0o644) -> None:
    """Write `text` to `path` on the node atomically; a `mode` other than 0644 from its first byte."""
    partial = shlex.quote(f"{path}.xc-new")
    if mode != 0o644:
        conn.run(f"umask 077; : > {partial} && chmod {mode:o} {partial}", hide=True, in_stream=False)
    conn.put(io.BytesIO(text.encode() if isinstance(text, str) else text), remote=f"{path}.xc-new")
    conn.run(f"mv -f {partial} {shlex.quote(path)}", hide=True, in_stream=False)


def log_text(master, job_id: str) -> str:
    return read_remote_file(master, f"{job_dir(job_id)}/log") or ""


def log_tail(master, job_id: str, lines: int = 20) -> str:
    """The last lines of the job's log, read on the master (a long run's log stays there)."""
    result = master.run(f"tail -n {int(lines)} {shlex.quote(job_dir(job_id) + '/log')}",
                        hide=True, warn=True, in_stream=False)
    return result.stdout if result.ok else ""


def log_first(master, job_id: str, text: str) -> str:
    """The first line of the job's log that holds `text` (found on the master), or ""."""
    result = master.run(f"grep -F -m 1 -e {shlex.quote(text)} {shlex.quote(job_dir(job_id) + '/log')}",
                        hide=True, warn=True, in_stream=False)
    return result.stdout if result.ok else ""


def rank_states(conns: Mapping[str, object], job_id: str) -> dict[str, NodeOutcome]:
    return {o.node: o for o in on_nodes(conns, _sh(RANKS_SH, job_id), timeout=30)}


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
        outcomes.append(NodeOutcome("job script", False, connections.explain(exc, master)))
    outcomes += on_nodes(conns, _sh(STOP_NODE_SH, job_id, grace), timeout=grace + 30)
    return outcomes


