"""`fab train --managed`: the run handed to its supervisor on the master (`hand_off`, `follow_run`; the
supervisor is node_setup/supervisor/), and `--managed --resume`'s request read back from the run's signed
spec (`resumed_request`; your own program's workdir scanned again here, `workdir_again`, and checked
against the digest the spec recorded).

The nodes are prepared by the job lifecycle (node_setup/tasks/job_run.py) before `hand_off`, as for every
path; the recoveries themselves are the supervisor's (docs/long-spot-runs.md), which runs the same
lifecycle on the master. A lost master's run is continued by the new master's boot step
(node_setup/supervisor/boot.py) from what `publish_spec` and `store_run` leave where the master's loss does not
take it along. The controller's job history (node_setup/job_history.py) gets the
run's first job once it started and, when the run ended with its master there, every job as the master
recorded its end.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from pathlib import Path
from typing import Any

from cluster.backend import BackendError
from cluster.inventory import Inventory
from cluster.job.jobplan import JobPlan
from cluster.job.request import OwnProgram, RequestError, RunRequest
from cluster.job.train_options import JobOptions
from cluster.job.userjob import CopyPlan, UserJobError
from cluster.run import runspec
from cluster.run import supervision as sv
from node_setup import job_history
from node_setup.backends import backend_for
from node_setup.ssh import recovery as nodes
from node_setup.tasks.common import BAD_INPUT, CTRL_C, FAILED, OK, STOPPED, UNREACHABLE, fail

START_WAIT_S = 300.0  # how long fab waits for the supervisor to start the run's first job


def say(line: str) -> None:
    print(f"managed: {line}", flush=True)


def _spec_key() -> runspec.Key:
    from node_setup.ssh.keys import KeyStoreError, spec_key

    try:
        return spec_key()
    except KeyStoreError as exc:
        raise fail(str(exc)) from None


# ---------------------------------------------------------------- the run handed to the master


def publish_spec(master, request: RunRequest, inventory: Inventory, output_dir: str, *, key: runspec.Key,
                 s3=None, handoff: dict[str, Any] | None = None) -> list[str]:
    """The run's signed spec where its checkpoints are kept (cluster/run/runspec.py): its output directory
    on the master, and with --checkpoint-uri beside the checkpoints in S3; the lines to say. `handoff`: the
    supervisor's spec, signed with it, which a new master starts the run's supervisor from."""
    from node_setup.aws import run_spec as spec_store
    from node_setup.ssh.job import write_remote_text

    text = runspec.signed_text(request, inventory.kind, key, cluster=inventory.name, handoff=handoff)
    path = runspec.spec_path(output_dir)
    master.run(f"cd && mkdir -p {shlex.quote(path.rsplit('/', 1)[0])}", hide=True, in_stream=False)
    write_remote_text(master, path, text)
    uri = request.checkpoint_uri
    if uri:
        why = spec_store.put(runspec.spec_uri(uri), text, s3, inventory.region)
        if why is None:
            return [f"the run's spec is beside its checkpoints: {runspec.spec_uri(uri)}"]
        return [f"warning: the run's spec could not be written to {runspec.spec_uri(uri)} ({why}); a lost master's "
                "run cannot be resumed from the bucket"]
    if not inventory.on_shared_disk(output_dir):  # the local cluster's output root: on the disk every node shares
        return ["no --checkpoint-uri: the checkpoints and the run's spec are only on the master's disk, and a lost "
                "master takes them along"]
    return []


def supervisor_spec(request: RunRequest, inventory: Inventory, job: JobPlan) -> tuple[dict[str, Any], dict[str, str]]:
    """What the supervisor on the master reads (node_setup/supervisor/onmaster.py), and the secret values apart."""
    try:  # what the supervisor's group reads back (AWS: the workers' group; local: the keeper's data directory)
        context = backend_for(inventory.kind).run_context(inventory)
    except BackendError as exc:
        raise fail(str(exc), UNREACHABLE if exc.unreachable else BAD_INPUT) from None
    return runspec.handoff(request, kind=inventory.kind,
                           run_nodes=job.inventory.to_mapping(), cluster=inventory.to_mapping(),
                           instance_ids={n.name: n.instance_id for n in job.inventory.nodes if n.instance_id},
                           context=context)


def hand_off(request: RunRequest, inventory: Inventory, job: JobPlan, life, *, all_ranks: bool = False) -> int:
    """`fab train --managed` once the lifecycle prepared the nodes: the run handed to its supervisor on the
    master, then its log followed (Ctrl-C detaches) or, with --detach, fab's return once the first job started."""
    managed = request.managed
    assert managed is not None  # the --managed path
    master = life.transport.conns[life.transport.master]
    request = dataclasses.replace(request, output_dir=job.output_dir)  # every relaunch writes where the first did
    spec, secrets = supervisor_spec(request, inventory, job)
    for line in publish_spec(master, request, inventory, job.output_dir, key=_spec_key(), handoff=spec):
        say(line)
    for line in store_run(inventory, request, secrets, spec):
        say(line)
    nodes.start_supervisor(master, spec, secrets, systemd=backend_for(inventory.kind).supervisor_as_service())
    say(f"run {request.run_id} handed to its supervisor on the master {job.inventory.master.name}: it recovers "
        + managed.describe(request.nodes))
    if job.inventory.master.spot:
        say("the master is a spot instance: it runs the job and the supervisor; a reclaimed master's run goes on "
            "from its newest checkpoint once a new master boots (docs/long-spot-runs.md#the-master)")
    deadline = time.time() + START_WAIT_S
    state = None
    while time.time() < deadline:
        state = nodes.supervised_state(master, request.run_id)
        if state and (state.get("job") or state.get("status") in sv.FINAL):
            break
        time.sleep(0.5)
    if not state:
        raise fail(f"the supervisor did not start on {job.inventory.master.name}; see "
                   f"~/{sv.RUN_ROOT}/{request.run_id}/{sv.LOG_FILE} there", UNREACHABLE)
    say(sv.status_line(state))
    job_history.observed(job.inventory, master)  # the run's first job at its start, into the controller's history
    if managed.detach or state.get("status") in sv.FINAL:
        say("detached: `fab status` shows the run, `fab logs --follow` follows it, `fab stop` ends it")
        return FAILED if state.get("status") == sv.FAILED else OK
    code = follow_run(master, request.run_id, all_ranks=all_ranks)
    job_history.observed(job.inventory, master)  # every job of the run, as the master recorded their ends
    return code


