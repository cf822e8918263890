"""The job's real `ipex.optimize` path, in the intel profile's stack from PyPI (torch 2.8.0, IPEX
2.8.0, transformers 4.56.2; tests/training/ipex_env.py builds it), on 1 and 2 ranks.

The environment is about 7 GB: deselect with `-m "not ipex"` (and skip building it with
XEON_CLUSTER_SKIP_IPEX=1 scripts/setup-dev.sh) where that is too much. CI builds and runs it.
On a CPU without the AVX-512 BW/VL/DQ (or AVX-NE-CONVERT) that IPEX needs for bf16 (some of this
project's test machines have AVX2 only), bf16 with IPEX is refused with one line; where the CPU has
it (every catalog instance type does, and so do other test machines) the job trains in bf16 with
IPEX instead.
"""

from __future__ import annotations

import pytest

from tests.training import ipex_env
from tests.training.conftest import mpi_env, read_summary, requires_mpi, run_mpi

pytestmark = [pytest.mark.ipex, pytest.mark.mpi, pytest.mark.slow, requires_mpi]


@pytest.fixture(scope="module")
def ipex_python() -> str:
    assert ipex_env.installed(), (f"{ipex_env.VENV} is missing: build it with `python -m tests.training.ipex_env`, "
                                  "or deselect these tests with -m 'not ipex'")
    return str(ipex_env.python())


def args_for(demo: dict, out, *extra: str) -> list[str]:
    return [*demo["args"], "--output_dir", str(out), "--checkpoint_minutes", "0", "--spot_watch", "off",
            "--per_device_train_batch_size", "16", "--max_steps", "12", "--logging_steps", "4", "--seed", "7",
            "--use_ipex", "on", *extra]


def explain(result) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout[-2000:]}\n--- stderr\n{result.stderr[-4000:]}"


def trained_on_the_intel_stack(result, out, ranks: int) -> dict:
    """The run's summary, once it shows `ranks` ranks trained with IPEX 2.8.0 and transformers 4.56.2."""
    assert result.returncode == 0, explain(result)
    summary = read_summary(out)
    assert summary["status"] == "completed" and summary["world_size"] == ranks
    assert summary["settings"]["ipex"].startswith("2.8.0"), summary["settings"]["ipex"]
    assert summary["settings"]["versions"]["transformers"] == "4.56.2"
    assert summary["settings"]["backend"] == ("gloo" if ranks > 1 else None)
    assert summary["last_logged_loss"] < summary["first_logged_loss"]
    assert len(set(summary["weights_sha256_per_rank"])) == 1
    return summary


@pytest.mark.parametrize("ranks", [1, 2])
def test_ipex_optimize_path_trains_on_the_intel_stack(ipex_python, qa_demo, tmp_path, ranks):
    out = tmp_path / "out"
    result = run_mpi([args_for(qa_demo, out)] * ranks, mpi_env(), python=ipex_python, timeout=400)
    trained_on_the_intel_stack(result, out, ranks)


def test_bf16_with_ipex_trains_or_is_refused_in_one_line_by_the_cpu(ipex_python, qa_demo, tmp_path):
    from training.hardware import cpu_flags, ipex_bf16_support

    out = tmp_path / "out"
    result = run_mpi([args_for(qa_demo, out, "--bf16", "true")], mpi_env(), python=ipex_python, timeout=400)
    if ipex_bf16_support(cpu_flags()):
        assert trained_on_the_intel_stack(result, out, 1)["settings"]["bf16"] is True
        return
    errors = [line for line in result.stderr.splitlines() + result.stdout.splitlines() if line.startswith("error: ")]
    assert result.returncode == 2, explain(result)
    assert len(errors) == 1 and "--bf16 with IPEX" in errors[0] and "--bf16 false" in errors[0], errors
