"""The built-in job's facts the controller and the job share (pure): its tasks and choices, the --compile
decision, and its other arguments (--extra) checked against its flags."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

TASKS = ("qa", "classification", "causal-lm")
GRAD_COMM_CHOICES = ("fp32", "bf16")  # gradients on the wire: as computed, or bf16 by DDP's communication hook
# fab bench's compute measurement only: DDP in lock-step, no gradient exchanged (never for training)
GRAD_COMM_MEASURE_ONLY = "none"
DEFAULT_GRAD_COMM = "bf16"  # loss within 1.5 % of fp32's, 1.8-2.0x faster when communication-bound (docs/benchmarks.md)
COMPILE_CHOICES = ("auto", "on", "off")  # auto: when fab bench's saving over the run exceeds the compile time
DEFAULT_COMPILE = "auto"
BF16_CHOICES = ("auto", "on", "off")

# S3 bucket names: 3-63 lower-case letters, digits, '.' and '-', starting and ending with a letter or digit.
S3_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]\Z")


class JobArgsError(ValueError):
    """An option the job cannot take; the message names it, the value and what is allowed."""


def parse_s3_uri(uri: str, setting: str = "--checkpoint-uri") -> tuple[str, str]:
    """('bucket', 'prefix') of `s3://bucket/prefix` (prefix without slashes at the ends)."""
    bucket, _, prefix = uri[5:].partition("/") if uri.startswith("s3://") else ("", "", "")
    if not S3_BUCKET_RE.fullmatch(bucket) or ".." in prefix.split("/"):
        raise JobArgsError(f"{setting}: {uri!r} is not allowed; allowed: s3://BUCKET/PREFIX with a valid bucket "
                           "name (3-63 lower-case letters, digits, '.' and '-'), e.g. s3://my-bucket/runs/qa-1")
    return bucket, prefix.strip("/")


def compile_choice(value: str | None, estimate=None, steps: int | None = None) -> tuple[str | None, str]:
    """(the job's --compile, None for its own default; the line `fab train` prints) for `--compile` (None: auto),
    the cluster's measured `estimate` (a CompileCost or None) and the run's steps (--max-steps or None)."""
    from cluster.cost.timemodel import compile_pays

    choice = str(value or DEFAULT_COMPILE).strip().lower()
    if choice not in COMPILE_CHOICES:
        raise JobArgsError(f"--compile: {value!r} is not allowed; choose {', '.join(COMPILE_CHOICES)} (auto: compile "
                           "when fab bench's measurement says the saving over the run exceeds the compile time)")
    given = choice if value or estimate is not None else None  # auto without an estimate: the job's own default
    if choice != "auto":
        return given, f"compile: {choice} (given: --compile {choice})"
    if estimate is None:
        return given, ("compile: auto -> eager: no compile measurement for this cluster "
                       "(`fab bench --compile` measures one)")
    if steps:
        return given, f"compile: auto -> {compile_pays(steps, estimate)[1]} (fab bench's measurement)"
    saving = estimate.eager_step_s - estimate.compiled_step_s
    if saving <= 0:
        return given, (f"compile: auto -> eager: fab bench measured the compiled step {estimate.compiled_step_s:.3f} "
                       f"s, no faster than eager {estimate.eager_step_s:.3f} s")
    return given, (f"compile: auto -> compiled if the run has more than {math.floor(estimate.compile_s / saving)} "
                   f"steps ({saving:.3f} s saved per step, {estimate.compile_s:.0f} s to compile, fab bench's "
                   "measurement); the job counts its steps and decides")


@dataclass(frozen=True)
class ExtraArg:
    """One of the built-in job's other arguments (--extra): a flag it accepts (underscores) and its value(s)."""

    flag: str
    values: tuple[str, ...] = ()

    def words(self) -> list[str]:
        return [self.flag, *self.values]


# The job's flags that fab train has an option for: in --extra they become that option's value, held typed.
# flag -> (the request's field, fab train's option).
TYPED_FLAGS = {
    "--task": ("task", "--task"), "--model_name_or_path": ("model", "--model"),
    "--dataset_name": ("dataset", "--dataset"), "--dataset_config_name": ("dataset_config", "--dataset-config"),
    "--train_file": ("train_file", "--train-file"), "--validation_file": ("validation_file", "--validation-file"),
    "--num_train_epochs": ("epochs", "--epochs"), "--per_device_train_batch_size": ("batch_size", "--batch-size"),
    "--max_steps": ("max_steps", "--max-steps"), "--bf16": ("bf16", "--bf16"),
    "--grad_comm": ("grad_comm", "--grad-comm"),
    "--ddp_bucket_mb": ("ddp_bucket_mb", "--ddp-bucket-mb"), "--compile": ("compile", "--compile"),
    "--checkpoint_minutes": ("checkpoint_minutes", "--checkpoint-every"),
    "--checkpoint_uri": ("checkpoint_uri", "--checkpoint-uri"), "--resume": ("resume", "--resume"),
    "--output_dir": ("output_dir", "--output-dir"), "--compile_estimate": ("compile_estimate", "--compile"),
    "--peft": ("peft", "--peft"),
}


def typed_arguments(values: dict[str, Any]) -> list[str]:
    """The job's arguments for its typed settings (by TYPED_FLAGS' field names; None and bf16 auto left out)."""
    args: list[str] = []
    for flag, (name, _) in TYPED_FLAGS.items():
        value = values.get(name)
        if value is None or value is False or (name == "bf16" and value == "auto"):
            continue
        if name == "bf16":
            value = "true" if value == "on" else "false"
        elif name == "compile_estimate":
            value = ",".join(f"{v:.4f}" if i < 2 else f"{v:.1f}" for i, v in enumerate(value))
        elif isinstance(value, float):
            value = f"{value:g}"
        args += [flag] if value is True else [flag, str(value)]
    return args


# What a recovery's batch override replaces (cluster/run/recovery.py's BatchPlan): never kept from --extra.
BATCH_FLAGS = ("--per_device_train_batch_size", "--gradient_accumulation_steps", "--global_batch_size")
_NEGATIVE_NUMBER = re.compile(r"^-\d+\Z|^-\d*\.\d+\Z")
_VALUE_RE = re.compile(r"^[^\x00-\x1f\x7f]{0,4000}\Z")


def _is_option(word: str) -> bool:
    return word.startswith("-") and not _NEGATIVE_NUMBER.match(word)


def parse_extra(words: Sequence[str], setting: str = "--extra") -> tuple[dict[str, str], tuple[ExtraArg, ...]]:
    """The built-in job's other arguments checked against its parser's flags (cluster/job/training_flags.py):
    (TYPED_FLAGS' values by flag, "" for a bare flag; every other argument as an ExtraArg)."""
    import difflib

    from cluster.job.training_flags import FLAGS, MANY, NONE, OPTIONAL, VALUE

    typed: dict[str, str] = {}
    found: list[ExtraArg] = []
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--") or word == "--":
            raise JobArgsError(f"{setting}: {word!r} is not allowed here; allowed: `python -m training` options, "
                               "each a --flag with its value, e.g. --learning_rate 3e-5")
        name, eq, inline = word.partition("=")
        flag = "--" + name[2:].replace("-", "_")
        kind = FLAGS.get(flag)
        if kind is None:
            close = difflib.get_close_matches(name, list(FLAGS), n=1, cutoff=0.75)
            raise JobArgsError(f"{setting}: {name} is not an argument of `python -m training`"
                               f"{f'; did you mean {close[0]}?' if close else ''} (`python -m training --help` on a "
                               "node lists them)")
        i += 1
        if eq:
            if kind == NONE:
                raise JobArgsError(f"{setting}: {name} takes no value (given {inline!r})")
            values: tuple[str, ...] = (inline,)
        elif kind == VALUE:
            if i >= len(words) or _is_option(words[i]):
                raise JobArgsError(f"{setting}: {name} needs a value, e.g. {name} 3")
            values, i = (words[i],), i + 1
        elif kind in (OPTIONAL, MANY):
            start = i
            while i < len(words) and not _is_option(words[i]) and (kind == MANY or i == start):
                i += 1
            values = tuple(words[start:i])
            if kind == MANY and not values:
                raise JobArgsError(f"{setting}: {name} needs one or more values")
        else:
            values = ()
        for value in values:
            if not _VALUE_RE.match(value):
                raise JobArgsError(f"{setting}: {name}: {value[:80]!r} is not allowed; allowed: one line of text")
        if flag in TYPED_FLAGS:
            if flag in typed:
                raise JobArgsError(f"{setting}: {name} is given twice; give it once")
            typed[flag] = values[0] if values else ""
            continue
        found.append(ExtraArg(flag, values))
    return typed, tuple(found)


def check_extra(extra: Sequence[ExtraArg], setting: str = "--extra") -> None:
    """Extra arguments as a request holds them: each a flag the job accepts with its values, none of TYPED_FLAGS."""
    for arg in extra:  # each an ExtraArg: the type (from_mapping reads [FLAG, VALUE...])
        if arg.flag in TYPED_FLAGS:
            raise JobArgsError(f"{setting}: {arg.flag} is not allowed here; allowed: fab train's "
                               f"{TYPED_FLAGS[arg.flag][1]}")
        typed, parsed = parse_extra(arg.words(), setting)
        if typed or parsed != (arg,):
            raise JobArgsError(f"{setting}: {' '.join(arg.words())[:120]!r} is not allowed; allowed: a flag of "
                               "`python -m training` with its value(s)")
