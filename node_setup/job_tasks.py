"""`fab train`, `fab status`, `fab logs`, `fab stop`: the training job on a cluster.

Thin tasks: discover (node_setup.discovery) -> plan (node_setup.job.plan_job, pure) -> push and
run (node_setup.job). Exit codes of `fab train`: the job's own exit code (training/exit_codes.py:
0 ok, 1 failed, 2 bad input, 75 interrupted by a spot reclaim; 255 when mpirun saw a rank die),
2 for a bad option or cluster choice, 3 when a node cannot be reached or prepared, 130 after
Ctrl-C.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from invoke import Exit, task

from cluster.inventory import Inventory, InventoryError
from cluster.launch import LaunchError, job_dir
from cluster.layout import LayoutError
from cluster.profiles import get_profile, venv_dir
from node_setup import job as jobs

EXIT_BAD_INPUT = 2
EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130
INTERRUPTED_BY_RECLAIM = 75  # training.exit_codes.INTERRUPTED
SYNTHETIC_ROOT = "xeon-cluster-data"  # relative to the home directory of every node
SYNTHETIC_ARGS_FALLBACK = ("--max_seq_length", "64", "--doc_stride", "16", "--learning_rate", "0.002",
                           "--warmup_steps", "5", "--weight_decay", "0.0")

CLUSTER_HELP = ("AWS cluster name, `local` (or local:NAME) or an inventory file; default: the only "
                "cluster running in the region")


# ----------------------------------------------------------------------------- shared helpers


def _inventory(cluster: str | None, region: str | None) -> Inventory:
    from node_setup.discovery import resolve_for_task  # imports boto3: only when a task needs it

    return resolve_for_task(cluster, region, EXIT_BAD_INPUT)


def _connections(inventory: Inventory) -> dict:
    """One Fabric Connection per node (name -> Connection), master first, host keys pinned."""
    from node_setup.connections import connections_for

    return connections_for(inventory)


def _int_or_none(name: str, value) -> int | None:
    if value in (None, "", 0, "0"):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise Exit(f"error: --{name}: {value!r} is not a whole number", code=EXIT_BAD_INPUT) from None


def _env_pairs(text: str) -> dict[str, str]:
    pairs = {}
    for item in shlex.split(text or ""):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise Exit(f"error: --env: {item!r} is not KEY=VALUE (e.g. --env 'FI_PROVIDER=tcp CCL_LOG_LEVEL=info')",
                       code=EXIT_BAD_INPUT)
        pairs[key] = value
    return pairs


def _print_outcomes(title: str, outcomes) -> None:
    print(title)
    print(jobs.outcome_table(outcomes))


def _synthetic_recommended(task_name: str) -> tuple[str, ...]:
    try:
        from training.synthetic import RECOMMENDED_ARGS
        return tuple(RECOMMENDED_ARGS[task_name])
    except Exception:  # the controller may lack the training extra; the qa settings are known
        return SYNTHETIC_ARGS_FALLBACK


def training_arguments(*, task_name="", model="", dataset="", dataset_config="", train_file="",
                       validation_file="", epochs=None, batch_size=None, bf16="auto", checkpoint_minutes=None,
                       checkpoint_uri="", max_steps=None, resume=False, extra="") -> list[str]:
    """The `python -m training` arguments for fab train's options (extra goes last, verbatim)."""
    args: list[str] = []
    for flag, value in (("--task", task_name), ("--model_name_or_path", model), ("--dataset_name", dataset),
                        ("--dataset_config_name", dataset_config), ("--train_file", train_file),
                        ("--validation_file", validation_file), ("--num_train_epochs", epochs),
                        ("--per_device_train_batch_size", batch_size),
                        ("--checkpoint_minutes", checkpoint_minutes), ("--checkpoint_uri", checkpoint_uri),
                        ("--max_steps", max_steps)):
        if value not in (None, ""):
            args += [flag, str(value)]
    bf16 = (bf16 or "auto").lower()
    if bf16 not in ("auto", "on", "off"):
        raise Exit(f"error: --bf16: {bf16!r} is not allowed; choose auto (on when the CPU has AMX or "
                   "AVX512-BF16), on or off", code=EXIT_BAD_INPUT)
    if bf16 != "auto":
        args += ["--bf16", "true" if bf16 == "on" else "false"]
    if resume:
        args.append("--resume")
    try:
        args += shlex.split(extra or "")
    except ValueError as exc:
        raise Exit(f"error: --extra: cannot split {extra!r}: {exc}", code=EXIT_BAD_INPUT) from None
    return args


