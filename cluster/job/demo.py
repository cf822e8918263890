"""The offline demo (pure): where every node keeps its synthetic data and tiny model, the settings under which
that model learns, and `synthetic_data`: the command every node runs before the launch to write them
(python -m training.synthetic).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from cluster.job.job_args import TASKS, JobArgsError

# Where the synthetic demo lives on every node, relative to the SSH user's home: a directory of data per
# task and size, and one model that all of them share (made by the first, about 4 s of CPU). On a cluster
# whose nodes share an output root (a local cluster), the model is made once there for every node.
SYNTHETIC_ROOT = "xeon-cluster-data"
SYNTHETIC_MODEL_NAME = "synthetic-model"
SYNTHETIC_MODEL_DIR = f"{SYNTHETIC_ROOT}/{SYNTHETIC_MODEL_NAME}"
# The tasks whose demo model is not the shared DistilBERT-shaped one: causal-lm's is a tiny Llama, shared the same way.
SYNTHETIC_TASK_MODEL_NAMES = {"causal-lm": "synthetic-causal-lm-model"}
# Settings under which the tiny demo model learns in a few dozen steps (with 16 per rank). No batch
# size here: callers add their own before these.
SYNTHETIC_SEQ_LENGTHS = {"qa": 64, "classification": 48, "causal-lm": 32}  # the demo's tokens per sample
SYNTHETIC_ARGS = {
    "qa": ("--max_seq_length", str(SYNTHETIC_SEQ_LENGTHS["qa"]), "--doc_stride", "16", "--learning_rate", "0.005",
           "--warmup_steps", "5", "--weight_decay", "0.0"),
    "classification": ("--max_seq_length", str(SYNTHETIC_SEQ_LENGTHS["classification"]), "--learning_rate", "0.005",
                       "--warmup_steps", "5"),
    "causal-lm": ("--max_seq_length", str(SYNTHETIC_SEQ_LENGTHS["causal-lm"]), "--learning_rate", "0.01",
                  "--warmup_steps", "5", "--weight_decay", "0.0", "--logging_steps", "4"),
}
SYNTHETIC_EPOCHS = "1"
SYNTHETIC_BATCH_SIZE = 16


@dataclass(frozen=True)
class SyntheticData:
    """The offline demo on a local cluster: where it is, and what writes it."""

    task: str
    directory: str  # relative to the home directory of every node
    prepare: str  # shell command every node runs before the launch (writes the data once)
    model: str  # the model's directory: in every home, or in the nodes' shared root

    @property
    def options(self) -> dict[str, str]:
        """The built-in job's settings that point it at the demo."""
        return {"task": self.task, "model": self.model,
                "train_file": f"{self.directory}/train.json", "validation_file": f"{self.directory}/eval.json"}


def synthetic_data(task: str, examples: int | None, python: str, shared_root: str | None = None) -> SyntheticData:
    """The demo for `task` with `examples` training examples (None: the generator's default). `shared_root`: a
    directory every node sees (the inventory's shared_output_root), where the model is made once for all."""
    task = task or TASKS[0]
    if task not in TASKS:
        raise JobArgsError(f"--task: {task!r} is not allowed; choose {' or '.join(TASKS)}")
    if examples is not None and examples < 1:
        raise JobArgsError(f"--synthetic-examples: {examples} is not allowed; give 1 or more")
    directory = f"{SYNTHETIC_ROOT}/synthetic-{task}" + (f"-{examples}" if examples else "")
    name = SYNTHETIC_TASK_MODEL_NAMES.get(task, SYNTHETIC_MODEL_NAME)
    model = f"{shared_root.rstrip('/')}/.{name}" if shared_root else f"{SYNTHETIC_ROOT}/{name}"
    command = [python, "-m", "training.synthetic", "--out", directory, "--task", task, "--model-dir", model]
    if examples:
        command += ["--examples", str(examples)]
    # made again when the data or the model is gone (a shared root cleared, say)
    prepare = (f"[ -f {shlex.quote(directory + '/train.json')} ] && [ -d {shlex.quote(model)} ] || "
               f"{shlex.join(command)} >/dev/null")
    return SyntheticData(task, directory, prepare, model)
