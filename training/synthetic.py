"""A tiny offline model, tokenizer and data set for tests and the no-AWS demo.

`python -m training.synthetic --out DIR [--task qa|classification|causal-lm] [--examples N] [--seed S] [--model-dir M]`
writes DIR/model (a small DistilBERT-shaped model with a generated word-level vocabulary and a
fast tokenizer), DIR/train.json and DIR/eval.json. The same seed gives byte-identical files, so
every node of a cluster can make its own copy. With --model-dir the model goes to M instead, and only
when M holds none yet: fab's demos of every task and size share one (the model is the costly part, the
data is written in milliseconds without importing torch).

The QA task: a context of filler words holds one or two clauses "<cue> is <word> ." and the
question asks "what is <cue> ?"; answers come from their own set of words. Picking a context word at random scores
about 1/25 exact match; a model that learnt "the word after `is`" scores about 75 %, one that also matches the
question's cue 100 %.
Classification: both sentences end in "key <word> ."; the label is 1 when sentence2's key word is one of the
first half of the key words (a lexicon, as in sentiment), 0 for the other half; sentence1's key and the filler
words carry nothing. The key words never appear as filler. The tiny model reaches over 90 % accuracy in three
epochs of 300 examples (about 60 steps); a rule that compares the two sentences' keys is beyond it at that size.
Causal LM (a tiny Llama-shaped model, its own shared directory): the prompt "repeat <words> :" and the completion the
same words again, so the loss over the completion falls as the model learns to copy.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

from cluster.job.demo import SYNTHETIC_ARGS

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
FIXED_WORDS = ("?", ".", ",", "what", "is", "the", "a", "of", "and", "key", "same", "other")
CUES = ("color", "shape", "owner", "place", "size", "sound", "taste", "price")
CONSONANTS = "bdfgklmnprstvz"
VOWELS = "aeiou"
FILLER_WORDS = 400
ANSWER_WORDS = 100  # the last 100 generated words only ever appear as answers
MODEL_CONFIG = {"dim": 64, "hidden_dim": 256, "n_layers": 2, "n_heads": 4, "max_position_embeddings": 128,
                "dropout": 0.0, "attention_dropout": 0.0, "qa_dropout": 0.0, "seq_classif_dropout": 0.0}


def _words() -> list[str]:
    syllables = [c + v for c in CONSONANTS for v in VOWELS]
    words = sorted({a + b for a in syllables for b in syllables})
    random.Random(1234).shuffle(words)  # fixed: the vocabulary never depends on --seed
    return sorted(words[:FILLER_WORDS])


def vocabulary() -> list[str]:
    return [*SPECIAL_TOKENS, *FIXED_WORDS, *CUES, *_words()]


def _qa_example(rng: random.Random, index: int, words: list[str], split: str) -> dict:
    fillers, answers = words[:FILLER_WORDS - ANSWER_WORDS], words[FILLER_WORDS - ANSWER_WORDS:]
    cues = rng.sample(CUES, rng.choice((1, 2)))
    values = rng.sample(answers, len(cues))
    asked = rng.randrange(len(cues))
    text = " ".join(rng.choice(fillers) for _ in range(rng.randint(3, 8)))
    answer_start = -1
    for number, (cue, value) in enumerate(zip(cues, values)):
        text += f" {cue} is "
        if number == asked:
            answer_start = len(text)
        text += f"{value} . " + " ".join(rng.choice(fillers) for _ in range(rng.randint(2, 7)))
    return {"id": f"{split}-{index:06d}", "question": f"what is {cues[asked]} ?", "context": text,
            "answers": [{"text": values[asked], "answer_start": answer_start}]}


def _squad_document(examples: list[dict], title: str) -> dict:
    paragraphs = [{"context": e["context"], "qas": [{"id": e["id"], "question": e["question"],
                                                     "answers": e["answers"]}]} for e in examples]
    return {"version": "synthetic-1", "data": [{"title": title, "paragraphs": paragraphs}]}


KEY_WORDS = 16  # classification: the first half of them mark label 1, the second half label 0


def _pair_example(rng: random.Random, index: int, words: list[str]) -> dict:
    fillers, keys = words[:FILLER_WORDS - ANSWER_WORDS], words[FILLER_WORDS - ANSWER_WORDS:][:KEY_WORDS]
    label = rng.randrange(2)
    half = KEY_WORDS // 2
    s1 = [rng.choice(fillers) for _ in range(rng.randint(3, 8))] + ["key", rng.choice(keys), "."]
    s2 = [rng.choice(fillers) for _ in range(rng.randint(3, 8))] + ["key", rng.choice(keys[:half] if label
                                                                                       else keys[half:]), "."]
    return {"idx": index, "sentence1": " ".join(s1), "sentence2": " ".join(s2), "label": label}


CAUSAL_SPECIAL_TOKENS = ("<pad>", "<unk>", "<s>", "</s>")
CAUSAL_WORDS = 200  # the copied words: the first generated ones
CAUSAL_MODEL_CONFIG = {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "num_key_value_heads": 2, "max_position_embeddings": 64}


def _causal_example(rng: random.Random, index: int, words: list[str]) -> dict:
    copied = [rng.choice(words[:CAUSAL_WORDS]) for _ in range(rng.randint(3, 6))]
    return {"id": index, "prompt": "repeat " + " ".join(copied) + " :", "completion": " ".join(copied) + " ."}


def _write_causal_model(model_dir: Path, seed: int) -> None:
    """A tiny Llama (LlamaConfig) with a word-level fast tokenizer of the demo's vocabulary."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model_dir.mkdir(parents=True, exist_ok=True)
    vocab = [*CAUSAL_SPECIAL_TOKENS, "repeat", ":", *FIXED_WORDS, *CUES, *_words()]
    vocab = list(dict.fromkeys(vocab))  # ":" and "." once each
    words = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, pad_token="<pad>", unk_token="<unk>",
                                        bos_token="<s>", eos_token="</s>",
                                        model_max_length=CAUSAL_MODEL_CONFIG["max_position_embeddings"])
    tokenizer.save_pretrained(str(model_dir))
    config = LlamaConfig(vocab_size=len(vocab), pad_token_id=0, bos_token_id=2, eos_token_id=3,
                         **CAUSAL_MODEL_CONFIG)
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    torch.random.set_rng_state(generator_state)
    model.save_pretrained(str(model_dir))


