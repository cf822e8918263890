"""What the job's fixed DDP bucket layout costs: `--ddp_find_unused_parameters true` (the job's default: DDP keeps
its first bucket layout, so a resumed job sums gradients as the run it continues) against `false` (DDP rebuilds its
buckets after the first step, in the order the gradients became ready).

Both run the built-in job on the same DistilBERT-shaped model (4 layers x 256 wide, built offline, QA data of
128 tokens) on N ranks of this host (Intel MPI's mpirun from the impi-rt wheel, gloo, one thread per rank), for
the same steps, and read the step times from summary.json; the runs alternate so background load hits both.

    python bench/bench_ddp_layout.py [--ranks 3] [--steps 30] [--batch 8] [--repeats 3]

Prints the median steady step time (the summary's p50) of each and their ratio. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_training_speed import build_model  # noqa: E402
from tests.training.conftest import mpi_env, run_mpi  # noqa: E402


def one_run(paths: dict, out: Path, ranks: int, steps: int, batch: int, fixed: bool) -> float:
    args = ["--task", "qa", "--model_name_or_path", paths["model"], "--train_file", paths["train_file"],
            "--max_seq_length", "128", "--doc_stride", "32", "--max_steps", str(steps),
            "--per_device_train_batch_size", str(batch), "--max_eval_samples", "0", "--checkpoint_minutes", "0",
            "--save_strategy", "no", "--spot_watch", "off", "--bf16", "false", "--logging_steps", "1000",
            "--ddp_find_unused_parameters", "true" if fixed else "false", "--output_dir", str(out)]
    result = run_mpi([args] * ranks, mpi_env(), timeout=1800)
    if result.returncode != 0:
        sys.exit(f"run failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return float(summary["step_time_seconds"]["p50"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    o = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ddp-layout-") as tmp:
        paths = build_model(Path(tmp))
        times: dict[str, list[float]] = {"fixed (find_unused true)": [], "rebuilt (find_unused false)": []}
        for repeat in range(o.repeats):
            for name, fixed in (("fixed (find_unused true)", True), ("rebuilt (find_unused false)", False)):
                seconds = one_run(paths, Path(tmp) / f"{repeat}-{fixed}", o.ranks, o.steps, o.batch, fixed)
                times[name].append(seconds)
                print(f"repeat {repeat + 1}: {name}: p50 step {seconds:.4f} s", flush=True)
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"\n{o.ranks} ranks, {o.steps} steps of {o.batch} per rank, median of {o.repeats}:")
    for name, seconds in medians.items():
        print(f"  {name:28s} {seconds:.4f} s per step")
    fixed, rebuilt = medians["fixed (find_unused true)"], medians["rebuilt (find_unused false)"]
    print(f"  fixed / rebuilt: {fixed / rebuilt:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
