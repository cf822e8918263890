"""`fab train`'s and `fab k8s-job`'s options (a job file's too) made into one RunRequest, resolved against the
inventory (pure; what needs this machine comes from node_setup/tasks/job_options.py). RequestError: one line."""

from __future__ import annotations

import functools
import shlex
from dataclasses import dataclass, field, fields, replace
from pathlib import PurePosixPath
from typing import Any, Callable, Mapping, get_args, get_type_hints

from cluster.inventory import Inventory, InventoryError
from cluster.job import k8s
from cluster.job import request as rq
from cluster.job import checks as ck
from cluster.job.checks import check_node_path
from cluster.job.run_env import check_env, parse_allow_env
from cluster.job.demo import SYNTHETIC_BATCH_SIZE, SYNTHETIC_EPOCHS
from cluster.job.job_args import (BF16_CHOICES, COMPILE_CHOICES, GRAD_COMM_CHOICES, TASKS, TYPED_FLAGS, JobArgsError,
                                  compile_choice, parse_extra)
from cluster.job.jobplan import default_output_dir, machine_for
from cluster.job.launch import DEFAULT_LAUNCHER, LAUNCHERS, LaunchError, env_pairs, job_dir
from cluster.job.lora import PEFT_CHOICES
from cluster.job.torchrun import DEFAULT_MAX_RESTARTS
from cluster.job.userjob import (DEFAULT_NOTICE_SIGNAL, DEFAULT_WORKDIR_LIMIT_MB, NO_SIGNAL, NOTICE_SIGNALS,
                                 human_bytes)
from cluster.job.worldcheck import TRAINED_ALONE
from cluster.run.recovery import DEFAULT_MAX_RECOVERIES, DEFAULT_WAIT_FOR_CAPACITY, parse_wait

PIN_CHOICES = {"": None, "on": True, "true": True, "off": False, "false": False}
TRUE_WORDS, FALSE_WORDS = ("", "true", "yes", "1", "on"), ("false", "no", "0", "off")
BUILTIN, OWN, MANAGED = rq.BUILTIN, rq.OWN, "managed"  # the options that mean something only to one of them
SAME = "same"  # `fab k8s-job` takes the option with fab train's help text
DURATION = "duration"  # a duration option (90s, 30m; off or 0: none): seconds


@dataclass(frozen=True)
class Cli:
    """How a JobOptions field is an option of `fab train` (and of `fab k8s-job` when `k8s` is its help there, or
    SAME): its `fab --help` group and text; `kind` where the field's type says less (int, DURATION); `unset`, what
    leaving it out means; `path`, a job file's value read relative to the file ("path", or "maybe": when such a
    file exists there); `only`, the program (BUILTIN, OWN) or mode (MANAGED) the option is for."""

    group: str
    help: str
    k8s: str | None = None
    kind: Any = None
    unset: str = ""
    path: str = ""
    only: str = ""
    k8s_default: Any = None  # `fab k8s-job`'s default where it is not fab train's


def _opt(group: str, help: str, default: Any = None, **cli: Any) -> Any:  # noqa: A002 - the option's help
    return field(default=default, metadata={"cli": Cli(group, help, **cli)})


CLUSTER, PROGRAM, TRAINING, RECOVERY, OUTPUT = "cluster", "program", "training", "spot and recovery", "output"
GROUPS = (CLUSTER, PROGRAM, TRAINING, RECOVERY, OUTPUT)  # `fab --help`'s order
_TRAIN_FILE = "training data (.json/.jsonl)"
_INSTEAD = "on every rank instead of the built-in job"


