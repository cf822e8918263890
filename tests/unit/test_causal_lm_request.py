"""fab train --task causal-lm --peft lora: the request and the job's command line it makes (pure), the offline
demo's own model directory, and --peft refused for the other tasks."""

from __future__ import annotations

import pytest

from cluster.inventory import Inventory
from cluster.job.demo import SYNTHETIC_ARGS, synthetic_data
from cluster.job.jobplan import plan
from cluster.job.request import RequestError
from cluster.job.train_options import request_from_options

RUN = "20260101-000000-aaaa"


def local_inventory() -> Inventory:
    data = {"name": "lab", "hosts": [{"name": f"node{i}", "address": f"10.0.0.{10 + i}"} for i in range(2)],
            "sockets": 1, "physical_cores": 2, "shared_cores": True, "shared_output_root": "/var/tmp/runs/lab"}
    return Inventory.from_mapping(data, default_name="lab", kind="local")


def training_args(**options) -> list[str]:
    request, _ = request_from_options(options, local_inventory(), run_id=RUN)
    return list(plan(request, local_inventory()).training_args)


def value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_the_causal_lm_demo_trains_lora_on_its_own_tiny_model():
    args = training_args(task="causal-lm", peft="lora", synthetic_examples=400, nodes=2)
    assert value(args, "--task") == "causal-lm" and value(args, "--peft") == "lora"
    demo = synthetic_data("causal-lm", 400, "python", "/var/tmp/runs/lab")
    assert value(args, "--model_name_or_path") == demo.model != synthetic_data("qa", 400, "python",
                                                                               "/var/tmp/runs/lab").model
    assert value(args, "--max_seq_length") == value(list(SYNTHETIC_ARGS["causal-lm"]), "--max_seq_length")
    assert "--task causal-lm" in demo.prepare and f"--model-dir {demo.model}" in demo.prepare


def test_peft_through_extra_is_the_typed_setting_and_other_tasks_refuse_it():
    args = training_args(task="causal-lm", synthetic_examples=400, extra="--peft lora --lora_r 4")
    assert args.count("--peft") == 1 and value(args, "--peft") == "lora" and value(args, "--lora_r") == "4"
    assert "--peft" not in training_args(task="causal-lm", synthetic_examples=400)
    with pytest.raises(RequestError, match="--peft: lora is not allowed with --task qa; allowed: --task causal-lm"):
        training_args(task="qa", peft="lora", synthetic_examples=400)
    with pytest.raises(RequestError, match="--peft"):
        training_args(task="causal-lm", peft="qlora", synthetic_examples=400)
