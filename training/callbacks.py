"""Trainer callbacks: step timing, and checkpoints on a timer, on a rebalance recommendation and on
a spot interruption notice.

Every step all ranks exchange three numbers with one tiny all-reduce: the highest rank (+1) that
has an interruption notice to act on, whether any rank's checkpoint timer has run out, and the
highest rank (+1) that has seen a rebalance recommendation. All ranks get the same answer at the
same step, so they save together and stop together. A rebalance recommendation is advice: one
checkpoint, and training goes on.

Checkpoints are this job's to prune (TrainingArguments.save_total_limit is taken over by the
job): rank 0 keeps the `keep` newest of this run, on its disk and on S3, and never touches
another run's.
"""

from __future__ import annotations

import logging
import os
import time

from transformers import TrainerCallback

from cluster.job import runreport
from training import checkpoint_s3, checkpoints, distributed, resume
from xeon_cluster.progress import ProgressRecorder

log = logging.getLogger(__name__)


class StepTimer(TrainerCallback):
    """Wall time of every optimizer step (between consecutive step ends, data loading included), and the
    job's progress record that `fab status` reads (xeon_cluster/progress.py: rank 0 writes it). Into the
    Trainer's log history (trainer_state.json, which `fab report` reads: cluster/job/runreport.py) it adds
    each logging step's step time and samples per second, and an entry at the step a run resumed from."""

    def __init__(self):
        self.train_begin: float | None = None
        self.first_step_end: float | None = None
        self.last_step_end: float | None = None
        self.step_seconds: list[float] = []
        self.start_step = 0
        self.progress: ProgressRecorder | None = None
        self.batch = 0
        self.logged = 0  # step_seconds already summed into a log entry

    def on_train_begin(self, args, state, control, **kwargs):
        self.train_begin = time.time()
        self.start_step = state.global_step
        batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * max(1, args.world_size)
        self.batch = batch
        self.progress = ProgressRecorder(state.max_steps or None, batch, args.output_dir)

    def on_log(self, args, state, control, logs=None, **kwargs):
        window = self.step_seconds[max(self.logged, 1 if len(self.step_seconds) > 1 else 0):]  # the first: warm-up
        self.logged = len(self.step_seconds)
        entry = state.log_history[-1] if state.log_history else None
        if not window or not isinstance(entry, dict) or entry.get("step") != state.global_step or "loss" not in entry:
            return
        seconds = sum(window) / len(window)
        entry[runreport.STEP_SECONDS] = round(seconds, 4)
        if seconds > 0:
            entry[runreport.SAMPLES_PER_SECOND] = round(self.batch / seconds, 2)

    def on_step_end(self, args, state, control, **kwargs):
        now = time.time()
        previous = self.last_step_end if self.last_step_end is not None else self.train_begin
        self.step_seconds.append(now - previous)
        self.last_step_end = now
        if self.first_step_end is None:
            self.first_step_end = now
            self.start_step = state.global_step - 1
            if self.start_step > 0:  # resumed from a checkpoint (the Trainer restores its state after train begins)
                state.log_history.append({"step": self.start_step, runreport.RESUMED: True})
        if self.progress is not None:
            self.progress.step(state.global_step, state.max_steps or None)

    def on_train_end(self, args, state, control, **kwargs):
        if self.progress is not None:
            self.progress.finish()


