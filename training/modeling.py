"""Tokenizer and model for the task; the QA pre-processing needs a fast tokenizer's offsets."""

from __future__ import annotations

from training.errors import BadInput


def load_tokenizer(model_args, task: str):
    from transformers import AutoTokenizer

    name = model_args.tokenizer_name or model_args.model_name_or_path
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, cache_dir=model_args.cache_dir)
    except (OSError, ValueError) as exc:
        raise BadInput(f"--model_name_or_path/--tokenizer_name {name!r}: no tokenizer could be loaded "
                       f"({str(exc).splitlines()[0][:200]}); give a hub id or a directory with tokenizer "
                       f"files") from None
    if not getattr(tokenizer, "is_fast", False):
        raise BadInput(
            f"tokenizer of {name!r} is {type(tokenizer).__name__}, which has no fast (Rust `tokenizers`) "
            f"implementation; --task {task} needs one for offset mappings and overflowing tokens. Use a model "
            "whose tokenizer ships tokenizer.json (e.g. distilbert-base-uncased, bert-base-uncased) or "
            "convert it with transformers' convert_slow_tokenizer and pass --tokenizer_name")
    return tokenizer


def load_model(model_args, task: str, num_labels: int | None = None, label_names=None):
    from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForQuestionAnswering,
                              AutoModelForSequenceClassification)

    name = model_args.model_name_or_path
    try:
        if task == "causal-lm":
            return AutoModelForCausalLM.from_pretrained(name, cache_dir=model_args.cache_dir)
        if task == "qa":
            model = AutoModelForQuestionAnswering.from_pretrained(name, cache_dir=model_args.cache_dir)
        else:
            config = AutoConfig.from_pretrained(name, cache_dir=model_args.cache_dir, num_labels=num_labels)
            if label_names is not None:
                config.id2label = {i: str(label) for i, label in enumerate(label_names)}
                config.label2id = {str(label): i for i, label in enumerate(label_names)}
            model = AutoModelForSequenceClassification.from_pretrained(name, config=config,
                                                                       cache_dir=model_args.cache_dir)
    except (OSError, ValueError) as exc:
        raise BadInput(f"--model_name_or_path {name!r}: the model could not be loaded "
                       f"({str(exc).splitlines()[0][:200]})") from None
    batch_mean_loss(model)
    return model


def batch_mean_loss(model) -> None:
    """Tell the Trainer that the model's loss is the mean over its batch (one label per example or per span).

    A model whose forward takes **kwargs is otherwise taken to divide its loss by `num_items_in_batch`, the
    label count over every rank; the Trainer then multiplies the loss by the number of ranks to undo DDP's
    averaging. Heads that ignore `num_items_in_batch` (DistilBERT's, BERT's) would report and optimise N times
    the loss at N ranks, and with gradient accumulation the sum of the micro-batches' means. With
    `accepts_loss_kwargs` False the Trainer divides by the accumulation steps and DDP averages over the ranks:
    the true mean at every node count (docs/your-own-script.md)."""
    model.accepts_loss_kwargs = False
