"""Wall time of `fab setup` (already installed: the check path) and `fab distribute` on 1, 2, 4, 8 local nodes.

    python bench/bench_fab_setup.py [--nodes 1,2,4,8] [--repeats 3]

Needs root and a machine where `fab local-up` works. Each size gets its own local cluster (own
config directory under a temporary directory, so the user's clusters are untouched), removed at
the end. The first `fab setup` per size is a warm-up (it may install this project's current
version into the shared venv); the timed runs are the no-op path. Distribution is timed on its
first run (key appended, master files written) and on repeats (nothing changes). Prints a table
and t(N)/t(1): work done in parallel keeps that near 1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from node_setup.local import cluster as lc  # noqa: E402  (after the sys.path line: run as a script)
from node_setup.local import state as local_state  # noqa: E402

FAB = [sys.executable, "-m", "fabric"]


def fab(args: list[str], env: dict) -> float:
    start = time.monotonic()
    result = subprocess.run([*FAB, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    took = time.monotonic() - start
    if result.returncode != 0:
        raise SystemExit(f"`fab {' '.join(args)}` failed (exit {result.returncode}):\n{result.stdout}\n{result.stderr}")
    return took


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1,2,4,8", help="comma-separated cluster sizes")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per size (median reported)")
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.nodes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="xc-bench-") as tmp:
        config, data = Path(tmp) / "config", Path(tmp) / "data"
        env = {**os.environ, "XDG_CONFIG_HOME": str(config), local_state.DATA_ROOT_ENV: str(data)}
        made = []
        try:
            for n in sizes:
                name = f"bench{n}-{os.getpid() % 10000}"
                paths = local_state.paths_for(name, config=config / "xeon-cluster", data=data)
                lc.create(n, name, paths=paths)
                made.append(paths)
                cluster = ["--cluster", str(paths.inventory_path)]
                warm = fab(["setup", *cluster], env)
                setup_times = [fab(["setup", *cluster], env) for _ in range(args.repeats)]
                first_dist = fab(["distribute", *cluster], env)
                dist_times = [fab(["distribute", *cluster], env) for _ in range(args.repeats)]
                rows.append((n, warm, statistics.median(setup_times), first_dist, statistics.median(dist_times)))
                print(f"  {n} node(s): setup warm-up {warm:.2f} s, setup {statistics.median(setup_times):.2f} s, "
                      f"distribute first {first_dist:.2f} s, again {statistics.median(dist_times):.2f} s", flush=True)
                lc.destroy(paths)
                made.remove(paths)
        finally:
            for paths in made:
                lc.destroy(paths)
    base = rows[0]
    print("\nnodes  setup (no-op) s  t/t(1)  distribute first s  t/t(1)  distribute again s  t/t(1)")
    for n, _, setup, first, again in rows:
        print(f"{n:5d}  {setup:15.2f}  {setup / base[2]:6.2f}  {first:18.2f}  {first / base[3]:6.2f}  "
              f"{again:18.2f}  {again / base[4]:6.2f}")
    last = rows[-1]
    print(f"\nt({last[0]})/t({base[0]}): setup {last[2] / base[2]:.2f}, distribute {last[3] / base[3]:.2f} "
          f"(first) {last[4] / base[4]:.2f} (again); wall time includes fab's own start-up (~1 s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
