"""`fab train`'s options (and a job file's, which arrive as the same options) made into one RunRequest,
resolved against the inventory once (pure; cluster/job/request.py says what the request holds).

`request_from_options(options, inventory, ...)`: the node count (`--nodes` or every node), the
launcher and its elastic settings or the --managed ones, the layout (the measured one of `fab bench
--layouts` when --ranks-per-node is left out), durations in seconds, the built-in job's typed
settings with --extra checked against the flags the job accepts (a flag fab train has an option for
becomes that option's value: given twice is refused), the offline demo when the nodes are offline
and no model or data is given, the data files of this machine to copy, the environment, the output
directory. What needs this machine (is a data file here; the workdir's scan; the calibration; the
stack's idle auto-stop) is handed in by the caller (node_setup/tasks/job_options.py). RequestError
(one line naming the option) for anything that cannot be used.
"""

from __future__ import annotations

import shlex
from pathlib import PurePosixPath
from typing import Any, Callable, Mapping

from cluster.inventory import Inventory, InventoryError
from cluster.job import request as rq
from cluster.job.checks import check_node_path
from cluster.job.run_env import check_env, parse_allow_env
from cluster.job.job_args import (SYNTHETIC_BATCH_SIZE, SYNTHETIC_EPOCHS, TASKS, JobArgsError, compile_choice,
                                  parse_extra)
from cluster.job.jobplan import default_output_dir, machine_for
from cluster.job.launch import LaunchError, env_pairs, job_dir
from cluster.run.recovery import DEFAULT_MAX_RECOVERIES, DEFAULT_WAIT_FOR_CAPACITY, RecoveryError, parse_wait

PIN_CHOICES = {"": None, "on": True, "true": True, "off": False, "false": False}
TRUE_WORDS, FALSE_WORDS = ("", "true", "yes", "1", "on"), ("false", "no", "0", "off")
# The built-in job's options, which mean nothing to your own program (--script/--module).
BUILTIN_OPTIONS = ("task", "model", "dataset", "dataset_config", "train_file", "validation_file", "epochs",
                   "batch_size", "max_steps", "checkpoint_every", "checkpoint_uri", "resume", "synthetic_examples",
                   "grad_comm", "ddp_bucket_mb", "compile", "peft")
OWN_OPTIONS = ("script", "module", "args", "workdir", "requirements", "independent_ranks")
MANAGED_ONLY = ("max_recoveries", "wait_for_capacity", "detach", "resume_arg")


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _given(value: Any) -> bool:
    return value not in (None, "", False)


def _number(option: str, text: str, kind: Callable[[str], Any]) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise rq.RequestError(f"{option}: {text!r} is not a number") from None


def _switch(option: str, text: str) -> bool:
    word = text.strip().lower()
    if word in TRUE_WORDS or word in FALSE_WORDS:
        return word in TRUE_WORDS
    raise rq.RequestError(f"{option}: {text!r} is not allowed; allowed: true or false")


def _estimate(text: str) -> tuple[float, float, float]:
    parts = text.split(",")
    if len(parts) != 3:
        raise rq.RequestError(f"--extra: --compile_estimate {text!r} is not allowed; allowed: EAGER_S,COMPILED_S,"
                              "COMPILE_S")
    a, b, c = (_number("--compile_estimate", p, float) for p in parts)
    return a, b, c


def _from_extra(typed: dict[str, str], options: dict[str, Any]) -> dict[str, Any]:
    """The typed values --extra gave (parse_extra's), as options; given as an option too is refused."""
    from cluster.job.job_args import TYPED_FLAGS

    by_field = {f: (flag, option) for flag, (f, option) in TYPED_FLAGS.items()}
    found: dict[str, Any] = {}
    for name, text in typed.items():
        flag, option = by_field[name]
        target = {"checkpoint_minutes": "checkpoint_every", "compile_estimate": "compile_estimate"}.get(name, name)
        if target != "compile_estimate" and _given(options.get(target)) and options.get(target) != "auto":
            raise rq.RequestError(f"--extra: {flag} repeats {option}; give it once")
        if name in ("epochs", "ddp_bucket_mb"):
            found[target] = _number(flag, text, float)
        elif name in ("batch_size", "max_steps"):
            found[target] = _number(flag, text, int)
        elif name == "checkpoint_minutes":
            found[target] = _number(flag, text, float) * 60
        elif name == "bf16":
            found[target] = "on" if _switch(flag, text) else "off"
        elif name == "resume":
            found[target] = _switch(flag, text)
        elif name == "compile_estimate":
            found[target] = _estimate(text)
        elif name == "output_dir":
            check_node_path(flag, text)
            found[target] = text
        else:
            found[target] = text
    return found