def _write_model(model_dir: Path, seed: int) -> None:
    import torch  # here, not above: writing the data alone never pays for torch and transformers
    from transformers import DistilBertConfig, DistilBertModel, DistilBertTokenizerFast
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    model_dir.mkdir(parents=True, exist_ok=True)
    vocab = vocabulary()
    (model_dir / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = DistilBertTokenizerFast.from_pretrained(str(model_dir), do_lower_case=True,
                                                        model_max_length=MODEL_CONFIG["max_position_embeddings"])
    tokenizer.save_pretrained(str(model_dir))
    config = DistilBertConfig(vocab_size=len(vocab), pad_token_id=0, **MODEL_CONFIG)
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = DistilBertModel(config)
    torch.random.set_rng_state(generator_state)
    model.save_pretrained(str(model_dir))


def _shared_model(model_dir: Path, seed: int, write=_write_model) -> None:
    """The model in `model_dir`, made only when it is not there yet. Demos made at once (the nodes of a cluster
    that share the directory) wait for each other on a lock beside it, so one makes it and the others find it;
    it is made beside it and renamed into place, so the directory exists only complete (and where the lock
    does not hold, a later rename finds it there and leaves it)."""
    if model_dir.is_dir():
        return
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    hidden = "." + model_dir.name.lstrip(".")  # the lock and the staging directory beside it, hidden
    with open(model_dir.parent / f"{hidden}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if model_dir.is_dir():
            return
        staging = Path(tempfile.mkdtemp(prefix=f"{hidden}-", dir=model_dir.parent))
        staging.chmod(0o755)  # as a plain mkdir under the usual umask: mkdtemp makes it 0700
        try:
            write(staging, seed)
            try:
                staging.rename(model_dir)
            except OSError:
                if not model_dir.is_dir():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def default_eval_examples(examples: int) -> int:
    return max(32, examples // 10)


def write_demo(out_dir, task: str = "qa", examples: int = 2000, seed: int = 0, model_dir=None) -> dict:
    """Write DIR/model, DIR/train.json and DIR/eval.json; return their paths and the recommended
    training arguments ("args") for this tiny model. `model_dir`: the model there instead of DIR/model,
    made only if it is not there yet."""
    if task not in SYNTHETIC_ARGS:
        raise ValueError(f"task: {task!r} is not allowed; choose {', '.join(SYNTHETIC_ARGS)}")
    if examples < 1:
        raise ValueError(f"examples: {examples} must be positive")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write = _write_causal_model if task == "causal-lm" else _write_model
    if model_dir is None:
        model = out / "model"
        write(model, seed)
    else:
        model = Path(model_dir)
        _shared_model(model, seed, write)
    rng = random.Random(seed)
    words = _words()
    paths = {"model": str(model), "train_file": str(out / "train.json"),
             "validation_file": str(out / "eval.json")}
    for split, count, path in (("train", examples, paths["train_file"]),
                               ("eval", default_eval_examples(examples), paths["validation_file"])):
        if task == "causal-lm":
            text = "".join(json.dumps(_causal_example(rng, i, words), sort_keys=True) + "\n" for i in range(count))
        elif task == "qa":
            rows = [_qa_example(rng, i, words, split) for i in range(count)]
            text = json.dumps(_squad_document(rows, f"synthetic {split}"), sort_keys=True)
        else:
            rows = [_pair_example(rng, i, words) for i in range(count)]
            text = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)
        Path(path).write_text(text)
    args = ["--task", task, "--model_name_or_path", paths["model"], "--train_file", paths["train_file"],
            "--validation_file", paths["validation_file"], *SYNTHETIC_ARGS[task]]
    return {**paths, "args": args}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.synthetic", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory to write model/, train.json, eval.json into")
    parser.add_argument("--task", default="qa", choices=tuple(SYNTHETIC_ARGS))
    parser.add_argument("--examples", type=int, default=2000, help="training examples (eval: a tenth, at least 32)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model-dir", help="the model here instead of OUT/model, made only if it is not there yet "
                                            "(demos of every task and size can share it)")
    options = parser.parse_args(argv)
    try:
        result = write_demo(options.out, task=options.task, examples=options.examples, seed=options.seed,
                            model_dir=options.model_dir)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
