"""--task causal-lm: the loss mask and the collator on the demo's tokenizer, the task's arguments, the LoRA step's
FLOPs against torch's own FLOP counter, DDP all-reducing only the adapters' gradients (2 gloo ranks on
loopback), and a 2-rank LoRA run under mpirun that learns, checkpoints only the adapter and resumes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.training.conftest import free_port, mpi_env, read_summary, requires_mpi, run_mpi
from tests.training.ddp_ranks import lora_model, reduced_by_ddp
from training import causal_lm
from training.causal_lm import IGNORED


@pytest.fixture(scope="module")
def causal_demo(tmp_path_factory) -> dict:
    from training.synthetic import write_demo

    return write_demo(tmp_path_factory.mktemp("causal-demo"), task="causal-lm", examples=240, seed=0)


@pytest.fixture(scope="module")
def tokenizer(causal_demo):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(causal_demo["model"])


# ---- the loss mask


def test_prompt_tokens_and_padding_are_left_out_of_the_loss(tokenizer):
    examples = {"prompt": ["repeat key of :", "repeat a :"], "completion": ["key of .", "a ."]}
    batch = causal_lm.tokenize(examples, tokenizer, ("prompt", "completion"), max_seq_length=16)
    prompt = tokenizer("repeat key of :")["input_ids"]
    completion = tokenizer("key of .", add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    assert batch["input_ids"][0] == prompt + completion + [eos]
    assert batch["labels"][0] == [IGNORED] * len(prompt) + completion + [eos]
    collated = causal_lm.CausalLM().collator(tokenizer)([{k: batch[k][i] for k in batch} for i in range(2)])
    short = len(batch["input_ids"][1])
    assert collated["labels"].shape == collated["input_ids"].shape == (2, len(batch["input_ids"][0]))
    assert collated["labels"][1, short:].tolist() == [IGNORED] * (collated["labels"].shape[1] - short)
    assert collated["attention_mask"][1].tolist() == [1] * short + [0] * (collated["labels"].shape[1] - short)
    learnt = collated["labels"][0] != IGNORED
    assert collated["input_ids"][0][learnt].tolist() == completion + [eos]


def test_plain_text_learns_every_token_and_truncation_drops_rows_with_nothing_to_learn():
    rows = causal_lm.features(None, [[5, 6, 7]], eos=3, max_length=8)
    assert rows["labels"] == rows["input_ids"] == [[5, 6, 7, 3]]
    cut = causal_lm.features([[9] * 6, [9, 9]], [[5, 6], [5, 6]], eos=3, max_length=6)
    assert cut["input_ids"] == [[9, 9, 5, 6, 3]]  # the first row's completion was cut off entirely
    assert cut["labels"] == [[IGNORED, IGNORED, 5, 6, 3]]


def test_alpaca_rows_become_instruction_and_input_prompts():
    examples = {"instruction": ["add", "greet"], "input": ["1 2", ""], "output": ["3", "hi"]}
    assert causal_lm.prompt_texts(examples, ("instruction", "output")) == ["add\n\n1 2\n\n", "greet\n\n"]


def test_the_demo_is_byte_identical_for_a_seed_and_its_completions_copy_the_prompt(tmp_path):
    import hashlib

    from training.synthetic import write_demo

    def digests(root: Path) -> dict[str, str]:
        return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(root.rglob("*")) if p.is_file()}

    first = write_demo(tmp_path / "a", task="causal-lm", examples=20, seed=3)
    write_demo(tmp_path / "b", task="causal-lm", examples=20, seed=3)
    assert digests(tmp_path / "a") == digests(tmp_path / "b") and "model/model.safetensors" in digests(tmp_path / "a")
    rows = [json.loads(line) for line in Path(first["train_file"]).read_text().splitlines()]
    assert len(rows) == 20 and all(r["completion"] == r["prompt"][len("repeat "):-len(":")] + "." for r in rows)


# ---- the arguments


@pytest.mark.parametrize("argv, message", [
    (["--task", "qa", "--peft", "lora"], "--peft lora is not allowed with --task qa"),
    (["--peft", "qlora"], "--peft: 'qlora' is not allowed; choose one of none, lora"),
    (["--lora_r", "0"], "--lora_r 0 is not allowed"),
    (["--lora_alpha", "-1"], "--lora_alpha -1 is not allowed"),
    (["--lora_dropout", "1"], "--lora_dropout 1 is not allowed"),
    (["--lora_target_modules", "q_proj;rm -rf"], "--lora_target_modules 'q_proj;rm -rf' is not allowed"),
])
def test_bad_lora_settings_are_one_line_naming_the_option(argv, message):
    from training import args
    from training.errors import BadInput

    with pytest.raises(BadInput) as caught:
        args.parse_job_arguments(["--task", "causal-lm", *argv])
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_causal_lm_defaults_and_target_modules_per_family():
    from cluster.job import lora
    from training import args

    model, data, job = args.parse_job_arguments(["--task", "causal-lm"])
    assert (model.model_name_or_path, data.dataset_name, data.max_seq_length, job.peft) == (
        "Qwen/Qwen2.5-0.5B", "tatsu-lab/alpaca", 512, "none")
    model, _, _ = args.parse_job_arguments(["--task", "qa"])
    assert model.model_name_or_path == "distilbert-base-uncased"
    assert lora.target_modules("llama", None) == lora.target_modules("qwen2", None) == (
        "q_proj", "k_proj", "v_proj", "o_proj")
    assert lora.target_modules("llama", "q_proj, v_proj") == ("q_proj", "v_proj")
    with pytest.raises(lora.LoraSettingError, match="no default for model type 't5'"):
        lora.target_modules("t5", None)


def test_a_target_module_the_model_lacks_is_named(causal_demo):
    from training.errors import BadInput

    with pytest.raises(BadInput, match="--lora_target_modules: c_attn is not a module of 'llama' models"):
        lora_model(causal_demo["model"], lora_target_modules="c_attn")


# ---- FLOPs


def test_lora_step_flops_match_torchs_flop_counter(causal_demo):
    """The job's model FLOPs of a LoRA step (training/mfu.py, cluster/cost/flops.py) against what torch counts
    for one forward and backward of the same model: within 10 % (the model leaves out the first layer's input
    gradient, which nothing needs)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from training import mfu

    model = lora_model(causal_demo["model"])
    seq, batch = 32, 4
    ids = torch.randint(10, model.config.vocab_size, (batch, seq))
    counter = FlopCounterMode(display=False)
    with counter:
        model(input_ids=ids, labels=ids).loss.backward()
    figures = mfu.model_flops(model, task="causal-lm", max_seq_length=seq, tokens_per_sample=seq, global_batch=batch,
                              nodes=1, peak=None)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert figures.trained_params == trained < figures.matmul_params / 10
    measured = counter.get_total_flops() / batch
    assert abs(figures.per_sample - measured) / measured < 0.10, (figures.per_sample, measured)
    # a full fine-tune of the same shape costs 6 per parameter per token, LoRA about 4
    full = mfu.flops.train_flops_per_sample(figures.matmul_params, figures.layers, figures.hidden, seq)
    assert 0.6 < figures.per_sample / full < 0.75


