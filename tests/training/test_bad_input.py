"""Bad data files and option values stop the job before training with one line and exit 2.

Table-driven, in this process (`training.train.main`, no launcher: one rank), so each case costs
well under a second; tests/training/test_mpi_training.py shows that a check needing the world stops both of 2
ranks with one line.
"""

from __future__ import annotations

import json
import logging
import re

import pytest

from cluster import exit_codes


def qa_row(i, answers):
    return {"id": str(i), "question": "what is color ?", "context": "color is red .", "answers": answers}


def jsonl(*rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


GOOD = {"text": ["red"], "answer_start": [9]}
NESTED_BAD_START = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": "color is red .", "qas": [
    {"id": "a", "question": "what is color ?", "answers": [{"text": "red", "answer_start": "nine"}]}]}]}]}

# case -> (file name, its bytes or None, extra arguments, the one line expected)
CASES = {
    "jsonl of numbers": ("numbers.jsonl", b"1\n2\n3\n", [],
                         r"^error: --train_file \S*numbers\.jsonl: line 1 is 1 \(a number\), not a JSON object; "
                         r"allowed: one JSON object per line"),
    "json list of strings": ("strings.json", b'["a", "b"]', [],
                             r"^error: --train_file \S*strings\.json: record 1 is 'a' \(a string\), not a JSON object"),
    "not UTF-8": ("latin1.jsonl", jsonl(qa_row(1, GOOD))[:-2] + b' "caf\xe9"}\n', [],
                  r"^error: --train_file \S*latin1\.jsonl: not UTF-8 text \(byte 0xe9 at offset \d+\); "
                  r"allowed: UTF-8"),
    "string answer_start": ("string_start.jsonl", jsonl(qa_row(1, {"text": ["red"], "answer_start": ["9"]})), [],
                            r"^error: \S*string_start\.jsonl: row 1: answers\.answer_start is \['9'\]; allowed: "
                            r"a list of whole numbers"),
    "scalar answer_start": ("scalar_start.jsonl", jsonl(qa_row(1, {"text": ["red"], "answer_start": "9"})), [],
                            r"^error: \S*scalar_start\.jsonl: row 1: answers\.answer_start is '9'; allowed: "
                            r"a list of whole numbers"),
    "mixed answer types": ("mixed.jsonl", jsonl(qa_row(1, GOOD), qa_row(2, {"text": "red", "answer_start": [9]})), [],
                           r"^error: --train_file \S*mixed\.jsonl: row 2: answers\.text is 'red' \(a string\), "
                           r"but row 1's is a list; every row must have the same shape"),
    "texts and starts differ": ("uneven.jsonl", jsonl(qa_row(1, {"text": ["red", "x"], "answer_start": [9]})), [],
                                r"^error: \S*uneven\.jsonl: row 1: answers has 2 text\(s\) but 1 answer_start"),
    "nested non-numeric start": ("nested.json", json.dumps(NESTED_BAD_START).encode(), [],
                                 r"^error: --train_file \S*nested\.json: .*answer_start 'nine'"),
    "checkpoint_minutes nan": (None, None, ["--checkpoint_minutes", "nan"],
                               r"^error: --checkpoint_minutes nan is not allowed; allowed: 0 \(off\) or a positive "
                               r"number of minutes"),
    "spot_poll_seconds inf": (None, None, ["--spot_poll_seconds", "inf"],
                              r"^error: --spot_poll_seconds inf is not allowed; allowed: a positive number"),
    "instance_type unknown": (None, None, ["--instance_type", "m9z.huge"],
                              r"^error: --instance_type: 'm9z.huge' is not allowed; choose one of c6i.16xlarge, "),
    "learning_rate nan": (None, None, ["--learning_rate", "nan"],
                          r"^error: --learning_rate nan is not allowed; allowed: a number"),
    "unknown task": (None, None, ["--task", "translation"],
                     r"^error: --task: 'translation' is not allowed; choose one of qa, classification"),
    "missing columns": ("no_answers.jsonl", jsonl({"id": "1", "question": "what is color ?",
                                                   "context": "color is red ."}), [],
                        r"^error: .*missing column\(s\) answers needed by --task qa"),
    "slow tokenizer": (None, None, ["--model_name_or_path", "{slow_model}"],
                       r"^error: .*ByT5Tokenizer, which has no fast"),
}


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_and_exit_2(case, qa_demo, slow_tokenizer_model, tmp_path, capsys, monkeypatch,
                                          restore_logging):
    from training import train

    for name in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                 "XEON_IMDS_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    file_name, content, extra, pattern = CASES[case]
    args = [*qa_demo["args"], "--output_dir", str(tmp_path / "out"), "--spot_watch", "off",
            "--checkpoint_minutes", "0", *(a.format(slow_model=slow_tokenizer_model) for a in extra)]
    if file_name:
        (tmp_path / file_name).write_bytes(content)
        args += ["--train_file", str(tmp_path / file_name)]
    code = train.main(args)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == exit_codes.BAD_INPUT, err[-3000:]
    assert len(errors) == 1 and re.search(pattern, errors[0]), err[-3000:]
    assert "Traceback" not in err
    assert not (tmp_path / "out" / "summary.json").exists()  # stopped before training
