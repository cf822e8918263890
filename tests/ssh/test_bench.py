"""`fab bench` on the session's local cluster: the calibration it keeps, and `fab plan` using it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cluster.cost import calibration as calib
from cluster.job.job_args import DEFAULT_GRAD_COMM
from tests.ssh.conftest import FAB, REPO_ROOT, run_fab

pytestmark = [pytest.mark.ssh, pytest.mark.mpi]


@pytest.fixture
def two_node_bench(installed_cluster, tmp_path):
    """`fab bench --nodes 2` on the session's cluster, whose SSH files it leaves set up for 2 nodes:
    they are distributed to all of its nodes again afterwards, as the other tests expect."""
    out = tmp_path / "cal.json"
    yield out, run_fab(installed_cluster, "bench", "--nodes", "2", "--steps", "1", "--repeats", "1", "--output",
                       str(out), timeout=300)
    assert run_fab(installed_cluster, "distribute").returncode == 0


def test_fab_bench_keeps_a_calibration_that_fab_plan_uses(installed_cluster, two_node_bench):
    out, bench = two_node_bench
    assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr
    cal = calib.parse(out.read_text(), str(out))
    # one rank on each of 2 nodes: compute with 1 and 2 nodes busy, both dtypes across 2
    assert set(cal.compute) == {1, 2} and set(cal.allreduce[2]) == {"fp32", "bf16"}
    assert cal.model == "synthetic" and cal.params > 100_000 and cal.backend == "gloo"
    assert "samples/s/node" in bench.stdout and str(out) in bench.stdout

    assert cal.instance_type == "" and cal.cores > 0 and cal.cpu  # the local machine it measured
    env = installed_cluster.env()  # tests/conftest.py keeps boto3 off the metadata address
    common = [*FAB, "plan", "--calibration", str(out), "--nodes", "1,2", "--samples", "640"]
    foreign = subprocess.run([*common, "--instance-type", "c6i.16xlarge", "--hourly-usd", "1"], cwd=REPO_ROOT, env=env,
                             capture_output=True, text=True, timeout=60)
    assert foreign.returncode == 2 and len(foreign.stderr.strip().splitlines()) == 1, foreign.stdout + foreign.stderr
    assert "does not apply here: it measured a local cluster's machine" in foreign.stderr, foreign.stderr
    local = ["--cluster", f"local:{installed_cluster.name}"]  # the machine it measured: this one, with no price
    plan = subprocess.run([*common, *local], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    assert "measured with 2 node(s) busy at once" in plan.stdout
    assert f"measured in {DEFAULT_GRAD_COMM} across 2 node(s)" in plan.stdout
    assert "local $0.0000/instance-hour, local cluster: no price" in plan.stdout, plan.stdout
    rows = json.loads(subprocess.run([*common, *local, "--json"], cwd=REPO_ROOT, env=env, capture_output=True,
                                     text=True, timeout=60).stdout)
    # the measured compute rate decides the compute part of a single node's step: 16 samples at cal.compute[1]
    assert rows[0]["step_seconds"] == round(16 / cal.compute[1], 4)
    assert all(row["total_usd"] == 0 and row["provisioning_seconds"] == 0 for row in rows), rows
    assert not Path(calib.path_for(Path(env["XDG_CONFIG_HOME"]) / "xeon-cluster", installed_cluster.name)).exists()