@dataclass(frozen=True)
class JobOptions:
    """fab train's and fab k8s-job's options, each declared once: type, default and (metadata "cli") how the tasks
    show it (docs/design.md, the command line). Left out: None (a switch: False)."""

    nodes: int | None = _opt(CLUSTER, "how many nodes to use, master first (1 to the nodes available; left out: "
                             "all)", k8s="worker pods, one per node (default 1)", unset="all nodes", k8s_default=1)
    task: str | None = _opt(TRAINING, f"training task: {' or '.join(TASKS)} (training default {TASKS[0]})",
                            k8s=SAME, only=BUILTIN)
    model: str | None = _opt(TRAINING, "model id or a directory on the nodes (--model_name_or_path)",
                             k8s="model id, or a directory relative to the volume (--model_name_or_path)", only=BUILTIN)
    dataset: str | None = _opt(TRAINING, "hub dataset name (default squad for qa, glue/mrpc for classification)",
                               k8s=SAME, only=BUILTIN)
    dataset_config: str | None = _opt(TRAINING, "hub dataset configuration (e.g. mrpc)", k8s=SAME, only=BUILTIN)
    train_file: str | None = _opt(TRAINING, f"{_TRAIN_FILE}: a file on this machine is copied to every node, else "
                                  "the path on the nodes", k8s=f"{_TRAIN_FILE}, a path relative to {k8s.WORK_MOUNT}",
                                  path="maybe", only=BUILTIN)
    validation_file: str | None = _opt(TRAINING, "evaluation data, like --train-file", k8s=SAME, path="maybe",
                                       only=BUILTIN)
    epochs: float | None = _opt(TRAINING, "number of training epochs, a whole number (--num_train_epochs; for part "
                                "of one: --max-steps)", k8s=SAME, kind=int, unset="the job's", only=BUILTIN)
    batch_size: int | None = _opt(TRAINING, "batch size per rank (--per_device_train_batch_size)", k8s=SAME,
                                  unset="the job's", only=BUILTIN)
    bf16: str | None = _opt(TRAINING, f"{', '.join(BF16_CHOICES)} (auto: on when the CPU has AMX/AVX512-BF16)",
                            "auto", k8s=SAME)
    checkpoint_every: float | None = _opt(OUTPUT, "save a checkpoint this often, e.g. 30m or 1h (off: only at the "
                                          "end)", k8s=SAME, kind=DURATION, only=BUILTIN)  # seconds
    checkpoint_uri: str | None = _opt(OUTPUT, "s3://bucket/prefix every checkpoint is uploaded to (and --resume "
                                      "reads)", k8s="s3://bucket/prefix every checkpoint is uploaded to (and a "
                                      "restarted pod resumes from)", only=BUILTIN)
    max_steps: int | None = _opt(TRAINING, "stop after N optimizer steps", k8s=SAME, only=BUILTIN)
    output_dir: str | None = _opt(OUTPUT, "output directory on the nodes, relative to the home directory (default "
                                  "xeon-cluster-runs/<job id>; local cluster: /var/tmp/xeon-cluster-runs/<cluster>/"
                                  "<job id>, which its nodes share; with --resume: the newest job's)")
    extra: str | None = _opt(TRAINING, "more `python -m training` arguments, e.g. --extra '--learning_rate 3e-5 "
                             "--max_seq_length 256', checked against the flags the job accepts before anything "
                             "starts (arguments after `--` are added here)", k8s="more `python -m training` "
                             "arguments (with --script/--module: your program's), verbatim, e.g. --extra "
                             "'--learning_rate 3e-5' (arguments after `--` are added here)")
    resume: bool = _opt(RECOVERY, "continue from the newest complete checkpoint (after a spot reclaim); with "
                        "--managed: the run of the spec beside --checkpoint-uri (or in --output-dir), checked "
                        "against this controller's signature", False, only=BUILTIN)
    ranks_per_node: int | None = _opt(PROGRAM, "override ranks per node (default one per socket)",
                                      k8s="override ranks per pod (default one per socket)", unset="one per socket")
    threads: int | None = _opt(PROGRAM, "override OpenMP threads per rank (default the rank's physical cores minus "
                               "CCL workers)", k8s="override OpenMP threads per rank (default the rank's share of the "
                               "pod's cores minus CCL workers)", unset="the rank's cores")
    ccl_workers: int | None = _opt(PROGRAM, "override oneCCL workers per rank (intel profile only)", k8s=SAME)
    pin: str | None = _opt(PROGRAM, "pin ranks to their cores: on or off (default on; off on the local cluster)")
    env: str | None = _opt(PROGRAM, "extra environment for every rank, e.g. --env 'FI_PROVIDER=tcp "
                           "CCL_LOG_LEVEL=info'; names that change how an interpreter, a shell or the loader starts "
                           "(PYTHON*, LD_*, BASH_ENV, PATH ...) only with --allow-env",
                           k8s="extra environment for every rank, e.g. --env 'CCL_LOG_LEVEL=info' (in clear text in "
                           "the manifest: never a secret; what cluster/job/secrets.py takes for one, by name or "
                           "value, gets a warning); names that change how an interpreter, a shell or the loader "
                           "starts (PYTHON*, LD_*, PATH ...) only with --allow-env")
    allow_env: str | None = _opt(PROGRAM, "names --env may set although they change how a program starts, e.g. "
                                 "--allow-env PYTHONHASHSEED (comma-separated; recorded with the run)", k8s=SAME)
    synthetic_examples: int | None = _opt(TRAINING, "train the offline demo (a tiny model and data made on every "
                                          "node) with N examples; the default on a local cluster without --model/"
                                          "--dataset/--train-file (2000 examples)", k8s="train the offline demo (a "
                                          "tiny model and data made on every node first) with N examples", only=BUILTIN)
    script: str | None = _opt(PROGRAM, f"run your own training script (a .py file in --workdir) {_INSTEAD}",
                              k8s=f"run your own training script (a .py file in --workdir) {_INSTEAD}; the workdir "
                              f"goes in a ConfigMap (at most {human_bytes(k8s.CONFIGMAP_LIMIT_BYTES)})", path="path",
                              only=OWN)
    module: str | None = _opt(PROGRAM, f"run `python -m MODULE` (found in --workdir or the node venv) {_INSTEAD}",
                              k8s=f"run `python -m MODULE` (found in --workdir or the image's venv) {_INSTEAD}",
                              only=OWN)
    args: str | None = _opt(PROGRAM, "arguments of your --script/--module, split like a shell would (arguments after "
                            "`--` are added)", k8s=SAME, only=OWN)
    workdir: str | None = _opt(PROGRAM, "folder copied to every node, where the ranks start (default: the script's "
                               "folder; with --module the current folder); .git, __pycache__, virtual environments "
                               "and what its .gitignore lists stay here", k8s="folder of your program, copied into "
                               "every pod (default: the script's folder; with --module the current folder); what "
                               "`fab train` withholds (dot-files, credentials, links out) stays here", path="path",
                               only=OWN)
    workdir_limit_mb: int | None = _opt(PROGRAM, f"refuse a workdir over this many MB to copy (default "
                                        f"{DEFAULT_WORKDIR_LIMIT_MB})", DEFAULT_WORKDIR_LIMIT_MB)
    requirements: str | None = _opt(PROGRAM, "a requirements file installed into the node venv before the launch "
                                    "(once per content); a requirement that would change a pinned package of the "
                                    "profile is refused", path="path", only=OWN)
    notice_signal: str | None = _opt(RECOVERY, f"signal every rank gets on a spot interruption notice: "
                                     f"{', '.join(NOTICE_SIGNALS)} or {NO_SIGNAL} (default {DEFAULT_NOTICE_SIGNAL})",
                                     DEFAULT_NOTICE_SIGNAL)
    launcher: str | None = _opt(PROGRAM, f"what starts the ranks: {' or '.join(LAUNCHERS)} (default "
                                f"{DEFAULT_LAUNCHER}; torchrun: one per node, started over SSH, c10d rendezvous on "
                                "the master)", DEFAULT_LAUNCHER)
    min_nodes: int | None = _opt(RECOVERY, "with --managed: resume on the survivors when at least M nodes are left "
                                 "and no replacement came in time (default 1); with --launcher torchrun: elastic, "
                                 "train on as few as M nodes (torchrun's M:N range; a node that leaves restarts the "
                                 "ranks on the others, which resume from the newest checkpoint)",
                                 k8s="elastic: train on as few as M pods (torchrun's M:N range, the operator's "
                                 f"elasticPolicy; --api {k8s.API_PYTORCHJOB} only)")
    max_restarts: int | None = _opt(RECOVERY, f"torchrun with --min-nodes: restarts of the ranks before the job "
                                    f"fails (default {DEFAULT_MAX_RESTARTS})", k8s="restarts before the job fails: "
                                    "the container restarts of the whole job (runPolicy.backoffLimit, default "
                                    f"{k8s.DEFAULT_RESTART_LIMIT}) and, elastic, torchrun's restarts of the ranks "
                                    f"(default {DEFAULT_MAX_RESTARTS}; --api {k8s.API_PYTORCHJOB} only: a TrainJob's "
                                    "runtime decides)")
    grad_comm: str | None = _opt(TRAINING, f"gradients on the wire: {' or '.join(GRAD_COMM_CHOICES)} (the job's "
                                 "--grad_comm; bf16 compresses DDP's buckets)", only=BUILTIN)
    ddp_bucket_mb: float | None = _opt(TRAINING, "DDP's gradient bucket size in MB, a positive number (the job's "
                                       "--ddp_bucket_mb; DDP's default 25)", only=BUILTIN)
    compile: str | None = _opt(TRAINING, f"torch.compile the model: {', '.join(COMPILE_CHOICES)} (default auto: "
                               "compiled when the saving `fab bench --compile` measured, over the run's steps, "
                               "exceeds the compile time; the job's --compile)", only=BUILTIN)
    peft: str | None = _opt(TRAINING, f"causal-lm: {' or '.join(PEFT_CHOICES)} (lora: peft's LoRA adapters on a "
                            "frozen model, the output holds the adapter only; --extra '--lora_r 8' and the job's "
                            "other --lora_* flags tune it; the job's --peft)", only=BUILTIN)
    managed: bool = _opt(RECOVERY, "fab stays attached: when the job is interrupted (spot reclaim, a node lost) it "
                         "gets replacements (or goes on with the survivors) and resumes from the newest checkpoint "
                         "(docs/long-spot-runs.md)", False)
    max_recoveries: int | None = _opt(RECOVERY, f"with --managed: recoveries before fab gives up (default "
                                      f"{DEFAULT_MAX_RECOVERIES})", only=MANAGED)
    wait_for_capacity: float | None = _opt(RECOVERY, "with --managed: how long to wait for replacement nodes, e.g. "
                                           f"90s, 10m, 1h (default {DEFAULT_WAIT_FOR_CAPACITY}; 0: do not ask, "
                                           "resume on the survivors at once)", kind=DURATION, only=MANAGED)  # seconds
    independent_ranks: bool = _opt(PROGRAM, "with --script/--module: the ranks are meant to run alone (no process "
                                   "group); without it a multi-rank job whose ranks never joined one exits "
                                   f"{TRAINED_ALONE} (each rank trained alone)", False, only=OWN)
    allow_busy: bool = _opt(CLUSTER, "launch even when a chosen node still runs a rank of another job (or the "
                            "master its job script); without it such a launch stops before anything starts, naming "
                            "the running job", False)
    resume_arg: str | None = _opt(RECOVERY, "with --managed --script/--module: the words your program gets when the "
                                  "supervisor restarts it after a recovery, {checkpoint} standing for the newest "
                                  "checkpoint folder, e.g. '--resume_from_checkpoint {checkpoint}' (it also gets "
                                  "XEON_CLUSTER_RESUME_FROM; docs/your-own-script.md)", only=MANAGED)
    workdir_changed_ok: bool = _opt(RECOVERY, "with --managed --resume of your own program: go on although its "
                                    "workdir here is not as the run recorded it (files changed, added or removed; "
                                    "recorded with the run)", False)
    detach: bool = _opt(RECOVERY, "with --managed: return as soon as the run has started on the master (its "
                        "supervisor goes on; `fab status`, `fab logs --follow`, `fab stop` reach it from any "
                        "controller)", False, only=MANAGED)
    name: str | None = _opt(OUTPUT, "a name for the job (a supervised run's every job): letters, digits, '.', '_' "
                            "and '-', starting with a letter; `fab jobs` shows it and --job takes it wherever it "
                            "takes a job id (the newest job of that name)")
    compile_estimate: tuple[float, float, float] | None = None  # not an option: only from --extra's --compile_estimate

    @classmethod
    def of(cls, options: "Mapping[str, Any] | JobOptions") -> "JobOptions":
        return options if isinstance(options, JobOptions) else cls(**options)

    def given(self, name: str) -> bool:
        """Whether the option `name` (a field) was given: not None, "" or False."""
        return getattr(self, name) not in (None, "", False)


