"""Causal language model fine-tuning; `CausalLM` is --task causal-lm for the job (training/tasks.py).

Rows of prompt/completion (or Alpaca's instruction/input/output) train on the completion only: the
prompt's labels are -100, as are the padding's (the collator's). Rows of plain text train on every
token. Each feature ends with the tokenizer's end-of-sequence token. With --peft lora the model is
wrapped in peft's LoRA (cluster/job/lora.py: the modules per model family): only the adapters train,
DDP all-reduces only their gradients, and the output and checkpoints hold only the adapter.
"""

from __future__ import annotations

import math

from training.errors import BadInput

IGNORED = -100  # the label the loss skips (transformers' cross-entropy ignore_index)


def prompt_texts(examples: dict[str, list], columns: tuple[str, str | None]) -> list[str]:
    """The prompts of a batch: the prompt column, or Alpaca's instruction and (when given) input."""
    first, _ = columns
    if first != "instruction":
        return list(examples[first])
    inputs = examples.get("input") or [""] * len(examples[first])
    return [f"{instruction}\n\n{given}\n\n" if given else f"{instruction}\n\n"
            for instruction, given in zip(examples[first], inputs)]


def features(prompts: list[list[int]] | None, targets: list[list[int]], eos: int, max_length: int) -> dict:
    """input_ids, attention_mask and labels of token id lists: `prompts` (None: plain text, every token learnt)
    before `targets`, the end-of-sequence id after, truncated to `max_length`; a row whose learnt tokens are
    all cut off is left out."""
    out: dict[str, list] = {"input_ids": [], "attention_mask": [], "labels": []}
    for index, target in enumerate(targets):
        prompt = prompts[index] if prompts is not None else []
        ids = (prompt + target + [eos])[:max_length]
        labels = ([IGNORED] * len(prompt) + target + [eos])[:max_length]
        if all(label == IGNORED for label in labels):
            continue
        out["input_ids"].append(ids)
        out["attention_mask"].append([1] * len(ids))
        out["labels"].append(labels)
    return out


def tokenize(examples: dict[str, list], tokenizer, columns: tuple[str, str | None], max_seq_length: int) -> dict:
    first, second = columns
    eos = tokenizer.eos_token_id
    if second is None:
        texts = tokenizer(examples[first], add_special_tokens=True)["input_ids"]
        return features(None, texts, eos, max_seq_length)
    prompts = tokenizer(prompt_texts(examples, columns), add_special_tokens=True)["input_ids"]
    completions = tokenizer(list(examples[second]), add_special_tokens=False)["input_ids"]
    return features(prompts, completions, eos, max_seq_length)


def apply_lora(model, job_args):
    """`model` wrapped in peft's LoRA with the job's rank, alpha, dropout and target modules."""
    from cluster.job import lora

    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise BadInput("--peft lora needs the peft package, which this node's software profile lacks (the stock "
                       "profile installs it: cluster/node/profiles.py)") from None

    try:
        targets = lora.target_modules(model.config.model_type, job_args.lora_target_modules)
    except lora.LoraSettingError as exc:
        raise BadInput(str(exc)) from None
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [t for t in targets if t.rsplit(".", 1)[-1] not in present]
    if missing:
        raise BadInput(f"--lora_target_modules: {', '.join(missing)} is not a module of "
                       f"{model.config.model_type!r} models; name its linear layers, e.g. "
                       f"{','.join(sorted(present & {'q_proj', 'v_proj', 'c_attn', 'query_key_value'})) or 'q_proj'}")
    job_args.lora_target_modules = ",".join(targets)  # what the summary reports
    config = LoraConfig(r=job_args.lora_r, lora_alpha=job_args.lora_alpha, lora_dropout=job_args.lora_dropout,
                        target_modules=list(targets), task_type="CAUSAL_LM")
    return get_peft_model(model, config)


class CausalLM:
    """--task causal-lm: next-token prediction, LoRA or full fine-tuning; evaluation loss and perplexity."""

    def prepare(self, train_raw, eval_raw, tokenizer, parsed, columns):
        """(train features, eval examples, eval features or None, model); `columns`: (prompt, completion) or
        (text, None)."""
        from transformers import set_seed

        from training import data, modeling

        if tokenizer.eos_token_id is None:
            raise BadInput(f"the tokenizer of {parsed.model.model_name_or_path!r} has no end-of-sequence token; "
                           "--task causal-lm needs one (give --tokenizer_name of one that has)")
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token  # padding is masked out of the loss and the attention
        tokenizer.padding_side = "right"  # the positions of a feature's tokens do not depend on its batch
        kwargs = {"tokenizer": tokenizer, "columns": columns, "max_seq_length": parsed.data.max_seq_length}
        train_features = data.tokenized(train_raw, tokenize, kwargs)
        if len(train_features) == 0:
            raise BadInput(f"no training example keeps a completion token within --max_seq_length "
                           f"{parsed.data.max_seq_length}; raise it or shorten the prompts")
        eval_features = None if eval_raw is None else data.tokenized(eval_raw, tokenize, kwargs)
        if eval_features is not None and len(eval_features) == 0:
            eval_raw, eval_features = None, None
        # evaluation needs the loss only: every token's logits over the vocabulary would not fit in memory
        parsed.training.prediction_loss_only = True
        set_seed(parsed.training.seed)
        model = modeling.load_model(parsed.model, "causal-lm")
        if parsed.job.peft == "lora":
            model = apply_lora(model, parsed.job)
        return train_features, eval_raw, eval_features, model

    def collator(self, tokenizer):
        from transformers import DataCollatorForSeq2Seq

        return DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORED)

    def predict_inputs(self, eval_features):
        return eval_features

    def scores(self, output, eval_raw, eval_features, data_args) -> dict:
        """The evaluation loss (mean over the learnt tokens) and its perplexity."""
        loss = float(output.metrics["test_loss"])
        return {"eval_loss": loss, "perplexity": math.exp(min(loss, 50.0))}
