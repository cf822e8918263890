"""A LoRA step against a full fine-tune's on this machine: the offline demo's tiny Llama (training/synthetic.py
--task causal-lm) trained by `python -m training --task causal-lm` for the same steps, one process each, with
`--peft lora` and with `--peft none`; samples per second, step times and trained parameters from each run's
summary.json.

    python bench/bench_lora.py [--steps 40] [--batch 16] [--repeats 2]

Prints a table (median over repeats; the runs alternate so background load hits both) and the ratio.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

METHODS = ("lora", "none")


def run(demo: dict, method: str, out: Path, steps: int, batch: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    command = [sys.executable, "-m", "training", *demo["args"], "--peft", method, "--output_dir", str(out),
               "--max_steps", str(steps), "--per_device_train_batch_size", str(batch), "--max_eval_samples", "0",
               "--checkpoint_minutes", "0", "--save_strategy", "no", "--spot_watch", "off", "--compile", "off"]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise SystemExit(f"{method}: exit {result.returncode}\n{result.stderr[-3000:]}")
    return json.loads((out / "summary.json").read_text())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bench/bench_lora.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    options = parser.parse_args(argv)

    from training.synthetic import write_demo

    with tempfile.TemporaryDirectory(prefix="bench-lora-") as tmp:
        work = Path(tmp)
        demo = write_demo(work / "demo", task="causal-lm", examples=options.steps * options.batch, seed=0)
        runs: dict[str, list[dict]] = {m: [] for m in METHODS}
        for repeat in range(options.repeats):
            for method in METHODS:
                runs[method].append(run(demo, method, work / f"{method}-{repeat}", options.steps, options.batch))
    print(f"{options.steps} steps x batch {options.batch}, the demo's tiny Llama, one process, median of "
          f"{options.repeats}")
    print(f"{'peft':<6} {'step p50 s':>11} {'samples/s':>10} {'trained':>9} {'parameters':>11} {'last loss':>10}  "
          "settings")
    rates = {}
    for method in METHODS:
        rows = runs[method]
        rates[method] = statistics.median(r["samples_per_second"] for r in rows)
        p50 = statistics.median(r["step_time_seconds"]["p50"] for r in rows)
        loss = statistics.median(r["last_logged_loss"] for r in rows if r["last_logged_loss"] is not None)
        first = rows[0]
        print(f"{method:<6} {p50:>11.4f} {rates[method]:>10.2f} {first['trainable_parameters']:>9} "
              f"{first['parameters']:>11} {loss:>10.4f}  bf16={first['settings']['bf16']} "
              f"threads={first['settings']['threads']}")
    print(f"load average at the end (1/5/15 min): {' '.join(f'{v:.2f}' for v in os.getloadavg())} on "
          f"{os.cpu_count()} CPUs")
    print(f"\nLoRA / full fine-tune samples per second: {rates['lora'] / rates['none']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