def store_run(inventory: Inventory, request: RunRequest, secrets: dict[str, str], spec: dict[str, Any],
              store=None) -> list[str]:
    """Where a new master finds the run (the backend's run store: SSM on AWS, its double locally): the cluster's
    private SSH key and the run's record (where its signed spec is, its withheld values), when the spec outlives
    the master (on the disk every node shares, else beside the checkpoints of --checkpoint-uri); the lines to
    say."""
    from node_setup.ssh.keys import KeyStoreError, ensure_cluster_key

    output_dir = str(request.output_dir or "")
    if inventory.on_shared_disk(output_dir):
        spec_at = runspec.spec_path(output_dir)
    elif request.checkpoint_uri:
        spec_at = runspec.spec_uri(request.checkpoint_uri)
    else:
        return []
    store = store or backend_for(inventory.kind).run_store(inventory.name, data_dir=spec.get("local_data_dir") or "",
                                                           region=inventory.region)
    if store is None:
        return []
    try:
        store.put(runspec.CLUSTER_KEY_NAME, ensure_cluster_key(inventory.name).private_key)
        store.put(runspec.run_record_name(request.run_id), runspec.run_record(request.run_id, spec_at, secrets))
    except (runspec.StoreError, KeyStoreError) as exc:
        return [f"warning: {exc}; a new master cannot continue the run by itself (`fab train --managed --resume` "
                "does)"]
    return [f"a new master continues the run by itself: its secrets are in {store.where(runspec.RUNS_FOLDER)}"]


def run_exit_code(verdict: str, state: dict | None) -> int:
    """fab's exit code for a supervised run that ended (cluster/run/runlog.py's verdict, its last state)."""
    from cluster.run import runlog

    if verdict != runlog.ENDED:
        return FAILED
    return {sv.COMPLETED: OK, sv.STOPPED: STOPPED}.get(
        (state or {}).get("status", ""), FAILED)


def detached_line(run_id: str) -> str:
    return (f"detached; run {run_id} goes on under its supervisor on the master: `fab logs --follow` reattaches, "
            "`fab status` shows it, `fab stop` ends it")


def follow_run(master, run_id: str, *, last_lines: int | None = None, all_ranks: bool = False) -> int:
    """Follow the whole run (every job's log and the supervisor's lines between them) until it ends: its
    final state as fab's exit code; Ctrl-C detaches (the run goes on) with CTRL_C."""
    from cluster.run import runlog
    from node_setup.ssh.supervised_log import show_run

    try:
        verdict, state = show_run(master, run_id, follow=True, last_lines=last_lines, all_ranks=all_ranks)
    except KeyboardInterrupt:
        print(f"\n{detached_line(run_id)}", flush=True)
        return CTRL_C
    print(runlog.end_line(run_id, state, verdict), flush=True)
    return run_exit_code(verdict, state)


