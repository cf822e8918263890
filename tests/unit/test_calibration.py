"""Calibrations (cluster/cost/calibration.py), `fab bench`'s plan (cluster/cost/benchplan.py) and the planner
with measured inputs, gradient communication and bucket size (cluster/cost/timemodel.py, costplan.py)."""

from __future__ import annotations

import json

import pytest

from cluster.cost import benchplan, costplan, plan_options
from cluster.cost import calibration as calib
from cluster.cost import timemodel as tm
from cluster.inventory import Inventory, Node
from cluster.job.job_args import DEFAULT_GRAD_COMM
from node_setup.backends.files import local_facts

PARAMS = 135_618


def _figures(**over) -> dict:
    figures = {"model": "synthetic", "params": PARAMS, "batch": 16, "seq_len": 64, "bucket_mb": 25, "backend": "gloo",
               "cpu": "Test CPU", "cores": 2, "compute": {"1": 800.0, "2": 600.0, "3": 450.0},
               "allreduce": {"2": {"fp32": {"gbps": 0.02, "latency_s": 2e-4, "seconds": 0.2},
                                   "bf16": {"gbps": 0.019, "latency_s": 2e-4, "seconds": 0.11}},
                             "3": {"fp32": {"gbps": 0.018, "latency_s": 1e-4, "seconds": 0.3}}}}
    figures.update(over)
    return figures


def _inventory() -> Inventory:
    """A local cluster's, with the facts its backend gives it."""
    nodes = tuple(Node(name=f"node{i}", address=f"10.9.9.{i + 2}", private_address=f"10.9.9.{i + 2}", rank=i,
                       role="master" if i == 0 else "worker") for i in range(3))
    return local_facts(Inventory(name="demo", kind="local", user="root", nodes=nodes, key_path="/k", profile="stock",
                                 sockets=1, physical_cores=2))


HERE = ("Test CPU", 2)  # the local machine `_cal` measured: a plan of the local cluster (fab plan --cluster local)


def _cal(**over) -> calib.Calibration:
    return benchplan.calibration_from(_figures(**over), _inventory(), link="20 Mbit/s per node", created=0)


@pytest.mark.parametrize("nodes", [2, 3, 8])
def test_ring_fit_recovers_the_bandwidth_and_latency_allreduce_seconds_assumes(nodes):
    payload, gbps, latency, buckets = 40e6, 3.0, 80e-6, 2
    big = tm.allreduce_seconds(payload, nodes, gbps, latency, wire_efficiency=1.0, buckets=buckets)
    small = tm.allreduce_seconds(4, nodes, gbps, latency, wire_efficiency=1.0, buckets=1)  # all latency, nearly
    fit_gbps, fit_latency = tm.ring_fit(nodes, payload, big, small, buckets)
    assert fit_gbps == pytest.approx(gbps, rel=1e-4) and fit_latency == pytest.approx(latency, rel=1e-4)


def test_bf16_gradients_halve_the_bytes_but_keep_ddp_s_bucket_count():
    fp32 = tm.Workload(params=100_000_000, samples=1000, gradient_bytes=4)
    bf16 = tm.Workload(params=100_000_000, samples=1000, gradient_bytes=2, bucket_gradient_bytes=4)
    assert fp32.buckets == bf16.buckets == 16  # 400 MB of fp32 gradients in 25 MiB buckets
    net = tm.Network(instance_gbps=10)
    a, b = tm.predict(fp32, net, 4, 50.0), tm.predict(bf16, net, 4, 50.0)
    latency = 2 * 3 * 16 * tm.RING_STEP_LATENCY_S * a.steps
    assert (b.comm_s - latency) == pytest.approx((a.comm_s - latency) / 2)


def test_a_smaller_bucket_pays_more_ring_latencies():
    big = tm.Workload(params=10_000_000, samples=1000, bucket_bytes=25 * 2**20)
    small = tm.Workload(params=10_000_000, samples=1000, bucket_bytes=1 * 2**20)
    net = tm.Network(instance_gbps=10, latency_s=1e-3)
    extra = tm.predict(small, net, 2, 50.0).comm_s - tm.predict(big, net, 2, 50.0).comm_s
    assert (small.buckets, big.buckets) == (39, 2)
    assert extra == pytest.approx(37 * 2 * 1e-3 * tm.predict(big, net, 2, 50.0).steps)


