"""Sizes of the models and data sets the time model knows (pure data).

Parameter counts are those of the Hugging Face checkpoints with their task heads (the head adds a
few thousand parameters, well under 0.1 percent); they decide how many gradient bytes each step
all-reduces. Pass `--params` for a model not listed here.

hidden and matmul_params (the parameters minus the word, position and type embedding tables)
come from the same configs; they give the model FLOPs per sample (cluster/cost/flops.py).

Data set sizes are the number of training *features* after tokenisation, which is what the
Trainer steps over (one SQuAD example that overflows `max_seq_length` becomes several features).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSize:
    name: str
    params: int
    layers: int
    source: str
    hidden: int = 0  # the width of a layer (attention's FLOPs, cluster/cost/flops.py); 0: not known
    matmul_params: int = 0  # the parameters outside the embedding tables (the model FLOPs); 0: not known
    kv_hidden: int = 0  # the width of the key and value projections (grouped-query attention); 0: not known

    def attention_shapes(self) -> list[tuple[int, int]]:
        """(in, out) of every attention projection (q, k, v, o of each layer): what LoRA adapts by default
        (cluster/job/lora.py); [] when the shape is not known."""
        if not (self.hidden and self.kv_hidden):
            return []
        h, kv = self.hidden, self.kv_hidden
        return [(h, h), (h, kv), (h, kv), (h, h)] * self.layers


@dataclass(frozen=True)
class DatasetSize:
    name: str
    train_features: int
    seq_len: int
    source: str


MODELS: dict[str, ModelSize] = {
    m.name: m
    for m in (
        ModelSize("distilbert-base-uncased", 66_362_880, 6,
                  "DistilBertModel config: 6 layers, hidden 768, vocab 30522 (Sanh et al. 2019: 66M)", hidden=768,
                  matmul_params=42_528_768),
        ModelSize("bert-base-uncased", 109_482_240, 12,
                  "BertModel config: 12 layers, hidden 768, vocab 30522 (Devlin et al. 2019: 110M)", hidden=768,
                  matmul_params=85_646_592),
        ModelSize("bert-large-uncased", 335_141_888, 24,
                  "BertModel config: 24 layers, hidden 1024 (Devlin et al. 2019: 340M)", hidden=1024,
                  matmul_params=303_361_024),
        ModelSize("roberta-base", 124_645_632, 12, "RobertaModel config: 12 layers, vocab 50265 (125M)", hidden=768,
                  matmul_params=85_646_592),
        ModelSize("all-minilm-l6-v2", 22_713_216, 6, "MiniLM-L6-H384 BERT (sentence-transformers: 22.7M)", hidden=384,
                  matmul_params=10_795_392),
        # causal LMs with tied embeddings: the output layer is the embedding table, a matmul (so matmul_params ==
        # params); their shapes are checked against transformers' own configs (tests/training/test_causal_lm.py)
        ModelSize("llama-3.2-1b", 1_235_814_400, 16,
                  "meta-llama/Llama-3.2-1B's LlamaConfig: 16 layers, hidden 2048, 32 heads, 8 KV heads of 64, "
                  "MLP 8192, vocab 128256, tied embeddings (1.24B)", hidden=2048, matmul_params=1_235_814_400,
                  kv_hidden=512),
        ModelSize("qwen2.5-1.5b", 1_543_714_304, 28,
                  "Qwen/Qwen2.5-1.5B's Qwen2Config: 28 layers, hidden 1536, 12 heads, 2 KV heads of 128, MLP 8960, "
                  "vocab 151936, tied embeddings (1.54B)", hidden=1536, matmul_params=1_543_714_304, kv_hidden=256),
    )
}

ALIASES = {
    "distilbert": "distilbert-base-uncased",
    "distilbert-base-cased": "distilbert-base-uncased",
    "bert-base": "bert-base-uncased",
    "bert-base-cased": "bert-base-uncased",
    "bert-large": "bert-large-uncased",
    "minilm": "all-minilm-l6-v2",
    "llama-3.2-1b-instruct": "llama-3.2-1b",
    "qwen2.5-1.5b-instruct": "qwen2.5-1.5b",
}

DATASETS: dict[str, DatasetSize] = {
    d.name: d
    for d in (
        DatasetSize("squad", 88_524, 384,
                    "SQuAD v1.1 train (87,599 examples) through transformers' run_qa.py with "
                    "max_seq_length 384, doc_stride 128 and an uncased BERT tokenizer"),
        DatasetSize("glue-mrpc", 3_668, 128, "GLUE MRPC train split"),
        DatasetSize("glue-qqp", 363_846, 128, "GLUE QQP train split"),
        DatasetSize("glue-sst2", 67_349, 128, "GLUE SST-2 train split"),
        DatasetSize("alpaca", 52_002, 256,
                    "tatsu-lab/alpaca train (52,002 instruction rows); 256 tokens a feature: about a batch's longest "
                    "row with a Llama 3 or Qwen 2.5 tokenizer (an estimate)"),
    )
}

DATASET_ALIASES = {"squad_v1": "squad", "squad-v1": "squad", "mrpc": "glue-mrpc", "qqp": "glue-qqp",
                   "sst2": "glue-sst2", "tatsu-lab/alpaca": "alpaca"}

_PARAMS_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMbB]?)\s*\Z")


def _strip_owner(name: str) -> str:
    # "distilbert/distilbert-base-uncased" and "google-bert/bert-base-uncased" name the same model.
    return name.strip().lower().rsplit("/", 1)[-1]


def lookup_model(name: str) -> ModelSize:
    key = _strip_owner(name)
    key = ALIASES.get(key, key)
    if key not in MODELS:
        raise ValueError(f"model: {name!r} has no known size; known: {', '.join(sorted(MODELS))}; "
                         "for another model pass its parameter count, e.g. --params 66M")
    return MODELS[key]


def lookup_dataset(name: str) -> DatasetSize:
    key = name.strip().lower()
    key = DATASET_ALIASES.get(key, key)
    if key not in DATASETS:
        raise ValueError(f"dataset: {name!r} has no known size; known: {', '.join(sorted(DATASETS))}; "
                         "for another data set pass its number of training features, e.g. --samples 120000")
    return DATASETS[key]


def parse_count(text: str | int, setting: str = "params") -> int:
    """`66M`, `1.3B`, `350k` or a plain integer -> an integer count."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = _PARAMS_RE.match(str(text))
        if not match:
            raise ValueError(f"{setting}: {text!r} is not a count; allowed: an integer or a number "
                             "with k, M or B, e.g. 66M or 1.3B")
        number, unit = float(match.group(1)), match.group(2).lower()
        value = round(number * {"": 1, "k": 1e3, "m": 1e6, "b": 1e9}[unit])
    if value <= 0:
        raise ValueError(f"{setting}: {text!r} must be positive")
    return value
