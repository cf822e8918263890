"""`fab train --managed`: the run handed to its supervisor on the master (`hand_off`, `follow_run`; the
supervisor is node_setup/supervisor/), with the --managed options checked first (`options`).

The nodes are prepared by node_setup/tasks/train.py (SSH distributed, uploads copied) before
`hand_off`; the recoveries themselves are the supervisor's (docs/long-spot-runs.md). A run that
ends master-lost on AWS while fab follows it: the master alone replaced (`recover_master`).
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass

from cluster.run import recovery as rc
from cluster.backend import BackendError
from cluster.inventory import Inventory
from cluster.job.jobplan import JobPlan
from node_setup.backends import backend_for
from node_setup.ssh import recovery as nodes
from node_setup.tasks.common import BAD_INPUT, CTRL_C, FAILED, INTERRUPTED_BY_RECLAIM, OK, STOPPED, UNREACHABLE, fail

MANAGED_HELP = {
    "managed": "fab stays attached: when the job is interrupted (spot reclaim, a node lost) it gets replacements "
               "(or goes on with the survivors) and resumes from the newest checkpoint (docs/long-spot-runs.md)",
    "max-recoveries": f"with --managed: recoveries before fab gives up (default {rc.DEFAULT_MAX_RECOVERIES})",
    "min-nodes": "with --managed: resume on the survivors when at least M nodes are left and no replacement came "
                 "in time (default 1); with --launcher torchrun: elastic, train on as few as M nodes (torchrun's "
                 "M:N range; a node that leaves restarts the ranks on the others, which resume from the newest "
                 "checkpoint)",
    "wait-for-capacity": f"with --managed: how long to wait for replacement nodes, e.g. 90s, 10m, 1h (default "
                         f"{rc.DEFAULT_WAIT_FOR_CAPACITY}; 0: do not ask, resume on the survivors at once)",
    "resume-arg": "with --managed --script/--module: the words your program gets when the supervisor restarts it "
                  "after a recovery, {checkpoint} standing for the newest checkpoint folder, e.g. "
                  "'--resume_from_checkpoint {checkpoint}' (it also gets XEON_CLUSTER_RESUME_FROM; "
                  "docs/your-own-script.md)",
    "detach": "with --managed: return as soon as the run has started on the master (its supervisor goes on; "
              "`fab status`, `fab logs --follow`, `fab stop` reach it from any controller)",
}
START_WAIT_S = 300.0  # how long fab waits for the supervisor to start the run's first job


def say(line: str) -> None:
    print(f"managed: {line}", flush=True)


def options(*, managed: bool, inventory: Inventory, nodes: int, launcher: str, own_program: bool, max_recoveries: str,
            min_nodes: str, wait: str, detach: bool = False, resume_arg: str = "",
            requirements: str = "") -> rc.ManagedOptions:
    """--managed's settings checked before anything starts (exit 2 with one line otherwise)."""
    from cluster.run import supervision as sv
    from cluster.job.launch import DEFAULT_LAUNCHER

    if not managed:
        given = ("--max-recoveries" if max_recoveries else "--wait-for-capacity" if wait else
                 "--detach" if detach else "--resume-arg")
        raise fail(f"{given}: only with --managed (fab supervises the job and recovers it)")
    if launcher != DEFAULT_LAUNCHER:
        raise fail(f"--managed: not with --launcher {launcher}; torchrun's elastic agent handles a node that leaves "
                   "(--min-nodes without --managed)")
    if resume_arg and not own_program:
        raise fail("--resume-arg: only with --script/--module (the built-in job resumes with --resume)")
    if own_program and requirements:
        raise fail("--requirements: not with --managed: a replacement node would lack them; put them in the "
                   "profile's image or install them from your program")
    try:
        sv.resume_words(resume_arg) if resume_arg else None
    except sv.SupervisionError as exc:
        raise fail(str(exc)) from None
    try:
        return rc.managed_options(max_recoveries=max_recoveries, min_nodes=min_nodes, wait=wait,
                                  nodes=nodes or len(inventory.nodes))
    except rc.RecoveryError as exc:
        raise fail(str(exc)) from None


# ---------------------------------------------------------------- the run handed to the master


def run_spec(opts: rc.ManagedOptions, *, inventory: Inventory, plan: JobPlan, inputs, layout: dict,
             resume_arg: str = "") -> dict:
    """What the supervisor on the master needs (node_setup/supervisor/onmaster.py reads and checks it)."""
    from cluster.run import supervision as sv

    spec = {
        "run_id": sv.check_run_id(plan.job_id), "kind": inventory.kind, "region": inventory.region,
        "inventory": plan.inventory.to_mapping(),
        "instance_ids": {n.name: n.instance_id for n in plan.inventory.nodes if n.instance_id},
        "training_args": list(inputs.args), "prepare": list(inputs.prepare), "layout": dict(layout),
        "output_dir": plan.output_dir, "max_recoveries": opts.max_recoveries, "min_nodes": opts.min_nodes,
        "wait_seconds": opts.wait_seconds, "poll_seconds": 5, "resume": "--resume" in inputs.args,
    }
    if plan.user is not None:  # --script/--module: restarted with the newest checkpoint (cluster/run/supervision.py)
        spec.update(program={"script": plan.user.script, "module": plan.user.module, "args": list(plan.user.args),
                             "signal": plan.user.signal or "none"}, resume_arg=resume_arg)
    try:  # what the supervisor's group reads back (AWS: the workers' group; local: the keeper's data directory)
        spec.update(backend_for(inventory.kind).run_context(inventory))
    except BackendError as exc:
        raise fail(str(exc), UNREACHABLE if exc.unreachable else BAD_INPUT) from None
    return spec


