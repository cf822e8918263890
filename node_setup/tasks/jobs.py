"""`fab jobs`, `fab status`, `fab logs`, `fab stop`: the jobs that `fab train` started, found on the master."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json as _json

from invoke import Exit

from cluster.cost import flops, spend
from cluster.job import jobprogress, joblist
from cluster.job.jobplan import check_job_id, shown
from cluster.job.logstream import assemble
from cluster.job.launch import DEFAULT_LAUNCHER
from cluster.inventory import DOWN
from cluster.names import printable
from node_setup import job_history
from node_setup.backends import backend_for
from node_setup.ssh import job as jobs
from node_setup.ssh.autostop import status_report as autostop_report
from node_setup.ssh.fanout import on_nodes, outcome_table
from node_setup.tasks import common
from node_setup.tasks import spend as node_spend
from node_setup.tasks.common import (CLUSTER_HELP, CTRL_C, JOB_HELP, REGION_HELP, UNREACHABLE, Unset, duration_or_off,
                                     fail, task)


MFU_LOG_LINES = 200  # the log's end `fab status` reads (the last line shown; an MFU line there, else the first)


def _job_on_master(cluster: str, region: str, job: str):
    """(inventory, connections, master connection, job id) for status, logs and stop."""
    inventory = common.inventory(cluster, region)
    conns = common.connect(inventory)
    master = conns[inventory.master.name]
    try:
        return inventory, conns, master, jobs.resolve_job_id(master, job or None)
    except jobs.JobError as exc:
        raise fail(str(exc)) from None


@task(help={"cluster": CLUSTER_HELP, "region": REGION_HELP, "job": JOB_HELP,
            "json": "print the nodes (with their spend), the total and the job as one JSON object, nothing else"})
def status(c, cluster="", region="", job="", json=False):
    """Show the nodes with their spend so far, and the job on them with its progress.

    The nodes' state, type, market, uptime, hourly price and spend so far and the cluster's total; the job's
    state, program, progress (step of total, samples/s, time left, cost so far) and last log line; --json
    prints the same as one JSON object."""
    if job:
        try:
            check_job_id(job)
        except ValueError as exc:
            raise fail(str(exc)) from None
    inventory = common.inventory(cluster, region)
    spent = node_spend.cluster_spend(inventory)
    facts: dict = {"nodes": [], "job": None, "problems": []}
    if not json:
        _status(inventory, job, spent, facts)
        return
    with contextlib.redirect_stdout(io.StringIO()):  # the table's text: with --json stdout holds the JSON only
        _status(inventory, job, spent, facts)
    text = node_spend.status_json(inventory, spent, facts["nodes"], facts["job"], facts["problems"])
    print(_json.dumps({**_json.loads(text), "supervised": facts.get("supervised")}, indent=2))


def _status(inventory, job: str, spent: spend.ClusterSpend, facts: dict) -> None:
    """`fab status`'s lines; `facts` collects what they show (nodes, job, problems) for --json."""
    conns = common.connect(inventory)
    master = conns[inventory.master.name]
    unreached = False
    try:
        job_id = jobs.resolve_job_id(master, job or None)
    except jobs.JobError:
        job_id = None
    except Exception as exc:  # noqa: BLE001 - the table below still shows every node
        job_id, unreached = None, True
        facts["problems"].append(f"master {inventory.master.name} unreachable: {type(exc).__name__}: {exc}")
        print(facts["problems"][-1])
    state, detail = "", ""
    if job_id:
        try:
            state, detail = jobs.job_state(master, job_id)
        except Exception as exc:  # noqa: BLE001 - as above: the table still shows every node
            job_id, unreached = None, True
            facts["problems"].append(f"master {inventory.master.name} unreachable: {type(exc).__name__}: {exc}")
            print(facts["problems"][-1])
    if job and state == "missing":  # as `fab logs` and `fab get` refuse it
        raise fail(f"--job: job {job_id!r} is not on the master {inventory.master.name}; `fab jobs` lists the jobs "
                   "there")
    ranks = jobs.rank_states(conns, job_id) if job_id else {o.node: o for o in on_nodes(conns, "true", timeout=30)}
    print(f"cluster {inventory.name} ({inventory.kind}, profile {inventory.profile}, {len(inventory.nodes)} node(s))")
    print(f"  {'node':<10} {'address':<16} {'state':<9} {'type':<16} {spend.SPEND_HEADER} {'reachable':<10} ranks")
    for node in sorted((*inventory.nodes, *inventory.down), key=lambda n: n.rank):  # down: the backend's, not reached
        outcome = ranks.get(node.name)
        reachable = "yes" if outcome and outcome.ok else "NO"
        running = ""
        if outcome and outcome.ok and job_id:
            live = [line.split()[0] for line in outcome.detail.splitlines() if line.endswith(" running")]
            # a job that ended has no rank running: one still alive is left over (fab stop ends it)
            alive = "running" if state == "running" else "left after the job's end"
            running = f"{len(live)} {alive} ({', '.join('r' + r for r in live)})" if live else "none running"
        elif outcome and not outcome.ok:
            running = outcome.detail.splitlines()[-1][:60] if outcome.detail else ""
        itype = node.instance_type or inventory.instance_type
        facts["nodes"].append({"name": node.name, "address": node.address, "state": node.state, "type": itype,
                               "spot": node.spot, "reachable": reachable == "yes", "ranks": running})
        print(f"  {node.name:<10} {node.address:<16} {node.state:<9} {(itype or '-'):<16} "
              f"{spend.spend_columns(spent.node(node.name))} {reachable:<10} {running}")
    print(f"  {spent.total_line()}")
    for line in spent.source_lines():
        print(f"  {line}")
    group = backend_for(inventory.kind).group_status(inventory)  # AWS's workers' group: set to 0, short, why
    if group is not None:
        group_line, group_problem = group
        print(group_line)
        if group_problem:
            facts["problems"].append(group_problem)
    if unreached:  # not "no job": whatever runs there cannot be read
        print(f"the master {inventory.master.name} cannot be reached, so its jobs and a supervised run's state "
              "cannot be read" + ("; it is down (the note above says what brings it back)" if inventory.master.state
                                  == DOWN else "; check that it runs and its sshd answers, then `fab status` again")
              + ". A run it supervises goes on without fab; one whose master was lost continues with "
              "`fab train --managed --resume` once a master is back")
        return
    autostop_line, autostop_problem = autostop_report(master)
    print(autostop_line)
    _supervised(master, facts)
    if autostop_problem:  # workers left running by the idle auto-stop: --json lists it too
        facts["problems"].append(autostop_problem)
    if not job_id:
        print("no job started yet (fab train starts one)")
        return
    detail = printable(detail)  # read from the master: shown as text, nothing a terminal would act on
    try:
        meta = jobs.read_metadata(master, job_id)
    except jobs.JobError as exc:
        meta = {}
        facts["problems"].append(str(exc))
        print(facts["problems"][-1])
    described = {"running": f"running (job script pid {detail})", "exited": f"finished, exit code {detail}",
                 "stopped": f"stopped by fab stop at {detail}", "lost": "ended without an exit code (node restarted?)",
                 "missing": "not found"}.get(state, printable(state))
    facts["job"] = {"id": job_id, "state": state, "detail": detail, "described": described,
                    **{key: meta.get(key) for key in ("started", "world_size", "hosts", "output_dir")},
                    "last_log_line": None, "progress": None}
    print(f"job {job_id}: {described}")
    if meta:
        print(f"  {printable(joblist.program_of(meta) or 'program unknown')}, started {meta.get('started')}, "
              f"{meta.get('world_size')} ranks on {printable(', '.join(meta.get('hosts', [])))}, "
              f"output {shown(printable(meta.get('output_dir') or '?'))}")
    _progress(master, meta, spent, running=state == "running", facts=facts)
    tail = assemble(jobs.log_tail(master, job_id, lines=MFU_LOG_LINES), meta.get("rank_hosts", []),
                    meta.get("launcher", DEFAULT_LAUNCHER), notes=False)  # as `fab logs` shows them
    if tail:
        facts["job"]["last_log_line"] = tail[-1]
        print(f"  last log line: {facts['job']['last_log_line']}")
    progress = flops.last_progress("\n".join(tail))  # the job's latest model FLOP/s per node and MFU
    if progress is None:  # the built-in job logs it once, at its first logging step
        progress = flops.last_progress(jobs.log_first(master, job_id, flops.PROGRESS_MARKER))
    facts["job"]["mfu"] = progress["mfu"] if progress else None
    if progress:
        print(f"  MFU: {progress['line']}")
    job_history.observed(inventory, master, say=lambda line: facts["problems"].append(line))  # into the history