def _newest_output_dir(master) -> str | None:
    """The output directory of the newest job on the master (what --resume continues)."""
    try:
        job_id = jobs.resolve_job_id(master, None)
        return jobs.read_metadata(master, job_id).get("output_dir")
    except jobs.JobError:
        return None


def _aws_preflight(inventory: Inventory) -> None:
    """Before launching on an AWS cluster: credentials, every node still running, no spot notice.

    Imported here, not at the top: node_setup.preflight imports boto3, which local and inventory-file
    clusters never need.
    """
    from node_setup.preflight import preflight_for_train

    report = preflight_for_train(inventory)
    if report is not None and not report.ok:
        print(report.render())
        raise Exit("error: preflight failed; fix the findings above and rerun", code=EXIT_BAD_INPUT)


def _print_summary(master, plan: jobs.JobPlan) -> None:
    path = f"{plan.output_dir}/summary.json"
    text = jobs.read_remote_file(master, path)
    if text is None:
        print(f"(no {path} on the master)")
        return
    import json

    try:
        summary = json.loads(text)
    except ValueError:
        print(f"summary ({path}): unreadable")
        return
    keys = ("status", "world_size", "nodes", "global_batch_size", "steps", "epoch", "train_loss",
            "samples_per_second", "wall_seconds", "final_model")
    print(f"summary ({jobs.shown(path)} on {plan.inventory.master.name}):")
    for key in keys:
        if key in summary:
            print(f"  {key}: {summary[key]}")
    for key, value in sorted((summary.get("metrics") or {}).items()):
        if not isinstance(value, (dict, list)):
            print(f"  {key}: {value}")


# ----------------------------------------------------------------------------- tasks


