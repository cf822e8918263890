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


class ProgressCallback(TrainerCallback):
    """Rank 0 keeps <output dir>/progress.json current (xeon_cluster/progress.py): the Trainer's step, its
    max_steps and the samples of one step (the global batch)."""

    def __init__(self, directory: str | None = None):
        self.directory = directory
        self.recorder: ProgressRecorder | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * max(1, args.world_size)
        self.recorder = ProgressRecorder(state.max_steps or None, batch, self.directory or args.output_dir)

    def on_step_end(self, args, state, control, **kwargs):
        if self.recorder is not None:
            self.recorder.step(state.global_step, state.max_steps or None)

    def on_train_end(self, args, state, control, **kwargs):
        if self.recorder is not None:
            self.recorder.finish()
