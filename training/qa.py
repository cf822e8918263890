"""SQuAD question answering: features with overflowing tokens and doc stride, and the way back
from start/end logits to answer text (after transformers' examples/pytorch/question-answering).
`QuestionAnswering` is --task qa for the job (training/tasks.py)."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np


def _tokenize(examples: dict[str, list], tokenizer, max_seq_length: int, doc_stride: int):
    """Question/context pairs in the tokenizer's padding order, long contexts split into
    overlapping windows; returns the encoding and whether the context is the second sequence."""
    questions = [q.lstrip() for q in examples["question"]]
    pad_on_right = tokenizer.padding_side == "right"
    first, second = (questions, examples["context"]) if pad_on_right else (examples["context"], questions)
    tokenized = tokenizer(first, second, truncation="only_second" if pad_on_right else "only_first",
                          max_length=max_seq_length, stride=doc_stride, return_overflowing_tokens=True,
                          return_offsets_mapping=True, padding="max_length")
    return tokenized, pad_on_right


def prepare_train_features(examples: dict[str, list], tokenizer, max_seq_length: int, doc_stride: int) -> dict:
    """Tokenise a batch of examples into features labelled with the answer's token span.

    A context longer than max_seq_length becomes several features that overlap by doc_stride;
    a feature that does not contain the answer points at the CLS token.
    """
    tokenized, pad_on_right = _tokenize(examples, tokenizer, max_seq_length, doc_stride)
    sample_mapping = tokenized.pop("overflow_to_sample_mapping")
    offset_mapping = tokenized.pop("offset_mapping")
    context_index = 1 if pad_on_right else 0
    starts, ends = [], []
    for i, offsets in enumerate(offset_mapping):
        input_ids = tokenized["input_ids"][i]
        cls_index = input_ids.index(tokenizer.cls_token_id) if tokenizer.cls_token_id in input_ids else 0
        sequence_ids = tokenized.sequence_ids(i)
        answers = examples["answers"][sample_mapping[i]]
        if not answers["answer_start"]:
            starts.append(cls_index)
            ends.append(cls_index)
            continue
        start_char = answers["answer_start"][0]
        end_char = start_char + len(answers["text"][0])
        token_start = 0
        while sequence_ids[token_start] != context_index:
            token_start += 1
        token_end = len(input_ids) - 1
        while sequence_ids[token_end] != context_index:
            token_end -= 1
        if not (offsets[token_start][0] <= start_char and offsets[token_end][1] >= end_char):
            starts.append(cls_index)
            ends.append(cls_index)
            continue
        while token_start < len(offsets) and offsets[token_start][0] <= start_char:
            token_start += 1
        starts.append(token_start - 1)
        while offsets[token_end][1] >= end_char:
            token_end -= 1
        ends.append(token_end + 1)
    tokenized["start_positions"] = starts
    tokenized["end_positions"] = ends
    return tokenized


def prepare_eval_features(examples: dict[str, list], tokenizer, max_seq_length: int, doc_stride: int) -> dict:
    """Features for evaluation: each keeps its example id and the character offsets of its
    context tokens (None elsewhere) so predictions can be mapped back to text."""
    tokenized, pad_on_right = _tokenize(examples, tokenizer, max_seq_length, doc_stride)
    sample_mapping = tokenized.pop("overflow_to_sample_mapping")
    context_index = 1 if pad_on_right else 0
    tokenized["example_id"] = []
    for i in range(len(tokenized["input_ids"])):
        sequence_ids = tokenized.sequence_ids(i)
        tokenized["example_id"].append(examples["id"][sample_mapping[i]])
        tokenized["offset_mapping"][i] = [
            offset if sequence_ids[k] == context_index else None
            for k, offset in enumerate(tokenized["offset_mapping"][i])
        ]
    return tokenized


def postprocess_predictions(examples, features, start_logits: np.ndarray, end_logits: np.ndarray,
                            n_best_size: int = 20, max_answer_length: int = 30) -> dict[str, str]:
    """Best-scoring valid span per example (SQuAD v1: every question has an answer)."""
    if len(features) != len(start_logits):
        raise ValueError(f"{len(start_logits)} predictions for {len(features)} features")
    features_per_example = collections.defaultdict(list)
    for index, example_id in enumerate(features["example_id"]):
        features_per_example[example_id].append(index)
    offsets_all = features["offset_mapping"]
    answers: dict[str, str] = {}
    for example in examples:
        best_score, best_text = -np.inf, ""
        context = example["context"]
        for feature_index in features_per_example.get(example["id"], ()):
            starts = start_logits[feature_index]
            ends = end_logits[feature_index]
            offsets = offsets_all[feature_index]
            start_candidates = np.argsort(starts)[-1:-n_best_size - 1:-1]
            end_candidates = np.argsort(ends)[-1:-n_best_size - 1:-1]
            for s in start_candidates:
                for e in end_candidates:
                    if (s >= len(offsets) or e >= len(offsets) or offsets[s] is None
                            or offsets[e] is None or e < s or e - s + 1 > max_answer_length):
                        continue
                    score = starts[s] + ends[e]
                    if score > best_score:
                        best_score, best_text = score, context[offsets[s][0]:offsets[e][1]]
        answers[example["id"]] = best_text
    return answers


def references(examples) -> dict[str, list[str]]:
    return {example["id"]: list(example["answers"]["text"]) for example in examples}


def eval_model_inputs(features, columns_to_drop=("example_id", "offset_mapping")) -> Any:
    """The evaluation features without the columns the model's forward does not take."""
    return features.remove_columns([c for c in columns_to_drop if c in features.column_names])


def with_ids(dataset, prefix: str):
    """`dataset` with an `id` column (`<prefix>-<row>`) when it has none: predictions are keyed by it."""
    if dataset is None or "id" in dataset.column_names:
        return dataset
    return dataset.add_column("id", [f"{prefix}-{i}" for i in range(len(dataset))])


class QuestionAnswering:
    """--task qa: SQuAD features with doc stride, a QA head, exact match and F1 over answer text."""

    def prepare(self, train_raw, eval_raw, tokenizer, parsed, columns):
        """(train features, eval examples, eval features or None, model); examples without ids get
        them. `columns` (the classification text columns) is None here."""
        from transformers import set_seed

        from training import data, modeling

        train_raw, eval_raw = with_ids(train_raw, "train"), with_ids(eval_raw, "eval")
        kwargs = {"tokenizer": tokenizer, "max_seq_length": parsed.data.max_seq_length,
                  "doc_stride": parsed.data.doc_stride}
        train_features = data.tokenized(train_raw, prepare_train_features, kwargs)
        eval_features = None if eval_raw is None else data.tokenized(eval_raw, prepare_eval_features, kwargs)
        set_seed(parsed.training.seed)  # the freshly initialised QA head is the same on every rank
        return train_features, eval_raw, eval_features, modeling.load_model(parsed.model, "qa")

    def collator(self, tokenizer):
        from transformers import default_data_collator

        return default_data_collator  # features are padded to max_seq_length already

    def predict_inputs(self, eval_features):
        return eval_model_inputs(eval_features)

    def scores(self, output, eval_raw, eval_features, data_args) -> dict:
        from training import metrics

        start_logits, end_logits = output.predictions
        answers = postprocess_predictions(eval_raw, eval_features, start_logits, end_logits,
                                          data_args.n_best_size, data_args.max_answer_length)
        return metrics.squad_scores(answers, references(eval_raw))
