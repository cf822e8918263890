"""The job's model FLOPs and the node's peak (cluster/cost/flops.py): the summary's `mfu` and its inputs,
and a progress line at every logging step (what `fab status` shows for a running job)."""

from __future__ import annotations

import logging
import os
import subprocess
from dataclasses import dataclass

from transformers import TrainerCallback

from cluster.stack import catalog
from cluster.cost import flops

log = logging.getLogger("training")

# qa pads every feature to --max_seq_length (training/qa.py); classification pads a batch to its
# longest, about the mean real length
PADDED_TO_MAX_LENGTH = ("qa",)


def lscpu_text() -> str:
    """`lscpu`'s output (C locale), "" where it cannot run."""
    try:
        return subprocess.run(["lscpu"], capture_output=True, text=True, timeout=20,
                              env={**os.environ, "LC_ALL": "C"}).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def current_mhz(cpuinfo: str | None = None) -> float:
    """/proc/cpuinfo's `cpu MHz` of the first processor (0: not there)."""
    from training.hardware import _first_cpuinfo_value

    try:
        return float(_first_cpuinfo_value("cpu MHz", cpuinfo) or 0)
    except ValueError:
        return 0.0


def node_peak(bf16: bool, instance_type: str | None) -> flops.Peak | None:
    """The node's peak: the catalog's for a known `instance_type`, else what lscpu says here."""
    known = catalog.lookup(instance_type or "")
    peak = flops.peak_from_catalog(known, bf16) if known else None
    return peak or flops.peak_from_lscpu(lscpu_text(), bf16, current_mhz=current_mhz())


def model_shape(model) -> tuple[int, int, int, int]:
    """(parameters outside embedding tables, those of them that train, layers, hidden width) of a transformers
    model (a peft model's too). A language model's output layer is a matmul even when it shares the input
    embedding's table."""
    import torch

    embedded = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if output is not None and id(output.weight) in embedded:
        embedded.discard(id(output.weight))
    matmul = [p for p in model.parameters() if id(p) not in embedded]
    trained = sum(p.numel() for p in matmul if p.requires_grad)
    config = model.config
    layers = next((getattr(config, k) for k in ("num_hidden_layers", "n_layers") if getattr(config, k, None)), 0)
    hidden = next((getattr(config, k) for k in ("hidden_size", "dim") if getattr(config, k, None)), 0)
    return sum(p.numel() for p in matmul), trained, int(layers), int(hidden)


@dataclass
class ModelFlops:
    """What MFU needs besides the step time: FLOPs per sample, samples per step per node, the peak."""

    matmul_params: int
    trained_params: int  # of the matmul parameters, those with a gradient (LoRA: the adapters')
    layers: int
    hidden: int
    seq_len: float
    per_sample: float
    global_batch: int
    nodes: int
    peak: flops.Peak | None

    def per_node_flops(self, step_seconds: float) -> float:
        return self.per_sample * self.global_batch / self.nodes / step_seconds if step_seconds > 0 else 0.0

    def summary(self, steady_step_seconds: float | None) -> dict:
        """The summary's `mfu` (None without a peak or a timed step) and `mfu_inputs`."""
        achieved = self.per_node_flops(steady_step_seconds or 0.0)
        ratio = flops.mfu(achieved, self.peak) if achieved else None
        return {
            "mfu": round(ratio, 6) if ratio is not None else None,
            "mfu_inputs": {
                "model_flops_per_sample": round(self.per_sample), "matmul_params": self.matmul_params,
                "trained_matmul_params": self.trained_params,
                "layers": self.layers, "hidden": self.hidden, "seq_len": round(self.seq_len, 2),
                "global_batch_size": self.global_batch, "nodes": self.nodes,
                "steady_step_seconds": steady_step_seconds,
                "achieved_flops_per_s_per_node": round(achieved),
                "peak": self.peak.as_dict() if self.peak else None,
                "formula": "6 x trained_matmul_params x seq_len + 4 x the frozen rest x seq_len + 12 x layers x "
                           "hidden x seq_len^2 FLOPs per sample; "
                           "MFU = achieved / peak per node",
            },
        }


def model_flops(model, *, task: str, max_seq_length: int, tokens_per_sample: float, global_batch: int, nodes: int,
                peak: flops.Peak | None) -> ModelFlops:
    matmul, trained, layers, hidden = model_shape(model)
    seq = float(max_seq_length) if task in PADDED_TO_MAX_LENGTH else max(1.0, tokens_per_sample)
    return ModelFlops(matmul, trained, layers, hidden, seq,
                      flops.train_flops_per_sample(matmul, layers, hidden, seq, trained),
                      global_batch, max(1, nodes), peak)


class FlopsLogger(TrainerCallback):
    """Rank 0 logs model FLOP/s per node and MFU once, at the first log after the first step (which carries
    warm-up and any compile, left out); the run's steady MFU is the summary's (`ModelFlops.summary`)."""

    def __init__(self, timer, figures: ModelFlops):
        self.timer = timer
        self.figures = figures
        self.logged = False

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or self.logged:
            return
        window = self.timer.step_seconds[1:]
        if not window:
            return
        self.logged = True
        line = flops.progress_line(state.global_step, self.figures.per_node_flops(sum(window) / len(window)),
                                   self.figures.peak)
        if line:
            log.info(line)