@task(auto_shortflags=False, help={
    "nodes": "how many nodes to use, master first (1 to the nodes available; default all)",
    "cluster": CLUSTER_HELP,
    "region": "AWS region (default: the configured one)",
    "task": "training task: qa or classification (training default qa)",
    "model": "model id or a directory on the nodes (--model_name_or_path)",
    "dataset": "hub dataset name (default squad for qa, glue/mrpc for classification)",
    "dataset-config": "hub dataset configuration (e.g. mrpc)",
    "train-file": "training data (.json/.jsonl): a file on this machine is copied to every node, "
                  "else the path on the nodes",
    "validation-file": "evaluation data, like --train-file",
    "epochs": "number of training epochs (--num_train_epochs)",
    "batch-size": "batch size per rank (--per_device_train_batch_size)",
    "bf16": "auto (on when the CPU has AMX/AVX512-BF16), on or off",
    "checkpoint-minutes": "save a checkpoint every N minutes (0: only at the end)",
    "checkpoint-uri": "s3://bucket/prefix every checkpoint is uploaded to (and --resume reads)",
    "max-steps": "stop after N optimizer steps",
    "output-dir": "output directory on the nodes, relative to the home directory (default "
                  "xeon-cluster-runs/<job id>; local cluster: /var/tmp/xeon-cluster-runs/<cluster>/<job id>, "
                  "which its nodes share; with --resume: the newest job's)",
    "extra": "more `python -m training` arguments, verbatim, e.g. --extra '--learning_rate 3e-5 --max_seq_length 256'",
    "resume": "continue from the newest complete checkpoint (after a spot reclaim)",
    "ranks-per-node": "override ranks per node (default one per socket)",
    "threads": "override OpenMP threads per rank (default the rank's physical cores minus CCL workers)",
    "ccl-workers": "override oneCCL workers per rank (intel profile only)",
    "pin": "pin ranks to their cores (default on; off on the local cluster)",
    "env": "extra environment for every rank, e.g. --env 'FI_PROVIDER=tcp CCL_LOG_LEVEL=info'",
    "synthetic-examples": "local cluster without model/data: training examples of the synthetic set (default 2000)",
    "dry-run": "print nodes, layout, full command and environment; connect to nothing",
})
def train(c, nodes=0, cluster="", region="", task="", model="", dataset="", dataset_config="",
          train_file="", validation_file="", epochs="", batch_size=0, bf16="auto", checkpoint_minutes="",
          checkpoint_uri="", max_steps=0, output_dir="", extra="", resume=False, ranks_per_node=0, threads=0,
          ccl_workers="", pin="", env="", synthetic_examples=0, dry_run=False):
    """Launch distributed training with mpirun on N nodes and stream its output."""
    inventory = _inventory(cluster, region)
    count = _int_or_none("nodes", nodes) or len(inventory.nodes)
    profile = get_profile(inventory.profile)
    venv = venv_dir(profile)

    prepare: list[str] = []
    uploads: dict[str, str] = {}  # local path -> path on every node (relative to home)
    data_args = dict(task_name=task, model=model, dataset=dataset, dataset_config=dataset_config,
                     train_file=train_file, validation_file=validation_file)
    job_id = jobs.new_job_id()
    for key in ("train_file", "validation_file"):
        path = data_args[key]
        if path and Path(path).expanduser().is_file():
            remote = f"{job_dir(job_id)}/data/{key}-{Path(path).name}"
            uploads[str(Path(path).expanduser())] = remote
            data_args[key] = remote
    synthetic = inventory.kind == "local" and not (model or dataset or train_file)
    defaults = {}
    if synthetic:
        task_kind = task or "qa"
        examples = _int_or_none("synthetic-examples", synthetic_examples)
        out = f"{SYNTHETIC_ROOT}/synthetic-{task_kind}" + (f"-{examples}" if examples else "")
        gen = f"{venv}/bin/python -m training.synthetic --out {out} --task {task_kind}"
        gen += f" --examples {examples}" if examples else ""
        prepare.append(f"[ -f {out}/train.json ] || {gen} >/dev/null")
        data_args.update(task_name=task_kind, model=f"{out}/model", train_file=f"{out}/train.json",
                         validation_file=f"{out}/eval.json")
        defaults = {"epochs": "1", "batch_size": 16}
    args = training_arguments(**data_args, epochs=epochs or defaults.get("epochs"),
                              batch_size=_int_or_none("batch-size", batch_size) or defaults.get("batch_size"),
                              bf16=bf16, checkpoint_minutes=checkpoint_minutes, checkpoint_uri=checkpoint_uri,
                              max_steps=_int_or_none("max-steps", max_steps), resume=resume,
                              extra=(shlex.join(_synthetic_recommended(data_args["task_name"])) + " " + extra
                                     if synthetic else extra))
    pin_choice = {"": None, "on": True, "true": True, "off": False, "false": False}.get(str(pin).lower(), "bad")
    if pin_choice == "bad":
        raise Exit(f"error: --pin: {pin!r} is not allowed; choose on or off", code=EXIT_BAD_INPUT)

    def make_plan(out_dir: str | None):
        return jobs.plan_job(inventory, nodes=count, training_args=args, job_id=job_id,
                             ranks_per_node=_int_or_none("ranks-per-node", ranks_per_node),
                             threads_per_rank=_int_or_none("threads", threads),
                             ccl_workers=None if ccl_workers in ("", None) else _int_or_none("ccl-workers", ccl_workers) or 0,
                             pin=pin_choice, extra_env=_env_pairs(env), output_dir=out_dir or None,
                             prepare=prepare)

    try:
        plan = make_plan(output_dir)
    except (InventoryError, LayoutError, LaunchError, ValueError) as exc:
        raise Exit(f"error: {exc}", code=EXIT_BAD_INPUT) from None

    if dry_run:
        print(plan.describe())
        for local, remote in uploads.items():
            print(f"would copy {local} to ~/{remote} on every node")
        if resume and not output_dir:
            print("note: --resume continues in the newest job's output directory (read from the master at launch)")
        print("\ndry run: nothing was started")
        return

    if inventory.kind == "aws":
        _aws_preflight(plan.inventory)  # only the nodes this job uses (--nodes)
    conns = _connections(plan.inventory)
    master = conns[plan.inventory.master.name]
    if resume and not output_dir:
        previous = _newest_output_dir(master)
        if previous:
            plan = make_plan(previous)
            print(f"resuming in {previous} (the newest job's output directory)")

    print(f"preparing {len(conns)} node(s): job directory"
          + (", synthetic model and data" if synthetic else "") + " ...", flush=True)
    outcomes = jobs.prepare_nodes(conns, plan)
    failed = [o for o in outcomes if not o.ok]
    if not failed and uploads:
        outcomes = _upload(conns, uploads)
        failed = [o for o in outcomes if not o.ok]
    if failed:
        _print_outcomes("node preparation:", outcomes)
        names = ", ".join(o.node for o in failed)
        raise Exit(f"error: cannot launch: {names} not ready (reason above); the other nodes are fine. "
                   f"Fix or replace {names}, or use fewer nodes (--nodes), then rerun", code=EXIT_UNREACHABLE)

    _distribute(plan.inventory, conns)
    pid = jobs.start(master, plan)
    print(f"layout: {plan.layout.describe()[1]}")
    print(f"job {plan.job_id} started on {plan.inventory.master.name} (pid {pid}): {plan.launch.world_size} ranks "
          f"on {', '.join(plan.launch.hosts)}; output {jobs.shown(plan.output_dir)}", flush=True)
    raise Exit(code=_follow_to_end(master, conns, plan.job_id, list(plan.launch.rank_hosts), plan=plan))


