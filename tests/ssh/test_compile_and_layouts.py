"""On the session's local cluster: `fab train --compile on` trains on 2 ranks under torchrun with the eager
run's loss (under mpirun: tests/training/test_compile_ddp.py, which also resumes each mode's checkpoint in the
other; the compiled graph does not depend on the launcher), and `fab bench --layouts` keeps a measured
layout that `fab train --dry-run` then uses.

Budget on a 2-core machine: the layouts about 2 minutes; the compiled runs (slow) about a minute of
torch.compile per rank, the first time (the compile cache is warm after that).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from cluster.cost import calibration as calib
from cluster.job.jobplan import machine_for
from cluster.cost.benchplan import layout_candidates
from tests.ssh.conftest import run_fab

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

# fp32 on both sides (--bf16 off): the compiled graph reorders float sums; the mean training loss of a few
# steps stays within this relative difference of the eager run's (tests/training/test_compile_ddp.py: 1e-3 per
# logged loss)
LOSS_RTOL = 1e-3
SMALL = ("--synthetic-examples", "200", "--max-steps", "3", "--bf16", "off", "--threads", "1")


def _summary(result) -> tuple[dict, Path]:
    started = re.search(r"^job (\S+) started on node0 .*; output (\S+)$", result.stdout, re.M)
    assert started, result.stdout[-3000:] + result.stderr
    output_dir = Path(started.group(2))
    return json.loads((output_dir / "summary.json").read_text()), output_dir


def test_the_compiled_job_trains_on_two_ranks_with_the_eager_loss(installed_cluster):
    outputs = []
    try:
        runs = {}
        for choice in ("off", "on"):
            result = run_fab(installed_cluster, "train", "--nodes", "2", "--launcher", "torchrun", "--compile", choice,
                             *SMALL, timeout=900)
            assert result.returncode == 0, result.stdout[-3000:] + result.stderr
            assert f"compile: {choice} (given: --compile {choice})" in result.stdout
            runs[choice], out = _summary(result)
            outputs.append(out)
        eager, compiled = runs["off"], runs["on"]
        assert compiled["settings"]["compile"] is True and eager["settings"]["compile"] is False
        assert compiled["world_size"] == eager["world_size"] == 2 and compiled["steps"] == 3
        assert compiled["train_loss"] == pytest.approx(eager["train_loss"], rel=LOSS_RTOL)
    finally:
        for out in outputs:
            shutil.rmtree(out, ignore_errors=True)


def test_fab_bench_layouts_keeps_the_fastest_and_fab_train_uses_it(installed_cluster):
    env = installed_cluster.env()
    path = calib.path_for(Path(env["XDG_CONFIG_HOME"]) / "xeon-cluster", installed_cluster.name)
    assert not path.exists()
    try:
        bench = run_fab(installed_cluster, "bench", "--nodes", "1", "--layouts", "--steps", "2", "--repeats", "1",
                        timeout=900)
        assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr
        cal = calib.parse(path.read_text(), str(path))
        machine = machine_for(installed_cluster.inventory, 1)[0]  # one node: all of this machine's cores
        assert sorted(cal.layout.step_s) == layout_candidates(machine, "gloo")
        assert cal.layout.machine == machine.name and cal.layout.nodes == 1
        best = cal.layout.ranks_per_node
        assert cal.layout.samples_per_s(best) == max(cal.layout.samples_per_s(r) for r in cal.layout.step_s)
        assert "samples/s/node" in bench.stdout and "fastest" in bench.stdout
        assert set(cal.compute) == {1} and not cal.allreduce  # one node: no all-reduce measured

        dry = run_fab(installed_cluster, "train", "--nodes", "1", "--dry-run", timeout=120)
        assert dry.returncode == 0, dry.stdout + dry.stderr
        assert f"layout: {best} rank(s) per node, measured fastest by fab bench on {cal.created[:10]}" in dry.stdout
        assert re.search(rf"mpirun -f \S+/hosts -n {best} -ppn {best} ", dry.stdout), dry.stdout
        # on two nodes each gets half of the cores: not the node the layouts were measured on, so the rule
        two = run_fab(installed_cluster, "train", "--nodes", "2", "--dry-run", timeout=120)
        assert two.returncode == 0 and "layout: the rule (one rank per socket)" in two.stdout
        assert re.search(r"mpirun -f \S+/hosts -n 2 -ppn 1 ", two.stdout), two.stdout
    finally:
        path.unlink(missing_ok=True)  # the session's other tests plan without it
        assert run_fab(installed_cluster, "distribute").returncode == 0  # bench distributed to one node only
