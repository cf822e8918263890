"""Sentence-pair (or single-sentence) classification, GLUE style; `Classification` is
--task classification for the job (training/tasks.py)."""

from __future__ import annotations

from training.errors import BadInput


def label_names(train, eval_dataset, label_column: str) -> list:
    """Sorted distinct labels of the training data (GLUE's ints stay ints: 0..n-1)."""
    names = sorted(set(train[label_column]), key=lambda v: (str(type(v)), v))
    if eval_dataset is not None and label_column in eval_dataset.column_names:
        unknown = set(eval_dataset[label_column]) - set(names) - {-1}  # -1: GLUE's hidden test label
        if unknown:
            raise BadInput(f"evaluation labels {sorted(map(str, unknown))[:5]} never occur in the training "
                           f"data (labels: {names[:10]})")
    if len(names) < 2:
        raise BadInput(f"column {label_column!r} has a single label ({names}); classification needs at least two")
    return names


def tokenize_pairs(examples: dict[str, list], tokenizer, columns: tuple[str, str | None], label_column: str,
                   label_ids: dict, max_seq_length: int) -> dict:
    first, second = columns
    texts = (examples[first],) if second is None else (examples[first], examples[second])
    encoded = tokenizer(*texts, truncation=True, max_length=max_seq_length)
    encoded["labels"] = [label_ids.get(label, -100) for label in examples[label_column]]
    return encoded


class Classification:
    """--task classification: text pairs with labels, a sequence classification head, accuracy and F1."""

    def prepare(self, train_raw, eval_raw, tokenizer, parsed, columns):
        """(train features, eval examples, eval features or None, model); `columns` are the text columns."""
        from transformers import set_seed

        from training import data, modeling

        data_args = parsed.data
        labels = label_names(train_raw, eval_raw, data_args.label_column)
        kwargs = {"tokenizer": tokenizer, "columns": columns, "label_column": data_args.label_column,
                  "label_ids": {label: i for i, label in enumerate(labels)},
                  "max_seq_length": data_args.max_seq_length}
        train_features = data.tokenized(train_raw, tokenize_pairs, kwargs)
        eval_features = None if eval_raw is None else data.tokenized(eval_raw, tokenize_pairs, kwargs)
        set_seed(parsed.training.seed)
        model = modeling.load_model(parsed.model, "classification", num_labels=len(labels), label_names=labels)
        return train_features, eval_raw, eval_features, model

    def collator(self, tokenizer):
        from transformers import DataCollatorWithPadding

        return DataCollatorWithPadding(tokenizer)

    def predict_inputs(self, eval_features):
        return eval_features

    def scores(self, output, eval_raw, eval_features, data_args) -> dict:
        """Accuracy and F1 over the examples with a known label (-100 marks the others)."""
        import numpy as np

        from training import metrics

        predictions = np.argmax(output.predictions, axis=-1).tolist()
        kept = [(p, t) for p, t in zip(predictions, output.label_ids.tolist()) if t != -100]
        return metrics.classification_scores([p for p, _ in kept], [t for _, t in kept])
