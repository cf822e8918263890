"""--compile on: the compiled job trains under DDP with the eager job's losses, and their checkpoints
resume in each other: an eager run of STEPS steps; the compiled job resumed from its step-2 checkpoint
(steps 3 to STEPS compiled); the eager job resumed from the compiled job's step-4 checkpoint. Every
step's loss equals the eager run's (slow: torch.compile takes about a minute per rank on a 2-core
machine, so the job is compiled once).
"""

import shutil
import subprocess
import sys

import pytest

from cluster.job import runreport
from tests.training.conftest import REPO, mpi_env, read_summary, requires_mpi, run_mpi

# fp32 on both sides: the compiled graph reorders float sums, never more than this per logged loss
LOSS_RTOL = 1e-3
STEPS = 6


def args_for(demo, out, compile_, *extra):
    return [*demo["args"], "--output_dir", str(out), "--checkpoint_minutes", "0", "--per_device_train_batch_size", "8",
            "--logging_steps", "1", "--seed", "7", "--spot_watch", "off", "--max_steps", str(STEPS),
            "--save_strategy", "steps", "--save_steps", "2", "--bf16", "false", "--max_eval_samples", "0",
            "--save_total_limit", "0", "--dist_backend", "gloo", "--compile", compile_, *extra]


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


def resumed_at(source, out, step: int):
    """A copy of `source`'s output folder as a kill after `step` leaves it: its checkpoints up to `step`."""
    shutil.copytree(source, out)
    for checkpoint in out.glob("checkpoint-*"):
        if int(checkpoint.name.split("-")[1]) > step:
            shutil.rmtree(checkpoint)
    (out / "summary.json").unlink()
    return out


@requires_mpi
@pytest.mark.slow
# One launcher: neither the compiled graph nor a checkpoint depends on it.
@pytest.mark.parametrize("launcher, ranks", [("mpirun", 2)])
def test_compiled_ddp_matches_eager_and_checkpoints_cross_resume(qa_demo, tmp_path, launcher, ranks):
    eager = tmp_path / "eager"
    result = launch(launcher, ranks, args_for(qa_demo, eager, "off"))
    assert result.returncode == 0, result.stderr[-4000:]
    assert read_summary(eager)["settings"]["compile"] is False and len(losses(eager)) == STEPS
    # the compiled job continues the eager job's step-2 checkpoint
    compiled = resumed_at(eager, tmp_path / "eager-then-compiled", 2)
    result = launch(launcher, ranks, args_for(qa_demo, compiled, "on", "--resume"))
    assert result.returncode == 0, result.stderr[-4000:]
    c = read_summary(compiled)
    assert c["settings"]["compile"] is True and c["settings"]["compile_reason"] == "set with --compile on"
    assert c["resumed_from"]["step"] == 2 and c["steps"] == STEPS
    assert losses(compiled)[2:] == pytest.approx(losses(eager)[2:], rel=LOSS_RTOL)
    # the log history `fab report` draws marks the recovery at step 2 (training/callbacks.py's step timer)
    report = runreport.job_report("r", {"trainer_state.json": (compiled / "trainer_state.json").read_text()})
    assert report.recoveries == (2,) and [s for s, _ in report.curves["loss"]] == list(range(1, STEPS + 1))
    # the eager job continues the compiled job's own step-4 checkpoint
    crossed = resumed_at(compiled, tmp_path / "compiled-then-eager", 4)
    result = launch(launcher, ranks, args_for(qa_demo, crossed, "off", "--resume"))
    assert result.returncode == 0, result.stderr[-4000:]
    e = read_summary(crossed)
    assert e["settings"]["compile"] is False and e["resumed_from"]["step"] == 4 and e["steps"] == STEPS
    assert losses(crossed)[4:] == pytest.approx(losses(eager)[4:], rel=LOSS_RTOL)
