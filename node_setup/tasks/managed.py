"""`fab train --managed`: the run handed to its supervisor on the master (`hand_off`, `follow_run`; the
supervisor is node_setup/supervisor/), with the --managed options checked first (`options`).

What follows `hand_off` below is the earlier controller-side loop, no longer called by `fab train`
(kept for node_setup/pulumi_recovery.py's test of `_ask_for_replacements` until the supervisor's AWS
backend replaces it):

The loop (the decisions are cluster/recovery.py's, the node work node_setup/ssh/recovery.py's):

1. launch and follow the job as `fab train` does (node_setup/tasks/train.py's `_launch`);
2. when it ends interrupted (exit 75: a spot reclaim; or any end while a node no longer answers):
   which nodes are lost (a spot notice on their metadata service, or no SSH answer); a lost
   master ends the loop with what can and cannot be done;
3. wait for a noticed node to go, forget its host key, ask for a replacement (local cluster: what
   `fab local-up` does; AWS, when the CLI and the stack are here: once EC2 reports the lost instances
   terminated, Pulumi refreshes and replaces those instances only, and stops with the command for the
   user when the stack has other pending changes (node_setup/pulumi_recovery.py; Pulumi is never
   killed); otherwise the command to run) and poll discovery up to --wait-for-capacity;
4. the replacement's host key pinned and shown, its software checked (`fab setup` where needed);
   without enough replacements, the survivors (at least --min-nodes) with the global batch kept by
   gradient accumulation;
5. relaunch with --resume in the same output directory (SSH and hostfile distributed again by the
   launch), and record the recovery in the run's summary.json ("recoveries").

At most --max-recoveries recoveries per `fab train --managed`; `fab train --managed --resume`
continues a run and keeps its earlier recoveries (recoveries.json in the output directory).

Why this module is longer than about 400 lines (about 450): the loop above is one task's, and its
steps share the run's state (the records, the first summary, the wanted nodes), so they stay together
as one helper each; every decision is already cluster/recovery.py's and every node's work
node_setup/ssh/recovery.py's, and what is left here is their order and what fab says at each.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from invoke import Exit

from cluster import recovery as rc
from cluster.inventory import Inventory
from cluster.jobplan import JobPlan, new_job_id, plan_job, shown
from node_setup.ssh import recovery as nodes
from node_setup.ssh.connections import close_all
from node_setup.tasks import common
from node_setup.tasks.common import BAD_INPUT, CTRL_C, INTERRUPTED_BY_RECLAIM, STOPPED, UNREACHABLE, fail

POLL_SECONDS = 5  # how often discovery is asked while waiting for capacity
GONE_GRACE_SECONDS = 60  # after a notice's time, how long a noticed node may still answer
NOT_RECOVERED = (BAD_INPUT, CTRL_C, STOPPED)  # ends that are the user's, not the cluster's


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
    from cluster import supervision as sv
    from cluster.launch import DEFAULT_LAUNCHER

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
    from cluster import supervision as sv

    spec = {
        "run_id": sv.check_run_id(plan.job_id), "kind": inventory.kind, "region": inventory.region,
        "inventory": plan.inventory.to_mapping(),
        "instance_ids": {n.name: n.instance_id for n in plan.inventory.nodes if n.instance_id},
        "training_args": list(inputs.args), "prepare": list(inputs.prepare), "layout": dict(layout),
        "output_dir": plan.output_dir, "max_recoveries": opts.max_recoveries, "min_nodes": opts.min_nodes,
        "wait_seconds": opts.wait_seconds, "poll_seconds": 5, "resume": "--resume" in inputs.args,
    }
    if plan.user is not None:  # --script/--module: restarted with the newest checkpoint (cluster/supervision.py)
        spec.update(program={"script": plan.user.script, "module": plan.user.module, "args": list(plan.user.args),
                             "signal": plan.user.signal or "none"}, resume_arg=resume_arg)
    if inventory.kind == "local":
        from node_setup.local.state import load_state, paths_for

        state = load_state(paths_for(inventory.name))
        spec["local_data_dir"] = state.data_dir if state else ""
    return spec


def hand_off(opts: rc.ManagedOptions, *, inventory: Inventory, plan: JobPlan, inputs, conns, layout: dict,
             detach: bool, resume_arg: str = "") -> int:
    """`fab train --managed`: the nodes' SSH distributed, the run handed to its supervisor on the master,
    then its log followed (Ctrl-C detaches) or, with `detach`, fab's return once the first job started."""
    from cluster import supervision as sv
    from node_setup.tasks import train

    master = conns[plan.inventory.master.name]
    train._distribute(plan.inventory, conns)  # the master reaches every node with the cluster key
    if inputs.uploads:
        train._upload(conns, inputs.uploads)
    spec = run_spec(opts, inventory=inventory, plan=plan, inputs=inputs, layout=layout, resume_arg=resume_arg)
    nodes.start_supervisor(master, spec, systemd=inventory.kind == "aws")
    say(f"run {plan.job_id} handed to its supervisor on the master {plan.inventory.master.name}: "
        + opts.describe().replace("fab stays attached and recovers", "it recovers"))
    if inventory.kind == "aws" and plan.inventory.master.spot:
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
        return 0 if state.get("status") not in (sv.FAILED,) else 1
    return follow_run(master, plan.job_id, int(state.get("pid") or 0))


