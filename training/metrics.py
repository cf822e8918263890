"""Exact match and F1 for SQuAD (the official v1.1 definitions), accuracy and F1 for classification.

The project's own code: nothing is downloaded at evaluation time.
"""

from __future__ import annotations

import collections
import re
import string
from typing import Mapping, Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, drop punctuation and articles, squeeze whitespace (SQuAD v1.1 evaluate script)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(truth))


def f1(prediction: str, truth: str) -> float:
    predicted = normalize_answer(prediction).split()
    expected = normalize_answer(truth).split()
    common = collections.Counter(predicted) & collections.Counter(expected)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(predicted)
    recall = overlap / len(expected)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: Mapping[str, str], references: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """{"exact_match": %, "f1": %} over the references; a missing prediction scores 0."""
    if not references:
        return {"exact_match": 0.0, "f1": 0.0}
    em_total = f1_total = 0.0
    for example_id, truths in references.items():
        prediction = predictions.get(example_id, "")
        truths = list(truths) or [""]
        em_total += max(exact_match(prediction, t) for t in truths)
        f1_total += max(f1(prediction, t) for t in truths)
    n = len(references)
    return {"exact_match": 100.0 * em_total / n, "f1": 100.0 * f1_total / n}


def classification_scores(predictions: Sequence[int], labels: Sequence[int]) -> dict[str, float]:
    """Accuracy, and F1 of the positive class for two labels (as GLUE MRPC reports) or macro F1."""
    if len(predictions) != len(labels):
        raise ValueError(f"{len(predictions)} predictions for {len(labels)} labels")
    if not labels:
        return {"accuracy": 0.0, "f1": 0.0}
    accuracy = sum(int(p == t) for p, t in zip(predictions, labels)) / len(labels)
    classes = sorted(set(labels) | set(predictions))
    binary = set(classes) <= {0, 1}

    def class_f1(c) -> float:
        tp = sum(1 for p, t in zip(predictions, labels) if p == c and t == c)
        fp = sum(1 for p, t in zip(predictions, labels) if p == c and t != c)
        fn = sum(1 for p, t in zip(predictions, labels) if p != c and t == c)
        return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)

    score = class_f1(1) if binary else sum(class_f1(c) for c in classes) / len(classes)
    return {"accuracy": accuracy, "f1": score}
