"""One run of `fab train` on the controller, every path alike: the built-in job, your own program,
`--managed` and `--managed --resume` differ only in their request (cluster/job/request.py).

`run(request, inventory)`: the backend's checks before a run (AWS: credentials, nodes running, no
notice), a connection per node, then the job lifecycle (node_setup/job_lifecycle/, over Fabric:
node_setup/ssh/transport.py): prepare (the busy-node check, the version warning, the offline demo),
upload (data files, the workdir, requirements), hosts (fab's distribution); then either the job's start
and its log followed to the end (`follow_to_end`: the outcome as fab's exit code, the summary, the
world check of your program, the cost), or with --managed the run handed to its supervisor on the
master (node_setup/tasks/managed.py), which runs the same lifecycle there for every job.

Exit codes (cluster/exit_codes.py): the job's own, or fab's (2 bad input, 3 a node
unreachable or not prepared, 130 Ctrl-C, 143 stopped), or cluster/job/worldcheck.py's TRAINED_ALONE.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from cluster.inventory import Inventory
from cluster.job import jobreport, jobsummary, worldcheck
from cluster.job.joblog import failure_report
from cluster.job.jobplan import JobPlan, plan, shown
from cluster.job.request import RunRequest
from node_setup import job_history
from node_setup.job_lifecycle.steps import BUSY, UNREACHABLE, Lifecycle, LifecycleError, table
from node_setup.ssh import job as jobs
from node_setup.tasks.common import CTRL_C, FAILED, INTERRUPTED_BY_RECLAIM, STOPPED, fail
from node_setup.tasks.common import UNREACHABLE as UNREACHABLE_CODE

if TYPE_CHECKING:
    from node_setup.ssh.transport import FabricTransport


def say(line: str) -> None:
    print(line, flush=True)


def preflight(inventory: Inventory) -> None:
    """Before anything starts: the backend's checks on the run's nodes (AWS: credentials, every node still
    running, no spot notice); exit 2 with the findings when one failed."""
    from node_setup.backends import backend_for

    report = backend_for(inventory.kind).preflight_for_run(inventory)
    if report is not None and not report.ok:
        print(report.render())
        raise fail("preflight failed; fix the findings above and rerun")


def prepared(request: RunRequest, inventory: Inventory, job: JobPlan):
    """The run's nodes checked, connected and prepared (prepare, upload, hosts): (the lifecycle, the plan,
    which --resume without --output-dir may have moved to the newest job's output directory)."""
    from node_setup.controller import project_version
    from node_setup.ssh.transport import DistributionFailed, FabricTransport
    from node_setup.tasks import common

    preflight(job.inventory)
    transport = FabricTransport(job.inventory, common.connect(job.inventory))
    life = Lifecycle(transport, say)
    if request.resume and request.output_dir is None:
        master = transport.conns[transport.master]
        try:
            previous = jobs.read_metadata(master, jobs.resolve_job_id(master, None)).get("output_dir")
        except jobs.JobError:
            previous = None
        if previous:
            job = plan(dataclasses.replace(request, output_dir=previous), inventory)
            say(f"resuming in {previous} (the newest job's output directory)")
    try:
        life.prepare(job, refuse_busy=not request.allow_busy, expected_version=project_version())
        try:
            life.upload(job, request.data_files)
            life.hosts(job)
        except BaseException:
            life.release(job)
            raise
    except LifecycleError as exc:
        if exc.reason != BUSY:
            say("node preparation:\n" + table(exc.answers))
        raise fail(str(exc), UNREACHABLE_CODE if exc.reason == UNREACHABLE else FAILED) from None
    except DistributionFailed as exc:
        say("distribution:\n" + exc.result.table())
        raise fail(f"cannot launch: {exc}", UNREACHABLE_CODE) from None
    return life, job


def run(request: RunRequest, inventory: Inventory, job: JobPlan, *, all_ranks: bool = False) -> int:
    """The run of `request` (`job`: its first job, planned) from the backend's checks to its end; fab's
    exit code. `all_ranks`: the log shows every rank's metrics, not rank 0's only."""
    from node_setup.tasks import managed
    from node_setup.tasks.spend import RunCostClock

    life, job = prepared(request, inventory, job)  # the launch claimed on the master (not with --allow-busy)
    if request.managed is not None:
        life.release(job)  # the supervisor's own launch claims it again
        return managed.hand_off(request, inventory, job, life, all_ranks=all_ranks)
    try:
        pid = life.start(job, request)  # its start command gives the claim up
    except BaseException as exc:
        life.release(job)
        if isinstance(exc, LifecycleError):
            raise fail(str(exc), FAILED) from None
        raise
    say(f"layout: {job.layout.describe()[1]}")
    say(f"job {job.job_id} started on {job.inventory.master.name} (pid {pid}): {job.launch.world_size} ranks on "
        f"{', '.join(job.launch.hosts)}; output {shown(job.output_dir)}")
    job_history.started(job)  # fab jobs and fab get find it even if its master goes before they ask
    master = life.transport.conns[life.transport.master]
    cost = RunCostClock.at_launch(job)  # prints the planned time and cost
    code = follow_to_end(life, job, all_ranks=all_ranks)
    own = request.own
    if own is not None and code == 0:
        code = world_check(life, job, own.independent_ranks)
    cost.at_end(master, job, code)  # prints the actual ones, records both in summary.json
    job_history.observed(job.inventory, master)  # its end, as the master recorded it
    return code


