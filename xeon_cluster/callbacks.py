"""A Hugging Face `Trainer` callback that saves a checkpoint and stops on a spot interruption notice.

    from xeon_cluster.callbacks import SpotNoticeCallback
    trainer = Trainer(..., callbacks=[SpotNoticeCallback()])

On a notice (the node's watcher signals the rank, or the notice file appears) the callback asks
the Trainer to save a checkpoint at the end of the current step and to stop. A spot notice reaches
one node, not all of them: with a process group the ranks agree with one tiny all-reduce per step,
so every rank saves and stops at the same step. Resume with the Trainer's own
`trainer.train(resume_from_checkpoint=True)` (or a path) in the next run.
"""

from __future__ import annotations

import signal

from transformers import TrainerCallback

from xeon_cluster import notice

DEFAULT_SIGNAL = "SIGUSR1"


class SpotNoticeCallback(TrainerCallback):
    def __init__(self, signal_name: str | None = DEFAULT_SIGNAL):
        self.noticed = False
        self.saved_at: int | None = None
        self.signalled = False
        if signal_name:
            signal.signal(getattr(signal, signal_name), self._on_signal)

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
