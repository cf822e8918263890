"""The offline demo: deterministic files, answers where they claim to be, a loadable fast tokenizer."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from tests.processes import run_together
from tests.training.conftest import REPO
from training import synthetic


def digest_tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_gives_byte_identical_files(tmp_path):
    a = synthetic.write_demo(tmp_path / "a", examples=40, seed=3)
    b = synthetic.write_demo(tmp_path / "b", examples=40, seed=3)
    synthetic.write_demo(tmp_path / "c", examples=40, seed=4)
    assert digest_tree(tmp_path / "a") == digest_tree(tmp_path / "b")
    assert digest_tree(tmp_path / "a")["train.json"] != digest_tree(tmp_path / "c")["train.json"]
    assert set(a) == {"model", "train_file", "validation_file", "args"}
    assert a["args"][:2] == ["--task", "qa"] and b["args"][3] == b["model"]


def test_answers_sit_at_their_offsets_and_tokenise_whole(tmp_path):
    from transformers import AutoTokenizer

    paths = synthetic.write_demo(tmp_path, examples=50, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(paths["model"])
    assert tokenizer.is_fast
    document = json.loads(Path(paths["validation_file"]).read_text())
    paragraphs = [p for article in document["data"] for p in article["paragraphs"]]
    assert len(paragraphs) == synthetic.default_eval_examples(50)
    for paragraph in paragraphs:
        answer = paragraph["qas"][0]["answers"][0]
        start = answer["answer_start"]
        assert paragraph["context"][start:start + len(answer["text"])] == answer["text"]
        assert tokenizer.unk_token_id not in tokenizer(paragraph["context"])["input_ids"]


def test_classification_demo_is_glue_shaped(tmp_path):
    paths = synthetic.write_demo(tmp_path, task="classification", examples=30, seed=0)
    rows = [json.loads(line) for line in Path(paths["train_file"]).read_text().splitlines()]
    assert len(rows) == 30 and set(rows[0]) == {"idx", "sentence1", "sentence2", "label"}
    assert {r["label"] for r in rows} == {0, 1}


def test_command_line(tmp_path, capsys):
    assert synthetic.main(["--out", str(tmp_path), "--examples", "10"]) == 0
    assert json.loads(capsys.readouterr().out)["train_file"] == str(tmp_path / "train.json")
    assert synthetic.main(["--out", str(tmp_path), "--examples", "0"]) == 2


def test_demos_with_a_model_dir_share_one_model_made_once(tmp_path):
    """fab's demos of every task and size share one model: the first makes it (the same files as a demo's
    own model), a later one writes only its data, without importing torch, and leaves the model as it is."""
    shared = tmp_path / "data" / "model"
    first = synthetic.write_demo(tmp_path / "data" / "qa-40", examples=40, seed=0, model_dir=shared)
    own = synthetic.write_demo(tmp_path / "own", examples=40, seed=0)
    assert first["model"] == str(shared) and digest_tree(shared) == digest_tree(Path(own["model"]))
    assert sorted(p.name for p in shared.parent.iterdir() if p.is_dir()) == ["model", "qa-40"]  # no staging left
    made = {p.name: p.stat().st_mtime_ns for p in shared.iterdir()}
    later = tmp_path / "data" / "cls-30"
    code = ("import sys; from training import synthetic; "
            f"assert synthetic.main(['--out', {str(later)!r}, '--task', 'classification', '--examples', '30', "
            f"'--model-dir', {str(shared)!r}]) == 0; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]", done.stdout  # neither was imported
    assert json.loads("\n".join(done.stdout.splitlines()[:-1]))["model"] == str(shared)
    assert len((later / "train.json").read_text().splitlines()) == 30
    assert {p.name: p.stat().st_mtime_ns for p in shared.iterdir()} == made


def test_demos_made_at_once_with_one_model_dir_make_the_model_once(tmp_path):
    """The nodes of a cluster that share the model's directory prepare their demos together: one makes the
    model (the only one that imports torch), the others wait for it and write only their data."""
    shared = tmp_path / "shared" / ".synthetic-model"
    code = ("import sys; from training import synthetic; "
            "assert synthetic.main(['--out', sys.argv[1], '--examples', '20', '--model-dir', sys.argv[2]]) == 0; "
            "print('torch' in sys.modules)")
    procs = run_together([[sys.executable, "-c", code, str(tmp_path / f"node{i}"), str(shared)] for i in range(3)],
                         tmp_path / "logs", timeout=300, cwd=REPO)
    assert [p.returncode for p in procs] == [0, 0, 0], [p.stderr for p in procs]
    assert sorted(p.stdout.splitlines()[-1] for p in procs) == ["False", "False", "True"]
    assert (shared / "model.safetensors").is_file()
    assert sorted(p.name for p in shared.parent.iterdir() if p.is_dir()) == [".synthetic-model"]
