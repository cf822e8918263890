"""One rank of the 2-rank gloo check that DDP all-reduces only the LoRA adapters' gradients
(tests/training/test_causal_lm.py). Its own small module, so a spawned rank imports torch, transformers and peft
and not the test module (a forked one could hang: the parent's OpenMP threads do not survive a fork)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace


def lora_model(model_dir: str, **overrides):
    """The demo's tiny Llama with the job's default LoRA adapters (no dropout), or `overrides`' settings."""
    from transformers import AutoModelForCausalLM

    from cluster.job import lora
    from training import causal_lm

    settings = {"lora_r": lora.DEFAULT_RANK, "lora_alpha": lora.DEFAULT_ALPHA, "lora_dropout": 0.0,
                "lora_target_modules": None, **overrides}
    return causal_lm.apply_lora(AutoModelForCausalLM.from_pretrained(model_dir), SimpleNamespace(**settings))


def reduced_by_ddp(rank: int, world: int, port: int, model_dir: str, record: str) -> None:
    """One backward under DDP with a comm hook that counts what each bucket all-reduces; writes
    {"reduced", "trainable", "parameters"} to `record`.<rank>."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DistributedDataParallel(lora_model(model_dir))
    reduced: list[int] = []

    def counting_hook(state, bucket):
        reduced.append(bucket.buffer().numel())
        return allreduce_hook(state, bucket)

    model.register_comm_hook(None, counting_hook)
    ids = torch.randint(10, 100, (2, 16)) + rank
    model(input_ids=ids, labels=ids).loss.backward()
    Path(f"{record}.{rank}").write_text(json.dumps({
        "reduced": sum(reduced), "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "parameters": sum(p.numel() for p in model.parameters())}))
    dist.destroy_process_group()