def _distribute(inventory: Inventory, conns) -> None:
    """Keys, ssh config, known_hosts and hostfile on the master, so mpirun reaches every node."""
    from node_setup.distribute import DistributionError, distribute

    try:
        distribute(inventory, conns=conns)
    except DistributionError as exc:
        print("distribution:")
        print(exc.result.table())
        raise Exit(f"error: cannot launch: {exc}", code=EXIT_UNREACHABLE) from None


def _upload(conns, uploads: dict[str, str]):
    """Copy the user's local data files to every node, in parallel."""
    from concurrent.futures import ThreadPoolExecutor

    folders = sorted({os.path.dirname(remote) for remote in uploads.values()})
    mkdir = "mkdir -p " + " ".join(shlex.quote(f) for f in folders)

    def one(item):
        name, conn = item
        try:
            conn.run(mkdir, hide=True, in_stream=False)  # one round trip per node, not one per file
            for local, remote in uploads.items():
                conn.put(local, remote=remote)
        except Exception as exc:
            return jobs.NodeOutcome(name, False, jobs.explain_failure(exc, conn))
        return jobs.NodeOutcome(name, True, f"copied {len(uploads)} file(s)")

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(conns)))) as pool:
        return list(pool.map(one, conns.items()))


def _follow_to_end(master, conns, job_id: str, rank_hosts: list[str], plan: jobs.JobPlan | None = None) -> int:
    """Stream the job until it ends; Ctrl-C asks whether to stop it. Returns fab's exit code."""
    try:
        jobs.follow(master, job_id, rank_hosts)
    except KeyboardInterrupt:
        return _on_interrupt(conns, job_id)
    state, detail = jobs.job_state(master, job_id)
    if state == "running":  # the stream broke (connection lost) while the job goes on
        print(f"\nlost the log stream; job {job_id} is still running: reattach with `fab logs --follow`")
        return 1
    if state == "stopped":
        print(f"\njob {job_id} was stopped (fab stop, {detail})")
        return 143
    code = int(detail) if state == "exited" and detail.strip().lstrip("-").isdigit() else None
    if code == 0:
        print(f"\njob {job_id} finished: exit code 0")
        if plan is not None:
            _print_summary(master, plan)
        return 0
    failures = jobs.failure_report(jobs.log_text(master, job_id), rank_hosts, code)
    print(f"\njob {job_id} " + (f"failed: exit code {code}" if code is not None else f"ended without an exit code ({state})"))
    for line in failures:
        print(f"  {line}")
    if code == INTERRUPTED_BY_RECLAIM:
        print("  spot capacity was reclaimed: the checkpoint is saved; rerun with `fab train --resume`")
    cleanup = jobs.stop(master, conns, job_id, grace=5)
    leftovers = [o for o in cleanup if not o.ok]
    if leftovers:
        _print_outcomes("could not clean up every node:", cleanup)
    else:
        print("  no rank of the job is left on any node")
    return code if code is not None else 1


