"""Trainer callbacks: step timing, and checkpoints on a timer or on a spot notice.

Every step all ranks exchange two numbers with one tiny all-reduce: the highest rank (+1) that
has seen a metadata notice, and whether any rank's checkpoint timer has run out. All ranks get
the same answer at the same step, so they save together and stop together.
"""

from __future__ import annotations

import logging
import os
import time

from transformers import TrainerCallback

from training import checkpoints, distributed

log = logging.getLogger(__name__)


class StepTimer(TrainerCallback):
    """Wall time of every optimizer step (between consecutive step ends, data loading included)."""

    def __init__(self):
        self.train_begin: float | None = None
        self.first_step_end: float | None = None
        self.last_step_end: float | None = None
        self.step_seconds: list[float] = []
        self.start_step = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.train_begin = time.time()
        self.start_step = state.global_step

    def on_step_end(self, args, state, control, **kwargs):
        now = time.time()
        previous = self.last_step_end if self.last_step_end is not None else self.train_begin
        self.step_seconds.append(now - previous)
        self.last_step_end = now
        if self.first_step_end is None:
            self.first_step_end = now
            self.start_step = state.global_step - 1


class SpotCheckpointCallback(TrainerCallback):
    """Time-based checkpoints, and checkpoint-then-stop when any rank sees an interruption notice."""

    def __init__(self, *, rank: int, watcher=None, checkpoint_minutes: float = 0.0,
                 checkpoint_uri: str | None = None, s3_client_factory=checkpoints.s3_client):
        self.rank = rank
        self.watcher = watcher
        self.interval = checkpoint_minutes * 60.0
        self.uri = checkpoint_uri
        self._client_factory = s3_client_factory
        self._client = None
        self.last_save = time.monotonic()
        self.interrupted_at: int | None = None
        self.notice_rank: int | None = None
        self.saved: list[dict] = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.last_save = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        seen = self.rank + 1 if self.watcher is not None and self.watcher.notice else 0
        due = int(self.interval > 0 and time.monotonic() - self.last_save >= self.interval)
        notice_rank_plus_one, any_due = distributed.max_over_ranks([seen, due])
        if notice_rank_plus_one and self.interrupted_at is None:
            self.interrupted_at = state.global_step
            self.notice_rank = notice_rank_plus_one - 1
            if self.rank == 0:
                log.warning("rank %d saw an interruption notice: checkpointing at step %d and stopping",
                            self.notice_rank, state.global_step)
            control.should_save = True
            control.should_training_stop = True
        elif any_due:
            control.should_save = True
        return control

    def on_save(self, args, state, control, **kwargs):
        directory = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        record = {"step": state.global_step, "path": directory, "uri": None, "upload_error": None}
        if self.rank == 0:
            started = time.monotonic()
            checkpoints.write_manifest(directory, state.global_step)
            if self.uri:
                try:
                    if self._client is None:
                        self._client = self._client_factory()
                    record["uri"] = checkpoints.upload_checkpoint(self._client, directory, self.uri)
                    log.info("checkpoint %d uploaded to %s", state.global_step, record["uri"])
                    if args.save_total_limit:  # S3 keeps as many as the output directory does
                        pruned = checkpoints.prune_s3(self._client, self.uri, args.save_total_limit)
                        if pruned:
                            log.info("removed older S3 checkpoints %s", pruned)
                except Exception as exc:  # keep training; the local copy still exists
                    record["upload_error"] = f"{type(exc).__name__}: {exc}"
                    log.error("checkpoint %d upload to %s failed: %s", state.global_step, self.uri, exc)
            record["seconds"] = round(time.monotonic() - started, 3)
            self.saved.append(record)
        distributed.barrier()  # nobody stops (or exits) before the checkpoint is complete
        self.last_save = time.monotonic()
        return control
