"""The options `fab train` and `fab k8s-job` share (help, defaults, groups), your own program from them
(`own_program`), and `fab train`'s request (`train_request`: what needs this machine, then
cluster/job/train_options.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cluster.inventory import Inventory
from cluster.job import request as rq
from cluster.job.job_args import BF16_CHOICES, COMPILE_CHOICES, GRAD_COMM_CHOICES, TASKS
from cluster.job.lora import PEFT_CHOICES
from cluster.job.torchrun import DEFAULT_MAX_RESTARTS
from cluster.job.train_options import JobOptions
from node_setup.tasks.common import Unset, duration_or_off, given

# The shared options' help, by option name (a task overrides a text where its option means more).
HELP = {
    "task": f"training task: {' or '.join(TASKS)} (training default {TASKS[0]})",
    "dataset": "hub dataset name (default squad for qa, glue/mrpc for classification)",
    "dataset-config": "hub dataset configuration (e.g. mrpc)",
    "epochs": "number of training epochs, a whole number (--num_train_epochs; for part of one: --max-steps)",
    "batch-size": "batch size per rank (--per_device_train_batch_size)",
    "bf16": f"{', '.join(BF16_CHOICES)} (auto: on when the CPU has AMX/AVX512-BF16)",
    "checkpoint-every": "save a checkpoint this often, e.g. 30m or 1h (off: only at the end)",
    "max-steps": "stop after N optimizer steps",
    "extra": "more `python -m training` arguments, e.g. --extra '--learning_rate 3e-5 --max_seq_length 256', checked "
             "against the flags the job accepts before anything starts (arguments after `--` are added here)",
    "ranks-per-node": "override ranks per node (default one per socket)",
    "threads": "override OpenMP threads per rank (default the rank's physical cores minus CCL workers)",
    "ccl-workers": "override oneCCL workers per rank (intel profile only)",
    "env": "extra environment for every rank, e.g. --env 'FI_PROVIDER=tcp CCL_LOG_LEVEL=info'; names that change how "
           "an interpreter, a shell or the loader starts (PYTHON*, LD_*, BASH_ENV, PATH ...) only with --allow-env",
    "allow-env": "names --env may set although they change how a program starts, e.g. --allow-env PYTHONHASHSEED "
                 "(comma-separated; recorded with the run)",
    "synthetic-examples": "train the offline demo (a tiny model and data made on every node first) with N examples",
    "max-restarts": f"torchrun with --min-nodes: restarts of the ranks before the job fails (default "
                    f"{DEFAULT_MAX_RESTARTS})",
}
# fab train's built-in job settings that fab k8s-job does not take.
TRAIN_HELP = {
    "grad-comm": f"gradients on the wire: {' or '.join(GRAD_COMM_CHOICES)} (the job's --grad_comm; bf16 compresses "
                 "DDP's buckets)",
    "ddp-bucket-mb": "DDP's gradient bucket size in MB, a positive number (the job's --ddp_bucket_mb; DDP's default "
                     "25)",
    "peft": f"causal-lm: {' or '.join(PEFT_CHOICES)} (lora: peft's LoRA adapters on a frozen model, the output "
            "holds the adapter only; --extra '--lora_r 8' and the job's other --lora_* flags tune it; the job's "
            "--peft)",
    "compile": f"torch.compile the model: {', '.join(COMPILE_CHOICES)} (default auto: compiled when the saving "
               "`fab bench --compile` measured, over the run's steps, exceeds the compile time; the job's --compile)",
}
# Their defaults (invoke takes each option's kind from its default: Unset carries it).
DEFAULTS: dict[str, Any] = {
    "epochs": Unset(int, "the job's"), "batch_size": Unset(int, "the job's"), "bf16": "auto",
    "checkpoint_every": Unset(duration_or_off), "max_steps": Unset(int), "ranks_per_node": Unset(int, "one per socket"),
    "threads": Unset(int, "the rank's cores"), "ccl_workers": Unset(int), "synthetic_examples": Unset(int),
    "min_nodes": Unset(int), "max_restarts": Unset(int), "env": "", "allow_env": "", "extra": "",
}
# Their groups in `fab --help` (node_setup/tasks/parsing.py); each task adds its own options.
GROUPS = {
    "program": ("ranks-per-node", "threads", "ccl-workers", "env", "allow-env"),
    "training": ("task", "model", "dataset", "dataset-config", "train-file", "validation-file", "epochs", "batch-size",
                 "max-steps", "bf16", "grad-comm", "ddp-bucket-mb", "compile", "peft", "synthetic-examples", "extra"),
    "spot and recovery": ("min-nodes", "max-restarts"),
    "output": ("checkpoint-every", "checkpoint-uri"),
}


def groups(**own: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """GROUPS with a task's own options added (group title with spaces as '_': spot_and_recovery=...), the
    cluster's first."""
    out = {"cluster": own.pop("cluster", ()), **{title: tuple(names) for title, names in GROUPS.items()}}
    for key, names in own.items():
        title = key.replace("_", " ")
        out[title] = (*out.get(title, ()), *names)
    return out