def _on_interrupt(conns, job_id: str) -> int:
    print("\ninterrupted.", flush=True)
    try:
        answer = input(f"Stop job {job_id} on every node? [y/N] ").strip().lower()
    except (EOFError, KeyboardInterrupt):
        answer = ""
    names = list(conns)
    fresh = _reconnect(conns)
    if answer in ("y", "yes"):
        outcomes = jobs.stop(fresh[names[0]], fresh, job_id)
        _print_outcomes(f"stopped job {job_id}:", outcomes)
    else:
        print(f"job {job_id} keeps running on the cluster: `fab logs --follow` reattaches, `fab stop` ends it")
    return EXIT_INTERRUPTED


def _reconnect(conns):
    """Fresh connections after an interrupted stream (its channel may be half-closed)."""
    for conn in conns.values():
        try:
            conn.close()
        except Exception:
            pass
    return conns


@task(auto_shortflags=False, help={"cluster": CLUSTER_HELP, "region": "AWS region (default: the configured one)",
            "job": "job id (default: the newest job)"})
def status(c, cluster="", region="", job=""):
    """Show nodes (state, type, spot), the job running on them and its last log line."""
    inventory = _inventory(cluster, region)
    conns = _connections(inventory)
    master = conns[inventory.master.name]
    try:
        job_id = jobs.resolve_job_id(master, job or None)
    except jobs.JobError:
        job_id = None
    except Exception as exc:
        job_id = None
        print(f"master {inventory.master.name} unreachable: {type(exc).__name__}: {exc}")
    ranks = jobs.rank_states(conns, job_id) if job_id else {
        o.node: o for o in jobs.on_every_node(conns, lambda _: "true", timeout=30)}
    print(f"cluster {inventory.name} ({inventory.kind}, profile {inventory.profile}, {len(inventory.nodes)} node(s))")
    print(f"  {'node':<10} {'address':<16} {'state':<9} {'type':<16} {'spot':<5} {'reachable':<10} ranks")
    for node in inventory.nodes:
        outcome = ranks.get(node.name)
        reachable = "yes" if outcome and outcome.ok else "NO"
        running = ""
        if outcome and outcome.ok and job_id:
            live = [line.split()[0] for line in outcome.detail.splitlines() if line.endswith(" running")]
            running = f"{len(live)} running ({', '.join('r' + r for r in live)})" if live else "none running"
        elif outcome and not outcome.ok:
            running = outcome.detail.splitlines()[-1][:60] if outcome.detail else ""
        spot = {True: "yes", False: "no", None: "-"}[node.spot]
        print(f"  {node.name:<10} {node.address:<16} {node.state:<9} {(node.instance_type or inventory.instance_type or '-'):<16} "
              f"{spot:<5} {reachable:<10} {running}")
    if not job_id:
        print("no job started yet (fab train starts one)")
        return
    state, detail = jobs.job_state(master, job_id)
    meta = {}
    try:
        meta = jobs.read_metadata(master, job_id)
    except jobs.JobError:
        pass
    described = {"running": f"running (job script pid {detail})", "exited": f"finished, exit code {detail}",
                 "stopped": f"stopped by fab stop at {detail}", "lost": "ended without an exit code (node restarted?)",
                 "missing": "not found"}.get(state, state)
    print(f"job {job_id}: {described}")
    if meta:
        print(f"  started {meta.get('started')}, {meta.get('world_size')} ranks on {', '.join(meta.get('hosts', []))}, "
              f"output {jobs.shown(meta.get('output_dir') or '?')}")
    tail = [line for line in jobs.log_tail(master, job_id).splitlines() if line.strip()]
    if tail:
        prefixer = jobs.RankPrefixer(meta.get("rank_hosts", []), sys.stdout)
        print(f"  last log line: {prefixer.line(tail[-1])}")