# ---- DDP all-reduces only the adapters' gradients


@pytest.mark.slow
def test_ddp_all_reduces_only_the_adapters_gradients(causal_demo, tmp_path):
    import torch.multiprocessing as mp

    record = str(tmp_path / "reduced")
    mp.spawn(reduced_by_ddp, args=(2, free_port(), causal_demo["model"], record), nprocs=2, join=True)
    for rank in (0, 1):
        seen = json.loads(Path(f"{record}.{rank}").read_text())
        assert seen["reduced"] == seen["trainable"] < seen["parameters"] / 10, seen


# ---- a 2-rank LoRA run: learns, checkpoints the adapter, resumes


def lora_args(demo: dict, output_dir, *extra: str) -> list[str]:
    return [*demo["args"], "--peft", "lora", "--output_dir", str(output_dir), "--checkpoint_minutes", "0",
            "--per_device_train_batch_size", "8", "--logging_steps", "2", "--seed", "7", "--spot_watch", "off",
            "--dist_backend", "gloo", "--save_steps", "8", *extra]


def explain(result) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-6000:]}"


@pytest.mark.mpi
@pytest.mark.slow
@requires_mpi
def test_two_ranks_lora_learn_checkpoint_only_the_adapter_and_resume(causal_demo, tmp_path):
    import torch

    out = tmp_path / "out"
    result = run_mpi([lora_args(causal_demo, out, "--max_steps", "8")] * 2, mpi_env())
    assert result.returncode == 0, explain(result)
    first = read_summary(out)
    assert first["status"] == "completed" and first["world_size"] == 2
    assert first["last_logged_loss"] < first["first_logged_loss"]
    assert 0 < first["trainable_parameters"] < first["parameters"] / 10
    assert first["settings"]["peft"]["target_modules"] == "q_proj,k_proj,v_proj,o_proj"
    assert {"adapter_model.safetensors", "adapter_config.json"} <= {p.name for p in out.iterdir()}
    assert not (out / "model.safetensors").exists(), "the output holds the adapter, not a copy of the base model"
    checkpoint = out / "checkpoint-8"
    names = {p.name for p in checkpoint.iterdir()}
    assert {"adapter_model.safetensors", "optimizer.pt", "rng_state_0.pth", "rng_state_1.pth",
            "xeon-checkpoint.json"} <= names and "model.safetensors" not in names, names
    state = torch.load(checkpoint / "optimizer.pt", weights_only=False)["state"]
    assert sum(s["exp_avg"].numel() for s in state.values()) == first["trainable_parameters"]

    result = run_mpi([lora_args(causal_demo, out, "--max_steps", "14", "--resume")] * 2, mpi_env())
    assert result.returncode == 0, explain(result)
    second = read_summary(out)
    assert second["resumed_from"]["step"] == 8 and second["start_step"] == 8 and second["steps"] == 14
    assert second["weights_sha256_per_rank"][0] == second["weights_sha256_per_rank"][1]
    assert math.isfinite(second["metrics"]["eval_loss"]) and second["metrics"]["perplexity"] > 1
    assert second["last_logged_loss"] < first["first_logged_loss"]


