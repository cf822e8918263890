"""What the job can train, by --task name, and the data and model it prepared for the run.

Every task has the same four methods: `prepare(train_raw, eval_raw, tokenizer, parsed, columns)`
-> (train features, eval examples, eval features or None, model); `collator(tokenizer)`;
`predict_inputs(eval_features)` (what `Trainer.predict` gets, on every rank); and
`scores(output, eval_raw, eval_features, data_args)` -> metrics (rank 0 only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from training.causal_lm import CausalLM
from training.classification import Classification
from training.qa import QuestionAnswering

TASKS = {"qa": QuestionAnswering, "classification": Classification, "causal-lm": CausalLM}


def for_name(name: str):
    """The task object for --task `name` (the name is checked when the arguments are parsed)."""
    return TASKS[name]()


@dataclass
class Prepared:
    """Tokenizer, data and model of one run, as `Job._prepare` made them."""

    tokenizer: Any
    source: dict  # where the data came from, as the summary reports it
    train_examples: int
    train_features: Any
    eval_raw: Any | None  # evaluation examples; None when there is nothing to evaluate
    eval_features: Any | None
    model: Any
    tokens_per_sample: float  # real (unpadded) tokens per training feature, on average
    parameters: int  # the model's, every one
    trainable_parameters: int  # those that train (with --peft lora: the adapters')