class SpotCheckpointCallback(TrainerCallback):
    """Time-based checkpoints, one checkpoint on a rebalance recommendation, and checkpoint-then-stop
    when any rank has an interruption notice to act on; every checkpoint gets the run's manifest,
    its upload and the run's pruning."""

    def __init__(self, *, rank: int, watcher=None, checkpoint_minutes: float = 0.0,
                 checkpoint_uri: str | None = None, s3_client_factory=checkpoint_s3.s3_client,
                 run_id: str | None = None, keep: int | None = None):
        self.rank = rank
        self.watcher = watcher
        self.interval = checkpoint_minutes * 60.0
        self.uri = checkpoint_uri
        self.run_id = run_id
        self.keep = keep or 0  # checkpoints of this run to keep (0: all)
        self._client_factory = s3_client_factory
        self._client = None
        self.last_save = time.monotonic()
        self.interrupted_at: int | None = None
        self.notice_rank: int | None = None
        self.rebalance_at: int | None = None
        self.saved: list[dict] = []
        self._not_saved: str | None = None  # why this rank could not save the checkpoint being taken
        self.position = resume.DataPosition(step=0, samples=0)  # where this job started in the data

    def samples_seen(self, args, step: int) -> int:
        """The samples the run had trained on at `step` (earlier jobs' at their own global batch, then this job's)."""
        global_batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * distributed.world_size()
        return self.position.samples + (step - self.position.step) * global_batch

    def on_train_begin(self, args, state, control, **kwargs):
        self.last_save = time.monotonic()

    def _seen(self, attribute: str) -> int:
        return self.rank + 1 if self.watcher is not None and getattr(self.watcher, attribute, None) else 0

    def on_step_end(self, args, state, control, **kwargs):
        due = int(self.interval > 0 and time.monotonic() - self.last_save >= self.interval)
        notice_rank_plus_one, any_due, rebalance_rank_plus_one = distributed.max_over_ranks(
            [self._seen("notice"), due, self._seen("rebalance")])
        if notice_rank_plus_one and self.interrupted_at is None:
            self.interrupted_at = state.global_step
            self.notice_rank = notice_rank_plus_one - 1
            if self.rank == 0:
                log.warning("rank %d saw an interruption notice: checkpointing at step %d and stopping",
                            self.notice_rank, state.global_step)
            control.should_save = True
            control.should_training_stop = True
        elif rebalance_rank_plus_one and self.rebalance_at is None:
            self.rebalance_at = state.global_step
            if self.rank == 0:
                log.warning("rank %d saw a rebalance recommendation: checkpointing at step %d and training on",
                            rebalance_rank_plus_one - 1, state.global_step)
            control.should_save = True
        elif any_due:
            control.should_save = True
        return control

    def not_saved(self, why: str) -> None:
        """This rank could not write its part of the checkpoint being taken (its disk is full: the trainer's
        _save_checkpoint, training/train.py); on_save then completes none and training goes on."""
        self._not_saved = why

    def on_save(self, args, state, control, **kwargs):
        # every rank has written its part (its RNG state) before the manifest lists them, or says it could not
        [failed] = distributed.max_over_ranks([int(self._not_saved is not None)])
        directory = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        record = {"step": state.global_step, "path": directory, "uri": None, "upload_error": None}
        world = distributed.world_size()
        # ranks on other nodes wrote their random state into their own folders: rank 0's gets a copy of each
        states = distributed.gather(None if failed or world <= 1 else
                                    checkpoints.read_rank_state(directory, self.rank, world))
        if self.rank == 0 and not failed:
            try:
                checkpoints.add_rank_states(directory, states, world)
                checkpoints.write_manifest(directory, state.global_step, run_id=self.run_id, world_size=world,
                                           samples_seen=self.samples_seen(args, state.global_step))
            except OSError as exc:
                self._not_saved = checkpoints.disk_full(exc, directory)
                if self._not_saved is None:
                    raise
                failed = 1
        if failed:
            self._discard(directory, state.global_step, record)
        elif self.rank == 0:
            started = time.monotonic()
            protect = [checkpoints.step_of(os.path.basename(state.best_model_checkpoint))] \
                if getattr(state, "best_model_checkpoint", None) else []
            if self.uri:
                record["uri"], record["upload_error"] = self._upload(directory, state.global_step, protect)
            if self.keep:
                pruned = checkpoints.prune_local(args.output_dir, self.keep, self.run_id, protect)
                if pruned:
                    log.info("removed older local checkpoints %s", pruned)
            record["seconds"] = round(time.monotonic() - started, 3)
            self.saved.append(record)
        distributed.barrier()  # nobody stops (or exits) before the checkpoint is complete
        self.last_save = time.monotonic()
        return control

    def _discard(self, directory: str, step: int, record: dict) -> None:
        """A checkpoint a rank's full disk could not hold: no manifest, its folder removed on every rank (so never
        resumed from, nor uploaded); the one before it stays the newest, and training goes on."""
        checkpoints.discard(directory)
        if self.rank == 0:
            why = self._not_saved or "another rank's disk is full"
            log.error("checkpoint %d not saved: %s; training goes on, the checkpoint before it stays the newest",
                      step, why)
            self.saved.append({**record, "path": None, "save_error": why})
        self._not_saved = None

    def _upload(self, directory: str, step: int, protect: list) -> tuple[str | None, str | None]:
        """(uri, None) after a verified upload (then the run's S3 pruning), or (None, error): training goes on."""
        try:
            if self._client is None:
                self._client = self._client_factory()
            uri = checkpoint_s3.upload_checkpoint(self._client, directory, self.uri)
        except Exception as exc:  # noqa: BLE001 - keep training; the local copy still exists
            log.error("checkpoint %d upload to %s failed: %s", step, self.uri, exc)
            return None, f"{type(exc).__name__}: {exc}"
        log.info("checkpoint %d uploaded to %s", step, uri)
        if self.keep:  # S3 keeps as many of this run's as the output directory does
            try:
                pruned = checkpoint_s3.prune_s3(self._client, self.uri, self.keep, self.run_id, protect)
            except Exception as exc:  # noqa: BLE001 - old checkpoints left over cost space, not progress
                log.warning("could not remove older S3 checkpoints under %s: %s", self.uri, exc)
            else:
                if pruned:
                    log.info("removed older S3 checkpoints %s", pruned)
        return uri, None