def _progress(master, meta: dict, spent: spend.ClusterSpend, *, running: bool, facts: dict) -> None:
    """The job's progress record (cluster/job/jobprogress.py): step of total, samples/s, time left, cost so far."""
    if not meta.get("output_dir"):
        return
    path = f"{meta['output_dir']}/{jobprogress.FILE}"
    record, problem = jobprogress.parse(jobs.read_remote_record(master, path),
                                        f"{getattr(master, 'host', 'the master')}: {shown(path)}")
    if problem:
        facts["problems"].append(problem)
        print(f"  progress: {printable(problem)}")
    if record is None:
        return
    now = node_spend.clock()
    started = joblist.epoch(meta.get("started"))
    if started is not None and record.updated < started:  # an earlier job's, in the same output folder
        print(f"  progress: none yet from this job (the record in {shown(printable(path))} is from before it started)")
        return
    running_s = (now if running else record.updated) - started if started is not None else None
    prices = [spent.node(host) for host in meta.get("hosts", [])]
    usd_per_hour = (sum(p.usd_per_hour for p in prices if p is not None and p.usd_per_hour is not None)
                    if prices and all(p is not None and p.usd_per_hour is not None for p in prices) else None)
    if not running:
        record = dataclasses.replace(record, steps_per_second=None)  # no time left for a job that ended
    facts["job"]["progress"] = jobprogress.as_json(record, running_s=running_s, usd_per_hour=usd_per_hour)
    print(f"  progress: {jobprogress.line(record, now=now, running_s=running_s, usd_per_hour=usd_per_hour)}")


