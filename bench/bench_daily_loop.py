"""Wall time of the daily loop's commands on a 3-node local cluster: the timings the tests no longer assert.

    python bench/bench_daily_loop.py [--repeats 3] [--steps 400]

What it times (median of --repeats each, fab's own start-up included): `fab setup` when everything is
installed (the no-op path), `fab train --managed --detach` until it returns (the run then goes on under
its supervisor), `fab status`, `fab jobs` and `fab logs --lines 20` while that run trains, `fab stop`, and
last `fab setup --ssh-timeout 5s` with one node's sshd stopped (the others finish; the down node is
named). Needs root and a machine where `fab local-up` works; the cluster gets its own config directory
under a temporary directory (the user's clusters are untouched) and is removed at the end. Prints a table.
"""

from __future__ import annotations

import argparse
import os
import signal
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


def fab(args: list[str], env: dict, *, ok: tuple[int, ...] = (0,)) -> float:
    start = time.monotonic()
    result = subprocess.run([*FAB, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    took = time.monotonic() - start
    if result.returncode not in ok:
        raise SystemExit(f"`fab {' '.join(args)}` failed (exit {result.returncode}):\n{result.stdout}\n{result.stderr}")
    return took


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each command (median reported)")
    parser.add_argument("--steps", type=int, default=400, help="steps of the managed run the reads are timed during")
    args = parser.parse_args(argv)
    rows: list[tuple[str, float]] = []

    def timed(label: str, command: list[str], env: dict, **options) -> None:
        took = statistics.median(fab(command, env, **options) for _ in range(args.repeats))
        rows.append((label, took))
        print(f"  {label}: {took:.2f} s", flush=True)

    with tempfile.TemporaryDirectory(prefix="xc-bench-") as tmp:
        config, data = Path(tmp) / "config", Path(tmp) / "data"
        env = {**os.environ, "XDG_CONFIG_HOME": str(config), local_state.DATA_ROOT_ENV: str(data)}
        name = f"daily-{os.getpid() % 10000}"
        paths = local_state.paths_for(name, config=config / "xeon-cluster", data=data)
        lc.create(3, name, paths=paths)
        cluster = ["--cluster", str(paths.inventory_path)]
        try:
            fab(["setup", *cluster], env)  # warm-up: may install this checkout into the shared venv
            timed("fab setup (installed: nothing to do)", ["setup", *cluster], env)
            detach = fab(["train", "--managed", "--detach", *cluster, "--max-steps", str(args.steps),
                          "--output-dir", f"/var/tmp/xc-bench-{name}"], env)
            rows.append(("fab train --managed --detach (until it returns)", detach))
            print(f"  fab train --managed --detach: {detach:.2f} s", flush=True)
            for label, command in (("fab status (a run training)", ["status"]), ("fab jobs", ["jobs"]),
                                   ("fab logs --lines 20", ["logs", "--lines", "20"])):
                timed(label, [*command, *cluster], env)
            rows.append(("fab stop", fab(["stop", *cluster], env)))
            state = local_state.load_state(paths)
            os.kill(state.nodes[2].sshd_pid, signal.SIGTERM)  # node2 unreachable from here on
            timed("fab setup --ssh-timeout 5s, one node's sshd stopped", ["setup", "--ssh-timeout", "5s", *cluster],
                  env, ok=(3,))
        finally:
            lc.destroy(paths)
            subprocess.run(["rm", "-rf", "--one-file-system", f"/var/tmp/xc-bench-{name}"], check=False)
    width = max(len(label) for label, _ in rows)
    print(f"\n{'command':<{width}}  seconds")
    for label, took in rows:
        print(f"{label:<{width}}  {took:7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