@functools.cache
def kind_of(name: str) -> Any:
    """The type of the field `name` without None (int for `int | None`)."""
    hint = get_type_hints(JobOptions)[name]
    return next((a for a in get_args(hint) if a is not type(None)), hint)


def _first_given(o: JobOptions, only: str, but: str = "") -> str | None:
    """The first option given (by declaration order) of those only for `only` (BUILTIN, OWN, MANAGED) but `but`."""
    return next((f.name for f in fields(JobOptions) if "cli" in f.metadata and f.metadata["cli"].only == only
                 and f.name != but and o.given(f.name)), None)


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _number(option: str, text: str, kind: Callable[[str], Any]) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise rq.RequestError(f"{option}: {text!r} is not a number") from None


def _from_extra(typed: dict[str, str], options: JobOptions) -> dict[str, Any]:
    """The values --extra's typed flags gave, read by their option's type; given as that option too is refused."""
    found: dict[str, Any] = {}
    for flag, text in typed.items():
        name, option = TYPED_FLAGS[flag]
        target = "checkpoint_every" if name == "checkpoint_minutes" else name
        if target != "compile_estimate" and options.given(target) and getattr(options, target) != "auto":
            raise rq.RequestError(f"--extra: {flag} repeats {option}; give it once")
        kind, word = kind_of(target), text.strip().lower()
        if name == "compile_estimate":
            if text.count(",") != 2:
                raise rq.RequestError(f"--extra: --compile_estimate {text!r} is not allowed; allowed: EAGER_S,"
                                      "COMPILED_S,COMPILE_S")
            found[target] = tuple(_number(flag, part, float) for part in text.split(","))
        elif kind is bool or name == "bf16":
            if word not in TRUE_WORDS + FALSE_WORDS:
                raise rq.RequestError(f"{flag}: {text!r} is not allowed; allowed: true or false")
            found[target] = word in TRUE_WORDS if kind is bool else "on" if word in TRUE_WORDS else "off"
        elif kind in (int, float):
            found[target] = _number(flag, text, kind) * (60 if name == "checkpoint_minutes" else 1)
        else:
            if name == "output_dir":
                check_node_path(flag, text)
            found[target] = text
    return found