# ---------------------------------------------------------------- --managed --resume


def read_spec(inventory: Inventory, *, checkpoint_uri: str, output_dir: str, master=None,
              s3=None) -> tuple[str, str, str]:
    """(the run's spec text, where it was read, the output directory it was read from: "" for S3): beside the
    checkpoints of --checkpoint-uri, else in --output-dir (or the newest job's) on the master. One line and exit 2
    when it is missing."""
    from node_setup.aws import run_spec as spec_store
    from node_setup.ssh import job as jobs

    if checkpoint_uri:
        from cluster.job.job_args import JobArgsError, parse_s3_uri

        try:
            parse_s3_uri(checkpoint_uri)
        except JobArgsError as exc:
            raise fail(str(exc)) from None
        where, directory = runspec.spec_uri(checkpoint_uri), ""
        text, why = spec_store.get(where, s3, inventory.region)
    else:
        directory = output_dir
        if not directory:
            try:
                directory = jobs.read_metadata(master, jobs.resolve_job_id(master, None)).get("output_dir") or ""
            except jobs.JobError:
                directory = ""
        if not directory:
            raise fail("--resume: with --managed it continues a run from its spec, and none is known here; give "
                       "--checkpoint-uri s3://... (where the run's checkpoints are) or --output-dir (the run's)")
        where = f"{inventory.master.name}:{runspec.spec_path(directory)}"
        text, why = jobs.read_remote_file(master, runspec.spec_path(directory)), "not found"
    if text is None:
        raise fail(f"--resume: no run spec at {where} ({why}); `fab train --managed` writes it there when it hands "
                   "a run over: give the run's --checkpoint-uri or --output-dir, or start the run without --resume")
    return text, where, directory


def resumed_request(inventory: Inventory, options: JobOptions | dict[str, Any], *, run_id: str, s3=None) -> RunRequest:
    """`fab train --managed --resume`: the run's request read back from its spec, the signature and every field
    checked before anything starts (one line naming where, exit 2), then the same run again: a new run id,
    --resume, the withheld --env values given again (`options`: fab train's, left out as None)."""
    from cluster.job.launch import LaunchError, env_pairs
    from cluster.job.run_env import check_env
    from node_setup.tasks import common

    o = JobOptions.of(options)
    uri, output_dir = o.checkpoint_uri or "", o.output_dir or ""
    master = common.connect(inventory)[inventory.master.name] if not uri else None
    text, where, read_from = read_spec(inventory, checkpoint_uri=uri, output_dir=output_dir, master=master, s3=s3)
    try:
        binding = runspec.Binding(inventory.name, inventory.kind, checkpoint_uri=uri or None,
                                  output_dir=None if uri else read_from)
        found = runspec.read(text, where, _spec_key(), binding)
        env = dict(check_env(env_pairs(o.env or ""), found.request.allow_env))
        own = found.request.own
        request = runspec.resumed(found, env, run_id, workdir=workdir_again(own) if own is not None else None,
                                  workdir_changed_ok=bool(o.workdir_changed_ok))
        inventory.first(request.nodes)
    except (runspec.RunSpecError, RequestError, LaunchError) as exc:
        raise fail(str(exc)) from None
    except ValueError as exc:  # the inventory has fewer nodes than the run
        raise fail(f"{where}: {exc}") from None
    own = request.own
    program = "its arguments with --resume"
    if own is not None:
        assert own.copy is not None  # workdir_again's
        program = (f"your program restarted with the newest checkpoint, its workdir {own.workdir} copied again "
                   f"({len(own.copy.files)} file(s), "
                   + ("--workdir-changed-ok" if own.workdir_changed_ok else "as the run recorded them") + ")")
    say(f"resuming run {found.request.run_id} from its spec at {where}: {request.nodes} node(s), {program}, its "
        "layout and --managed settings (the other options given now are not used)")
    return request


def workdir_again(own: OwnProgram) -> CopyPlan:
    """Your program's workdir, the folder on this controller the run recorded, scanned again as at the first
    launch (the same skip rules and size limit); one line and exit 2 when it cannot be."""
    from node_setup.ssh.workdir import scan

    if not Path(own.workdir).is_dir():
        raise fail(f"--resume: the run's workdir {own.workdir} is not a folder on this machine; the run copies it "
                   "again from the controller that started it: resume there, with the workdir where it was")
    try:
        return scan(own.workdir, own.workdir_limit_mb * 1024 * 1024)
    except UserJobError as exc:
        raise fail(str(exc)) from None


