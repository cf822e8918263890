"""The job's arguments: three dataclasses of its own plus every TrainingArguments field.

Parsing happens in two phases because building TrainingArguments initialises torch.distributed
(through accelerate): phase one reads the job's own dataclasses (backend choice, checkpoint
settings) before the process group exists, phase two reads everything once it does.
Defaults follow the recipe: distilbert-base-uncased on SQuAD, batch 32 per rank, one epoch,
bf16 when the CPU has AMX-BF16 or AVX512-BF16.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Sequence

from cluster.job.job_args import (COMPILE_CHOICES, DEFAULT_COMPILE, DEFAULT_GRAD_COMM, GRAD_COMM_CHOICES,
                              GRAD_COMM_MEASURE_ONLY, TASKS)
from cluster.job import lora
from training.checkpoint_s3 import parse_s3_uri
from training.errors import BadInput

DEFAULT_DATASETS = {"qa": ("squad", None), "classification": ("glue", "mrpc"), "causal-lm": ("tatsu-lab/alpaca", None)}
DEFAULT_MAX_SEQ_LENGTH = {"qa": 384, "classification": 128, "causal-lm": 512}
DEFAULT_MODELS = {"qa": "distilbert-base-uncased", "classification": "distilbert-base-uncased",
                  "causal-lm": "Qwen/Qwen2.5-0.5B"}
LOCAL_DATA_SUFFIXES = (".json", ".jsonl")
BACKEND_CHOICES = ("auto", "gloo", "ccl")
IPEX_CHOICES = ("auto", "on", "off")
SPOT_WATCH_CHOICES = ("auto", "on", "off")

# TrainingArguments defaults that differ from transformers' own, for this job.
TRAINING_DEFAULTS = {
    "output_dir": "output",
    "per_device_train_batch_size": 32,
    "per_device_eval_batch_size": 64,
    "num_train_epochs": 1.0,
    "use_cpu": True,
    # True, though every parameter is used: DDP then never rebuilds its gradient buckets after the first step, so a
    # resumed job reduces gradients in the same layout as the run it continues (a rebuild puts each gradient at
    # another place in the buffer, and gloo's sum of an element at 3+ ranks depends on its place)
    "ddp_find_unused_parameters": True,
    "report_to": "none",
    "disable_tqdm": True,  # progress bars do not survive mpirun's line-prefixed output
    "logging_steps": 20,
    "save_total_limit": 2,
}


@dataclass
class ModelArguments:
    model_name_or_path: str | None = field(default=None, metadata={
        "help": "Hub model id or local directory (config, weights and a fast tokenizer); default "
                "distilbert-base-uncased for qa and classification, Qwen/Qwen2.5-0.5B for causal-lm."})
    tokenizer_name: str | None = field(default=None, metadata={
        "help": "Tokenizer id or directory when it differs from the model's."})
    cache_dir: str | None = field(default=None, metadata={"help": "Where hub downloads are cached."})


@dataclass
class DataArguments:
    task: str = field(default="qa", metadata={"help": f"What to train: {' or '.join(TASKS)}."})
    dataset_name: str | None = field(default=None, metadata={
        "help": "Hub dataset (default: squad for qa, glue/mrpc for classification, tatsu-lab/alpaca for "
                "causal-lm). Ignored with --train_file."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Hub dataset configuration (e.g. mrpc)."})
    train_file: str | None = field(default=None, metadata={
        "help": "Local training data, .json or .jsonl: SQuAD (nested or flat) for qa, GLUE rows for classification."})
    validation_file: str | None = field(default=None, metadata={"help": "Local evaluation data, same shape."})
    train_split: str = field(default="train", metadata={"help": "Hub split to train on."})
    validation_split: str = field(default="validation", metadata={"help": "Hub split to evaluate on."})
    text_columns: str | None = field(default=None, metadata={
        "help": "classification: one or two comma-separated text columns (default: the first known pair "
                "found: sentence1,sentence2 / question1,question2 / question,sentence / premise,hypothesis / "
                "sentence)."})
    label_column: str = field(default="label", metadata={"help": "classification: the label column."})
    prompt_column: str = field(default="prompt", metadata={
        "help": "causal-lm: the prompt column of prompt/completion rows (the loss is over the completion only)."})
    completion_column: str = field(default="completion", metadata={"help": "causal-lm: the completion column."})
    text_column: str = field(default="text", metadata={
        "help": "causal-lm: the column of plain text rows (the loss is over every token), used when the rows have "
                "neither prompt/completion nor instruction/output (Alpaca's shape)."})
    max_seq_length: int | None = field(default=None, metadata={
        "help": "Tokens per feature (default 384 for qa, 128 for classification, 512 for causal-lm)."})
    doc_stride: int = field(default=128, metadata={"help": "qa: overlap between chunks of a long context."})
    n_best_size: int = field(default=20, metadata={"help": "qa: start/end candidates per feature."})
    max_answer_length: int = field(default=30, metadata={"help": "qa: longest answer in tokens."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Use only the first N training examples."})
    max_eval_samples: int | None = field(default=None, metadata={
        "help": "Use only the first N evaluation examples (0 skips evaluation)."})


@dataclass
class JobArguments:
    global_batch_size: int | None = field(default=None, metadata={
        "help": "Samples per optimizer step over all ranks; sets the per-rank batch "
                "(must divide by world size x gradient_accumulation_steps)."})
    checkpoint_minutes: float = field(default=10.0, metadata={
        "help": "Save a checkpoint every N minutes of training (0: only TrainingArguments' save_* settings)."})
    checkpoint_uri: str | None = field(default=None, metadata={
        "help": "s3://bucket/prefix to upload every checkpoint to (verified; probed at start); --resume also "
                "looks there."})
    resume: bool = field(default=False, metadata={
        "help": "Continue the run of the newest complete checkpoint every rank can read (in its output_dir "
                "or under --checkpoint_uri)."})
    resume_without_rank_state: bool = field(default=False, metadata={
        "help": "With --resume: go on when the checkpoint lacks a rank's random state (that rank then starts a new "
                "random stream; the run no longer equals the one it continues). Without it such a resume stops."})
    dist_backend: str = field(default="auto", metadata={
        "help": "torch.distributed backend: auto (ccl when oneccl_bindings_for_pytorch imports, else gloo), gloo, "
                "ccl."})
    use_ipex: str = field(default="auto", metadata={
        "help": "Apply ipex.optimize: auto (when intel_extension_for_pytorch imports), on, off."})
    spot_watch: str = field(default="auto", metadata={
        "help": "Poll the instance metadata service for spot interruption notices (checkpoint and stop) and "
                "rebalance recommendations (checkpoint once): auto (on EC2, when XEON_IMDS_ENDPOINT is set, or on a "
                "local cluster node, which holds the metadata address itself), on, off."})
    spot_poll_seconds: float = field(default=5.0, metadata={"help": "Seconds between metadata polls."})
    grad_comm: str = field(default=DEFAULT_GRAD_COMM, metadata={
        "help": "How gradients cross the network: bf16 (DDP's bf16 compression hook: half the bytes; the "
                "optimizer still steps in fp32) or fp32 (as computed); none is fab bench's measurement only (no "
                "gradient "
                "is exchanged, the ranks' models drift apart)."})
    ddp_bucket_mb: float | None = field(default=None, metadata={
        "help": "DDP's gradient bucket size in MB (default: DDP's own, 25); sets TrainingArguments' "
                "ddp_bucket_cap_mb."})
    compile: str = field(default=DEFAULT_COMPILE, metadata={
        "help": "torch.compile the model (TrainingArguments' torch_compile): on, off, or auto: on when "
                "--compile_estimate's saving over the run's steps exceeds its compile time (off without one)."})
    compile_estimate: str | None = field(default=None, metadata={
        "help": "EAGER_S,COMPILED_S,COMPILE_S: the steady step eager and compiled and the compile time fab bench "
                "measured (fab train passes them from the cluster's calibration)."})
    peft: str = field(default=lora.DEFAULT_PEFT, metadata={
        "help": "causal-lm: lora trains low-rank adapters on a frozen model (peft's LoRA; the output holds the "
                "adapter only); none trains every parameter."})
    lora_r: int = field(default=lora.DEFAULT_RANK, metadata={"help": "--peft lora: the adapters' rank."})
    lora_alpha: float = field(default=lora.DEFAULT_ALPHA, metadata={
        "help": "--peft lora: the adapters' scale (alpha / rank multiplies their output)."})
    lora_dropout: float = field(default=lora.DEFAULT_DROPOUT, metadata={"help": "--peft lora: dropout before A."})
    lora_target_modules: str | None = field(default=None, metadata={
        "help": "--peft lora: comma-separated modules to adapt (default per model family: q_proj,k_proj,v_proj,"
                "o_proj for llama, mistral, qwen2/3 and gemma; see cluster/job/lora.py)."})
    instance_type: str | None = field(default=None, metadata={
        "help": "The nodes' EC2 instance type (fab train passes it): its catalogued cores and clock give the "
                "peak FLOP/s the summary's MFU is measured against; default: what lscpu says on rank 0's node."})


@dataclass
class ParsedArguments:
    model: ModelArguments
    data: DataArguments
    job: JobArguments
    training: object  # transformers.TrainingArguments
    bf16_explicit: bool


def _raise_bad_input(message: str):
    raise BadInput(f"{message} (see `python -m training --help`)")


def _parser(dataclass_types):
    from transformers import HfArgumentParser

    parser = HfArgumentParser(dataclass_types, prog="python -m training")
    parser.error = _raise_bad_input  # argparse would exit with a usage text on every rank
    return parser


def _is_help(argv: Sequence[str]) -> bool:
    return any(arg in ("-h", "--help") for arg in argv)


def parse_job_arguments(argv: Sequence[str]) -> tuple[ModelArguments, DataArguments, JobArguments]:
    """Phase one: the job's own arguments, before any process group exists."""
    if _is_help(argv):  # the full help, TrainingArguments included; exits
        parse_all(argv, bf16_supported=False)
    parser = _parser((ModelArguments, DataArguments, JobArguments))
    model, data, job, _rest = parser.parse_args_into_dataclasses(
        args=list(argv), return_remaining_strings=True)
    validate_job(model, data, job)
    refuse_nan(model, data, job)
    return model, data, job