def _program(o: JobOptions, own: rq.OwnProgram | None, offline: bool, run_id: str, *, calibration: Any = None,
             local_file: Callable[[str], str | None] = lambda path: None
             ) -> tuple[rq.BuiltinJob | rq.OwnProgram, tuple[rq.DataFile, ...], list[str], JobOptions]:
    """(`own` or the built-in job, the data files to copy, the compile line, the options with --extra's values);
    each program's options only with it."""
    if own is not None:
        used = _first_given(o, BUILTIN, but="compile" if o.compile == "auto" else "")
        if used or (o.bf16 or "auto") != "auto":
            raise rq.RequestError(f"{_option(used or 'bf16')}: {rq.BUILTIN_ONLY}")
        return own, (), [], o
    used = _first_given(o, OWN)
    if used:
        raise rq.RequestError(f"{_option(used)}: only with --script or --module (your own program)")
    if o.given("resume_arg"):
        raise rq.RequestError("--resume-arg: only with --script/--module (the built-in job resumes with --resume)")
    try:
        words = shlex.split(o.extra or "")
    except ValueError as exc:
        raise rq.RequestError(f"--extra: cannot split {o.extra!r} like a shell would ({exc}); check its "
                              "quotes") from None
    typed, extra = ck.passes(parse_extra, words, JobArgsError)
    o = replace(o, **_from_extra(typed, o))
    paths: dict[str, str | None] = {}  # --train-file/--validation-file: a file here is copied to every node
    files: list[rq.DataFile] = []
    for key in ("train_file", "validation_file"):
        path = paths[key] = getattr(o, key) or None
        here = local_file(path) if path else None
        if here:
            files.append(rq.DataFile(here, f"{job_dir(run_id)}/data/{key}-{PurePosixPath(here).name}"))
            paths[key] = files[-1].node
    demo = None
    if o.synthetic_examples is not None or (offline and not (o.model or o.dataset or paths["train_file"])):
        demo = rq.Demo(o.task or TASKS[0], o.synthetic_examples)
    # the user's own --compile_estimate (through --extra) replaces the calibration's
    estimate = calibration.compile_cost() if calibration is not None and o.compile_estimate is None else None
    choice, compile_line = ck.passes(lambda c: compile_choice(c, estimate, o.max_steps or None), o.compile or None,
                                     JobArgsError)
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
    return job, tuple(files), [compile_line], o


