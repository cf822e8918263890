"""`fab train`'s and `fab k8s-job`'s options (a job file's too) made into one RunRequest, resolved against the
inventory once (pure). What needs this machine (files here, the calibration, the idle auto-stop) is handed in by
node_setup/tasks/job_options.py; RequestError (one line naming the option) for anything that cannot be used.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
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


@dataclass(frozen=True)
class JobOptions:
    """fab train's and fab k8s-job's options as the tasks parsed them (a job file's too), typed; left out: None
    (a switch: False). `of` takes them by name from a mapping (an unknown name is a TypeError)."""

    nodes: int | None = None
    task: str | None = None
    model: str | None = None
    dataset: str | None = None
    dataset_config: str | None = None
    train_file: str | None = None
    validation_file: str | None = None
    epochs: float | None = None
    batch_size: int | None = None
    bf16: str | None = None
    checkpoint_every: float | None = None  # seconds
    checkpoint_uri: str | None = None
    max_steps: int | None = None
    output_dir: str | None = None
    extra: str | None = None
    resume: bool = False
    ranks_per_node: int | None = None
    threads: int | None = None
    ccl_workers: int | None = None
    pin: str | None = None
    env: str | None = None
    allow_env: str | None = None
    synthetic_examples: int | None = None
    script: str | None = None
    module: str | None = None
    args: str | None = None
    workdir: str | None = None
    workdir_limit_mb: int | None = None
    requirements: str | None = None
    notice_signal: str | None = None
    launcher: str | None = None
    min_nodes: int | None = None
    max_restarts: int | None = None
    grad_comm: str | None = None
    ddp_bucket_mb: float | None = None
    compile: str | None = None
    peft: str | None = None
    managed: bool = False
    max_recoveries: int | None = None
    wait_for_capacity: float | None = None  # seconds
    independent_ranks: bool = False
    allow_busy: bool = False
    resume_arg: str | None = None
    workdir_changed_ok: bool = False
    detach: bool = False
    name: str | None = None
    compile_estimate: tuple[float, float, float] | None = None  # only from --extra's --compile_estimate

    @classmethod
    def of(cls, options: "Mapping[str, Any] | JobOptions") -> "JobOptions":
        return options if isinstance(options, JobOptions) else cls(**options)

    def given(self, name: str) -> bool:
        """Whether the option `name` (a field) was given: not None, "" or False."""
        return _given(getattr(self, name))


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


def _from_extra(typed: dict[str, str], options: JobOptions) -> dict[str, Any]:
    """The typed values --extra gave (parse_extra's), as options; given as an option too is refused."""
    from cluster.job.job_args import TYPED_FLAGS

    by_field = {f: (flag, option) for flag, (f, option) in TYPED_FLAGS.items()}
    found: dict[str, Any] = {}
    for name, text in typed.items():
        flag, option = by_field[name]
        target = {"checkpoint_minutes": "checkpoint_every", "compile_estimate": "compile_estimate"}.get(name, name)
        if target != "compile_estimate" and options.given(target) and getattr(options, target) != "auto":
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


def _data_files(options: JobOptions, run_id: str, local_file: Callable[[str], str | None]
                ) -> tuple[dict[str, str | None], tuple[rq.DataFile, ...]]:
    """--train-file/--validation-file: a file of this machine is copied to every node (its path there)."""
    paths: dict[str, str | None] = {}
    files = []
    for key, path in (("train_file", options.train_file or None), ("validation_file", options.validation_file or None)):
        here = local_file(path) if path else None
        if here:
            node = f"{job_dir(run_id)}/data/{key}-{PurePosixPath(here).name}"
            files.append(rq.DataFile(here, node))
            path = node
        paths[key] = path
    return paths, tuple(files)


def _builtin(o: JobOptions, offline: bool, run_id: str, *, calibration: Any,
             local_file: Callable[[str], str | None]
             ) -> tuple[rq.BuiltinJob, tuple[rq.DataFile, ...], list[str], JobOptions]:
    """The built-in job's settings, the data files to copy, the compile line, and the options with what --extra
    gave them (a typed flag in --extra is that option's value)."""
    try:
        words = shlex.split(o.extra or "")
    except ValueError as exc:
        raise rq.RequestError(f"--extra: cannot split {o.extra!r} like a shell would ({exc}); check "
                              "its quotes") from None
    try:
        typed, extra = parse_extra(words)
    except JobArgsError as exc:
        raise rq.RequestError(str(exc)) from None
    o = replace(o, **_from_extra(typed, o))
    paths, files = _data_files(o, run_id, local_file)
    given_data = o.model or o.dataset or paths["train_file"]
    examples = o.synthetic_examples
    demo = None
    if examples is not None or (offline and not given_data):
        task = o.task or TASKS[0]
        if task not in TASKS:
            raise rq.RequestError(f"--task: {task!r} is not allowed; choose {' or '.join(TASKS)}")
        demo = rq.Demo(task, examples)
    estimate = calibration.compile_cost() if calibration is not None else None
    if o.compile_estimate is not None:
        estimate = None  # the user's own --compile_estimate (through --extra) replaces the calibration's
    try:
        choice, compile_line = compile_choice(o.compile or None, estimate, o.max_steps or None)
    except JobArgsError as exc:
        raise rq.RequestError(str(exc)) from None
    measured = None
    if estimate is not None and choice == "auto":
        measured = (estimate.eager_step_s, estimate.compiled_step_s, estimate.compile_s)
    job = rq.BuiltinJob(
        task=demo.task if demo else o.task or None, model=o.model or None,
        dataset=o.dataset or None, dataset_config=o.dataset_config or None,
        train_file=paths["train_file"], validation_file=paths["validation_file"],
        epochs=o.epochs or (float(SYNTHETIC_EPOCHS) if demo else None),
        batch_size=o.batch_size or (SYNTHETIC_BATCH_SIZE if demo else None),
        max_steps=o.max_steps or None, bf16=(o.bf16 or "auto").lower(),
        grad_comm=(o.grad_comm or "").strip().lower() or None,
        ddp_bucket_mb=o.ddp_bucket_mb, compile=choice,
        peft=(o.peft or "").strip().lower() or None,
        compile_estimate=o.compile_estimate or measured, demo=demo, extra=extra)
    return job, files, [compile_line], o


def check_program_options(o: JobOptions, own: rq.OwnProgram | None) -> None:
    """Your own program's options only with --script/--module (`own`), the built-in job's only without it
    (fab train's and fab k8s-job's options); RequestError naming the first one given otherwise."""
    if own is None:
        used = next((name for name in OWN_OPTIONS if o.given(name)), None)
        if used:
            raise rq.RequestError(f"{_option(used)}: only with --script or --module (your own program)")
        if o.given("resume_arg"):
            raise rq.RequestError("--resume-arg: only with --script/--module (the built-in job resumes with --resume)")
        return
    used = next((name for name in BUILTIN_OPTIONS if o.given(name) and not (name == "compile" and o.compile == "auto")),
                None)
    if used or (o.bf16 or "auto") != "auto":
        raise rq.RequestError(f"{_option(used or 'bf16')}: an option of the built-in job, not allowed with "
                              "--script/--module; pass your program's own arguments with --args (or after `--`)")


def request_from_options(options: Mapping[str, Any] | JobOptions, inventory: Inventory, *, run_id: str,
                         own: rq.OwnProgram | None = None, calibration: Any = None,
                         local_file: Callable[[str], str | None] = lambda path: None,
                         idle_stop_s: int | None = None) -> tuple[rq.RunRequest, list[str]]:
    """(the run, the lines to print: the measured layout and the compile decision).

    `options`: fab train's (JobOptions, or by parameter name, an option left out as None); `own`: your
    program when --script/--module is given (node_setup/tasks/job_options.py checks its files);
    `calibration`: the cluster's `fab bench` calibration or None; `local_file(path)`: the absolute path
    of a data file of this machine, None when it is none; `idle_stop_s`: the auto-stop to arm at the start.
    """
    o = JobOptions.of(options)
    if o.workdir_changed_ok:  # fab train --managed --resume reads the run from its spec
        raise rq.RequestError(f"{rq.CHANGED_OK_OPTION}: only with --managed --resume (a run of your own program "
                              "continued, its workdir copied again from here)")
    pin = (o.pin or "").lower()
    if pin not in PIN_CHOICES:
        raise rq.RequestError(f"--pin: {o.pin!r} is not allowed; choose on or off")
    if not o.managed:
        used = next((name for name in MANAGED_ONLY if o.given(name)), None)
        if used:
            raise rq.RequestError(f"{_option(used)}: only with --managed (fab supervises the job and recovers it)")
    check_program_options(o, own)
    nodes = o.nodes or len(inventory.nodes)
    try:
        machine = machine_for(inventory.first(nodes), nodes)[0]
        pairs = env_pairs(o.env or "")
    except (InventoryError, LaunchError) as exc:
        raise rq.RequestError(str(exc)) from None
    allow = parse_allow_env(o.allow_env or "")
    lines: list[str] = []
    ranks = o.ranks_per_node
    if ranks is None and calibration is not None:  # no --ranks-per-node: a measured layout, else the rule
        from cluster.cost.calibration import layout_for

        ranks, line = layout_for(calibration, machine.name)
        lines.append(line)
    files: tuple[rq.DataFile, ...] = ()
    program: rq.BuiltinJob | rq.OwnProgram
    if own is None:
        program, files, more, o = _builtin(o, inventory.offline, run_id, calibration=calibration,
                                           local_file=local_file)
        lines += more
    else:
        program = own
    supervision = None
    if o.managed:
        try:
            wait_s = parse_wait(DEFAULT_WAIT_FOR_CAPACITY) if o.wait_for_capacity is None \
                else float(o.wait_for_capacity)
        except RecoveryError as exc:
            raise rq.RequestError(str(exc)) from None
        supervision = rq.Managed(
            max_recoveries=DEFAULT_MAX_RECOVERIES if o.max_recoveries is None else int(o.max_recoveries),
            min_nodes=o.min_nodes or 1, wait_s=wait_s, detach=o.detach)
    launcher = rq.Launcher(o.launcher or "mpirun", None if o.managed else o.min_nodes, o.max_restarts)
    output_dir = o.output_dir or (None if o.resume else default_output_dir(inventory, run_id))
    request = rq.RunRequest(
        run_id=run_id, nodes=nodes, program=program, launcher=launcher,
        layout=rq.LayoutRequest(ranks, o.threads, o.ccl_workers, PIN_CHOICES[pin]),
        env=check_env(pairs, allow), allow_env=allow, output_dir=output_dir,
        checkpoint_every_s=o.checkpoint_every, checkpoint_uri=o.checkpoint_uri or None,
        resume=bool(o.resume), managed=supervision, allow_busy=bool(o.allow_busy), idle_stop_s=idle_stop_s,
        name=o.name or None, data_files=files)
    return request, [line for line in lines if line]


def k8s_request(options: Mapping[str, Any] | JobOptions, *, run_id: str,
                own: rq.OwnProgram | None = None) -> rq.RunRequest:
    """`fab k8s-job`'s options (those it shares with fab train, left out as None) as a run request: one pod
    per node, torchrun in each (elastic with --min-nodes), the built-in job's settings and --extra checked as
    fab train checks them (the offline demo only when --synthetic-examples asks), or your program (`own`, made by
    node_setup/tasks/job_options.py's own_program as for fab train); each program's options only with it."""
    o = JobOptions.of(options)
    check_program_options(o, own)
    try:
        pairs = env_pairs(o.env or "", "CCL_LOG_LEVEL=info")
    except LaunchError as exc:
        raise rq.RequestError(str(exc)) from None
    allow = parse_allow_env(o.allow_env or "")
    program: rq.BuiltinJob | rq.OwnProgram
    if own is None:
        program, _, _, o = _builtin(o, False, run_id, calibration=None, local_file=lambda path: None)
    else:
        program = own
    return rq.RunRequest(
        run_id=run_id, nodes=o.nodes or 1, program=program,
        launcher=rq.Launcher("torchrun", o.min_nodes, o.max_restarts if o.min_nodes is not None else None),
        layout=rq.LayoutRequest(o.ranks_per_node, o.threads, o.ccl_workers),
        env=check_env(pairs, allow), allow_env=allow, output_dir=o.output_dir or None,
        checkpoint_every_s=o.checkpoint_every, checkpoint_uri=o.checkpoint_uri or None)