def _data_files(options: Mapping[str, Any], run_id: str, local_file: Callable[[str], str | None]
                ) -> tuple[dict[str, str | None], tuple[rq.DataFile, ...]]:
    """--train-file/--validation-file: a file of this machine is copied to every node (its path there)."""
    paths: dict[str, str | None] = {}
    files = []
    for key in ("train_file", "validation_file"):
        path = options.get(key) or None
        here = local_file(path) if path else None
        if here:
            node = f"{job_dir(run_id)}/data/{key}-{PurePosixPath(here).name}"
            files.append(rq.DataFile(here, node))
            path = node
        paths[key] = path
    return paths, tuple(files)


def _builtin(options: dict[str, Any], offline: bool, run_id: str, *, calibration: Any,
             local_file: Callable[[str], str | None]) -> tuple[rq.BuiltinJob, tuple[rq.DataFile, ...], list[str]]:
    try:
        words = shlex.split(options.get("extra") or "")
    except ValueError as exc:
        raise rq.RequestError(f"--extra: cannot split {options.get('extra')!r} like a shell would ({exc}); check "
                              "its quotes") from None
    try:
        typed, extra = parse_extra(words)
    except JobArgsError as exc:
        raise rq.RequestError(str(exc)) from None
    options.update(_from_extra(typed, options))
    paths, files = _data_files(options, run_id, local_file)
    given_data = options.get("model") or options.get("dataset") or paths["train_file"]
    examples = options.get("synthetic_examples")
    demo = None
    if examples is not None or (offline and not given_data):
        task = options.get("task") or TASKS[0]
        if task not in TASKS:
            raise rq.RequestError(f"--task: {task!r} is not allowed; choose {' or '.join(TASKS)}")
        demo = rq.Demo(task, examples)
    estimate = calibration.compile_cost() if calibration is not None else None
    if options.get("compile_estimate") is not None:
        estimate = None  # the user's own --compile_estimate (through --extra) replaces the calibration's
    try:
        compile_args, compile_line = compile_choice(options.get("compile") or None, estimate,
                                                    options.get("max_steps") or None)
    except JobArgsError as exc:
        raise rq.RequestError(str(exc)) from None
    choice = compile_args[1] if compile_args else None
    measured = None
    if estimate is not None and choice == "auto":
        measured = (estimate.eager_step_s, estimate.compiled_step_s, estimate.compile_s)
    job = rq.BuiltinJob(
        task=demo.task if demo else options.get("task") or None, model=options.get("model") or None,
        dataset=options.get("dataset") or None, dataset_config=options.get("dataset_config") or None,
        train_file=paths["train_file"], validation_file=paths["validation_file"],
        epochs=options.get("epochs") or (float(SYNTHETIC_EPOCHS) if demo else None),
        batch_size=options.get("batch_size") or (SYNTHETIC_BATCH_SIZE if demo else None),
        max_steps=options.get("max_steps") or None, bf16=(options.get("bf16") or "auto").lower(),
        grad_comm=(options.get("grad_comm") or "").strip().lower() or None,
        ddp_bucket_mb=options.get("ddp_bucket_mb"), compile=choice,
        peft=(options.get("peft") or "").strip().lower() or None,
        compile_estimate=options.get("compile_estimate") or measured, demo=demo, extra=extra)
    return job, files, [compile_line]


def check_program_options(options: Mapping[str, Any], own: rq.OwnProgram | None) -> None:
    """Your own program's options only with --script/--module (`own`), the built-in job's only without it
    (fab train's and fab k8s-job's options); RequestError naming the first one given otherwise."""
    if own is None:
        used = next((name for name in OWN_OPTIONS if _given(options.get(name))), None)
        if used:
            raise rq.RequestError(f"{_option(used)}: only with --script or --module (your own program)")
        if _given(options.get("resume_arg")):
            raise rq.RequestError("--resume-arg: only with --script/--module (the built-in job resumes with --resume)")
        return
    used = next((name for name in BUILTIN_OPTIONS if _given(options.get(name))
                 and not (name == "compile" and options[name] == "auto")), None)
    if used or (options.get("bf16") or "auto") != "auto":
        raise rq.RequestError(f"{_option(used or 'bf16')}: an option of the built-in job, not allowed with "
                              "--script/--module; pass your program's own arguments with --args (or after `--`)")