def follow_run(master, run_id: str, pid: int) -> int:
    """Follow the supervisor's log until the run ends: its final state as fab's exit code."""
    from cluster import supervision as sv

    try:
        nodes.follow_supervisor(master, run_id, pid)
    except KeyboardInterrupt:
        print(f"\ndetached; run {run_id} goes on under its supervisor on the master: `fab logs --follow` "
              "reattaches, `fab status` shows it, `fab stop` ends it", flush=True)
        return CTRL_C
    state = nodes.supervised_state(master, run_id) or {}
    return {sv.COMPLETED: 0, sv.STOPPED: STOPPED, sv.MASTER_LOST: INTERRUPTED_BY_RECLAIM}.get(state.get("status"), 1)


# ---------------------------------------------------------------- one run (the controller-side loop)


def _run(inventory: Inventory, plan: JobPlan, inputs, conns) -> int:
    """Launch and follow one job; its exit code (a launch that could not reach a node: 3)."""
    from node_setup.tasks import train

    try:
        return train._launch(inventory, plan, inputs=inputs, conns=conns)
    except Exit as exc:
        if exc.message:
            print(exc.message, file=sys.stderr, flush=True)
        return exc.code
    except Exception as exc:  # noqa: BLE001 - the master went away mid-stream: the loop finds out why
        print(f"\nlost the job's stream: {type(exc).__name__}: {exc}", flush=True)
        return UNREACHABLE


def _running_job(inventory: Inventory, plan: JobPlan, conns, layout: dict) -> JobPlan | None:
    """With --resume: the newest job on the master when it still runs in this output directory (a
    restarted `fab train --managed --resume` follows it instead of launching a second one)."""
    from node_setup.ssh import job as jobs

    master = conns[plan.inventory.master.name]
    try:
        job_id = jobs.resolve_job_id(master, None)
        meta = jobs.read_metadata(master, job_id) if jobs.job_state(master, job_id)[0] == "running" else None
    except Exception:  # noqa: BLE001 - no job, or none readable: launch as usual
        return None
    by_name = {n.name: n for n in inventory.nodes}
    hosts = (meta or {}).get("hosts") or []
    if not meta or meta.get("output_dir") != plan.output_dir or not all(h in by_name for h in hosts):
        return None
    job_nodes = replace(inventory, nodes=tuple(replace(by_name[h], rank=i) for i, h in enumerate(hosts)))
    return plan_job(job_nodes, nodes=len(hosts), training_args=meta.get("training_args") or (), job_id=job_id,
                    output_dir=plan.output_dir, **layout)


def _follow(plan: JobPlan, conns) -> int:
    from node_setup.tasks import train

    try:
        return train._follow_to_end(conns[plan.inventory.master.name], conns, plan, managed=True)
    except Exception as exc:  # noqa: BLE001 - as in _run
        print(f"\nlost the job's stream: {type(exc).__name__}: {exc}", flush=True)
        return UNREACHABLE