# ---- the planner's 1B-class models, against transformers' own configs


@pytest.mark.parametrize("name, config", [
    ("llama-3.2-1b", dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                          num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                          tie_word_embeddings=True)),
    ("qwen2.5-1.5b", dict(model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                          num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                          tie_word_embeddings=True)),
])
def test_the_catalogued_causal_lms_and_their_adapters_match_the_real_models(name, config):
    """The planner's sizes (cluster/cost/models.py) and LoRA count (cluster/job/lora.py) against the model
    transformers builds from the published config (on the meta device: no weights) and peft's adapters."""
    from types import SimpleNamespace

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from cluster.cost import models
    from cluster.job import lora
    from training import mfu

    settings = dict(config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(settings.pop("model_type"), **settings))
    size = models.lookup_model(name)
    matmul, trained, layers, hidden = mfu.model_shape(model)
    assert (sum(p.numel() for p in model.parameters()), matmul, layers, hidden) == (
        size.params, size.matmul_params, size.layers, size.hidden)
    with torch.device("meta"):
        adapted = causal_lm.apply_lora(model, SimpleNamespace(lora_r=16, lora_alpha=32.0, lora_dropout=0.0,
                                                              lora_target_modules=None))
    assert sum(p.numel() for p in adapted.parameters() if p.requires_grad) == lora.adapter_parameters(
        size.attention_shapes(), 16)
