"""The planner checked against this project's own runs, on a local cluster (root; makes and removes its own).

For each link speed (not limited: compute-bound; --slow-mbit: communication-bound) it brings up a
local cluster of --nodes nodes with that link (`fab local-up --link-mbit`), runs `fab setup`,
`fab bench --steps K` (the calibration, over as many steps as the runs), then for 2..N nodes and each
gradient communication (fp32, bf16) `fab plan --cluster ... --json` (calibrated) and a short run of
the offline job (`fab train --synthetic-examples E --max-steps K`), and prints predicted vs measured
step time, the error, and each run's final loss. The measured step is the job's mean step after its
first (summary.json `step_time_seconds.mean`): the planner's step is a steady one, and its start-up
term covers the rest (the first step's warm-up, shown as `first s`, and the launch before it).

    python bench/bench_calibration.py [--nodes 3] [--slow-mbit 20] [--steps 40] [--examples 800]
                                      [--grad-comm fp32,bf16] [--name xcb-cal]

`--grad-comm fp32` alone compares nothing: use it where the job has no `--grad_comm` (check
`python -m training --help`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from training import hardware  # noqa: E402

ENV = {**os.environ, "AWS_EC2_METADATA_DISABLED": "true"}  # fab plan must never ask the metadata service
BATCH = 16  # the offline demo's batch per rank (fab train's default for it)


def fab(*args: str, timeout: float = 1200) -> str:
    result = subprocess.run([sys.executable, "-m", "fabric", *args], cwd=REPO, env=ENV, capture_output=True,
                            text=True, timeout=timeout)
    if result.returncode != 0:
        sys.exit(f"fab {' '.join(args)} failed "
                 f"({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-2000:]}")
    return result.stdout


def summary_of(train_output: str) -> dict:
    for line in train_output.splitlines():
        if line.strip().startswith("final_model:"):
            return json.loads((Path(line.split(":", 1)[1].strip()) / "summary.json").read_text())
    sys.exit(f"no summary in the fab train output:\n{train_output[-2000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--slow-mbit", type=float, default=20.0)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--examples", type=int, default=800)
    parser.add_argument("--grad-comm", default="fp32,bf16",
                        help="comma-separated; fp32 only where the job has no --grad_comm")
    parser.add_argument("--name", default="xcb-cal")
    o = parser.parse_args()
    comms = [c for c in o.grad_comm.split(",") if c]
    cluster = f"local:{o.name}"
    rows = []
    try:
        for link in (0.0, o.slow_mbit):
            up = ["local-up", "--nodes", str(o.nodes), "--name", o.name, "--replace"]
            fab(*(up + (["--link-mbit", f"{link:g}"] if link else [])), timeout=120)
            fab("setup", "--cluster", cluster)
            # the calibration's compute over as many steps as the runs it predicts (the same warm-up and
            # epoch boundaries per step; on a shared 2-core machine it did not make two runs agree better)
            bench_out = fab("bench", "--cluster", cluster, "--nodes", str(o.nodes), "--steps", str(o.steps))
            print(bench_out[bench_out.index("cluster "):].rstrip(), flush=True)
            for nodes in range(2, o.nodes + 1):
                for comm in comms:
                    samples = o.steps * BATCH * nodes  # the plan's epoch: exactly the run's steps
                    plan = json.loads(fab("plan", "--cluster", cluster, "--nodes", f"1,{nodes}", "--samples",
                                          str(samples), "--grad-comm", comm, "--hourly-usd", "1", "--json"))
                    predicted = next(r for r in plan if r["nodes"] == nodes)
                    extra = ["--extra", f"--grad_comm {comm}"] if comm != "fp32" or len(comms) > 1 else []
                    t0 = time.monotonic()
                    out = fab("train", "--cluster", cluster, "--nodes", str(nodes), "--synthetic-examples",
                              str(o.examples), "--max-steps", str(o.steps), *extra)
                    wall = time.monotonic() - t0
                    s = summary_of(out)
                    steps = s["step_time_seconds"]
                    rows.append(dict(link=f"{link:g} Mbit/s" if link else "not limited", nodes=nodes, comm=comm,
                                     predicted=predicted["step_seconds"], comm_s=predicted["comm_seconds_per_step"],
                                     measured=steps["mean"], first=steps["first"],
                                     overall=s["train_seconds"] / s["steps_this_run"], loss=s["train_loss"],
                                     wall=wall))
                    r = rows[-1]
                    print(f"  {r['link']:<12} {nodes} nodes {comm}: predicted {r['predicted']:.4f} s/step, "
                          f"measured {r['measured']:.4f} s/step, loss {r['loss']:.4f}", flush=True)
    finally:
        subprocess.run([sys.executable, "-m", "fabric", "local-down", "--name", o.name], cwd=REPO, env=ENV,
                       capture_output=True, timeout=120)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nCPU: {hardware.cpu_model()}, {os.cpu_count()} CPUs; load average (1/5/15 min) {load}")
    print(f"{o.steps} steps x batch {BATCH}/rank of the offline demo ({o.examples} examples); measured step = the "
          "job's mean step after the first; first s = its first step; all s/step = train_seconds / steps")
    print(f"{'link':<12} {'nodes':>5} {'grads':>5} {'pred s/step':>11} {'pred comm':>9} {'meas s/step':>11} "
          f"{'error':>7} {'first s':>7} {'all s/step':>10} {'final loss':>10}")
    for r in rows:
        err = (r["predicted"] - r["measured"]) / r["measured"]
        print(f"{r['link']:<12} {r['nodes']:>5} {r['comm']:>5} {r['predicted']:>11.4f} {r['comm_s']:>9.4f} "
              f"{r['measured']:>11.4f} {err:>+7.0%} {r['first']:>7.3f} {r['overall']:>10.4f} {r['loss']:>10.4f}")
    by = {(r["link"], r["nodes"], r["comm"]): r for r in rows}
    for (link, nodes, comm), r in by.items():
        if comm == "bf16" and (link, nodes, "fp32") in by:
            f = by[(link, nodes, "fp32")]
            print(f"bf16 vs fp32, {link}, {nodes} nodes: {f['measured'] / r['measured']:.2f}x faster per step "
                  f"(predicted {f['predicted'] / r['predicted']:.2f}x); final loss {r['loss']:.4f} vs {f['loss']:.4f} "
                  f"({(r['loss'] - f['loss']) / f['loss']:+.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