def plain(options: dict[str, Any]) -> JobOptions:
    """A task's options, typed, with every Unset (left out) as None."""
    return JobOptions.of({name: (value if given(value) else None) for name, value in options.items()})


# ------------------------------------------------------------------------------ fab train's request


def own_program(options: JobOptions | dict[str, Any], profile: str) -> rq.OwnProgram | None:
    """--script/--module with their options, checked on this machine (the files, the workdir's scan, the
    requirements for the nodes' `profile`); None without them: fab train's and fab k8s-job's. RequestError (or
    UserJobError) with one line otherwise."""
    from cluster.job import userjob
    from cluster.node.profiles import get_profile
    from node_setup.ssh.workdir import scan

    o = JobOptions.of(options)
    script, module = o.script or "", o.module or ""
    if not (script or module):
        return None
    if script and module:
        raise rq.RequestError(f"--module: {module!r} given with --script {script!r}; allowed: one of them")
    words = userjob.split_args(f"{o.args or ''} {o.extra or ''}")
    signal = userjob.notice_signal(o.notice_signal or "")
    workdir = o.workdir or ""
    if script:
        path = Path(script).expanduser()
        if not path.is_file():
            raise rq.RequestError(f"--script: {script!r} is not a file on this machine; allowed: the path of your "
                                  "training script")
        root = Path(workdir).expanduser() if workdir else path.parent
    else:
        userjob.check_module(module)
        root = Path(workdir).expanduser() if workdir else Path.cwd()
    if not root.is_dir():
        raise rq.RequestError(f"--workdir: {workdir!r} is not a folder on this machine")
    limit_mb = int(o.workdir_limit_mb or userjob.DEFAULT_WORKDIR_LIMIT_MB)
    rel = userjob.script_in_workdir(str(path.resolve()), str(root.resolve())) if script else None
    copy = scan(root, limit_mb * 1024 * 1024)
    install = None
    requirements = o.requirements or ""
    if requirements:
        req_path = Path(requirements).expanduser()
        if not req_path.is_file():
            raise rq.RequestError(f"--requirements: {requirements!r} is not a file on this machine")
        install = userjob.parse_requirements(req_path.read_text(errors="replace"), requirements,
                                             get_profile(profile))
    return rq.OwnProgram(script=rel, module=module or None, args=tuple(words), signal=signal,
                         workdir=str(root.resolve()), workdir_limit_mb=limit_mb, requirements=requirements or None,
                         resume_arg=o.resume_arg or "", independent_ranks=bool(o.independent_ranks), copy=copy,
                         install=install)


def train_request(options: JobOptions, inventory: Inventory, *, run_id: str) -> tuple[rq.RunRequest, list[str]]:
    """fab train's options (plain: left out is None) made into the run's request, and the lines to print (the
    calibration's note, the measured layout, the compile decision). RequestError/UserJobError: one line."""
    from node_setup import calibrations
    from node_setup.backends import backend_for
    from cluster.job.train_options import request_from_options

    own = own_program(options, inventory.profile)
    cal, note = calibrations.for_cluster(inventory.name)
    idle_s = backend_for(inventory.kind).default_idle_stop(inventory)

    def local_file(path: str) -> str | None:
        here = Path(path).expanduser()
        return str(here.resolve()) if here.is_file() else None

    request, lines = request_from_options(options, inventory, run_id=run_id, own=own, calibration=cal,
                                          local_file=local_file, idle_stop_s=idle_s)
    return request, [line for line in (note, *lines) if line]