def _supervised(master, facts: dict) -> None:
    """The newest supervised run (`fab train --managed`): its state file on the master, one line."""
    from cluster.run.supervision import status_line
    from node_setup.ssh.recovery import supervised_state

    try:
        state = supervised_state(master)
    except Exception:  # noqa: BLE001 - no run, or the master went: the rest of the status stands
        state = None
    facts["supervised"] = state
    if state:
        print(status_line(state))


@task(help={"cluster": CLUSTER_HELP, "region": REGION_HELP, "job": JOB_HELP,
            "follow": "keep streaming until the job ends (a supervised run's: until the run ends, every job in turn)",
            "lines": "show only the last N lines first (default: the whole log)",
            "all-ranks": "show the metrics every rank prints, not rank 0's only"})
def logs(c, cluster="", region="", job="", follow=False, lines=Unset(int, "the whole log"), all_ranks=False):
    """Print a job's log, whole lines labelled by node and rank; --follow reattaches to a running job.

    Without --job, the newest job of a supervised run (`fab train --managed`) shows the whole run: every job in
    order, the supervisor's lines between them, and with --follow on until the run ends, with the run's exit
    code. Other ranks' metrics are shown with --all-ranks; --lines N counts the lines as shown."""
    _, _, master, job_id = _job_on_master(cluster, region, job)
    try:
        meta = jobs.read_metadata(master, job_id)
    except jobs.JobError as exc:
        raise fail(str(exc)) from None
    last = lines or None  # a count of 1 or more, or not given: the whole log
    run = meta.get("supervised_run")
    if run and not job:
        _run_logs(master, str(run), follow=follow, last=last, all_ranks=all_ranks)
        return
    if not follow:
        jobs.follow(master, job_id, meta.get("rank_hosts", []), last_lines=last, follow_=False,
                    launcher=meta.get("launcher", DEFAULT_LAUNCHER), all_ranks=all_ranks)
        return
    try:
        jobs.follow(master, job_id, meta.get("rank_hosts", []), last_lines=last,
                    launcher=meta.get("launcher", DEFAULT_LAUNCHER), all_ranks=all_ranks)
    except KeyboardInterrupt:
        print(f"\ndetached; job {job_id} keeps running (`fab stop` ends it)")
        raise Exit(code=CTRL_C) from None
    state, detail = jobs.job_state(master, job_id)
    print(f"\njob {job_id}: {state} {detail}".rstrip())
    if state == "exited" and detail.strip().isdigit():
        raise Exit(code=int(detail))


