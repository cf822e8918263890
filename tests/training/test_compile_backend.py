"""--compile on reaches torch.compile: the Trainer hands accelerate a compile backend (with none, accelerate's
TorchDynamoPlugin falls back to "no" and the model trains eager, whatever torch_compile says)."""

import subprocess
import sys

import pytest

from tests.training.conftest import REPO, mpi_env, warm_env


@pytest.mark.parametrize("choice, estimate, backend", [
    ("on", "", "INDUCTOR"),
    ("off", "", "NO"),
    ("auto", "1.0,0.5,2", "INDUCTOR"),  # 10 steps x 0.5 s saved > 2 s to compile
    ("auto", "1.0,0.5,60", "NO"),
])
@pytest.mark.slow
def test_the_trainer_compiles_exactly_when_the_job_says_so(choice, estimate, backend):
    # a process of its own (accelerate's state is one per process), forked from the warm interpreter
    done = subprocess.run([sys.executable, "-m", "tests.warm_python", "-m", "tests.training.compile_probe", choice,
                           estimate], env=warm_env(mpi_env()), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"dynamo backend: {backend}" in done.stdout
