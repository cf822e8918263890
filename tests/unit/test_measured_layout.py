"""A calibration's measured layout and compile figures (cluster/cost/calibration.py, cluster/job/job_args.py), and
`fab train --dry-run` taking them from the cluster's calibration (node_setup/tasks/train.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.cost import calibration as calib
from cluster.cost import timemodel as tm
from cluster.job.demo import SYNTHETIC_MODEL_DIR
from cluster.job.job_args import JobArgsError, compile_choice

ROOT = Path(__file__).resolve().parents[2]
MACHINE = "r7iz.metal-16xl"
# the real job's mean step per ranks per node at batch 16: 2 ranks carry 32 samples in 0.5 s, the most per node
LAYOUT = {"machine": MACHINE, "nodes": 2, "batch": 16, "created": "2026-11-26T03:10:00Z",
          "candidates": {"1": {"step_s": 0.4}, "2": {"step_s": 0.5}, "4": {"step_s": 1.2}}}
COMPILE = {"eager_step_s": 1.33, "compiled_step_s": 0.93, "compile_s": 60.0}


def calibration(**extra) -> dict:
    return {"version": calib.VERSION, "cluster": "lab", "model": "synthetic", "params": 200_000, "batch": 16,
            "compute": {"1": 40.0, "2": 38.0}, "created": "2026-11-26T03:00:00Z", **extra}


def test_the_layout_block_keeps_each_candidate_and_the_fastest_survives_a_round_trip():
    cal = calib.from_mapping(calibration(layout=LAYOUT), "cal.json")
    assert cal.layout.step_s == {1: 0.4, 2: 0.5, 4: 1.2}
    assert cal.layout.samples_per_s(2) == pytest.approx(64.0)  # 2 ranks x 16 / 0.5 s
    assert cal.layout.ranks_per_node == 2  # 40, 64 and 53.3 samples/s per node
    again = calib.parse(cal.to_json(), "again")
    assert again.layout == cal.layout
    written = json.loads(cal.to_json())["layout"]
    assert written["ranks_per_node"] == 2 and written["candidates"]["4"]["samples_per_s"] == pytest.approx(16 * 4 / 1.2)
    assert calib.from_mapping(calibration(), "old").layout is None  # a calibration without one still reads


def test_a_tie_keeps_the_fewer_ranks():
    tie = calib.LayoutChoice(MACHINE, 1, 8, {1: 0.25, 2: 0.5})
    assert tie.ranks_per_node == 1


@pytest.mark.parametrize("layout, problem", [
    ({"machine": MACHINE, "nodes": 1, "batch": 16, "candidates": {}}, "expected an object with candidates"),
    ({**LAYOUT, "candidates": {"2": {"step_s": 0}}}, "layout.candidates[2].step_s is 0"),
    ({**LAYOUT, "candidates": {"0": {"step_s": 1.0}}}, "layout candidate 0 ranks per node"),
    ("fast", "expected an object with candidates"),
])
def test_an_unusable_layout_block_is_refused_by_name(layout, problem):
    with pytest.raises(calib.CalibrationError) as err:
        calib.from_mapping(calibration(layout=layout), "cal.json")
    assert problem in str(err.value) and "cal.json" in str(err.value)


def test_the_measured_layout_is_used_only_on_the_node_it_was_measured_on():
    cal = calib.from_mapping(calibration(layout=LAYOUT), "cal.json")
    ranks, line = calib.layout_for(cal, MACHINE)
    assert ranks == 2
    assert line.startswith("layout: 2 rank(s) per node, measured fastest by fab bench on 2026-11-26 "
                           "(1: 40.0, 2: 64.0, 4: 53.3 samples/s per node")
    ranks, line = calib.layout_for(cal, "m7i.48xlarge")
    assert ranks is None and line.startswith("layout: the rule (one rank per socket)")
    assert calib.layout_for(None, MACHINE) == (None, "")
    assert calib.layout_for(calib.from_mapping(calibration(), "x"), MACHINE) == (None, "")


AMX = tm.CompileCost(**COMPILE)


def test_compile_choice_says_the_choice_and_its_reason():
    choice, line = compile_choice("", AMX)  # auto by default, the measurement passed for the job to decide
    assert choice == "auto"
    assert line.startswith("compile: auto -> compiled if the run has more than 150 steps (0.400 s saved per step, "
                           "60 s to compile")
    assert compile_choice("auto", AMX, steps=100)[1].startswith("compile: auto -> 100 steps x (1.330 - 0.930) s = "
                                                                "40 s saved <= 60 s to compile: eager")
    assert compile_choice("", None) == (None, "compile: auto -> eager: no compile measurement for this cluster "
                                            "(`fab bench --compile` measures one)")
    assert compile_choice("on", AMX) == ("on", "compile: on (given: --compile on)")
    slower = tm.CompileCost(0.1, 0.12, 30)
    assert "no faster than eager" in compile_choice("auto", slower)[1]
    with pytest.raises(JobArgsError, match="--compile: 'fast' is not allowed"):
        compile_choice("fast", AMX)


INVENTORY = f"name: lab\nuser: ubuntu\ninstance_type: {MACHINE}\nhosts: [192.0.2.10, 192.0.2.11]\n"


def _fab_train(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    return subprocess.run([sys.executable, "-m", "fabric", "train", "--cluster", str(tmp_path / "lab.yaml"),
                           "--nodes", "2", "--model", "/models/m", "--train-file", "/data/t.json", "--dry-run", *argv],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)


def test_fab_train_dry_run_takes_the_measured_layout_and_the_compile_figures(tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "lab.yaml").write_text(INVENTORY)
    rule = _fab_train(tmp_path)  # no calibration: the rule (one rank per socket: 2 on this type), eager
    assert rule.returncode == 0, rule.stdout + rule.stderr
    assert "-ppn 2" in rule.stdout and "measured fastest" not in rule.stdout and "--compile " not in rule.stdout
    assert "compile: auto -> eager: no compile measurement" in rule.stdout

    layout = {**LAYOUT, "candidates": {"1": {"step_s": 0.2}, "2": {"step_s": 0.5}}}  # 1 rank: 80 samples/s
    path = calib.path_for(tmp_path / "config" / "xeon-cluster", "lab")
    path.parent.mkdir(parents=True)
    path.write_text(calib.from_mapping(calibration(layout=layout, compile=COMPILE), "t").to_json())
    measured = _fab_train(tmp_path)
    assert measured.returncode == 0, measured.stdout + measured.stderr
    assert "-ppn 1" in measured.stdout
    assert "layout: 1 rank(s) per node, measured fastest by fab bench on 2026-11-26" in measured.stdout
    assert "--compile auto --compile_estimate 1.3300,0.9300,60.0" in measured.stdout
    assert "compile: auto -> compiled if the run has more than 150 steps" in measured.stdout
    given = _fab_train(tmp_path, "--ranks-per-node", "2", "--compile", "off", "--max-steps", "500")
    assert given.returncode == 0, given.stdout + given.stderr
    assert "-ppn 2" in given.stdout and "measured fastest" not in given.stdout and "compile: off (given" in given.stdout
    assert "--compile off" in given.stdout

    path.write_text("{not json")  # a broken calibration is named and left aside, never stops a launch
    broken = _fab_train(tmp_path)
    assert broken.returncode == 0 and "-ppn 2" in broken.stdout and "not JSON" in broken.stdout


def test_fab_train_refuses_a_bad_compile_choice_in_one_line(tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "lab.yaml").write_text(INVENTORY)
    bad = _fab_train(tmp_path, "--compile", "fast")
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: --compile: 'fast' is not allowed; choose auto")
    assert len(bad.stderr.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- fab plan and fab bench (pure)

from cluster.cost import benchplan, costplan, plan_options  # noqa: E402
from cluster.stack.catalog import custom, lookup  # noqa: E402
from cluster.inventory import Inventory  # noqa: E402

PRICE = costplan.Price(1.0, "spot", "given")


def _plan(cal_data: dict, **options):
    cal = calib.from_mapping({"instance_type": MACHINE, **cal_data}, "cal.json")  # measured on the type planned
    o = plan_options.PlanOptions(nodes="1,2", model="", batch=None, samples=1_600, instance_type=MACHINE, **options)
    inputs = plan_options.plan_inputs(None, o, cal)
    return inputs, costplan.plan_rows(inputs, PRICE)


def test_fab_plan_takes_the_measured_layout_and_scales_the_measured_compute_by_its_speed_up():
    inputs, rows = _plan(calibration(layout=LAYOUT))
    assert inputs.ranks_per_node == 2
    assert inputs.rate(1) == pytest.approx(40.0 * 64.0 / 40.0) and inputs.rate(2) == pytest.approx(38.0 * 1.6)
    line = dict((name, (value, source)) for name, value, source in inputs.sources)["ranks per node"]
    assert line[0] == "2" and line[1].startswith("measured fastest by fab bench --layouts on 2026-11-26")
    assert rows[1].prediction.ranks_per_node == 2  # (the model runs one node as one process)
    given, _ = _plan(calibration(layout=LAYOUT), ranks_per_node=1)
    assert given.ranks_per_node == 1 and given.rate(1) == pytest.approx(40.0)  # as measured, with 1 rank
    rule, _ = _plan(calibration())
    assert rule.ranks_per_node == 1  # the calibration's own (fab bench runs one rank per node)


def test_fab_plan_adds_the_compile_to_the_start_up_where_it_pays():
    cheap = {"eager_step_s": 0.5, "compiled_step_s": 0.25, "compile_s": 10.0}
    # 1 node: 1600 / 16 = 100 steps x 0.25 s = 25 s saved > 10 s: compiled; 2 nodes: 50 x 0.25 = 12.5 s > 10 s too
    inputs, rows = _plan(calibration(compile=cheap))
    eager_inputs, eager_rows = _plan(calibration(compile=cheap), compile="off")
    for row, eager in zip(rows, eager_rows):
        assert row.prediction.compile_s == 10.0 and eager.prediction.compile_s == 0.0
        assert row.prediction.startup_s == pytest.approx(eager.prediction.startup_s + 10.0)
        assert row.prediction.compute_s == pytest.approx(eager.prediction.compute_s * 0.5)
    text = costplan.render_table(rows)
    assert "compiled: 1, 2 node(s): run time includes 10 s of compile in the start-up" in text
    assert [row.as_json() for row in rows][0]["compile_seconds"] == 10.0
    dear = {**cheap, "compile_s": 20.0}  # 2 nodes save 12.5 s < 20 s: eager there
    _, rows = _plan(calibration(compile=dear))
    assert [r.prediction.compile_s for r in rows] == [20.0, 0.0]
    assert "eager: 2 node(s)" in costplan.render_table(rows)
    _, forced = _plan(calibration(compile=dear), compile="on")
    assert [r.prediction.compile_s for r in forced] == [20.0, 20.0]
    with pytest.raises(ValueError, match="--compile: on needs the calibration's compile figures"):
        _plan(calibration(), compile="on")
    with pytest.raises(ValueError, match="--compile: 'yes' is not allowed"):
        _plan(calibration(), compile="yes")


def test_the_candidate_layouts_are_those_the_node_has_cores_for():
    assert benchplan.layout_candidates(lookup(MACHINE), "gloo") == [1, 2, 4, 8]  # 2 sockets x 16 cores
    assert benchplan.layout_candidates(custom("two", 1, 2), "gloo") == [1, 2]  # this 2-core machine, one node
    assert benchplan.layout_candidates(custom("one", 1, 1), "gloo") == [1]


def test_each_layout_run_is_the_real_job_in_that_layout():
    inv = Inventory.from_mapping({"name": "lab", "instance_type": MACHINE, "hosts": ["192.0.2.10", "192.0.2.11"]},
                                 default_name="lab")
    o = benchplan.check_options(benchplan.BenchOptions(nodes=1, steps=3, layouts=True))
    machine, plans = benchplan.plan_layout_runs(inv, o)
    assert machine == MACHINE and [p.layout.ranks_per_node for p in plans] == [1, 2, 4, 8]
    for p in plans:
        assert len(p.launch.hosts) == 1 and p.launch.world_size == p.layout.ranks_per_node
        args = list(p.training_args)
        assert args[args.index("--max_steps") + 1] == "4" and args[args.index("--compile") + 1] == "off"
    assert len({p.job_id for p in plans}) == 4
    assert plans[0].prepare[0].endswith(f"training.synthetic --out xeon-cluster-data/synthetic-qa --task qa "
                                        f"--model-dir {SYNTHETIC_MODEL_DIR} >/dev/null")  # no shared root here
    args = list(plans[0].training_args)
    assert args[args.index("--model_name_or_path") + 1] == SYNTHETIC_MODEL_DIR
    mine = benchplan.check_options(benchplan.BenchOptions(nodes=1, model="/models/m", seq_len=128, layouts=True))
    args = list(benchplan.plan_layout_runs(inv, mine)[1][0].training_args)  # a model of the nodes on the demo's data
    assert args[args.index("--model_name_or_path") + 1] == "/models/m" and "--validation_file" not in args
    assert args[args.index("--max_seq_length") + 1] == "128" and args.count("--max_seq_length") == 1
    assert len(benchplan.plan_bench(inv, o).launch.hosts) == 1  # --layouts allows one node
    with pytest.raises(ValueError, match="an all-reduce needs two"):
        benchplan.plan_bench(inv, benchplan.BenchOptions(nodes=1))
    choice = benchplan.layout_choice(machine, plans[:2], [0.4, 0.5], o.batch, "2026-11-26T03:10:00Z")
    assert choice.step_s == {1: 0.4, 2: 0.5} and choice.nodes == 1 and choice.ranks_per_node == 2
    cal = calib.from_mapping(calibration(layout=choice.to_mapping(), compile=COMPILE), "x")
    table = benchplan.render_table(cal)
    assert "compile (one node): step 1330.0 ms eager, 930.0 ms compiled, 60.0 s to compile" in table
    assert "         2     500.0            64.0  fastest" in table


def test_the_bench_figures_compile_block():
    from training.bench import compile_figures

    assert compile_figures((0.5, 3.0), (0.4, 65.0)) == {"eager_step_s": 0.5, "compiled_step_s": 0.4, "compile_s": 62.0}
    assert compile_figures((0.5, 3.0), (0.4, 2.0))["compile_s"] == 0.001  # never 0: the calibration wants > 0
