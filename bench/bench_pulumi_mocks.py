"""How long evaluating the Pulumi program takes under mocks, for 1, 16 and 64 workers.

Runs the real infra/__main__.py with the same test doubles as tests/infra (no CLI, no AWS), a few
times per size, and prints the best and median wall time and the number of resources registered.
This is the program's own cost (config, lookups, resource registration); a real `pulumi up` adds
the engine, the provider and AWS, which dominate.

    python bench/bench_pulumi_mocks.py [--repeat 5] [--workers 1 16 64]
"""

from __future__ import annotations

import argparse
import statistics
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pulumi  # noqa: E402

from tests.infra.conftest import PROJECT, STACK, FakeAws, Harness, RecordingMonitor, minimal_config  # noqa: E402


def evaluate(workers: int) -> tuple[float, int]:
    fake = FakeAws()
    monitor = RecordingMonitor(fake)
    pulumi.runtime.set_mocks(fake, project=PROJECT, stack=STACK, preview=False, monitor=monitor)
    started = time.perf_counter()
    Harness(fake, monitor).run(minimal_config(workerCount=workers))
    return time.perf_counter() - started, len(monitor.registrations)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 16, 64])
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", DeprecationWarning)
    # The program makes the cluster key in the controller's key store: a throwaway one here.
    os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="xc-bench-config-")

    evaluate(1)  # warm-up: imports pulumi_aws modules once
    print(f"{'workers':>7} {'resources':>9} {'best s':>8} {'median s':>9} {'ms/instance':>11}")
    for workers in args.workers:
        runs = [evaluate(workers) for _ in range(args.repeat)]
        times = [t for t, _ in runs]
        resources = runs[0][1]
        best, median = min(times), statistics.median(times)
        print(f"{workers:>7} {resources:>9} {best:>8.3f} {median:>9.3f} {1000 * median / (workers + 1):>11.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
