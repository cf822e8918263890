"""SQuAD loading, pre-processing with doc stride and post-processing, on tiny in-memory data."""

import json

import numpy as np
import pytest

from training import data, qa
from training.errors import BadInput


@pytest.fixture(scope="module")
def tokenizer(qa_demo):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qa_demo["model"])


def squad_rows():
    context = " ".join(["bako"] * 40) + " color is peso . " + " ".join(["kiru"] * 40)
    start = context.index("peso")
    return {"id": ["q1"], "question": ["what is color ?"], "context": [context],
            "answers": [{"text": ["peso"], "answer_start": [start]}]}


def test_long_context_becomes_overlapping_features_labelled_with_the_answer(tokenizer):
    rows = squad_rows()
    features = qa.prepare_train_features(rows, tokenizer, max_seq_length=32, doc_stride=8)
    assert len(features["input_ids"]) > 3  # 85 context words in 32-token windows
    labelled = [i for i, s in enumerate(features["start_positions"]) if s != 0]
    assert labelled, "some window must contain the answer"
    for i in labelled:
        span = features["input_ids"][i][features["start_positions"][i]:features["end_positions"][i] + 1]
        assert tokenizer.decode(span) == "peso"
    unlabelled = [i for i, s in enumerate(features["start_positions"]) if s == 0]
    assert all(features["end_positions"][i] == 0 for i in unlabelled)  # CLS for windows without it


def test_postprocessing_maps_logits_back_to_the_answer_text(tokenizer):
    from datasets import Dataset

    examples = Dataset.from_dict(squad_rows())
    features = Dataset.from_dict(qa.prepare_eval_features(squad_rows(), tokenizer, max_seq_length=32, doc_stride=8))
    train = qa.prepare_train_features(squad_rows(), tokenizer, max_seq_length=32, doc_stride=8)
    start_logits = np.full((len(features), 32), -10.0)
    end_logits = np.full((len(features), 32), -10.0)
    for i, (s, e) in enumerate(zip(train["start_positions"], train["end_positions"])):
        if s:
            start_logits[i, s] = end_logits[i, e] = 10.0
        else:  # a confident CLS must never become an answer: offsets outside the context are None
            start_logits[i, 0] = end_logits[i, 0] = 50.0
    answers = qa.postprocess_predictions(examples, features, start_logits, end_logits)
    assert answers == {"q1": "peso"}


def test_nested_squad_is_flattened(tmp_path):
    document = {"version": "1.1", "data": [{"title": "T", "paragraphs": [
        {"context": "color is red .", "qas": [{"id": "a", "question": "what is color ?",
                                                 "answers": [{"text": "red", "answer_start": 9}]}]}]}]}
    path = tmp_path / "train.json"
    path.write_text(json.dumps(document))
    rows = data.read_rows(str(path))
    assert rows == [{"id": "a", "title": "T", "context": "color is red .", "question": "what is color ?",
                     "answers": {"text": ["red"], "answer_start": [9]}}]


def test_json_lines_and_broken_files(tmp_path):
    lines = tmp_path / "rows.jsonl"
    lines.write_text('{"sentence1": "a", "sentence2": "b", "label": 1}\n\n{"sentence1": "c", "sentence2": "d", '
                     '"label": 0}\n')
    assert len(data.read_rows(str(lines))) == 2
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(BadInput, match="not valid JSON"):
        data.read_rows(str(broken))


def test_missing_columns_are_named():
    with pytest.raises(BadInput, match=r"train\.json: missing column\(s\) answers needed by --task qa \(found: id, "
                                       r"question, context\)"):
        data.check_qa_columns(["id", "question", "context"], "train.json", {"id": "1"})
    with pytest.raises(BadInput, match="column 'answers' must be"):
        data.check_qa_columns(["question", "context", "answers"], "train.json", {"answers": ["red"]})
    assert data.check_classification_columns(["question1", "question2", "label"], "qqp", None, "label") == \
        ("question1", "question2")
    with pytest.raises(BadInput, match="missing column 'label' needed by --task classification"):
        data.check_classification_columns(["sentence1", "sentence2"], "mrpc.jsonl", None, "label")
    with pytest.raises(BadInput, match="no text columns"):
        data.check_classification_columns(["a", "b", "label"], "x.jsonl", None, "label")
    with pytest.raises(BadInput, match="missing column\\(s\\) b named by --text_columns"):
        data.check_classification_columns(["a", "label"], "x.jsonl", "a,b", "label")


def test_examples_without_ids_get_them_and_ids_are_kept():
    from datasets import Dataset

    bare = Dataset.from_dict({"question": ["q", "r"]})
    assert qa.with_ids(bare, "eval")["id"] == ["eval-0", "eval-1"]
    assert qa.with_ids(Dataset.from_dict({"id": ["x"]}), "eval")["id"] == ["x"]
    assert qa.with_ids(None, "eval") is None