def request_from_options(options: Mapping[str, Any] | JobOptions, inventory: Inventory, *, run_id: str,
                         own: rq.OwnProgram | None = None, calibration: Any = None,
                         local_file: Callable[[str], str | None] = lambda path: None,
                         idle_stop_s: int | None = None) -> tuple[rq.RunRequest, list[str]]:
    """(the run, the lines to print: the measured layout and the compile decision). `own`: --script/--module's
    program; `calibration`: `fab bench`'s or None; `local_file(path)`: a data file of this machine's absolute path
    or None; `idle_stop_s`: the auto-stop to arm at the start."""
    o = JobOptions.of(options)
    if o.workdir_changed_ok:  # fab train --managed --resume reads the run from its spec
        raise rq.RequestError(f"{rq.CHANGED_OK_OPTION}: only with --managed --resume (a run of your own program "
                              "continued, its workdir copied again from here)")
    pin = (o.pin or "").lower()
    if pin not in PIN_CHOICES:
        raise rq.RequestError(f"--pin: {o.pin!r} is not allowed; choose on or off")
    if not o.managed:
        used = _first_given(o, MANAGED)
        if used:
            raise rq.RequestError(f"{_option(used)}: only with --managed (fab supervises the job and recovers it)")
    nodes = o.nodes or len(inventory.nodes)
    machine = ck.passes(lambda n: machine_for(inventory.first(n), n)[0], nodes, (InventoryError, LaunchError))
    pairs = ck.passes(env_pairs, o.env or "", (InventoryError, LaunchError))
    allow = parse_allow_env(o.allow_env or "")
    lines: list[str] = []
    ranks = o.ranks_per_node
    if ranks is None and calibration is not None:  # no --ranks-per-node: a measured layout, else the rule
        from cluster.cost.calibration import layout_for

        ranks, line = layout_for(calibration, machine.name)
        lines.append(line)
    program, files, more, o = _program(o, own, inventory.offline, run_id, calibration=calibration,
                                       local_file=local_file)
    supervision = None
    if o.managed:
        wait_s = parse_wait(DEFAULT_WAIT_FOR_CAPACITY) if o.wait_for_capacity is None else float(o.wait_for_capacity)
        supervision = rq.Managed(
            max_recoveries=DEFAULT_MAX_RECOVERIES if o.max_recoveries is None else int(o.max_recoveries),
            min_nodes=o.min_nodes or 1, wait_s=wait_s, detach=o.detach)
    launcher = rq.Launcher(o.launcher or DEFAULT_LAUNCHER, None if o.managed else o.min_nodes, o.max_restarts)
    output_dir = o.output_dir or (None if o.resume else default_output_dir(inventory, run_id))
    request = rq.RunRequest(
        run_id=run_id, nodes=nodes, program=program, launcher=launcher,
        layout=rq.LayoutRequest(ranks, o.threads, o.ccl_workers, PIN_CHOICES[pin]),
        env=check_env(pairs, allow), allow_env=allow, output_dir=output_dir,
        checkpoint_every_s=o.checkpoint_every, checkpoint_uri=o.checkpoint_uri or None,
        resume=bool(o.resume), managed=supervision, allow_busy=bool(o.allow_busy), idle_stop_s=idle_stop_s,
        name=o.name or None, data_files=files)
    return request, [line for line in (*lines, *more) if line]


def k8s_request(options: Mapping[str, Any] | JobOptions, *, run_id: str,
                own: rq.OwnProgram | None = None) -> rq.RunRequest:
    """`fab k8s-job`'s options as a run request: one pod per node, torchrun in each (elastic with --min-nodes), the
    built-in job checked as fab train checks it (the demo only with --synthetic-examples), or your program `own`."""
    o = JobOptions.of(options)
    pairs = ck.passes(lambda text: env_pairs(text, "CCL_LOG_LEVEL=info"), o.env or "", LaunchError)
    allow = parse_allow_env(o.allow_env or "")
    program, _, _, o = _program(o, own, False, run_id)
    return rq.RunRequest(
        run_id=run_id, nodes=o.nodes or 1, program=program,
        launcher=rq.Launcher("torchrun", o.min_nodes, o.max_restarts if o.min_nodes is not None else None),
        layout=rq.LayoutRequest(o.ranks_per_node, o.threads, o.ccl_workers),
        env=check_env(pairs, allow), allow_env=allow, output_dir=o.output_dir or None,
        checkpoint_every_s=o.checkpoint_every, checkpoint_uri=o.checkpoint_uri or None)
