"""--compile on: the compiled job trains under DDP with the eager job's losses, and their checkpoints
resume in each other (slow: torch.compile takes about a minute per rank on a 2-core machine)."""

import shutil
import subprocess
import sys

import pytest

from cluster.job import runreport
from tests.training.conftest import REPO, mpi_env, read_summary, requires_mpi, run_mpi

# fp32 on both sides: the compiled graph reorders float sums, never more than this per logged loss
LOSS_RTOL = 1e-3
STEPS = 4


def args_for(demo, out, compile_, *extra):
    return [*demo["args"], "--output_dir", str(out), "--checkpoint_minutes", "0", "--per_device_train_batch_size", "8",
            "--logging_steps", "1", "--seed", "7", "--spot_watch", "off", "--max_steps", str(STEPS),
            "--save_strategy", "steps", "--save_steps", "2", "--bf16", "false", "--max_eval_samples", "0",
            "--dist_backend", "gloo", "--compile", compile_, *extra]


def losses(out) -> list[float]:
    import json

    state = json.loads((out / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    return [e["loss"] for e in state["log_history"] if "loss" in e]


def launch(launcher, ranks, args):
    if launcher == "mpirun":
        return run_mpi([args] * ranks, mpi_env(), timeout=900)
    env = mpi_env()
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
                           "--master_addr", "127.0.0.1", "--master_port", env["MASTER_PORT"], "-m", "training", *args],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=900)


@requires_mpi
@pytest.mark.slow
# One launcher: neither the compiled graph nor a checkpoint depends on it.
@pytest.mark.parametrize("launcher, ranks", [("mpirun", 2)])
def test_compiled_ddp_matches_eager_and_checkpoints_cross_resume(qa_demo, tmp_path, launcher, ranks):
    eager, compiled = tmp_path / "eager", tmp_path / "compiled"
    for out, mode in ((eager, "off"), (compiled, "on")):
        result = launch(launcher, ranks, args_for(qa_demo, out, mode))
        assert result.returncode == 0, result.stderr[-4000:]
    e, c = read_summary(eager), read_summary(compiled)
    assert (e["settings"]["compile"], c["settings"]["compile"]) == (False, True)
    assert c["settings"]["compile_reason"] == "set with --compile on"
    assert len(losses(eager)) == len(losses(compiled)) == STEPS
    assert losses(compiled) == pytest.approx(losses(eager), rel=LOSS_RTOL)
    # a checkpoint written by one resumes in the other: each run's step 2, continued by the other mode
    for source, mode in ((eager, "on"), (compiled, "off")):
        crossed = tmp_path / f"{source.name}-then-{mode}"
        shutil.copytree(source, crossed)
        shutil.rmtree(crossed / f"checkpoint-{STEPS}")
        (crossed / "summary.json").unlink()
        result = launch(launcher, ranks, args_for(qa_demo, crossed, mode, "--resume"))
        assert result.returncode == 0, result.stderr[-4000:]
        resumed = read_summary(crossed)
        assert resumed["resumed_from"]["step"] == 2 and resumed["steps"] == STEPS
        # the log history `fab report` draws marks the recovery at step 2 (training/callbacks.py's step timer)
        report = runreport.job_report("r", {"trainer_state.json": (crossed / "trainer_state.json").read_text()})
        assert report.recoveries == (2,) and [s for s, _ in report.curves["loss"]] == list(range(1, STEPS + 1))
        assert losses(crossed)[2:] == pytest.approx(losses(eager)[2:], rel=LOSS_RTOL)
