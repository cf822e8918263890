"""SQuAD exact match / F1 and classification scores against hand-worked cases."""

import pytest

from training import metrics


def test_normalisation_follows_squad():
    assert metrics.normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert metrics.exact_match("an apple", "Apple.") == 1.0


def test_f1_is_token_overlap():
    # predicted "big red dog", truth "red dog": precision 2/3, recall 1 -> 0.8
    assert metrics.f1("big red dog", "the red dog") == pytest.approx(0.8)
    assert metrics.f1("cat", "dog") == 0.0


def test_squad_scores_take_the_best_reference_and_count_missing_as_wrong():
    references = {"a": ["Paris", "the city of Paris"], "b": ["1889"], "c": ["blue"]}
    predictions = {"a": "city of paris", "b": "in 1889"}
    scores = metrics.squad_scores(predictions, references)
    assert scores["exact_match"] == pytest.approx(100 / 3)
    assert scores["f1"] == pytest.approx(100 * (1 + 2 / 3) / 3)


def test_classification_scores():
    scores = metrics.classification_scores([1, 0, 1, 1], [1, 0, 0, 1])
    assert scores["accuracy"] == 0.75
    assert scores["f1"] == pytest.approx(0.8)  # tp 2, fp 1, fn 0
    multi = metrics.classification_scores([0, 1, 2, 2], [0, 1, 2, 1])
    assert multi["accuracy"] == 0.75
    with pytest.raises(ValueError):
        metrics.classification_scores([1], [1, 0])
