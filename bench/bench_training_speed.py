"""Training speed on this machine: plain Trainer settings vs the way the toolkit launches the job.

Both runs train the same small DistilBERT-shaped model (built offline, 4 layers x 256 wide,
sequences of 128 tokens) on the same synthetic SQuAD data for the same number of steps, one
process each, through `python -m training`, and read the step times from its summary.json:

- plain:   fp32, no OMP_NUM_THREADS, no LD_PRELOAD (what `Trainer` does out of the box);
- toolkit: the environment `cluster.job.layout` gives one rank on this machine (OMP_NUM_THREADS =
           physical cores, tcmalloc preloaded) and bf16 autocast when the CPU has AMX-BF16 or
           AVX512-BF16 (the job's default), detected and reported.

    python bench/bench_training_speed.py [--steps 40] [--batch 16] [--repeats 2]

Prints a table (median over repeats, runs alternate so background load hits both) and the ratio.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BENCH_MODEL = {"dim": 256, "hidden_dim": 1024, "n_layers": 4, "n_heads": 4, "max_position_embeddings": 256}
TUNED_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "LD_PRELOAD", "KMP_AFFINITY", "KMP_BLOCKTIME",
                   "OMP_PROC_BIND", "OMP_PLACES")


def build_model(workdir: Path) -> dict:
    """Synthetic data + the demo tokenizer, with a bigger model than the demo's so compute dominates."""
    import torch
    from transformers import DistilBertConfig, DistilBertModel

    from training.synthetic import write_demo

    paths = write_demo(workdir / "demo", task="qa", examples=2000, seed=0)
    model_dir = workdir / "bench-model"
    shutil.copytree(paths["model"], model_dir)
    config = DistilBertConfig.from_pretrained(model_dir, **BENCH_MODEL)
    torch.manual_seed(0)
    DistilBertModel(config).save_pretrained(model_dir)
    return {**paths, "model": str(model_dir)}


def toolkit_env() -> tuple[dict, list[str]]:
    """One rank's environment from cluster.job.layout for this machine, as `fab train` would set it."""
    from cluster.job.layout import machine_from_lscpu, plan_layout

    text = subprocess.run(["lscpu", "-p=CPU,CORE,SOCKET"], capture_output=True, text=True, check=True).stdout
    layout = plan_layout(machine_from_lscpu(text, "this machine"), backend="gloo", ranks_per_node=1)
    env = {k: v for k, v in layout.rank_env().items() if not k.startswith("I_MPI_")}  # no mpirun here
    if "LD_PRELOAD" in env:
        present = [p for p in env["LD_PRELOAD"].split(":") if os.path.exists(p)]
        env["LD_PRELOAD"] = ":".join(present)
        if not present:
            del env["LD_PRELOAD"]
    return env, layout.describe()


def run(paths: dict, out: Path, *, steps: int, batch: int, extra_env: dict, bf16: str | None,
        python: str = sys.executable, extra_args: tuple[str, ...] = ()) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in TUNED_VARIABLES}
    env.update(extra_env)
    env.update(PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    args = [python, "-m", "training", "--task", "qa", "--model_name_or_path", paths["model"],
            "--train_file", paths["train_file"], "--max_seq_length", "128", "--doc_stride", "32",
            "--per_device_train_batch_size", str(batch), "--max_steps", str(steps), "--output_dir", str(out),
            "--save_strategy", "no", "--checkpoint_minutes", "0", "--logging_steps", str(steps),
            "--spot_watch", "off"]
    if bf16 is not None:
        args += ["--bf16", bf16]
    args += list(extra_args)
    result = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"training run failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads((out / "summary.json").read_text())


def medians(summaries: list[dict]) -> tuple[float, float, float]:
    """(step time p50, step time mean, samples/s), each the median over one variant's runs."""
    return (statistics.median(s["step_time_seconds"]["p50"] for s in summaries),
            statistics.median(s["step_time_seconds"]["mean"] for s in summaries),
            statistics.median(s["samples_per_second"] for s in summaries))


def table_title(options: argparse.Namespace) -> str:
    return (f"\n{options.steps} steps x batch {options.batch} x 128 tokens, model {BENCH_MODEL}, "
            f"median of {options.repeats} run(s) each\n")


def load_average() -> str:
    """The load average (1, 5, 15 min) and the CPUs: other work on the machine inflates every run."""
    return f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--breakdown", action="store_true",
                        help="also run the toolkit environment in fp32, to separate bf16 from threads/allocator")
    options = parser.parse_args(argv)

    from training import hardware

    bf16, bf16_reason = hardware.bf16_support(hardware.cpu_flags())
    tuned_env, layout_lines = toolkit_env()
    print(f"CPU: {hardware.cpu_model()}, {hardware.physical_cores()} physical cores; "
          f"bf16: {'yes' if bf16 else 'no'} ({bf16_reason}); AMX: "
          f"{'yes' if 'amx_bf16' in hardware.cpu_flags() else 'no'}")
    print("toolkit layout: " + "; ".join(layout_lines[:2]))
    print(f"toolkit env: {tuned_env}")
    with tempfile.TemporaryDirectory(prefix="bench-training-") as tmp:
        work = Path(tmp)
        paths = build_model(work)
        variants = {"plain": ({}, "false"), "toolkit": (tuned_env, None)}  # None: the job's bf16 default
        if options.breakdown:
            variants["toolkit-fp32"] = (tuned_env, "false")
        results: dict[str, list[dict]] = {name: [] for name in variants}
        for repeat in range(options.repeats):
            for name, (extra_env, bf16_flag) in variants.items():
                summary = run(paths, work / f"{name}-{repeat}", steps=options.steps, batch=options.batch,
                              extra_env=extra_env, bf16=bf16_flag)
                results[name].append(summary)
    rows = {name: (*medians(summaries), summaries[0]["settings"]) for name, summaries in results.items()}
    print(table_title(options))
    print(f"{'run':12} {'step p50 s':>11} {'step mean s':>12} {'samples/s':>10}  settings")
    for name, (p50, mean, rate, s) in rows.items():
        print(f"{name:12} {p50:11.4f} {mean:12.4f} {rate:10.2f}  bf16={s['bf16']} threads={s['threads']} "
              f"allocator={s['allocator']}")
    ratio = rows["toolkit"][2] / rows["plain"][2] if rows["plain"][2] else float("nan")
    print(f"load average at the end (1/5/15 min): {load_average()} (other work on the machine inflates both runs)")
    print(f"\ntoolkit / plain samples per second: {ratio:.2f}x "
          f"(step time p50 ratio plain/toolkit {rows['plain'][0] / rows['toolkit'][0]:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
