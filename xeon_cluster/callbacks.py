"""Hugging Face `Trainer` callbacks: a checkpoint and a stop on a spot interruption notice, and the progress
record `fab status` shows (step out of total, samples per second, time left).

    from xeon_cluster.callbacks import ProgressCallback, SpotNoticeCallback
    trainer = Trainer(..., callbacks=[SpotNoticeCallback(), ProgressCallback()])

On a notice (the node's watcher signals the rank with the signal the launch configured,
XEON_CLUSTER_NOTICE_SIGNAL, or the notice file appears) the callback asks
the Trainer to save a checkpoint at the end of the current step and to stop. A spot notice reaches
one node, not all of them: with a process group the ranks agree with one tiny all-reduce per step,
so every rank saves and stops at the same step. Resume with the Trainer's own
`trainer.train(resume_from_checkpoint=True)` (or a path) in the next run.
"""

from __future__ import annotations

import inspect
import logging
import signal

from transformers import TrainerCallback

from xeon_cluster import NO_SIGNAL, notice, notice_signal
from xeon_cluster.progress import ProgressRecorder


class SpotNoticeCallback(TrainerCallback):
    """`signal_name`: the signal to handle; by default the one the node's watcher sends
    (xeon_cluster.notice_signal()); "none" handles none (the notice file is still read every step)."""

    def __init__(self, signal_name: str | None = None):
        self.noticed = False
        self.saved_at: int | None = None
        self.signalled = False
        name = notice_signal() if signal_name is None else signal_name
        self.signal_name = None if not name or name.lower() == NO_SIGNAL else name
        if self.signal_name:
            signal.signal(getattr(signal, self.signal_name), self._on_signal)

    def _on_signal(self, signum, frame) -> None:  # noqa: ARG002 - a signal handler's signature
        self.noticed = self.signalled = True

    def _agreed(self) -> bool:
        mine = self.noticed or notice() is not None
        try:
            import torch
            import torch.distributed as dist
        except ImportError:
            return mine
        if not (dist.is_available() and dist.is_initialized()):
            return mine
        flag = torch.tensor([1 if mine else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def on_step_end(self, args, state, control, **kwargs):
        if self.saved_at is None and self._agreed():
            self.noticed = True
            self.saved_at = state.global_step
            control.should_save = True
            control.should_training_stop = True
        return control


def loss_times_ranks(model, args) -> str | None:
    """Why the Trainer will report and optimise N times the loss of `model` on N ranks, or None.

    With `average_tokens_across_devices` (transformers' default) and a model whose forward takes **kwargs, the
    Trainer takes the model to divide its loss by `num_items_in_batch` (the label count over every rank) and
    multiplies the loss by the number of ranks to undo DDP's averaging. A head that computes its own batch mean
    (BERT's and DistilBERT's classification and QA heads) ignores that count, so its loss and gradients come out N
    times too large. Known from the forward's source: it names neither `loss_function` nor `num_items_in_batch`."""
    if max(1, getattr(args, "world_size", 1)) <= 1 or not getattr(args, "average_tokens_across_devices", False):
        return None
    if model is None or getattr(model, "accepts_loss_kwargs", None) is False:
        return None
    try:
        forward = type(model).forward
        takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD
                           for p in inspect.signature(forward).parameters.values())
        source = inspect.getsource(forward)
    except (TypeError, ValueError, OSError):
        return None
    if not takes_kwargs or "loss_function" in source or "num_items_in_batch" in source:
        return None
    return (f"{type(model).__name__}'s loss is its batch mean and ignores num_items_in_batch, so the Trainer reports "
            f"and optimises {args.world_size} x the loss on {args.world_size} ranks; set `model.accepts_loss_kwargs "
            "= False` before building the Trainer (or TrainingArguments(average_tokens_across_devices=False))")


class ProgressCallback(TrainerCallback):
    """Rank 0 keeps <output dir>/progress.json current (xeon_cluster/progress.py): the Trainer's step, its
    max_steps and the samples of one step (the global batch). At the start, rank 0 warns when the Trainer will
    multiply the model's loss by the number of ranks (`loss_times_ranks`)."""

    def __init__(self, directory: str | None = None):
        self.directory = directory
        self.recorder: ProgressRecorder | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        why = loss_times_ranks(kwargs.get("model"), args) if getattr(args, "process_index", 0) == 0 else None
        if why:
            logging.getLogger("xeon_cluster").warning("xeon-cluster: %s", why)
        batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * max(1, args.world_size)
        self.recorder = ProgressRecorder(state.max_steps or None, batch, self.directory or args.output_dir)

    def on_step_end(self, args, state, control, **kwargs):
        if self.recorder is not None:
            self.recorder.step(state.global_step, state.max_steps or None)

    def on_train_end(self, args, state, control, **kwargs):
        if self.recorder is not None:
            self.recorder.finish()
