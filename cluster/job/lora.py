"""LoRA fine-tuning's settings (pure): the choices of the built-in job's --peft, its defaults, and the
modules LoRA adapts in each model family when --lora_target_modules is not given.

The job (training/args.py, training/causal_lm.py) and the planner (cluster/cost/plan_options.py) read the
same facts.
"""

from __future__ import annotations

import math
import re

PEFT_CHOICES = ("none", "lora")
DEFAULT_PEFT = "none"
DEFAULT_RANK = 16
DEFAULT_ALPHA = 32.0
DEFAULT_DROPOUT = 0.05

# transformers' config.model_type -> the linear layers LoRA adapts: every attention projection, as the
# LoRA paper's best setting (Hu et al. 2021, section 7.1: W_q, W_k, W_v, W_o)
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
TARGET_MODULES: dict[str, tuple[str, ...]] = {
    **{family: ATTENTION for family in ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2",
                                         "gemma3_text", "olmo", "olmo2", "granite", "smollm3")},
    "phi": ("q_proj", "k_proj", "v_proj", "dense"),
    "phi3": ("qkv_proj", "o_proj"),
    "opt": ("q_proj", "k_proj", "v_proj", "out_proj"),
    "gpt2": ("c_attn", "c_proj"),
    "gpt_neox": ("query_key_value", "dense"),
    "falcon": ("query_key_value", "dense"),
    "bloom": ("query_key_value", "dense"),
}
_MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,99}\Z")


class LoraSettingError(ValueError):
    """A LoRA setting the job cannot take; the message names it, the value and what is allowed."""


def target_modules(model_type: str, given: str | None) -> tuple[str, ...]:
    """The modules to adapt: `given` (comma-separated names) or the family's default."""
    if given:
        names = tuple(n.strip() for n in given.split(",") if n.strip())
        bad = [n for n in names if not _MODULE_RE.match(n)]
        if not names or bad:
            raise LoraSettingError(f"--lora_target_modules {given!r} is not allowed; allowed: comma-separated "
                                   "module names (letters, digits, '_' and '.'), e.g. q_proj,v_proj")
        return names
    if model_type not in TARGET_MODULES:
        raise LoraSettingError(f"--lora_target_modules: no default for model type {model_type!r} (defaults for "
                               f"{', '.join(sorted(TARGET_MODULES))}); name the linear layers to adapt, e.g. "
                               "--lora_target_modules q_proj,v_proj")
    return TARGET_MODULES[model_type]


def check(rank: int, alpha: float, dropout: float) -> None:
    """The rank, alpha and dropout LoRA can use; one line naming the first that is not."""
    if rank < 1:
        raise LoraSettingError(f"--lora_r {rank} is not allowed; allowed: a whole number of 1 or more, e.g. 16")
    if not (math.isfinite(alpha) and alpha > 0):
        raise LoraSettingError(f"--lora_alpha {alpha:g} is not allowed; allowed: a number above 0, e.g. 32")
    if not (math.isfinite(dropout) and 0 <= dropout < 1):
        raise LoraSettingError(f"--lora_dropout {dropout:g} is not allowed; allowed: 0 or more and below 1")


def adapter_parameters(shapes: list[tuple[int, int]], rank: int) -> int:
    """Parameters of LoRA adapters of rank `rank` on linear layers of (in, out) `shapes`: A is rank x in,
    B out x rank."""
    return sum(rank * (n_in + n_out) for n_in, n_out in shapes)
