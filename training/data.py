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


def _flatten_squad(articles: list, where: str) -> list[dict]:
    rows = []
    for article in articles:
        title = article.get("title", "")
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                answers = qa.get("answers", [])
                starts = []
                for answer in answers:
                    try:
                        starts.append(int(answer["answer_start"]))
                    except (TypeError, ValueError):
                        raise BadInput(f"{where}: question {qa.get('id')!r}: answer_start {answer['answer_start']!r} "
                                       "is not allowed; allowed: a whole number (the answer's character offset "
                                       "in the context)") from None
                rows.append({
                    "id": str(qa["id"]), "title": title, "context": paragraph["context"],
                    "question": qa["question"],
                    "answers": {"text": [a["text"] for a in answers], "answer_start": starts},
                })
    return rows


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(value) -> str | None:
    """What arrow makes of a JSON value: a column must hold one kind (None, JSON null, fits any)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "list", dict: "object"}.get(type(value), type(value).__name__)


def _record(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise BadInput(f"{where} is {_shown(value)} (a {_kind(value) or 'null'}), not a JSON object; allowed: "
                       "one JSON object per line (JSON lines) or a list of objects, e.g. "
                       '{"question": "...", "context": "...", "answers": {"text": ["..."], "answer_start": [0]}}')
    return value


def check_same_shape(rows: list[dict], source: str) -> None:
    """Every field (nested ones by dotted name, list items as name[]) holds one kind of value in all
    rows; BadInput naming the first row that differs (arrow would fail on it with a traceback)."""
    first: dict[str, tuple[str, int]] = {}

    def visit(value, name: str, row: int) -> None:
        kind = _kind(value)
        if kind is None:
            return
        seen = first.setdefault(name, (kind, row))
        if seen[0] != kind:
            raise BadInput(f"{source}: row {row}: {name} is {_shown(value)} (a {kind}), but row {seen[1]}'s is a "
                           f"{seen[0]}; every row must have the same shape")
        if kind == "object":
            for key, item in value.items():
                visit(item, f"{name}.{key}" if name else str(key), row)
        elif kind == "list":
            for item in value:
                visit(item, f"{name}[]", row)

    for number, row in enumerate(rows, 1):
        for key, value in row.items():
            visit(value, str(key), number)


def read_rows(path: str, setting: str | None = None) -> list[dict]:
    """Rows of a local .json/.jsonl file; nested SQuAD is flattened to the hub's row shape.

    `setting` (e.g. --train_file) starts every message, before the path.
    """
    where = f"{setting} {path}" if setting else path
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BadInput(f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); allowed: "
                       "UTF-8 JSON or JSON lines; convert it, e.g. `iconv -f latin1 -t utf-8`") from None

    def json_lines() -> list[dict]:
        rows = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                rows.append(_record(json.loads(line), f"{where}: line {number}"))
        return rows

    try:
        if path.endswith(".jsonl"):
            return json_lines()
        try:
            document = json.loads(text)
        except json.JSONDecodeError:  # JSON lines in a .json file
            return json_lines()
    except json.JSONDecodeError as exc:
        raise BadInput(f"{where}: not valid JSON or JSON lines ({exc})") from None
    if isinstance(document, dict) and isinstance(document.get("data"), list):
        document = document["data"]
        if document and isinstance(document[0], dict) and "paragraphs" in document[0]:
            try:
                return _flatten_squad(document, where)
            except (KeyError, TypeError, AttributeError) as exc:
                raise BadInput(f"{where}: nested SQuAD data lacks {exc}; each article needs "
                               "paragraphs[].context and paragraphs[].qas[].{id, question, answers}") from None
    if not isinstance(document, list):
        raise BadInput(f"{where}: expected a list of records, {{\"data\": [...]}} or JSON lines")
    return [_record(row, f"{where}: record {number}") for number, row in enumerate(document, 1)]


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


def check_qa_answers(answers_column: Iterable, source: str) -> None:
    """Every row's answers: {"text": [strings], "answer_start": [whole numbers]}, one start per text."""
    for row, answers in enumerate(answers_column, 1):
        if not (isinstance(answers, dict) and {"text", "answer_start"} <= set(answers)):
            raise BadInput(f"{source}: row {row}: column 'answers' must be {{\"text\": [...], \"answer_start\": "
                           f"[...]}}, "
                           f"found {json.dumps(answers)[:80]}")
        text, starts = answers["text"], answers["answer_start"]
        if not isinstance(text, list) or not all(isinstance(t, str) for t in text):
            raise BadInput(f"{source}: row {row}: answers.text is {_shown(text)}; allowed: a list of answer strings, "
                           'e.g. ["red"]')
        if not isinstance(starts, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in starts):
            raise BadInput(f"{source}: row {row}: answers.answer_start is {_shown(starts)}; allowed: a list of whole "
                           "numbers (each answer's character offset in the context), e.g. [9]")
        if len(text) != len(starts):
            raise BadInput(f"{source}: row {row}: answers has {len(text)} text(s) but {len(starts)} answer_start(s); "
                           "allowed: one start per text")