def test_calibration_round_trips_and_picks_the_nearest_measurement():
    cal = _cal()
    again = calib.parse(cal.to_json(), "file")
    assert again.compute == {1: 800.0, 2: 600.0, 3: 450.0} and again.link == "20 Mbit/s per node"
    assert again.rate(8) == (450.0, 3)
    assert again.link_fit(3, "bf16")[1] == 2  # no bf16 across 3: the nearest count that has one
    assert again.link_fit(2, "fp16") is None


@pytest.mark.parametrize("text, message", [
    ("not json", "not JSON"),
    (json.dumps({"version": 99}), "not a version 1 calibration"),
    (json.dumps({**_figures(), "version": 1, "cluster": "c", "compute": {"1": -5}}), "compute[1] is -5"),
    (json.dumps({**_figures(), "version": 1}), "unreadable (KeyError"),
])
def test_an_unusable_calibration_is_refused_with_the_reason(text, message):
    with pytest.raises(calib.CalibrationError, match=message.replace("[", r"\[").replace("(", r"\(")):
        calib.parse(text, "f.json")


def test_calibration_path_is_per_cluster_and_refuses_odd_names(tmp_path):
    assert calib.path_for(tmp_path, "demo") == tmp_path / "calibration" / "demo.json"
    for odd in ("../x", "local:demo"):  # a name, never a `--cluster` value: node_setup/discovery.py's cluster_name
        with pytest.raises(calib.CalibrationError, match=f"--cluster: '{odd}'"):
            calib.path_for(tmp_path, odd)


def test_fab_plan_finds_the_calibration_of_the_cluster_its_cluster_option_names(tmp_path, monkeypatch):
    from node_setup.tasks import costs

    monkeypatch.setattr(costs, "config_root", lambda: tmp_path)
    (tmp_path / "calibration").mkdir()
    (tmp_path / "calibration" / "demo.json").write_text(_cal().to_json())
    (tmp_path / "lab.yaml").write_text("name: demo\nhosts: [192.0.2.10]\n")
    for given in ("local:demo", "demo", str(tmp_path / "lab.yaml")):
        found, note = costs.load_calibration("", given)
        assert found is not None and note == "", given
    assert costs.load_calibration("", "local")[0] is None


def test_plan_with_a_calibration_uses_measured_inputs_and_says_so():
    cal = _cal()
    options = plan_options.PlanOptions(nodes="2,3", model="", batch=None, samples=16 * 2 * 40, grad_comm="fp32",
                                       local_machine=HERE)
    inputs = plan_options.plan_inputs(None, options, cal)
    rows = costplan.plan_rows(inputs, costplan.Price(1.0, "spot", "given"))
    two = rows[0].prediction
    # compute: 32 samples per step per node... 16 per node at 600 samples/s
    assert two.compute_s / two.steps == pytest.approx(16 / 600)
    expected_comm = tm.allreduce_seconds(PARAMS * 4, 2, 0.02, 2e-4, wire_efficiency=1.0, buckets=1)
    assert two.comm_s / two.steps == pytest.approx(expected_comm)
    assert rows[1].prediction.compute_s / rows[1].prediction.steps == pytest.approx(16 / 450)
    text = plan_options.render_sources(inputs)
    assert "measured with 2 node(s) busy at once" in text and "measured in fp32 across 3 node(s)" in text
    assert "given (--grad-comm)" in text and "DDP's default" in text


def test_plan_with_a_calibration_of_another_model_keeps_the_catalog_compute():
    options = plan_options.PlanOptions(nodes="1,2", model="distilbert-base-uncased", local_machine=HERE)
    inputs = plan_options.plan_inputs(None, options, _cal())
    compute = next(s for s in inputs.sources if s[0] == "compute")
    assert compute[2].startswith("catalog default") and "the calibration measured synthetic" in compute[2]
    link = next(s for s in inputs.sources if s[0].startswith("all-reduce"))
    assert link[2] == "measured in bf16 across 2 node(s)"  # the network is the cluster's whatever the model


