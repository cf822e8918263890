"""Sentence-pair (or single-sentence) classification, GLUE style."""

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