def _run_logs(master, run_id: str, *, follow: bool, last: int | None, all_ranks: bool = False) -> None:
    """`fab logs` on a supervised run: the whole run's log (node_setup/ssh/supervised_log.py)."""
    from cluster.run import runlog
    from cluster.run.supervision import RUN_ID_RE, status_line
    from node_setup.ssh.supervised_log import show_run
    from node_setup.tasks.managed import follow_run

    if not RUN_ID_RE.match(run_id):
        raise fail(f"the newest job names the supervised run {run_id!r}, which is no run id; pass --job to read "
                   "that job's log alone")
    if follow:
        raise Exit(code=follow_run(master, run_id, last_lines=last, all_ranks=all_ranks))
    verdict, state = show_run(master, run_id, follow=False, last_lines=last, all_ranks=all_ranks)
    print(runlog.end_line(run_id, state, verdict) if verdict == runlog.ENDED else status_line(state or {"run": run_id}))


@task(help={"cluster": CLUSTER_HELP, "region": REGION_HELP, "job": JOB_HELP,
            "grace": f"how long ranks get to exit after TERM before KILL, e.g. 30s (default "
                     f"{jobs.STOP_GRACE_SECONDS}s; 0: KILL at once)"},
      kinds={"grace": duration_or_off})
def stop(c, cluster="", region="", job="", grace=float(jobs.STOP_GRACE_SECONDS)):
    """Stop a job on every node; checks that no rank is left anywhere."""
    _, conns, master, job_id = _job_on_master(cluster, region, job)
    from node_setup.ssh.recovery import request_stop

    run = request_stop(master)  # a supervised run's supervisor first, so that it does not relaunch
    if run:
        print(f"supervised run {run}: its supervisor was asked to stop")
    outcomes = jobs.stop(master, conns, job_id, grace=round(grace))
    print(f"stop job {job_id}:")
    print(outcome_table(outcomes))
    failed = [o.node for o in outcomes if not o.ok]
    if failed:
        raise fail(f"could not confirm the job is gone on: {', '.join(failed)} (reason above); rerun "
                   "`fab stop` once they are reachable", UNREACHABLE)


@task(help={"cluster": CLUSTER_HELP, "region": REGION_HELP,
            "json": "print the jobs as one JSON object, nothing else",
            "costs": "what each job cost (recorded, else nodes x duration x the cluster's price now) and each "
                     "supervised run with its recoveries"})
def list_jobs(c, cluster="", region="", json=False, costs=False):
    """List the cluster's jobs, newest first, with their state, exit code, program and output folder.

    Also the start, duration, nodes and ranks: read from the master's job records in one SSH round, and from
    the controller's job history for the jobs of a master since replaced."""
    inventory = common.inventory(cluster, region)
    master = common.connect(inventory)[inventory.master.name]
    try:
        rows, problems = joblist.parse(jobs.list_jobs(master), inventory.master.name)
    except jobs.JobError as exc:
        raise fail(str(exc)) from None
    rows = job_history.record(inventory.name, rows, say=problems.append, identity=job_history.identity(inventory))
    if json:
        print(joblist.as_json(rows, inventory.name, problems))
        return
    if costs:
        from cluster.cost.jobcosts import cost_table

        spent = node_spend.cluster_spend(inventory)
        priced = [n.usd_per_hour for n in spent.nodes if n.usd_per_hour is not None]
        per_node_hour = sum(priced) / len(priced) if priced and len(priced) == len(spent.nodes) else None
        print(cost_table(rows, per_node_hour, inventory.name))
    else:
        print(joblist.table(rows, inventory.name, master=inventory.master.name))
    for line in problems:
        print(printable(line))


TASKS = [list_jobs, status, logs, stop]
TASK_NAMES = {"list_jobs": "jobs"}
