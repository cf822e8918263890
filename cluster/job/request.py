"""One training run as a typed, frozen value (pure): `RunRequest` and its parts, each value checked as it is
made (RequestError: one line naming the setting); `to_mapping`/`from_mapping`, its serialized form (the run spec)
read back through the same checks (docs/design.md, the layers: Request)."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from types import UnionType
from typing import Any, Mapping, Union, get_args, get_origin, get_type_hints

from cluster.job.job_args import (BF16_CHOICES, COMPILE_CHOICES, GRAD_COMM_CHOICES, TASKS, ExtraArg, JobArgsError,
                                  check_extra, parse_s3_uri)
from cluster.job.launch import DEFAULT_LAUNCHER, LAUNCHERS
from cluster.job.lora import PEFT_CHOICES
from cluster.job import checks as ck
from cluster.job.checks import RequestError, check_node_path
from cluster.job.run_env import check_env, parse_allow_env
from cluster.durations import format_duration
from cluster.names import UnsafeValue, job_name
from cluster.job.userjob import (NOTICE_SIGNALS, CopyPlan, RequirementsPlan, UserJobError, UserProgram,
                                 check_entry_path, check_module)
from cluster.run.supervision import RUN_ID_RE, SupervisionError, resume_words

CHANGED_OK_OPTION = "--workdir-changed-ok"  # a resumed run of your own program goes on with a changed workdir
_SCRIPT_RE = re.compile(r"^[^\x00-\x1f\x7f]{1,1000}\Z")
_FILE_RE = re.compile(r"^[^\x00-\x1f\x7f]{1,4000}\Z")  # a file of the workdir, relative to it
_SHA256_RE = re.compile(r"^[0-9a-f]{64}\Z")
MAX_NODES = 10000
MAX_WAIT_S = 7 * 86400
BUILTIN, OWN = "builtin", "own"
BUILTIN_ONLY = ("an option of the built-in job, not allowed with --script/--module; pass your program's own arguments "
                "with --args (or after `--`)")
_LOCAL = {"local": True}  # a field's metadata: this controller's own, left out of the serialized form


@dataclass(frozen=True)
class Launcher:
    """What starts the ranks: mpirun, or torchrun per node (elastic down to `min_nodes`)."""

    name: str = ck.checked(DEFAULT_LAUNCHER, ck.choice, "--launcher", LAUNCHERS, optional=False)
    min_nodes: int | None = ck.checked(None, ck.whole, "--min-nodes", 1, MAX_NODES)
    max_restarts: int | None = ck.checked(None, ck.whole, "--max-restarts", 0, 1000)

    def __post_init__(self) -> None:
        ck.fields(self)
        if self.name != "torchrun" and (self.min_nodes is not None or self.max_restarts is not None):
            raise RequestError(f"{'--min-nodes' if self.min_nodes is not None else '--max-restarts'}: only with "
                               "--launcher torchrun (its elastic agent handles a node that leaves)")


@dataclass(frozen=True)
class LayoutRequest:
    """The layout asked for (None: the rule's or a measured one, cluster/job/layout.py)."""

    ranks_per_node: int | None = ck.checked(None, ck.whole, "--ranks-per-node", 1, 4096)
    threads_per_rank: int | None = ck.checked(None, ck.whole, "--threads", 1, 4096)
    ccl_workers: int | None = ck.checked(None, ck.whole, "--ccl-workers", 0, 4096)
    pin: bool | None = ck.checked(None, ck.flag, "--pin", optional=True)

    def __post_init__(self) -> None:
        ck.fields(self)


@dataclass(frozen=True)
class Demo:
    """The offline demo (training/synthetic.py): every node writes it first, rebuilt from these two."""

    task: str = field(metadata=ck.rule(ck.choice, "--task", TASKS, optional=False))
    examples: int | None = ck.checked(None, ck.whole, "--synthetic-examples", 1, 10**9)

    def __post_init__(self) -> None:
        ck.fields(self)


@dataclass(frozen=True)
class BuiltinJob:
    """`python -m training` with its typed settings; `extra`: its other arguments (--extra), checked."""

    task: str | None = ck.checked(None, ck.choice, "--task", TASKS)
    model: str | None = ck.checked(None, ck.line, "--model")
    dataset: str | None = ck.checked(None, ck.line, "--dataset")
    dataset_config: str | None = ck.checked(None, ck.line, "--dataset-config")
    train_file: str | None = ck.checked(None, ck.line, "--train-file")  # on the nodes
    validation_file: str | None = ck.checked(None, ck.line, "--validation-file")
    epochs: float | None = ck.checked(None, ck.number, "--epochs", 0, 1e6, above=True)
    batch_size: int | None = ck.checked(None, ck.whole, "--batch-size", 1, 1 << 20)
    max_steps: int | None = ck.checked(None, ck.whole, "--max-steps", 1, 1 << 40)
    bf16: str = ck.checked("auto", ck.choice, "--bf16", BF16_CHOICES, optional=False)
    grad_comm: str | None = ck.checked(None, ck.choice, "--grad-comm", GRAD_COMM_CHOICES)
    ddp_bucket_mb: float | None = None
    compile: str | None = ck.checked(None, ck.choice, "--compile", COMPILE_CHOICES)  # None: the job's own default
    compile_estimate: tuple[float, float, float] | None = None  # fab bench's: eager step, compiled step, compile s
    peft: str | None = ck.checked(None, ck.choice, "--peft", PEFT_CHOICES)  # None: the job's own default (none)
    demo: Demo | None = None
    extra: tuple[ExtraArg, ...] = ()

    kind = BUILTIN

    def __post_init__(self) -> None:
        ck.fields(self)
        if self.peft not in (None, "none") and (self.task or TASKS[0]) != "causal-lm":
            raise RequestError(f"--peft: {self.peft} is not allowed with --task {self.task or TASKS[0]}; allowed: "
                               "--task causal-lm")
        if self.ddp_bucket_mb is not None and not (isinstance(self.ddp_bucket_mb, (int, float)) and not isinstance(
                self.ddp_bucket_mb, bool) and math.isfinite(self.ddp_bucket_mb) and self.ddp_bucket_mb > 0):
            raise RequestError(f"--ddp-bucket-mb: {self.ddp_bucket_mb!r} is not allowed; give a positive number of MB "
                               "(DDP's default is 25)")
        for part in self.compile_estimate or ():  # its shape: the type (from_mapping reads a list of three)
            ck.number("compile estimate", part, 0, 1e6)
        if self.demo is not None and (self.model or self.dataset or self.train_file):
            raise RequestError("--synthetic-examples: the offline demo brings its own model and data; leave out "
                               "--model, --dataset and --train-file, or drop --synthetic-examples")
        ck.passes(check_extra, self.extra, JobArgsError)


def workdir_digest(copy: CopyPlan) -> tuple[tuple[str, str], ...]:
    """The workdir's digest a run records: each file the copy plan copies, (path, SHA-256), by path."""
    return tuple(sorted((f.path, f.digest) for f in copy.files))


@dataclass(frozen=True)
class OwnProgram:
    """Your own program (--script/--module) run by every rank from the job's copy of the workdir (a file of this
    controller, as `requirements`: `copy` and `install` are their plans); `workdir_files`: its digest or None."""

    script: str | None = ck.checked(None, ck.line, "--script", pattern=_SCRIPT_RE)  # relative to the workdir
    module: str | None = None
    args: tuple[str, ...] = ()
    signal: str | None = ck.checked("SIGUSR1", ck.choice, "--notice-signal", NOTICE_SIGNALS)
    workdir: str = ck.checked("", ck.line, "--workdir", optional=False)
    workdir_limit_mb: int = ck.checked(200, ck.whole, "--workdir-limit-mb", 1, 1 << 30, optional=False)
    requirements: str | None = ck.checked(None, ck.line, "--requirements")
    resume_arg: str = ck.checked("", ck.line, "--resume-arg", optional=False)
    independent_ranks: bool = ck.checked(False, ck.flag, "--independent-ranks")
    workdir_files: tuple[tuple[str, str], ...] | None = field(default=None, repr=False)
    workdir_changed_ok: bool = ck.checked(False, ck.flag, CHANGED_OK_OPTION)
    copy: CopyPlan | None = field(default=None, compare=False, repr=False, metadata=_LOCAL)
    install: RequirementsPlan | None = field(default=None, compare=False, repr=False, metadata=_LOCAL)

    kind = OWN

    def __post_init__(self) -> None:
        if (self.script is None) == (self.module is None):
            raise RequestError("--script/--module: give one of them (your program)")
        ck.fields(self)
        if self.script is not None and (self.script.startswith("/") or ".." in self.script.split("/")):
            raise ck.refuse("--script", self.script, "a path inside the workdir")
        if self.module is not None:
            ck.passes(check_module, self.module, UserJobError)
        for word in self.args:
            ck.line("--args", word, optional=False)
        if self.resume_arg:
            ck.passes(resume_words, self.resume_arg, SupervisionError)
        if self.workdir_files is None and self.copy is not None:
            object.__setattr__(self, "workdir_files", workdir_digest(self.copy))
        seen: set[str] = set()
        for path, digest in self.workdir_files or ():  # pairs: the type (from_mapping reads lists of two)
            ck.line("workdir digest", path, optional=False, pattern=_FILE_RE)
            try:
                check_entry_path(path)
            except UserJobError:
                raise ck.refuse("workdir digest", path, "paths inside the workdir") from None
            ck.line(f"workdir digest {path}", digest, optional=False, pattern=_SHA256_RE,
                    allowed="a SHA-256 digest (64 hex digits)")
            if path in seen:
                raise ck.refuse("workdir digest", path, "each path once")
            seen.add(path)

    @property
    def program(self) -> UserProgram:
        return UserProgram(self.script, self.module, self.args, self.signal)


@dataclass(frozen=True)
class Managed:
    """`fab train --managed`: the supervisor's settings."""

    max_recoveries: int = ck.checked(3, ck.whole, "--max-recoveries", 0, 1000, optional=False)
    min_nodes: int = ck.checked(1, ck.whole, "--min-nodes", 1, MAX_NODES, optional=False)
    wait_s: float = ck.checked(900.0, ck.number, "--wait-for-capacity", 0, MAX_WAIT_S)
    detach: bool = ck.checked(False, ck.flag, "--detach")

    def __post_init__(self) -> None:
        ck.fields(self)

    def describe(self, nodes: int) -> str:
        """`up to 3 interruption(s); replacements awaited up to 15m 00s; at least 1 of 3 node(s) to go on`."""
        wait = ("no wait for replacements (resume on the survivors at once)" if not self.wait_s
                else f"replacements awaited up to {format_duration(self.wait_s)}")
        return (f"up to {self.max_recoveries} interruption(s); {wait}; at least {self.min_nodes} of {nodes} node(s) "
                "to go on")


@dataclass(frozen=True)
class DataFile:
    """A data file of this controller copied to every node before the launch (at `node`, under the home)."""

    local: str
    node: str


@dataclass(frozen=True)
class RunRequest:
    run_id: str  # the first job's id (a supervised run's id)
    nodes: int = field(metadata=ck.rule(ck.whole, "--nodes", 1, MAX_NODES, optional=False))
    program: BuiltinJob | OwnProgram
    launcher: Launcher = Launcher()
    layout: LayoutRequest = LayoutRequest()
    env: tuple[tuple[str, str], ...] = ()
    allow_env: tuple[str, ...] = ()
    output_dir: str | None = ck.checked(None, check_node_path, "--output-dir")  # None: jobplan.py's default
    # 0: only at the end
    checkpoint_every_s: float | None = ck.checked(None, ck.number, "--checkpoint-every", 0, 10 * 365 * 86400)
    checkpoint_uri: str | None = None
    resume: bool = ck.checked(False, ck.flag, "--resume")
    managed: Managed | None = None
    allow_busy: bool = ck.checked(False, ck.flag, "--allow-busy")
    idle_stop_s: int | None = ck.checked(None, ck.whole, "idle auto-stop", 1, MAX_WAIT_S)  # armed at the start
    name: str | None = None  # `fab train --name`: the job's (a supervised run's every job's) name
    data_files: tuple[DataFile, ...] = field(default=(), compare=False, metadata=_LOCAL)

    def __post_init__(self) -> None:
        if not isinstance(self.run_id, str) or not RUN_ID_RE.match(self.run_id):
            raise ck.refuse("run id", self.run_id, "a job id such as 20261123-101500-ab12")
        ck.fields(self)
        for name in self.allow_env:
            parse_allow_env(name)
        if len({name for name, _ in self.env}) != len(self.env):
            raise ck.refuse("--env", [name for name, _ in self.env], "each name once")
        check_env(dict(self.env), self.allow_env)
        if self.checkpoint_uri is not None:
            ck.passes(parse_s3_uri, self.checkpoint_uri, JobArgsError)
        if self.name is not None:
            ck.passes(job_name, self.name, UnsafeValue)
        min_nodes = self.launcher.min_nodes if self.managed is None else self.managed.min_nodes
        if min_nodes is not None and not 1 <= min_nodes <= self.nodes:
            raise RequestError(f"--min-nodes: {min_nodes} is not allowed; allowed 1 to {self.nodes} (the job's nodes)")
        own = self.own  # --resume: a supervised run continued from its spec (fab train --managed --resume)
        if own is not None and (self.checkpoint_every_s is not None or self.checkpoint_uri
                                or (self.resume and self.managed is None)):
            which = ("--checkpoint-every" if self.checkpoint_every_s is not None else
                     "--checkpoint-uri" if self.checkpoint_uri else "--resume")
            raise RequestError(f"{which}: {BUILTIN_ONLY}")
        if self.managed is None:
            if own is not None and own.resume_arg:
                raise RequestError("--resume-arg: only with --managed (fab supervises the job and recovers it)")
            return
        if self.launcher.name != DEFAULT_LAUNCHER:
            raise RequestError(f"--managed: not with --launcher {self.launcher.name}; torchrun's elastic agent "
                               "handles a node that leaves (--min-nodes without --managed)")
        if own is not None and own.requirements:
            raise RequestError("--requirements: not with --managed: a replacement node would lack them; put them in "
                               "the profile's image or install them from your program")

    @property
    def builtin(self) -> BuiltinJob | None:
        return self.program if isinstance(self.program, BuiltinJob) else None

    @property
    def own(self) -> OwnProgram | None:
        return self.program if isinstance(self.program, OwnProgram) else None

    def env_map(self) -> dict[str, str]:
        return dict(self.env)

    def with_env(self, env: Mapping[str, str]) -> "RunRequest":
        """The request with these environment values in place of its own of the same name."""
        merged = {**self.env_map(), **env}
        return dataclasses.replace(self, env=tuple(merged.items()))

    def to_mapping(self) -> dict[str, Any]:
        """JSON-ready: every field but this controller's files (DataFile, the copy and install plans)."""
        return _mapping(self)

    @classmethod
    def from_mapping(cls, data: object) -> "RunRequest":
        """The request `to_mapping` wrote, every field checked (RequestError naming it; unknown fields refused)."""
        return _build(cls, data, "request")


def _serialized(cls: Any) -> dict[str, Any]:
    """`cls`'s serialized fields by name, with their type hints: all but this controller's own (`_LOCAL`)."""
    hints = get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if not f.metadata.get("local")}