def publish_spec(master, spec: dict, *, region: str | None = None, s3=None) -> list[str]:
    """The run's spec where its checkpoints are kept (cluster/run/runspec.py): its output directory on the
    master, and with --checkpoint-uri beside the checkpoints in S3; the lines to say."""
    from cluster.run import runspec
    from cluster.job.job_args import job_setting
    from node_setup.aws import run_spec as spec_store
    from node_setup.ssh.job import write_remote_json

    text = runspec.text(spec)
    path = runspec.spec_path(spec["output_dir"])
    master.run(f"cd && mkdir -p {shlex.quote(path.rsplit('/', 1)[0])}", hide=True, in_stream=False)
    write_remote_json(master, path, json.loads(text))
    uri = job_setting(spec["training_args"], "--checkpoint_uri")
    if uri:
        why = spec_store.put(runspec.spec_uri(uri), text, s3, region)
        if why is None:
            return [f"the run's spec is beside its checkpoints: {runspec.spec_uri(uri)}"]
        return [f"warning: the run's spec could not be written to {runspec.spec_uri(uri)} ({why}); a lost master's "
                "run cannot be resumed from the bucket"]
    inventory = Inventory.from_mapping(spec["inventory"], default_name=spec["inventory"]["name"])
    if not inventory.on_shared_disk(spec["output_dir"]):  # the local cluster's output root: on the shared disk
        return ["no --checkpoint-uri: the checkpoints and the run's spec are only on the master's disk, and a lost "
                "master takes them along"]
    return []


@dataclass
class ResumedRun:
    """A supervised run continued from its spec: what `hand_off` needs."""

    opts: rc.ManagedOptions
    plan: JobPlan
    inputs: object  # .args, .prepare (train's JobInputs shape)
    layout: dict
    where: str


@dataclass
class _Inputs:
    args: list[str]
    prepare: list[str]


def read_spec(inventory: Inventory, *, checkpoint_uri: str, output_dir: str, master=None, s3=None) -> tuple[dict, str]:
    """(the run's spec, checked, and where it was read): beside the checkpoints of --checkpoint-uri, else in
    --output-dir (or the newest job's) on the master. One line and exit 2 when it is missing or malformed."""
    from cluster.run import runspec
    from node_setup.aws import run_spec as spec_store
    from node_setup.ssh import job as jobs

    if checkpoint_uri:
        from cluster.job.job_args import JobArgsError, parse_s3_uri

        try:
            parse_s3_uri(checkpoint_uri)
        except JobArgsError as exc:
            raise fail(str(exc)) from None
        where = runspec.spec_uri(checkpoint_uri)
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
    try:
        return runspec.read(text, where), where
    except runspec.RunSpecError as exc:
        raise fail(str(exc)) from None


def resumed_run(inventory: Inventory, found: dict, where: str, *, env: str) -> ResumedRun:
    """The run of `found` (read_spec's) planned again on this cluster with --resume: the same node count,
    arguments, layout, output directory and --managed settings; one line and exit 2 for what does not fit."""
    from cluster.run import runspec
    from cluster.job.jobplan import new_job_id, plan_job
    from cluster.job.launch import env_pairs

    try:
        args, layout = runspec.resumed(found, env_pairs(env))
        plan = plan_job(inventory, nodes=found["nodes"], training_args=args, job_id=new_job_id(),
                        output_dir=found["output_dir"], prepare=found["prepare"], **layout)
        opts = rc.managed_options(max_recoveries=found["max_recoveries"], min_nodes=found["min_nodes"],
                                  wait=f"{found['wait_seconds']:g}s", nodes=found["nodes"])
    except (ValueError, rc.RecoveryError) as exc:  # the plan's errors (layout, launch, inventory) are ValueErrors
        raise fail(f"{where}: {exc}") from None
    return ResumedRun(opts, plan, _Inputs(args, list(found["prepare"])), layout, where)


