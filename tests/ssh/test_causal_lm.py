"""`fab train --task causal-lm --peft lora` on a local cluster: the offline demo's tiny Llama fine-tuned with LoRA on
two nodes under real sshd and Intel MPI; the loss falls, the adapters are a small share of the parameters and the
output holds the adapter, not the base model. About 40 s (the demo's model is made once per cluster)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.ssh.conftest import run_fab

pytestmark = [pytest.mark.ssh, pytest.mark.mpi]


def test_lora_on_two_nodes_learns_and_writes_only_the_adapter(installed_cluster):
    result = run_fab(installed_cluster, "train", "--task", "causal-lm", "--peft", "lora", "--synthetic-examples",
                     "400", "--nodes", "2", timeout=600)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    started = re.search(r"^job (\S+) started on node0 .*; output (\S+)$", out, re.M)
    assert started, out[-3000:]
    output_dir = Path(started.group(2))
    try:
        data = json.loads((output_dir / "summary.json").read_text())
        assert data["task"] == "causal-lm" and data["status"] == "completed" and data["nodes"] == 2
        assert data["last_logged_loss"] < data["first_logged_loss"], (data["first_logged_loss"],
                                                                      data["last_logged_loss"])
        assert 0 < data["trainable_parameters"] < data["parameters"] / 10
        assert data["settings"]["peft"]["method"] == "lora" and data["samples_per_second"] > 0
        assert data["weights_sha256_per_rank"][0] == data["weights_sha256_per_rank"][1]
        names = {p.name for p in output_dir.iterdir()}
        assert {"adapter_model.safetensors", "adapter_config.json"} <= names and "model.safetensors" not in names
        adapter = json.loads((output_dir / "adapter_config.json").read_text())
        assert adapter["peft_type"] == "LORA" and sorted(adapter["target_modules"]) == ["k_proj", "o_proj", "q_proj",
                                                                                         "v_proj"]
    finally:
        shutil.rmtree(output_dir, ignore_errors=True)
