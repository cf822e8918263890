"""On the session's local cluster: `fab bench --layouts` keeps a measured layout that `fab train --dry-run`
then uses. (The compiled job against the eager one is tests/training/test_compile_ddp.py's, under mpirun: the
compiled graph does not depend on the launcher or on how the nodes were reached; `--compile on` reaching the
job's command line is tests/unit/test_measured_layout.py's.)

Budget on a 2-core machine: about a minute.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cluster.cost import calibration as calib
from cluster.job.jobplan import machine_for
from cluster.cost.benchplan import layout_candidates
from tests.ssh.conftest import run_fab

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


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