def _summary(inventory: Inventory, plan: JobPlan) -> dict | None:
    from node_setup.tasks import train

    conns = common.connect(replace(inventory, nodes=(inventory.master,)))
    try:
        return train._read_summary(conns[inventory.master.name], plan)[0]
    except Exception:  # noqa: BLE001 - no summary is a known case
        return None
    finally:
        close_all(conns)


def _on_master(inventory: Inventory, work):
    conns = common.connect(replace(inventory, nodes=(inventory.master,)))
    try:
        return work(conns[inventory.master.name])
    finally:
        close_all(conns)


# ---------------------------------------------------------------- capacity


def _target(inventory: Inventory) -> str:
    from node_setup.local.state import DEFAULT_NAME

    return "" if inventory.name == DEFAULT_NAME else f" --name {inventory.name}"


def _stack(inventory: Inventory) -> str | None:
    from node_setup.controller import PROJECT_ROOT
    from node_setup.stack_config import stack_files

    files = stack_files(PROJECT_ROOT)
    if inventory.name in files:
        return inventory.name
    return next(iter(files)) if len(files) == 1 else None


def replacement_command(inventory: Inventory, count: int) -> str:
    if inventory.kind == "local":
        return f"fab local-up --nodes {count}{_target(inventory)}"
    if inventory.kind == "aws":
        return f"pulumi up --refresh --stack {_stack(inventory) or '<stack>'}"
    return "bring the lost nodes back at their addresses (your own machines)"


def _ask_for_replacements(inventory: Inventory, count: int, lost_ids: list[str]) -> None:
    """Local cluster: bring the lost nodes back (what `fab local-up` does); AWS: Pulumi replaces only the
    lost instances (node_setup/pulumi_recovery.py: never killed, nothing else applied)."""
    if inventory.kind == "local":
        from node_setup.local import cluster as local_cluster
        from node_setup.local import state as local_state

        say(f"asking for replacements: {replacement_command(inventory, count)}")
        try:
            local_cluster.create(count, inventory.name, wheelhouse=inventory.wheelhouse,
                                 progress=lambda line: print(line, flush=True))
        except local_state.LocalClusterError as exc:
            say(f"the local cluster could not bring the nodes back: {exc}")
        return
    from node_setup import pulumi_cli
    from node_setup.controller import PROJECT_ROOT

    command = replacement_command(inventory, count)
    stack = _stack(inventory) if inventory.kind == "aws" else None
    if stack and pulumi_cli.find_pulumi():
        from node_setup import pulumi_recovery

        say("asking for replacements of the lost node(s) only")
        pulumi_recovery.replace_lost(stack, lost_ids, region=inventory.region, say=say, cwd=str(PROJECT_ROOT))
        return
    say(f"replace the lost node(s) yourself: {command}  (fab polls discovery meanwhile)")


def _discover(inventory: Inventory, cluster: str, region: str) -> Inventory | None:
    """The cluster as discovery sees it now (a local cluster: its inventory file, also with nodes down)."""
    try:
        if inventory.kind == "local":
            from node_setup.discovery import load_inventory_file
            from node_setup.local.state import paths_for

            return load_inventory_file(paths_for(inventory.name).inventory_path)
        return common.inventory(cluster, region)
    except (Exit, ValueError, OSError):
        return None


def _wait_for_capacity(inventory: Inventory, wanted: list[str], opts: rc.ManagedOptions, cluster: str,
                       region: str) -> tuple[Inventory, list[str]]:
    """Poll discovery until every wanted node answers or --wait-for-capacity is over: (inventory, alive)."""
    deadline = time.time() + opts.wait_seconds
    current, up = inventory, nodes.alive(inventory)
    while True:
        found = _discover(inventory, cluster, region)
        if found is not None:
            current = found
            up = nodes.alive(replace(found, nodes=tuple(n for n in found.nodes if n.name in wanted)))
        if len(up) >= len(wanted) or time.time() >= deadline:
            return current, up
        time.sleep(min(POLL_SECONDS, max(0.5, deadline - time.time())))