def _mapping(value: Any) -> Any:
    if isinstance(value, ExtraArg):
        return value.words()
    if dataclasses.is_dataclass(value):
        kind = {"kind": value.kind} if hasattr(value, "kind") else {}
        return {**kind, **{name: _mapping(getattr(value, name)) for name in _serialized(type(value))}}
    if isinstance(value, tuple):
        return [_mapping(v) for v in value]
    return value


def _build(cls: Any, data: object, where: str) -> Any:
    """`cls` from its mapping: exactly its serialized fields, each read by its type hint, `cls` checking them."""
    if not isinstance(data, dict):
        raise ck.refuse(where, type(data).__name__, "an object")
    hints = _serialized(cls)
    unknown = sorted(set(data) - set(hints) - ({"kind"} if hasattr(cls, "kind") else set()))
    if unknown:
        raise RequestError(f"{where}: unknown field {unknown[0]!r}; allowed: {', '.join(sorted(hints))}")
    values = {name: _read(hints[name], raw, f"{where} {name}") for name, raw in data.items() if name != "kind"}
    try:
        return cls(**values)
    except TypeError as exc:  # a field missing
        raise RequestError(f"{where}: {exc}") from None


def _read(hint: Any, raw: object, where: str) -> Any:
    """A value of type `hint` from its JSON: a part from an object (by its `kind` where several), a tuple from a
    list (an ExtraArg from [FLAG, VALUE...]); anything else as it is."""
    types = get_args(hint) if get_origin(hint) in (Union, UnionType) else (hint,)
    if raw is None and type(None) in types:
        return None
    types = tuple(t for t in types if t is not type(None))
    if len(types) > 1:
        kinds = {t.kind: t for t in types}
        if not isinstance(raw, dict) or raw.get("kind") not in kinds:
            raise ck.refuse(where, raw.get("kind") if isinstance(raw, dict) else raw,
                            f"an object of kind {' or '.join(kinds)}")
        return _build(kinds[raw["kind"]], raw, where)
    (hint,) = types
    if hint is ExtraArg:
        if not (isinstance(raw, list) and raw and all(isinstance(w, str) for w in raw)):
            raise ck.refuse(where, raw, "[FLAG, VALUE...]")
        return ExtraArg(raw[0], tuple(raw[1:]))
    if dataclasses.is_dataclass(hint):
        return _build(hint, raw, where)
    if get_origin(hint) is tuple:
        items = get_args(hint)
        if not isinstance(raw, list):
            raise ck.refuse(where, raw, "a list")
        items = (items[0],) * len(raw) if items[-1] is Ellipsis else items
        if len(raw) != len(items):
            raise ck.refuse(where, raw, f"a list of {len(items)} values")
        return tuple(_read(h, item, where) for h, item in zip(items, raw))
    return raw