def bf16_given(argv: Sequence[str]) -> bool:
    return any(arg == "--bf16" or arg.startswith("--bf16=") for arg in argv)


def training_arguments_class():
    """TrainingArguments, minus any field the job's own arguments also define.

    transformers before 4.57 (the intel profile's 4.56) has a boolean `use_ipex` of its own, which
    would clash with the job's `--use_ipex auto|on|off` in one parser (and would make the Trainer
    apply IPEX a second time). Such a field is re-declared with init=False, which HfArgumentParser
    skips, so it keeps its default and the job's option is the only one. The class is a global of
    this module (JobTrainingArguments), so checkpoints can pickle the arguments.
    """
    from transformers import TrainingArguments

    ours = {f.name for f in dataclasses.fields(JobArguments)}
    clashing = [f for f in dataclasses.fields(TrainingArguments) if f.init and f.name in ours]
    if not clashing:
        return TrainingArguments
    if "JobTrainingArguments" not in globals():
        namespace = {"__annotations__": {f.name: f.type for f in clashing}, "__module__": __name__,
                     "__qualname__": "JobTrainingArguments",
                     **{f.name: field(default=f.default, init=False) for f in clashing}}
        globals()["JobTrainingArguments"] = dataclass(type("JobTrainingArguments", (TrainingArguments,), namespace))
    return globals()["JobTrainingArguments"]


