"""The recipe's Intel stack against stock PyTorch, same box, model, data and steps.

- stock: this environment (torch 2.13, transformers 5), the toolkit's one-rank environment;
- ipex:  the intel profile's stack from PyPI (torch 2.8, IPEX 2.8, transformers 4.56; built by
         `python -m tests.training.ipex_env`) with `--use_ipex on`, the same environment.

Both in bf16 when the CPU can run IPEX in bf16 (AVX-512 BW/VL/DQ or AVX-NE-CONVERT), else both
in fp32, which the table says.

    python bench/bench_ipex_vs_stock.py [--steps 40] [--batch 16] [--repeats 2]

Not part of the test suite.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_training_speed import build_model, load_average, medians, run, table_title, toolkit_env  # noqa: E402
from tests.training import ipex_env  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    options = parser.parse_args(argv)
    if not ipex_env.ready():
        raise SystemExit(f"{ipex_env.VENV} is missing: python -m tests.training.ipex_env")

    from training import hardware

    bf16 = hardware.ipex_bf16_support(hardware.cpu_flags())
    precision = "true" if bf16 else "false"
    env, _ = toolkit_env()
    print(f"CPU: {hardware.cpu_model()}, {hardware.physical_cores()} physical cores; "
          f"precision: {'bf16' if bf16 else 'fp32 (IPEX cannot run bf16 on this CPU)'}")
    variants = {"stock": (sys.executable, ("--use_ipex", "off")),
                "ipex": (str(ipex_env.python()), ("--use_ipex", "on"))}
    results: dict[str, list[dict]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(prefix="bench-ipex-") as tmp:
        work = Path(tmp)
        paths = build_model(work)
        for repeat in range(options.repeats):
            for name, (python, extra) in variants.items():
                results[name].append(run(paths, work / f"{name}-{repeat}", steps=options.steps, batch=options.batch,
                                         extra_env=env, bf16=precision, python=python, extra_args=extra))
    print(table_title(options))
    print(f"{'run':6} {'torch':>14} {'ipex':>10} {'step p50 s':>11} {'samples/s':>10}")
    rates = {}
    for name, summaries in results.items():
        versions = summaries[0]["settings"]["versions"]
        p50, _, rates[name] = medians(summaries)
        print(f"{name:6} {versions['torch']:>14} {str(summaries[0]['settings']['ipex']):>10} {p50:11.4f} "
              f"{rates[name]:10.2f}")
    print(f"\nipex / stock samples per second: {rates['ipex'] / rates['stock']:.2f}x (load average {load_average()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
