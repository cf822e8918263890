"""fab plan --peft lora (pure): only the adapters are all-reduced, the checkpoint is the adapter's, the step's model
FLOPs are a frozen base's, and a model without a catalogued shape is refused with one line."""

from __future__ import annotations

import pytest

from cluster.cost import flops, models
from cluster.cost import timemodel as tm
from cluster.cost.plan_mfu import plan_flops
from cluster.cost.plan_options import PlanOptions, plan_inputs
from cluster.job import lora

LLAMA = dict(nodes="4", model="meta-llama/Llama-3.2-1B", dataset="alpaca", batch=8, provisioning=False)


def sources(inputs) -> dict[str, tuple[str, str]]:
    return {name: (value, where) for name, value, where in inputs.sources}


def test_lora_all_reduces_only_the_adapters_and_saves_only_them():
    full, adapted = plan_inputs(None, PlanOptions(**LLAMA)), plan_inputs(None, PlanOptions(**LLAMA, peft="lora"))
    size = models.lookup_model("llama-3.2-1b")
    adapters = lora.adapter_parameters(size.attention_shapes(), lora.DEFAULT_RANK)
    assert full.workload.params == size.params and adapted.workload.params == adapters == 3_407_872
    assert sources(adapted)["checkpoint"][0] == f"{adapters * 12 / 2**20:,.0f} MiB per rank's copy"
    assert sources(full)["checkpoint"][0] == f"{size.params * 12 / 2**20:,.0f} MiB per rank's copy"
    full_row, lora_row = (tm.predict(i.workload, i.network, 4, i.samples_per_s, ranks_per_node=i.ranks_per_node)
                          for i in (full, adapted))
    assert lora_row.comm_s / lora_row.steps < full_row.comm_s / full_row.steps / 100
    assert "LoRA: 3.4M trained" in adapted.header


def test_the_lora_plans_flops_and_rate_are_the_frozen_bases():
    options = PlanOptions(**LLAMA, peft="lora")
    inputs = plan_inputs(None, options)
    size = models.lookup_model("llama-3.2-1b")
    expected = flops.train_flops_per_sample(size.matmul_params, size.layers, size.hidden, 256, 3_407_872)
    assert plan_flops(options, inputs).per_sample == expected
    distil = models.lookup_model("distilbert-base-uncased")
    reference = tm.default_throughput("r7iz.metal-16xl", "distilbert-base-uncased", "squad").samples_per_s
    assert inputs.samples_per_s == pytest.approx(
        reference * flops.train_flops_per_sample(distil.matmul_params, distil.layers, distil.hidden, 384) / expected)
    full = plan_inputs(None, PlanOptions(**LLAMA))
    assert full.samples_per_s < inputs.samples_per_s  # 6 FLOPs per parameter per token instead of about 4


@pytest.mark.parametrize("options, message", [
    (dict(model="distilbert-base-uncased", dataset="squad", peft="lora"),
     "--peft lora: the attention shape of 'distilbert-base-uncased' is not in the model catalog"),
    (dict(peft="qlora"), "--peft: 'qlora' is not allowed; choose none or lora"),
])
def test_a_plan_lora_cannot_make_is_one_line(options, message):
    with pytest.raises(ValueError) as caught:
        plan_inputs(None, PlanOptions(nodes="2", provisioning=False, **options))
    assert message in str(caught.value) and "\n" not in str(caught.value)