def reporting() -> str:
    """`--report_to`'s default: none, but `kubeflow` in a Kubeflow Trainer TrainJob whose control plane takes
    progress (its TrainJobStatus feature gate injects the status server's address; transformers' own test
    of it): the Trainer's KubeflowCallback then reports progress, time left and metrics to the TrainJob's
    status.trainerStatus. A `--report_to` given wins. transformers before 5 (the intel profile's 4.56) has no
    such callback: none there."""
    try:
        from transformers.integrations import is_kubeflow_available
    except ImportError:
        return TRAINING_DEFAULTS["report_to"]
    return "kubeflow" if is_kubeflow_available() else TRAINING_DEFAULTS["report_to"]


def parse_all(argv: Sequence[str], *, bf16_supported: bool) -> ParsedArguments:
    """Phase two: every argument, TrainingArguments included (initialises accelerate's state)."""
    parser = _parser((ModelArguments, DataArguments, JobArguments, training_arguments_class()))
    explicit = bf16_given(argv)
    parser.set_defaults(**{**TRAINING_DEFAULTS, "report_to": reporting()},
                        **({} if explicit else {"bf16": bf16_supported}))
    if _is_help(argv):
        parser.parse_args(list(argv))  # prints help and exits
    try:
        model, data, job, training = parser.parse_args_into_dataclasses(args=list(argv))
    except BadInput:
        raise
    except ValueError as exc:  # unknown arguments, TrainingArguments.__post_init__ checks
        raise BadInput(str(exc)) from None
    validate_job(model, data, job)
    refuse_nan(model, data, job, training)
    return ParsedArguments(model, data, job, training, explicit)