def check_text_columns(dataset, columns: Iterable[str], source: str, task: str) -> None:
    """The named columns hold text (arrow strings), not numbers, lists or nothing."""
    for column in columns:
        feature = dataset.features.get(column)
        if getattr(feature, "dtype", None) not in ("string", "large_string"):
            example = dataset[0][column] if len(dataset) else None
            raise BadInput(f"{source}: column {column!r} holds {_kind(example) or 'null'} values (e.g. "
                           f"{_shown(example)}); "
                           f"allowed for --task {task}: text (strings)")


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

    def table(setting: str, path: str):
        rows = read_rows(path, setting)
        if not rows:
            return None
        check_same_shape(rows, f"{setting} {path}")
        try:
            return Dataset.from_list(rows)
        except Exception as exc:  # noqa: BLE001 - arrow's many errors for rows it cannot make a table of
            raise BadInput(f"{setting} {path}: its rows do not make a table ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0][:160]}); allowed: rows with the same fields and kinds "
                           "of values") from None

    if data_args.train_file:
        train = table("--train_file", data_args.train_file)
        if train is None:
            raise BadInput(f"--train_file {data_args.train_file}: no records")
        evaluation = table("--validation_file", data_args.validation_file) if data_args.validation_file else None
        return train, evaluation, {"train": data_args.train_file, "validation": data_args.validation_file}

    from datasets import load_dataset

    name = data_args.dataset_name
    try:
        splits = load_dataset(name, data_args.dataset_config_name, cache_dir=cache_dir)
    except Exception as exc:  # offline, unknown name, gated: datasets raises many kinds
        raise BadInput(f"--dataset_name "
                       f"{name!r}{' ' + data_args.dataset_config_name if data_args.dataset_config_name else ''} "
                       f"could not be loaded ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                       "check the name and network access, or pass --train_file/--validation_file") from None
    if data_args.train_split not in splits:
        raise BadInput(f"--train_split {data_args.train_split!r} is not in {name} (splits: {', '.join(splits)})")
    evaluation = splits[data_args.validation_split] if data_args.validation_split in splits else None
    return splits[data_args.train_split], evaluation, {"dataset": name, "config": data_args.dataset_config_name}


INSTRUCTION_COLUMNS = ("instruction", "output")  # Alpaca's rows (and an optional "input")


def causal_lm_columns(columns: list[str], data_args, source: str) -> tuple[str, str | None]:
    """(prompt, completion) of prompt/completion rows (or Alpaca's instruction/output), else (text, None)."""
    for pair in ((data_args.prompt_column, data_args.completion_column), INSTRUCTION_COLUMNS):
        if not _missing(columns, pair):
            return pair
    if data_args.text_column in columns:
        return data_args.text_column, None
    raise BadInput(f"{source}: no text for --task causal-lm (found: {', '.join(columns) or 'none'}); allowed: "
                   f"{data_args.prompt_column}/{data_args.completion_column} rows (the loss over the completion), "
                   f"instruction/output rows as Alpaca's, or {data_args.text_column} rows; name them with "
                   "--prompt_column/--completion_column or --text_column")


def check_columns(dataset, data_args, source: str) -> tuple[str, str | None] | None:
    """BadInput when `dataset` lacks what the task needs; the text column pair for classification and causal-lm."""
    first = dataset[0] if len(dataset) else None
    if data_args.task == "causal-lm":
        pair = causal_lm_columns(dataset.column_names, data_args, source)
        check_text_columns(dataset, [c for c in pair if c], source, "causal-lm")
        return pair
    if data_args.task == "qa":
        check_qa_columns(dataset.column_names, source, first)
        check_text_columns(dataset, ("question", "context"), source, "qa")
        check_qa_answers(dataset["answers"], source)
        return None
    pair = check_classification_columns(dataset.column_names, source, data_args.text_columns,
                                        data_args.label_column)
    check_text_columns(dataset, [c for c in pair if c], source, "classification")
    label = dataset.features.get(data_args.label_column)
    if type(label).__name__ not in ("Value", "ClassLabel"):
        raise BadInput(f"{source}: column {data_args.label_column!r} holds {_kind(first[data_args.label_column])} "
                       f"values (e.g. {_shown(first[data_args.label_column])}); allowed: one label (a number or "
                       "a string) per row")
    return pair


def limit(dataset, count: int | None):
    if dataset is None or count is None:
        return dataset
    return dataset.select(range(min(count, len(dataset))))


def tokenized(dataset, tokenize, kwargs: dict):
    """`dataset` tokenised in batches by `tokenize(batch, **kwargs)`, keeping only its output columns."""
    return dataset.map(tokenize, batched=True, remove_columns=dataset.column_names, fn_kwargs=kwargs)