# ---------------------------------------------------------------- the loop


def _master_lost(plan: JobPlan, code: int) -> int:
    inv, out = plan.inventory, plan.output_dir
    uri = next((plan.training_args[i + 1] for i, a in enumerate(plan.training_args[:-1]) if a == "--checkpoint_uri"),
               None)
    say(f"the master {inv.master.name} was reclaimed or stopped answering. It runs the job (the launcher and its log) "
        "and rank 0, which writes the checkpoints: fab cannot move the job to another node, so it stops here.")
    if uri:
        kept = f"the checkpoints uploaded to {uri} survive it"
    elif inv.kind == "local" and out.startswith("/"):
        kept = f"on this local cluster {out} is on the disk every node shares, so its checkpoints survive"
    else:
        kept = (f"its checkpoints were only on its local disk ({shown(out)}, no --checkpoint-uri): they go with it, "
                "and a new run starts from step 0 (use --checkpoint-uri s3://... for long spot runs)")
    say(f"what survives: {kept}.")
    known = ("" if code != UNREACHABLE else
             " (the master went before fab could read the job's own code: 3, a node could not be reached)")
    say(f"to go on: {replacement_command(inv, len(inv.nodes))}, then `fab train --managed --resume` with the same "
        f"options (it continues the newest checkpoint every node can read); exit code {code}{known}")
    return code


def supervise(opts: rc.ManagedOptions, **run) -> int:
    """Run the job under supervision (see the module docstring); fab's exit code."""
    try:
        return _supervise(opts, **run)
    except KeyboardInterrupt:  # between jobs (a job's own Ctrl-C is train's question to stop it or not)
        say("interrupted between runs; the run's recoveries so far are in recoveries.json in its output directory; "
            "`fab train --managed --resume` continues it")
        return CTRL_C


def _supervise(opts: rc.ManagedOptions, *, cluster: str, region: str, inventory: Inventory, plan: JobPlan, inputs,
               conns, layout: dict) -> int:
    say(opts.describe())
    master = plan.inventory.master.name
    records = _on_master(plan.inventory, lambda m: nodes.read_records(m, plan.output_dir))
    if records:
        say(f"continuing the run in {shown(plan.output_dir)}: {len(records)} earlier recovery(ies) kept")
    first_summary: dict | None = None
    wanted = [n.name for n in plan.inventory.nodes]  # the job's nodes at the start: what recoveries restore
    done = 0
    attached = _running_job(inventory, plan, conns, layout) if "--resume" in inputs.args else None
    if attached:
        say(f"job {attached.job_id} still runs in {shown(plan.output_dir)}: following it instead of launching another")
        plan = attached
    while True:
        started = time.time()
        code = _follow(plan, conns) if attached else _run(inventory, plan, inputs, conns)
        attached = None
        ended = time.time()
        conns = None
        if code == 0 or code in NOT_RECOVERED:
            return _finish(plan, records, code)
        summary = _summary(plan.inventory, plan) if code == INTERRUPTED_BY_RECLAIM else None
        if summary and first_summary is None:
            first_summary = summary
        notices, lost, noticed = _losses(plan.inventory)
        if not lost and code != INTERRUPTED_BY_RECLAIM:
            say(f"the job failed (exit code {code}) and every node answers: not an interruption, no recovery")
            return _finish(plan, records, code)
        cause = ("spot notice" if noticed or code == INTERRUPTED_BY_RECLAIM and lost
                 else "unreachable" if lost else "interrupted")
        say(f"the job ended with exit code {code}; lost: {', '.join(lost) or 'none'} ({cause})")
        if master in lost:
            _finish(plan, records, code)
            return _master_lost(plan, code)
        if done >= opts.max_recoveries:
            say(f"--max-recoveries {opts.max_recoveries} reached: not recovering again; "
                f"`fab train --managed --resume` continues the run")
            return _finish(plan, records, code)
        step, saved_at = _on_master(plan.inventory, lambda m, out=plan.output_dir: nodes.newest_checkpoint(m, out))
        current, up = _capacity(plan.inventory, lost, notices, noticed, wanted, opts, cluster, region)
        decision = rc.next_step(len(wanted), len(up), opts.min_nodes)
        if decision == rc.TOO_FEW or master not in up:
            say(f"only {len(up)} node(s) answer ({', '.join(up) or 'none'}); --min-nodes is {opts.min_nodes}: "
                f"stopping. {replacement_command(plan.inventory, len(wanted))}, then `fab train --managed --resume`")
            return _finish(plan, records, code)
        chosen = _ready([n for n in current.nodes if n.name in up][:len(wanted)], current, lost, opts)
        if chosen is None:
            return _finish(plan, records, code)
        survivors = replace(current, nodes=tuple(replace(n, rank=i) for i, n in enumerate(chosen)))
        new_plan, batch_line = _resume_plan(survivors, plan, inputs, layout, first_summary or summary)
        lost_seconds = _seconds_lost(summary, step, saved_at or started, ended)
        done += 1
        waited = time.time() - ended  # from the job's end: finding the lost nodes, replacements, checks
        record = rc.recovery_record(number=len(records) + 1, at=ended, cause=cause, step=step, exit_code=code,
                                    nodes_lost=lost, nodes_after=[n.name for n in chosen], seconds_lost=lost_seconds,
                                    seconds_waiting=waited, batch=batch_line)
        records.append(record)
        _on_master(survivors, lambda m, out=plan.output_dir: nodes.write_records(m, out, records))
        say(f"recovery {record['number']}: lost {', '.join(lost) or 'none'} at step {step}; resuming on "
            f"{len(chosen)} node(s) ({', '.join(record['nodes_after'])}) from checkpoint-{step}; "
            f"{lost_seconds:g} s of work lost, {waited:.1f} s waiting"
            + ("" if decision == rc.FULL else f"; {decision}: {len(chosen)} of {len(wanted)} node(s)"))
        if batch_line:
            say(batch_line)
        plan, inventory = new_plan, survivors