def refuse_nan(*parsed) -> None:
    """No option may be nan: every comparison with it is false, so it would pass every check."""
    for instance in parsed:
        for item in dataclasses.fields(instance):
            value = getattr(instance, item.name, None)
            if isinstance(value, float) and math.isnan(value):
                raise BadInput(f"--{item.name} nan is not allowed; allowed: a number")


def _positive(name: str, value: float, allowed: str, zero: bool = False) -> None:
    """A finite number above 0 (or 0 itself when `zero`), else one line naming the option."""
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise BadInput(f"--{name} {value:g} is not allowed; allowed: {allowed}")


def _choice(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise BadInput(f"--{name}: {value!r} is not allowed; choose one of {', '.join(allowed)}")


def validate_job(model: ModelArguments, data: DataArguments, job: JobArguments) -> None:
    """Checks that need no data and no distributed state; every rank reaches the same verdict."""
    _choice("task", data.task, TASKS)
    _choice("dist_backend", job.dist_backend, BACKEND_CHOICES)
    _choice("use_ipex", job.use_ipex, IPEX_CHOICES)
    _choice("spot_watch", job.spot_watch, SPOT_WATCH_CHOICES)
    _choice("grad_comm", job.grad_comm, (*GRAD_COMM_CHOICES, GRAD_COMM_MEASURE_ONLY))
    if model.model_name_or_path is None:
        model.model_name_or_path = DEFAULT_MODELS[data.task]
    _choice("peft", job.peft, lora.PEFT_CHOICES)
    if job.peft != "none" and data.task != "causal-lm":
        raise BadInput(f"--peft {job.peft} is not allowed with --task {data.task}; allowed: --task causal-lm "
                       "(or --peft none)")
    try:
        lora.check(job.lora_r, job.lora_alpha, job.lora_dropout)
        if job.lora_target_modules is not None:
            lora.target_modules("", job.lora_target_modules)
    except lora.LoraSettingError as exc:
        raise BadInput(str(exc)) from None
    if data.max_seq_length is None:
        data.max_seq_length = DEFAULT_MAX_SEQ_LENGTH[data.task]
    if data.max_seq_length < 16:
        raise BadInput(f"--max_seq_length {data.max_seq_length} is too short; use at least 16 (384 for SQuAD)")
    if data.task == "qa" and not 0 <= data.doc_stride < data.max_seq_length // 2:
        raise BadInput(f"--doc_stride {data.doc_stride} must be below half of --max_seq_length "
                       f"{data.max_seq_length}; e.g. --doc_stride {data.max_seq_length // 3}")
    for name in ("max_train_samples", "max_eval_samples"):
        value = getattr(data, name)
        if value is not None and value < (1 if name == "max_train_samples" else 0):
            raise BadInput(f"--{name} {value} must be a positive number of examples")
    for name in ("train_file", "validation_file"):
        path = getattr(data, name)
        if path is None:
            continue
        if not path.endswith(LOCAL_DATA_SUFFIXES):
            raise BadInput(f"--{name} {path!r}: only {' and '.join(LOCAL_DATA_SUFFIXES)} files are read")
        if not os.path.isfile(path):
            raise BadInput(f"--{name} {path!r} does not exist on this node; copy it to every node "
                           "(or use a shared directory) and pass its path")
    if data.validation_file and not data.train_file:
        raise BadInput("--validation_file needs --train_file as well (or neither, to use --dataset_name)")
    if not data.train_file and data.dataset_name is None:
        data.dataset_name, default_config = DEFAULT_DATASETS[data.task]
        data.dataset_config_name = data.dataset_config_name or default_config
    _positive("checkpoint_minutes", job.checkpoint_minutes, "0 (off) or a positive number of minutes", zero=True)
    if job.checkpoint_uri is not None:
        parse_s3_uri(job.checkpoint_uri)  # the controller's rule (cluster/job/job_args.py)
    _positive("spot_poll_seconds", job.spot_poll_seconds, "a positive number of seconds")
    if job.ddp_bucket_mb is not None:
        _positive("ddp_bucket_mb", job.ddp_bucket_mb, "a positive number of MB")
    _choice("compile", job.compile, COMPILE_CHOICES)
    if job.compile_estimate is not None:
        compile_estimate(job.compile_estimate)
    if job.instance_type is not None:
        from cluster.stack import catalog

        _choice("instance_type", job.instance_type, catalog.known_types())
    if job.global_batch_size is not None and job.global_batch_size < 1:
        raise BadInput(f"--global_batch_size {job.global_batch_size} must be positive")


def compile_estimate(text: str):
    """`EAGER_S,COMPILED_S,COMPILE_S` -> cluster.cost.timemodel.CompileCost, or one line naming the option."""
    import re

    from cluster.cost.timemodel import CompileCost

    number = r"[0-9]+(?:\.[0-9]+)?"
    if (not re.fullmatch(rf"{number},{number},{number}", text or "")
            or 0.0 in (values := [float(v) for v in text.split(",")])[:2]):
        raise BadInput(f"--compile_estimate {text!r} is not allowed; allowed: EAGER_S,COMPILED_S,COMPILE_S, three "
                       "seconds (steps above 0), e.g. 1.33,0.93,60")
    return CompileCost(*values)


def resolve_compile(job: JobArguments, training, steps: int) -> str:
    """Set TrainingArguments' torch_compile from --compile; the reason, for the summary's settings."""
    if job.compile != "auto":
        training.torch_compile = job.compile == "on"
        why = f"set with --compile {job.compile}"
    elif training.torch_compile:
        why = "set with --torch_compile"
    else:
        from cluster.cost.timemodel import compile_pays

        estimate = compile_estimate(job.compile_estimate) if job.compile_estimate else None
        training.torch_compile, verdict = compile_pays(steps, estimate)
        why = f"auto: {verdict}"
    if training.torch_compile and not training.torch_compile_backend:
        # TrainingArguments picks the backend only when torch_compile is set at its creation; the Trainer
        # hands accelerate the backend, and with none accelerate compiles nothing ("no")
        training.torch_compile_backend = "inductor"
    return why


def apply_ddp_settings(job: JobArguments, training) -> None:
    """--ddp_bucket_mb becomes TrainingArguments' ddp_bucket_cap_mb (the Trainer passes it to DDP)."""
    if job.ddp_bucket_mb is not None:
        training.ddp_bucket_cap_mb = job.ddp_bucket_mb


def apply_global_batch(job: JobArguments, training, world_size: int) -> None:
    """Turn --global_batch_size into the per-rank batch, or explain why it does not divide."""
    if job.global_batch_size is None:
        return
    accumulation = training.gradient_accumulation_steps
    share = world_size * accumulation
    if job.global_batch_size % share:
        lower = job.global_batch_size // share * share
        options = ", ".join(str(n) for n in (lower, lower + share) if n > 0)
        raise BadInput(
            f"--global_batch_size {job.global_batch_size} does not divide over {world_size} ranks x "
            f"{accumulation} gradient accumulation step(s); use a multiple of {share} (e.g. {options}) "
            "or change the number of ranks")
    training.per_device_train_batch_size = job.global_batch_size // share