@task(auto_shortflags=False, help={"cluster": CLUSTER_HELP, "region": "AWS region (default: the configured one)",
            "job": "job id (default: the newest job)", "follow": "keep streaming until the job ends",
            "lines": "show only the last N lines first (default: the whole log)"})
def logs(c, cluster="", region="", job="", follow=False, lines=0):
    """Print a job's log with node/rank prefixes; --follow reattaches to a running job."""
    inventory = _inventory(cluster, region)
    conns = _connections(inventory)
    master = conns[inventory.master.name]
    try:
        job_id = jobs.resolve_job_id(master, job or None)
        meta = jobs.read_metadata(master, job_id)
    except jobs.JobError as exc:
        raise Exit(f"error: {exc}", code=EXIT_BAD_INPUT) from None
    last = _int_or_none("lines", lines)
    if not follow:
        jobs.follow(master, job_id, meta.get("rank_hosts", []), last_lines=last, follow_=False)
        return
    try:
        jobs.follow(master, job_id, meta.get("rank_hosts", []), last_lines=last)
    except KeyboardInterrupt:
        print(f"\ndetached; job {job_id} keeps running (`fab stop` ends it)")
        raise Exit(code=EXIT_INTERRUPTED) from None
    state, detail = jobs.job_state(master, job_id)
    print(f"\njob {job_id}: {state} {detail}".rstrip())
    if state == "exited" and detail.strip().isdigit():
        raise Exit(code=int(detail))


@task(auto_shortflags=False, help={"cluster": CLUSTER_HELP, "region": "AWS region (default: the configured one)",
            "job": "job id (default: the newest job)",
            "grace": "seconds ranks get to exit after TERM before KILL (default 10)"})
def stop(c, cluster="", region="", job="", grace=jobs.STOP_GRACE_SECONDS):
    """Stop a job on every node; checks that no rank is left anywhere."""
    inventory = _inventory(cluster, region)
    conns = _connections(inventory)
    master = conns[inventory.master.name]
    try:
        job_id = jobs.resolve_job_id(master, job or None)
    except jobs.JobError as exc:
        raise Exit(f"error: {exc}", code=EXIT_BAD_INPUT) from None
    outcomes = jobs.stop(master, conns, job_id, grace=int(grace))
    _print_outcomes(f"stop job {job_id}:", outcomes)
    failed = [o.node for o in outcomes if not o.ok]
    if failed:
        raise Exit(f"error: could not confirm the job is gone on: {', '.join(failed)} (reason above); rerun "
                   "`fab stop` once they are reachable", code=EXIT_UNREACHABLE)


TASKS = [train, status, logs, stop]