def request_from_options(options: Mapping[str, Any], inventory: Inventory, *, run_id: str,
                         own: rq.OwnProgram | None = None, calibration: Any = None,
                         local_file: Callable[[str], str | None] = lambda path: None,
                         idle_stop_s: int | None = None) -> tuple[rq.RunRequest, list[str]]:
    """(the run, the lines to print: the measured layout and the compile decision).

    `options`: fab train's, by parameter name, an option left out as None (invoke's Unset); `own`: your
    program when --script/--module is given (node_setup/tasks/job_options.py checks its files);
    `calibration`: the cluster's `fab bench` calibration or None; `local_file(path)`: the absolute path
    of a data file of this machine, None when it is none; `idle_stop_s`: the auto-stop to arm at the start.
    """
    options = dict(options)
    if _given(options.get("workdir_changed_ok")):  # fab train --managed --resume reads the run from its spec
        raise rq.RequestError(f"{rq.CHANGED_OK_OPTION}: only with --managed --resume (a run of your own program "
                              "continued, its workdir copied again from here)")
    if (options.get("pin") or "").lower() not in PIN_CHOICES:
        raise rq.RequestError(f"--pin: {options['pin']!r} is not allowed; choose on or off")
    managed = bool(options.get("managed"))
    if not managed:
        used = next((name for name in MANAGED_ONLY if _given(options.get(name))), None)
        if used:
            raise rq.RequestError(f"{_option(used)}: only with --managed (fab supervises the job and recovers it)")
    check_program_options(options, own)
    nodes = options.get("nodes") or len(inventory.nodes)
    try:
        machine = machine_for(inventory.first(nodes), nodes)[0]
        pairs = env_pairs(options.get("env") or "")
    except (InventoryError, LaunchError) as exc:
        raise rq.RequestError(str(exc)) from None
    allow = parse_allow_env(options.get("allow_env") or "")
    lines: list[str] = []
    ranks = options.get("ranks_per_node")
    if ranks is None and calibration is not None:  # no --ranks-per-node: a measured layout, else the rule
        from cluster.cost.calibration import layout_for

        ranks, line = layout_for(calibration, machine.name)
        lines.append(line)
    files: tuple[rq.DataFile, ...] = ()
    program: rq.BuiltinJob | rq.OwnProgram
    if own is None:
        program, files, more = _builtin(options, inventory.offline, run_id, calibration=calibration,
                                        local_file=local_file)
        lines += more
    else:
        program = own
    min_nodes = options.get("min_nodes")
    supervision = None
    if managed:
        try:
            wait_s = parse_wait(DEFAULT_WAIT_FOR_CAPACITY) if options.get("wait_for_capacity") is None \
                else float(options["wait_for_capacity"])
        except RecoveryError as exc:
            raise rq.RequestError(str(exc)) from None
        recoveries = options.get("max_recoveries")
        supervision = rq.Managed(max_recoveries=DEFAULT_MAX_RECOVERIES if recoveries is None else int(recoveries),
                                 min_nodes=min_nodes or 1, wait_s=wait_s, detach=bool(options.get("detach")))
    launcher = rq.Launcher(options.get("launcher") or "mpirun", None if managed else min_nodes,
                           options.get("max_restarts"))
    resume = bool(options.get("resume"))
    output_dir = options.get("output_dir") or (None if resume else default_output_dir(inventory, run_id))
    request = rq.RunRequest(
        run_id=run_id, nodes=nodes, program=program, launcher=launcher,
        layout=rq.LayoutRequest(ranks, options.get("threads"), options.get("ccl_workers"),
                                PIN_CHOICES[(options.get("pin") or "").lower()]),
        env=check_env(pairs, allow), allow_env=allow, output_dir=output_dir,
        checkpoint_every_s=options.get("checkpoint_every"), checkpoint_uri=options.get("checkpoint_uri") or None,
        resume=resume, managed=supervision, allow_busy=bool(options.get("allow_busy")), idle_stop_s=idle_stop_s,
        name=options.get("name") or None, data_files=files)
    return request, [line for line in lines if line]


def k8s_request(options: Mapping[str, Any], *, run_id: str, own: rq.OwnProgram | None = None) -> rq.RunRequest:
    """`fab k8s-job`'s options (those it shares with fab train, left out as None) as a run request: one pod
    per node, torchrun in each (elastic with --min-nodes), the built-in job's settings and --extra checked as
    fab train checks them (the offline demo only when --synthetic-examples asks), or your program (`own`, made by
    node_setup/tasks/job_options.py's own_program as for fab train); each program's options only with it."""
    options = dict(options)
    check_program_options(options, own)
    try:
        pairs = env_pairs(options.get("env") or "", "CCL_LOG_LEVEL=info")
    except LaunchError as exc:
        raise rq.RequestError(str(exc)) from None
    allow = parse_allow_env(options.get("allow_env") or "")
    program: rq.BuiltinJob | rq.OwnProgram = own if own is not None else _builtin(
        options, False, run_id, calibration=None, local_file=lambda path: None)[0]
    min_nodes = options.get("min_nodes")
    return rq.RunRequest(
        run_id=run_id, nodes=options.get("nodes") or 1, program=program,
        launcher=rq.Launcher("torchrun", min_nodes, options.get("max_restarts") if min_nodes is not None else None),
        layout=rq.LayoutRequest(options.get("ranks_per_node"), options.get("threads"), options.get("ccl_workers")),
        env=check_env(pairs, allow), allow_env=allow, output_dir=options.get("output_dir") or None,
        checkpoint_every_s=options.get("checkpoint_every"), checkpoint_uri=options.get("checkpoint_uri") or None)
