"""A process of its own for tests/training/test_compile_backend.py (accelerate's state is one per process): prints
what the job resolves --compile CHOICE [ESTIMATE] to, then the dynamo backend a Trainer with those arguments hands
accelerate. `python -m tests.training.compile_probe CHOICE ESTIMATE` (ESTIMATE may be empty)."""

import sys
import tempfile

import torch
from transformers import Trainer, TrainingArguments

from training.args import JobArguments, resolve_compile

t = TrainingArguments(output_dir=tempfile.mkdtemp(), report_to=[], use_cpu=True)
print(resolve_compile(JobArguments(compile=sys.argv[1], compile_estimate=sys.argv[2] or None), t, 10))
trainer = Trainer(model=torch.nn.Linear(2, 2), args=t)
print("dynamo backend:", trainer.accelerator.state.dynamo_plugin.backend.value)
