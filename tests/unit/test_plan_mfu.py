"""`fab plan`'s predicted MFU (cluster/cost/plan_mfu.py on cluster/cost/costplan.py's plan)."""

import json

import pytest

from cluster.cost import costplan, flops, plan_options
from cluster.cost.costplan import Price
from cluster.cost.plan_options import PlanOptions
from cluster.cost.plan_mfu import plan_flops

PRICE = Price(3.0, "spot", "given")


def planned(**options):
    o = PlanOptions(**options)
    inputs = plan_options.plan_inputs(None, o)
    return inputs, costplan.plan_rows(inputs, PRICE), plan_flops(o, inputs)


def test_recipe_plan_predicts_mfu_against_the_r7iz_amx_peak():
    inputs, rows, f = planned(nodes="1,2")
    assert f.peak.precision == flops.AMX_BF16 and f.peak.flops_per_s == 32 * 3.9e9 * 1024
    assert f.per_sample == flops.train_flops_per_sample(42_528_768, 6, 768, 384)
    one = f.mfu(inputs, rows[0])
    # the recipe's 26-minute epoch: 88,524 samples x 106 GFLOP over (26 min - start-up) = 6.1 TFLOP/s, 4.8 % of 128
    expected = f.per_sample * 88_524 / rows[0].prediction.epoch_seconds / f.peak.flops_per_s
    assert one == pytest.approx(expected) and 0.04 < one < 0.06
    assert f.mfu(inputs, rows[1]) < one  # communication costs utilisation
    line = f.line(inputs, rows)
    assert line.startswith("MFU (model FLOP/s per node over the peak, 127.80 TFLOP/s bf16 "
                           "(AMX)") and "1 node(s) 4." in line
    assert [r["mfu"] for r in json.loads(f.json(inputs, rows))] == [round(f.mfu(inputs, r), 5) for r in rows]
    assert {name for name, _, _ in f.sources} == {"model FLOPs", "peak"}


def test_ice_lake_is_measured_against_its_fp32_peak_and_an_unknown_model_gets_no_mfu():
    _, _, c6i = planned(nodes="1", instance_type="c6i.16xlarge")
    assert c6i.peak.precision == flops.FP32_AVX512 and c6i.peak.flops_per_s == 32 * 3.5e9 * 64
    inputs, rows, unknown = planned(nodes="1", model="my-model", params="50M", single_node_time="1h")
    assert unknown.mfu(inputs, rows[0]) is None
    assert unknown.line(inputs, rows).startswith("MFU: not predicted")
