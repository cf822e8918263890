"""The summary's MFU and its inputs, the progress line `fab status` reads (logged once) and the log history
`fab report` draws, from a real run."""

import subprocess
import sys

import pytest

from cluster.cost import flops
from cluster.job import runreport
from tests.training.conftest import REPO, mpi_env, read_summary


@pytest.mark.slow
def test_summary_has_mfu_and_its_inputs_against_the_catalog_peak(qa_demo, tmp_path):
    env = {k: v for k, v in mpi_env().items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "training", *qa_demo["args"], "--output_dir", str(out),
                             "--max_steps", "5", "--logging_steps", "2", "--per_device_train_batch_size", "8",
                             "--bf16", "false", "--spot_watch", "off", "--max_eval_samples", "0",
                             "--checkpoint_minutes", "0", "--save_strategy", "no",
                             "--instance_type", "c6i.16xlarge"],
                            env=env, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-4000:]
    data = read_summary(out)
    inputs = data["mfu_inputs"]
    # the demo's DistilBERT: 2 layers of width 64 at 64 tokens (qa pads every feature to the full length)
    assert (inputs["layers"], inputs["hidden"], inputs["seq_len"]) == (2, 64, 64)
    assert inputs["model_flops_per_sample"] == round(flops.train_flops_per_sample(inputs["matmul_params"], 2, 64, 64))
    assert inputs["steady_step_seconds"] == data["step_time_seconds"]["mean"]
    assert inputs["achieved_flops_per_s_per_node"] == pytest.approx(
        inputs["model_flops_per_sample"] * 8 / inputs["steady_step_seconds"], rel=1e-3)
    peak = inputs["peak"]  # the catalog's, not this machine's: fp32 on Ice Lake's AVX-512
    assert peak["precision"] == flops.FP32_AVX512 and peak["peak_flops_per_s"] == 32 * 3.5e9 * 64
    assert peak["source"].startswith("catalog: c6i.16xlarge")
    assert data["mfu"] == pytest.approx(inputs["achieved_flops_per_s_per_node"] / peak["peak_flops_per_s"], rel=1e-2)
    found = flops.last_progress(result.stderr)
    assert found is not None and found["line"].startswith("step 2: model FLOP/s per "
                                                          "node")  # the first log after the first step, only
    assert sum(flops.PROGRESS_MARKER in line for line in result.stderr.splitlines()) == 1, result.stderr[-4000:]
    assert found["peak_tflops"] == pytest.approx(7.168)
    # the log history `fab report` draws (cluster/job/runreport.py), written at the end: every logging step's
    # loss, learning rate, step time and samples per second (the global batch, 8, over that step time)
    made = runreport.job_report("r", {"trainer_state.json": (out / "trainer_state.json").read_text()})
    assert [s for s, _ in made.curves["loss"]] == [2, 4] and made.problems == () and made.recoveries == ()
    assert [s for s, _ in made.curves["learning_rate"]] == [2, 4]
    for (step, seconds), (_, speed) in zip(made.curves[runreport.STEP_SECONDS],
                                           made.curves[runreport.SAMPLES_PER_SECOND]):
        assert speed == pytest.approx(8 / seconds, rel=1e-2), (step, seconds, speed)