def resume(inventory: Inventory, *, checkpoint_uri: str, output_dir: str, env: str, detach: bool, prepare_nodes,
           preflight) -> int:
    """`fab train --managed --resume`: the run's spec read back (read_spec), the run planned again
    (resumed_run), the nodes prepared (`preflight` on AWS, `prepare_nodes`: train's distribution) and the
    run handed to a new supervisor that starts with --resume from the newest checkpoint every rank can read."""
    from node_setup.tasks import common

    master = common.connect(inventory)[inventory.master.name] if not checkpoint_uri else None
    found, where = read_spec(inventory, checkpoint_uri=checkpoint_uri, output_dir=output_dir, master=master)
    run = resumed_run(inventory, found, where, env=env)
    say(f"resuming run {found['run_id']} from its spec at {where}: {found['nodes']} node(s), its arguments with "
        "--resume, its layout and --managed settings (the other options given now are not used)")
    if inventory.kind == "aws":
        preflight(run.plan.inventory)
    conns = common.connect(run.plan.inventory)
    prepare_nodes(run.plan.inventory, conns)
    return hand_off(run.opts, inventory=inventory, plan=run.plan, inputs=run.inputs, conns=conns, layout=run.layout,
                    detach=detach)


def hand_off(opts: rc.ManagedOptions, *, inventory: Inventory, plan: JobPlan, inputs, conns, layout: dict,
             detach: bool, resume_arg: str = "") -> int:
    """`fab train --managed` once train has prepared the nodes: the run handed to its supervisor on the
    master, then its log followed (Ctrl-C detaches) or, with `detach`, fab's return once the first job started."""
    from cluster.run import supervision as sv

    master = conns[plan.inventory.master.name]
    spec = run_spec(opts, inventory=inventory, plan=plan, inputs=inputs, layout=layout, resume_arg=resume_arg)
    for line in publish_spec(master, spec, region=inventory.region):
        say(line)
    nodes.start_supervisor(master, spec, systemd=backend_for(inventory.kind).supervisor_as_service())
    say(f"run {plan.job_id} handed to its supervisor on the master {plan.inventory.master.name}: "
        + opts.describe().replace("fab stays attached and recovers", "it recovers"))
    if plan.inventory.master.spot:
        say("the master is a spot instance: it is the run's single point of failure (a reclaimed master ends the "
            "run; `fab train --managed --resume` continues it once it is back)")
    deadline = time.time() + START_WAIT_S
    state = None
    while time.time() < deadline:
        state = nodes.supervised_state(master, plan.job_id)
        if state and (state.get("job") or state.get("status") in sv.FINAL):
            break
        time.sleep(0.5)
    if not state:
        raise fail(f"the supervisor did not start on {plan.inventory.master.name}; see "
                   f"~/{sv.RUN_ROOT}/{plan.job_id}/{sv.LOG_FILE} there", UNREACHABLE)
    say(sv.status_line(state))
    if detach or state.get("status") in sv.FINAL:
        say("detached: `fab status` shows the run, `fab logs --follow` follows it, `fab stop` ends it")
        return FAILED if state.get("status") == sv.FAILED else OK
    code = follow_run(master, plan.job_id)
    if code == INTERRUPTED_BY_RECLAIM and backend_for(inventory.kind).replaces_lost_master():  # ended master-lost
        recover_master(plan.inventory)
    return code


def run_exit_code(verdict: str, state: dict | None) -> int:
    """fab's exit code for a supervised run that ended (cluster/run/runlog.py's verdict, its last state)."""
    from cluster.run import runlog
    from cluster.run import supervision as sv

    if verdict != runlog.ENDED:
        return FAILED
    return {sv.COMPLETED: OK, sv.STOPPED: STOPPED, sv.MASTER_LOST: INTERRUPTED_BY_RECLAIM}.get(
        (state or {}).get("status"), FAILED)


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


# ---------------------------------------------------------------- a lost master (AWS)


def _stack(inventory: Inventory) -> str | None:
    """The cluster's stack: the stack file named as the cluster, else the only one here; None otherwise."""
    from node_setup.controller import PROJECT_ROOT
    from node_setup.stack_config import stack_files

    files = stack_files(PROJECT_ROOT)
    if inventory.name in files:
        return inventory.name
    return next(iter(files)) if len(files) == 1 else None


def recover_master(inventory: Inventory) -> str | None:
    """After the supervisor ended the run master-lost on AWS: the master alone replaced by a targeted
    `pulumi up` (node_setup/pulumi_recovery.py: never killed, nothing else applied) when the Pulumi CLI
    and the cluster's stack file are here, else the command said. The workers are the group's: it
    replaces its own. What replace_lost_master returned, or None when fab ran no Pulumi command."""
    from node_setup import pulumi_cli, pulumi_recovery
    from node_setup.controller import PROJECT_ROOT

    stack, master = _stack(inventory), inventory.master
    if not (stack and master.instance_id and pulumi_cli.find_pulumi()):
        say(f"replace the master yourself: `pulumi up --refresh --stack {stack or '<stack>'}`, then "
            "`fab train --managed --resume` with the same options continues the run")
        return None
    say(f"replacing the lost master {master.name} only (the workers are the group's)")
    result = pulumi_recovery.replace_lost_master(stack, master.instance_id, region=inventory.region, say=say,
                                                 cwd=str(PROJECT_ROOT))
    if result == pulumi_recovery.REPLACED:
        say("the master is back: `fab train --managed --resume` with the same options continues the run")
    return result