# ---------------------------------------------------------------- one recovery's steps


def _losses(inventory: Inventory) -> tuple[dict[str, str | None], list[str], list[str]]:
    """After the job's end: (the answering nodes' spot notices, the lost nodes: noticed or not answering,
    the noticed nodes)."""
    notices = nodes.notices(inventory)
    answering = set(notices)
    lost = [n.name for n in inventory.nodes if n.name not in answering or notices.get(n.name)]
    noticed = [name for name, body in notices.items() if body]
    return notices, lost, noticed


def _capacity(inventory: Inventory, lost: list[str], notices: dict[str, str | None], noticed: list[str],
              wanted: list[str], opts: rc.ManagedOptions, cluster: str, region: str) -> tuple[Inventory, list[str]]:
    """The lost nodes' old host keys forgotten and replacements asked for and waited for (none with
    --wait-for-capacity 0): (the cluster as discovery sees it, the wanted nodes that answer)."""
    full = _discover(inventory, cluster, region) or inventory
    if opts.wait_seconds and lost:
        if noticed:
            due = max((rc.notice_due(notices[n]) or time.time()) for n in noticed)
            still = nodes.wait_until_gone(inventory, noticed, due + GONE_GRACE_SECONDS, say)
            if still:
                say(f"{', '.join(still)} still answer(s) after the notice's time; treating as lost")
        _forget(inventory, lost)
        lost_ids = [n.instance_id for n in inventory.nodes if n.name in lost and n.instance_id]
        _ask_for_replacements(full, len(full.nodes), lost_ids)
        return _wait_for_capacity(full, wanted, opts, cluster, region)
    if lost:
        say("--wait-for-capacity 0: not asking for replacements")
        _forget(inventory, lost)
    up = [n for n in nodes.alive(replace(full, nodes=tuple(x for x in full.nodes if x.name in wanted)))
          if n not in lost]
    return full, up


