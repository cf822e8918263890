"""--compile on reaches torch.compile: the Trainer hands accelerate a compile backend (with none, accelerate's
TorchDynamoPlugin falls back to "no" and the model trains eager, whatever torch_compile says)."""

import subprocess
import sys

import pytest

from tests.training.conftest import REPO

PROBE = """
import sys, tempfile
import torch
from transformers import Trainer, TrainingArguments
from training.args import JobArguments, resolve_compile

t = TrainingArguments(output_dir=tempfile.mkdtemp(), report_to=[], use_cpu=True)
print(resolve_compile(JobArguments(compile=sys.argv[1], compile_estimate=sys.argv[2] or None), t, 10))
trainer = Trainer(model=torch.nn.Linear(2, 2), args=t)
print("dynamo backend:", trainer.accelerator.state.dynamo_plugin.backend.value)
"""


@pytest.mark.parametrize("choice, estimate, backend", [
    ("on", "", "INDUCTOR"),
    ("off", "", "NO"),
    ("auto", "1.0,0.5,2", "INDUCTOR"),  # 10 steps x 0.5 s saved > 2 s to compile
    ("auto", "1.0,0.5,60", "NO"),
])
@pytest.mark.slow
def test_the_trainer_compiles_exactly_when_the_job_says_so(choice, estimate, backend):
    # a process of its own: accelerate's state is one per process
    done = subprocess.run([sys.executable, "-c", PROBE, choice, estimate], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"dynamo backend: {backend}" in done.stdout
