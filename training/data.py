"""Loading the training and evaluation data and checking that it has the columns the task needs.

Local files are read into memory (no dataset cache shared between ranks, nothing to race on):
SQuAD-format JSON (the official nested {"data": [{"paragraphs": [...]}]} or flat rows like the
hub's `squad`) for qa; GLUE-shaped rows (JSON array, {"data": [...]} or JSON lines) for
classification.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from training.errors import BadInput

QA_COLUMNS = ("question", "context", "answers")
TEXT_COLUMN_CANDIDATES = (("sentence1", "sentence2"), ("question1", "question2"), ("question", "sentence"),
                          ("premise", "hypothesis"), ("sentence", None), ("text", None))


def _flatten_squad(articles: list) -> list[dict]:
    rows = []
    for article in articles:
        title = article.get("title", "")
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                rows.append({
                    "id": str(qa["id"]), "title": title, "context": paragraph["context"],
                    "question": qa["question"],
                    "answers": {"text": [a["text"] for a in qa.get("answers", [])],
                                "answer_start": [int(a["answer_start"]) for a in qa.get("answers", [])]},
                })
    return rows


def read_rows(path: str) -> list[dict]:
    """Rows of a local .json/.jsonl file; nested SQuAD is flattened to the hub's row shape."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        if path.endswith(".jsonl"):
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        try:
            document = json.loads(text)
        except json.JSONDecodeError:  # JSON lines in a .json file
            return [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise BadInput(f"{path}: not valid JSON or JSON lines ({exc})") from None
    if isinstance(document, dict) and isinstance(document.get("data"), list):
        document = document["data"]
        if document and isinstance(document[0], dict) and "paragraphs" in document[0]:
            try:
                return _flatten_squad(document)
            except (KeyError, TypeError) as exc:
                raise BadInput(f"{path}: nested SQuAD data lacks {exc}; each article needs "
                               "paragraphs[].context and paragraphs[].qas[].{id, question, answers}") from None
    if not isinstance(document, list) or not all(isinstance(row, dict) for row in document):
        raise BadInput(f"{path}: expected a list of records, {{\"data\": [...]}} or JSON lines")
    return document


def _missing(columns: Iterable[str], needed: Iterable[str]) -> list[str]:
    have = set(columns)
    return [c for c in needed if c not in have]


def check_qa_columns(columns: list[str], source: str, first_row: dict | None) -> None:
    missing = _missing(columns, QA_COLUMNS)
    if missing:
        raise BadInput(
            f"{source}: missing column(s) {', '.join(missing)} needed by --task qa (found: "
            f"{', '.join(columns) or 'none'}); SQuAD-format rows need id, question, context and "
            "answers {text: [...], answer_start: [...]}")
    answers = (first_row or {}).get("answers")
    if first_row is not None and not (isinstance(answers, dict) and {"text", "answer_start"} <= set(answers)):
        raise BadInput(f"{source}: column 'answers' must be {{\"text\": [...], \"answer_start\": [...]}}, "
                       f"found {json.dumps(answers)[:80]}")


def text_columns_for(columns: list[str], requested: str | None, source: str) -> tuple[str, str | None]:
    if requested:
        names = [c.strip() for c in requested.split(",") if c.strip()]
        if not 1 <= len(names) <= 2:
            raise BadInput(f"--text_columns {requested!r}: give one or two column names separated by a comma")
        missing = _missing(columns, names)
        if missing:
            raise BadInput(f"{source}: missing column(s) {', '.join(missing)} named by --text_columns "
                           f"(found: {', '.join(columns)})")
        return names[0], names[1] if len(names) == 2 else None
    for first, second in TEXT_COLUMN_CANDIDATES:
        if first in columns and (second is None or second in columns):
            return first, second
    raise BadInput(f"{source}: no text columns for --task classification (found: {', '.join(columns)}); "
                   "expected sentence1/sentence2 as in GLUE MRPC, or name them with --text_columns a,b")


def check_classification_columns(columns: list[str], source: str, text_columns: str | None,
                                 label_column: str) -> tuple[str, str | None]:
    pair = text_columns_for(columns, text_columns, source)
    if label_column not in columns:
        raise BadInput(f"{source}: missing column {label_column!r} needed by --task classification "
                       f"(found: {', '.join(columns)}); name the label column with --label_column")
    return pair


def load_splits(data_args, cache_dir: str | None = None):
    """(train Dataset, eval Dataset or None, description of where they came from)."""
    from datasets import Dataset

    if data_args.train_file:
        train_rows = read_rows(data_args.train_file)
        if not train_rows:
            raise BadInput(f"--train_file {data_args.train_file}: no records")
        train = Dataset.from_list(train_rows)
        evaluation = None
        if data_args.validation_file:
            eval_rows = read_rows(data_args.validation_file)
            evaluation = Dataset.from_list(eval_rows) if eval_rows else None
        return train, evaluation, {"train": data_args.train_file, "validation": data_args.validation_file}

    from datasets import load_dataset

    name = data_args.dataset_name
    try:
        splits = load_dataset(name, data_args.dataset_config_name, cache_dir=cache_dir)
    except Exception as exc:  # offline, unknown name, gated: datasets raises many kinds
        raise BadInput(f"--dataset_name {name!r}{' ' + data_args.dataset_config_name if data_args.dataset_config_name else ''} "
                       f"could not be loaded ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                       "check the name and network access, or pass --train_file/--validation_file") from None
    if data_args.train_split not in splits:
        raise BadInput(f"--train_split {data_args.train_split!r} is not in {name} (splits: {', '.join(splits)})")
    evaluation = splits[data_args.validation_split] if data_args.validation_split in splits else None
    return splits[data_args.train_split], evaluation, {"dataset": name, "config": data_args.dataset_config_name}


def check_columns(dataset, data_args, source: str) -> tuple[str, str | None] | None:
    """BadInput when `dataset` lacks what the task needs; the text column pair for classification."""
    first = dataset[0] if len(dataset) else None
    if data_args.task == "qa":
        check_qa_columns(dataset.column_names, source, first)
        return None
    return check_classification_columns(dataset.column_names, source, data_args.text_columns,
                                        data_args.label_column)


def limit(dataset, count: int | None):
    if dataset is None or count is None:
        return dataset
    return dataset.select(range(min(count, len(dataset))))