def _ready(chosen: list, current: Inventory, lost: list[str], opts: rc.ManagedOptions) -> list | None:
    """The chosen nodes less the new machines (host key pinned and shown) whose software is not ready;
    None when that leaves fewer than --min-nodes."""
    new = [n.name for n in chosen if n.name in lost]
    if not new:
        return chosen
    for name, fingerprint in nodes.host_key_fingerprints(current, new).items():
        say(f"{name}: new machine, host key pinned: {fingerprint}")
    problems = nodes.check_software(current, new, lambda node, msg: print(f"  {node}: {msg}", flush=True))
    bad = [name for name, why in problems.items() if why]
    for name in bad:
        say(f"{name}: not ready ({problems[name]}); leaving it out")
    chosen = [n for n in chosen if n.name not in bad]
    if bad and len(chosen) < opts.min_nodes:
        say(f"{len(chosen)} node(s) ready; --min-nodes is {opts.min_nodes}: stopping")
        return None
    if not bad:
        say(f"{', '.join(new)}: software checked (profile {current.profile})")
    return chosen


def _resume_plan(survivors: Inventory, plan: JobPlan, inputs, layout: dict,
                 reference: dict | None) -> tuple[JobPlan, str | None]:
    """The relaunch on the survivors with --resume in the same output directory; where the number of
    ranks changed, the global batch of `reference` (the first summary.json) kept by gradient
    accumulation: (the plan, the line that says what became of the batch, or None)."""
    base_args = list(inputs.args)
    args = base_args + ([] if "--resume" in base_args else ["--resume"])
    count = len(survivors.nodes)
    new_plan = plan_job(survivors, nodes=count, training_args=args, job_id=new_job_id(),
                        output_dir=plan.output_dir, prepare=inputs.prepare, **layout)
    batch_line = None
    if reference is None and count != len(plan.inventory.nodes):
        batch_line = ("global batch unknown (no summary.json from the interrupted run): per-rank batch and "
                      "accumulation kept, so the global batch follows the number of ranks")
    elif reference and new_plan.launch.world_size != reference.get("world_size"):
        batch = rc.batch_for(per_rank=int(reference["per_rank_batch_size"]),
                             accumulation=int(reference["gradient_accumulation_steps"]),
                             ranks_before=int(reference["world_size"]), ranks=new_plan.launch.world_size)
        batch_line = batch.describe(int(reference["per_rank_batch_size"]),
                                    int(reference["gradient_accumulation_steps"]))
        new_plan = plan_job(survivors, nodes=count, training_args=rc.with_batch(args, batch),
                            job_id=new_plan.job_id, output_dir=plan.output_dir, prepare=inputs.prepare, **layout)
    return new_plan, batch_line


def _seconds_lost(summary: dict | None, step, since: float, ended: float) -> float:
    """The work the interruption cost: from the step it stopped at back to checkpoint `step` (by the
    mean step time), else the time from `since` (the checkpoint's save, or the launch) to the end."""
    stopped = None
    if summary:
        stopped = (summary.get("interruption") or {}).get("step") or summary.get("steps")
    lost_seconds = rc.work_lost_seconds(stopped, step, (summary or {}).get("step_time_seconds", {}).get("mean"))
    if lost_seconds is None:
        lost_seconds = round(max(0.0, ended - since), 1)
    return lost_seconds


def _forget(inventory: Inventory, lost: list[str]) -> None:
    addresses = {n.name: n.address for n in inventory.nodes}
    for name, removed in nodes.forget_old_host_keys(inventory, lost).items():
        say(f"{name}: forgot its old host key ({removed} line(s) for {addresses[name]})")


def _finish(plan: JobPlan, records: list[dict], code: int) -> int:
    """Put the run's recoveries into its summary.json on the master; fab's exit code."""
    if records:
        try:
            merged = _on_master(plan.inventory, lambda m: nodes.merge_into_summary(m, plan.output_dir, records))
        except Exception:  # noqa: BLE001 - the master may be gone; recoveries.json still has them
            merged = False
        where = f"{shown(plan.output_dir)}/summary.json" if merged else f"{shown(plan.output_dir)}/recoveries.json"
        say(f"{len(records)} recovery(ies) recorded in {where} on {plan.inventory.master.name}")
    return code
