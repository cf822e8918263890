"""The planner's compile term (cluster/cost/timemodel.py): start-up, step time and the auto rule."""

import pytest

from cluster.cost import timemodel as tm

# the AMX Xeon's full DistilBERT step at 384 tokens, 1 rank x 16 threads: 1.33 s eager, 0.93 s compiled, ~60 s
AMX = tm.CompileCost(eager_step_s=1.33, compiled_step_s=0.93, compile_s=60.0)
WORK = tm.Workload(params=66_362_880, samples=3_200, batch_per_rank=32)
NET = tm.Network(25)


def test_compile_time_is_added_to_the_start_up_and_the_step_is_scaled():
    eager = tm.predict(WORK, NET, 1, 32 / 1.33)
    compiled = tm.predict(WORK, NET, 1, 32 / 1.33, compiled=AMX)
    assert compiled.compile_s == 60.0 and eager.compile_s == 0.0
    assert compiled.startup_s == pytest.approx(eager.startup_s + 60.0)
    assert compiled.step_seconds == pytest.approx(0.93) and eager.step_seconds == pytest.approx(1.33)
    assert compiled.run_seconds == pytest.approx(eager.startup_s + 60 + 100 * 0.93)
    assert compiled.efficiency == pytest.approx(1.0)  # the single-node reference is compiled too
    two = tm.predict(WORK, NET, 2, 32 / 1.33, compiled=AMX)
    assert two.startup_s == pytest.approx(tm.startup_seconds(2) + 60.0)  # paid once, every rank compiling at once


def test_auto_compiles_only_when_the_saving_exceeds_the_compile_time():
    assert tm.compile_pays(151, AMX)[0] is True  # 151 x 0.4 s = 60.4 s > 60 s
    assert tm.compile_pays(150, AMX)[0] is False  # 60 s saved: not more than the compile
    yes, why = tm.compile_pays(2_766, AMX)  # a SQuAD epoch at global batch 32
    assert yes and why.startswith("2766 steps x (1.330 - 0.930) s = 1106 s saved > 60 s to compile: compiled")
    slower = tm.CompileCost(eager_step_s=0.1, compiled_step_s=0.12, compile_s=30)
    assert tm.compile_pays(10**6, slower)[0] is False
    assert tm.compile_pays(10**6, None) == (False, "no compile measurement (fab bench measures one): eager")


def test_fab_train_compile_option_becomes_the_job_s_with_the_calibration_s_estimate():
    from cluster.cost import calibration as calib
    from cluster.job.job_args import JobArgsError, compile_choice
    from cluster.job.request import BuiltinJob
    from tests.unit.test_jobplan import inventory, job_plan

    assert compile_choice("")[0] is None and compile_choice("ON")[0] == "on" and compile_choice("off", AMX)[0] == "off"
    assert compile_choice("auto", AMX)[0] == "auto"
    args = list(job_plan(inventory(), 2, compile="auto", compile_estimate=(1.33, 0.93, 60.0)).training_args)
    assert args[args.index("--compile") + 1] == "auto"
    assert args[args.index("--compile_estimate") + 1] == "1.3300,0.9300,60.0"
    assert "--compile" not in job_plan(inventory(), 2, compile=BuiltinJob().compile).training_args
    with pytest.raises(JobArgsError, match=r"^--compile: 'maybe' is not allowed; choose auto, on, off"):
        compile_choice("maybe")
    base = {"version": calib.VERSION, "cluster": "c", "model": "m", "params": 10, "batch": 4, "compute": {"1": 5.0}}
    assert calib.from_mapping(base).compile_cost() is None
    measured = calib.from_mapping({**base, "compile": {"eager_step_s": 1.33, "compiled_step_s": 0.93, "compile_s": 60}})
    assert measured.compile_cost() == AMX and calib.parse(measured.to_json()).compile_cost() == AMX
    with pytest.raises(calib.CalibrationError, match="compile.compile_s is -1"):
        calib.from_mapping({**base, "compile": {"eager_step_s": 1, "compiled_step_s": 1, "compile_s": -1}})