# ---------------------------------------------------------------------------------------- the end


def read_summary(master, job: JobPlan) -> tuple[dict | None, str | None]:
    """(summary.json of the job on the master, checked: cluster/job/jobsummary.py, None), or (None, why
    there is none to read)."""
    path = f"{job.output_dir}/summary.json"
    text = jobs.read_remote_record(master, path)
    if text is None:
        return None, f"(no {path} on the master)"
    summary, warnings = jobsummary.parse(text, path)
    for line in warnings:
        say(line)
    return (summary, None) if summary is not None else (None, f"summary ({path}): unreadable")


def follow_to_end(life: Lifecycle[FabricTransport], job: JobPlan, *, all_ranks: bool = False) -> int:
    """Stream the job until it ends (Ctrl-C asks whether to stop it), then its outcome (the one rule,
    cluster/job/jobreport.py) as fab's exit code, with what it means."""
    master = life.transport.conns[life.transport.master]
    job_id, rank_hosts = job.job_id, list(job.launch.rank_hosts)
    try:
        jobs.follow(master, job_id, rank_hosts, launcher=job.launch.launcher, all_ranks=all_ranks)
    except KeyboardInterrupt:
        return on_interrupt(life, job)
    ended = life.outcome(job)
    if ended is None:  # the stream broke (connection lost) while the job goes on
        say(f"\nlost the log stream; job {job_id} is still running: reattach with `fab logs --follow`")
        return FAILED
    if ended.state == jobreport.STOPPED:
        say(f"\njob {job_id} was stopped (fab stop, {ended.detail})")
        return STOPPED
    if ended.code == 0:
        say(f"\njob {job_id} finished: exit code 0")
        if job.user:
            say(f"output: {shown(job.output_dir)} on {job.inventory.master.name} (`fab get` copies it here)")
        else:
            summary, problem = read_summary(master, job)
            say("\n".join([problem or ""] if summary is None else jobreport.summary_lines(
                summary, shown(f"{job.output_dir}/summary.json"), job.inventory.master.name)))
        return 0
    said = ended.launcher_code
    if ended.code == INTERRUPTED_BY_RECLAIM:  # the program's own outcome: it stopped at a spot notice
        say(f"\njob {job_id} interrupted: exit code {ended.code} (a spot notice)")
    else:
        say(f"\njob {job_id} " + (f"failed: exit code {said}" if said is not None else
                                  f"ended without an exit code ({ended.state})"))
    for line in failure_report(jobs.log_text(master, job_id), rank_hosts, said):
        say(f"  {line}")
    if ended.first is not None and said is not None and ended.code != said:
        # the launcher's own code (Intel MPI: 255, torchrun: 1) says less than the program's
        say(f"  exit code {ended.code}: rank {ended.first.rank}'s program's own (the launcher returned {said})")
    if ended.code == INTERRUPTED_BY_RECLAIM and not job.user:
        try:  # whatever the master's summary holds, the cleanup below still runs
            for line in jobreport.reclaim_report(read_summary(master, job)[0], job.inventory.master.name):
                say(f"  {line}")
        except Exception as exc:  # noqa: BLE001 - e.g. the master went with the reclaim
            say(f"  what was saved cannot be read from {job.inventory.master.name} ({type(exc).__name__}: {exc})")
    cleanup = life.stop(job, grace=5)
    if any(not a.ok for a in cleanup):
        say("could not clean up every node:\n" + table(cleanup))
    else:
        say("  no rank of the job is left on any node")
    return ended.code if ended.code is not None else FAILED


def on_interrupt(life: Lifecycle[FabricTransport], job: JobPlan) -> int:
    say("\ninterrupted.")
    try:
        answer = input(f"Stop job {job.job_id} on every node? [y/N] ").strip().lower()
    except (EOFError, KeyboardInterrupt):
        answer = ""
    life.transport.close()  # the interrupted stream may have left a half-closed channel; the next command reconnects
    if answer in ("y", "yes"):
        say(f"stopped job {job.job_id}:\n" + table(life.stop(job)))
    else:
        say(f"job {job.job_id} keeps running on the cluster: `fab logs --follow` reattaches, `fab stop` ends it")
    return CTRL_C


def world_check(life: Lifecycle[FabricTransport], job: JobPlan, independent: bool) -> int:
    """After your program ended 0 on every rank: did its ranks form one world (cluster/job/worldcheck.py)?"""
    from node_setup.ssh.world import read_records

    records, problems = read_records(life.transport.conns, job.job_id)
    found = worldcheck.verdict(records, job.launch.world_size, independent=independent)
    say("\n".join([*problems, *found.lines]))
    return found.code