def test_plan_grad_comm_defaults_to_the_jobs_and_bf16_is_faster_when_communication_bound():
    cal = _cal(allreduce={"2": {"fp32": {"gbps": 0.02, "latency_s": 2e-4, "seconds": 0.2},
                                "bf16": {"gbps": 0.02, "latency_s": 2e-4, "seconds": 0.1}}})
    options = dict(nodes="2", model="", batch=None, samples=1280, local_machine=HERE)

    def step_seconds(**extra):
        inputs = plan_options.plan_inputs(None, plan_options.PlanOptions(**options, **extra), cal)
        return costplan.plan_rows(inputs, costplan.Price(1.0, "spot", "given"))[0].prediction.step_seconds

    assert step_seconds() == step_seconds(grad_comm=DEFAULT_GRAD_COMM)
    assert step_seconds(grad_comm="fp32") / step_seconds(grad_comm="bf16") > 1.3


def _aws_cal(**over) -> calib.Calibration:
    inventory = Inventory(name="prod", kind="aws", user="ubuntu", nodes=_inventory().nodes, key_path="/k",
                          profile="stock", instance_type="c6i.16xlarge")
    from node_setup.backends import backend_for

    measured = backend_for(inventory.kind).measured_type(inventory)  # what fab bench records: the nodes' EC2 type
    return benchplan.calibration_from(_figures(**over), inventory, measured_type=measured, created=0)


def test_a_calibration_applies_only_to_the_machine_it_measured():
    local, aws = _cal(), _aws_cal()
    assert (local.instance_type, local.cores, aws.instance_type) == ("", 2, "c6i.16xlarge")
    assert calib.foreign_machine(aws, instance_type="c6i.16xlarge") == ""
    assert calib.foreign_machine(local, cpu="Test CPU", cores=2) == ""
    assert calib.foreign_machine(aws, instance_type="r7iz.metal-16xl") == \
        "it measured c6i.16xlarge, not r7iz.metal-16xl"
    assert calib.foreign_machine(local, instance_type="c6i.16xlarge") == \
        "it measured a local cluster's machine (Test CPU, 2 cores), not c6i.16xlarge"
    assert "not this machine (Test CPU, 4 cores)" in calib.foreign_machine(local, cpu="Test CPU", cores=4)
    assert calib.foreign_machine(local, cpu="Other CPU", cores=2) != ""
    assert calib.foreign_machine(aws, cpu="Test CPU", cores=2) != ""  # an instance type's, on a local cluster
    old = calib.from_mapping({**local.to_mapping(), "cores": None}, "old.json")  # written before cores were
    assert calib.foreign_machine(old, cpu="Test CPU", cores=2) != ""


def test_plan_refuses_a_calibration_of_another_machine_unless_asked():
    """A local cluster's calibration on an AWS instance type: refused naming --calibration, or applied with
    --any-machine and a note saying so."""
    options = dict(nodes="1,2", model="", batch=None, samples=1280, instance_type="c6i.16xlarge")
    with pytest.raises(ValueError, match=r"^--calibration: fab bench does not apply here: it measured a local "
                                         r"cluster's machine \(Test CPU, 2 cores\), not c6i.16xlarge; .*--any-machine"):
        plan_options.plan_inputs(None, plan_options.PlanOptions(**options), _cal())
    inputs = plan_options.plan_inputs(None, plan_options.PlanOptions(**options, any_machine=True), _cal())
    assert any("applied anyway (--any-machine)" in note for note in inputs.notes), inputs.notes
    same_machine = plan_options.plan_inputs(None, plan_options.PlanOptions(**options), _aws_cal()).notes
    assert not [note for note in same_machine if "--any-machine" in note or "another machine" in note], same_machine


def test_a_rate_per_node_above_one_nodes_is_flagged_as_noise():
    """Two nodes at 483 samples/s each beat one at 289: the plan's efficiency (its own arithmetic) is above
    100 %, and a note says it is noise."""
    fast = {"gbps": 100.0, "latency_s": 1e-6, "seconds": 1e-4}
    cal = _cal(compute={"1": 289.0, "2": 483.0, "3": 280.0}, allreduce={"2": {"fp32": fast, "bf16": fast}})
    assert calib.noisy_counts(cal) == [2]
    inputs = plan_options.plan_inputs(None, plan_options.PlanOptions(nodes="1,2", model="", batch=None,
                                                                     samples=1280, local_machine=HERE), cal)
    rows = costplan.plan_rows(inputs, costplan.Price(0.0, "local", "none"))
    assert rows[1].prediction.efficiency > 1
    assert any(note.startswith("calibration: at 2 node(s) it measured more samples/s per node than one node alone "
                               "(289.0): noise") for note in inputs.notes), inputs.notes
    assert calib.noisy_counts(_cal()) == []
    assert benchplan.render_table(cal).splitlines()[-1].startswith("not stable: at 2 node(s) it measured more")
    assert "not stable" not in benchplan.render_table(_cal())


def test_bench_plan_launches_the_bench_program_with_one_rank_per_node():
    plan = benchplan.plan_bench(_inventory(), benchplan.BenchOptions(nodes=2))
    command = plan.launch.command_line()
    assert "-m training.bench" in command and "--model synthetic" in command
    assert plan.launch.world_size == 2 and plan.layout.ranks_per_node == 1
    assert plan.output_dir.startswith("/var/tmp/xeon-cluster-runs/demo/bench-")


@pytest.mark.parametrize("over, message", [
    (dict(model="bert-base-uncased"), "--model: 'bert-base-uncased' is not allowed"),
    (dict(model="/models/../etc"), "--model: '/models/../etc' is not allowed"),
    (dict(model="/m; rm -rf /"), "--model: '/m; rm -rf /' is not allowed"),
    (dict(batch=0), "--batch: 0 is not allowed; give 1 to 4096"),
    (dict(bucket_mb=0.5), "--ddp-bucket-mb: 0.5 is not allowed"),
])
def test_bench_options_are_checked(over, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        benchplan.check_options(benchplan.BenchOptions(**over))


def test_bench_table_lists_every_node_count():
    table = benchplan.render_table(_cal())
    lines = table.splitlines()
    assert "20 Mbit/s per node" in lines[0] and "Test CPU" in lines[0]
    assert lines[-1].split()[:4] == ["3", "450.0", "300.0", "0.018"]


def test_fab_plan_of_a_local_cluster_takes_its_calibration_and_gives_no_price(tmp_path):
    """`fab plan --cluster local:NAME` with a calibration of this machine (its CPU and cores, as training/bench.py
    records them): no price, no `pulumi up`; the same file for an AWS instance type: one line, exit 2."""
    from tests.fab_run import fab_in_process
    from training.hardware import cpu_model, physical_cores

    path = tmp_path / "cal.json"
    path.write_text(_cal(cpu=cpu_model(), cores=physical_cores()).to_json())
    common = ("plan", "--calibration", str(path), "--nodes", "1,2", "--samples", "640")
    local = fab_in_process(*common, "--cluster", "local:demo", "--json")
    assert local.returncode == 0, local.stdout + local.stderr
    rows = json.loads(local.stdout)
    assert [(r["market"], r["total_usd"], r["provisioning_seconds"]) for r in rows] == [("local", 0, 0)] * 2, rows
    foreign = fab_in_process(*common, "--instance-type", "c6i.16xlarge", "--hourly-usd", "1")
    assert foreign.returncode == 2 and len(foreign.stderr.strip().splitlines()) == 1, foreign.stderr
    assert "--calibration: " in foreign.stderr and "not c6i.16xlarge" in foreign.stderr
    anyway = fab_in_process(*common, "--instance-type", "c6i.16xlarge", "--hourly-usd", "1", "--any-machine")
    assert anyway.returncode == 0 and "applied anyway (--any-machine)" in anyway.stdout, anyway.stderr
