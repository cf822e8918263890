"""A run's checkpoints at start-up: the --checkpoint_uri probe, the run's id, and with --resume the
checkpoint to continue (the newest one every rank can read, fetched where a node lacks it).

Every decision is made by rank 0 and shared, so all ranks continue the same checkpoint or stop
with the same message (training/distributed.py).
"""

from __future__ import annotations

import logging
import os
from typing import NamedTuple

from training.errors import BadInput

log = logging.getLogger("training")


class DataPosition(NamedTuple):
    """Where a job starts in the run's data: the Trainer's step and the samples trained on before it."""

    step: int
    samples: int


def data_position(manifest: dict, step: int, global_batch: int) -> DataPosition:
    """Where a job with `global_batch` samples per step continues a checkpoint of `step`.

    At the checkpoint's own global batch, at its step. At another one (a smaller world whose batch no accumulation
    keeps), at the step of this batch that has seen as many samples: the Trainer places a resumed job in its data by
    steps, so step 50 of 64 samples (3,200 seen) continued with 48 would go back to sample 2,400 and train part of
    an epoch twice; it continues as step 67 instead. A checkpoint that does not record its samples (written before
    they were kept) is continued at its step."""
    samples = manifest.get("samples_seen")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
        return DataPosition(step, step * global_batch)
    if samples == step * global_batch:
        return DataPosition(step, samples)
    return DataPosition(round(samples / global_batch), samples)


class RunCheckpoints:
    """`run_id`: the run this job belongs to (made at a fresh start, kept by --resume); `keep`: how
    many of its checkpoints to keep (--save_total_limit; 0: all). `agreed(stage)` runs a stage
    and makes every rank raise the first rank's error (Job._agreed)."""

    def __init__(self, info, agreed):
        self.info = info
        self._agreed = agreed
        self.run_id: str | None = None
        self.keep = 0
        self._s3_client = None

    def s3(self):
        """The job's S3 client (made once, when first needed)."""
        from training import checkpoint_s3

        if self._s3_client is None:
            self._s3_client = checkpoint_s3.s3_client()
        return self._s3_client

    def _look_on_s3(self, uri: str | None) -> list:
        """Rank 0: probe --checkpoint_uri (write, read back, delete), then its complete checkpoints."""
        from training import checkpoint_s3

        if not uri:
            return []
        checkpoint_s3.probe_uri(checkpoint_s3.s3_client(max_attempts=3), uri)
        try:
            return checkpoint_s3.s3_checkpoints(self.s3(), uri)
        except Exception as exc:  # noqa: BLE001 - S3 errors come in many classes
            raise BadInput(f"--checkpoint_uri {uri}: could not list its checkpoints ({type(exc).__name__}: "
                           f"{exc})") from None

    def start(self, parsed):
        """Before the data: the --checkpoint_uri probe, this run's id, and with --resume the checkpoint
        to continue ((path, Found) or None). A fresh start into another run's checkpoints stops here."""
        from training import checkpoints, distributed

        job_args, training_args = parsed.job, parsed.training
        output_dir, uri = training_args.output_dir, job_args.checkpoint_uri
        self.keep = training_args.save_total_limit or 0
        training_args.save_total_limit = None  # the job prunes, within its run (training/callbacks.py)
        remote = self._agreed(lambda: self._look_on_s3(uri) if self.info.rank == 0 else [])
        local = checkpoints.local_checkpoints(output_dir, quiet=self.info.rank != 0)
        if not job_args.resume:
            run_id, message = checkpoints.new_run_id(), None
            given = training_args.resume_from_checkpoint  # the Trainer's own flag: that checkpoint's run
            if given:
                run_id = (checkpoints.read_manifest(given) or {}).get("run_id") or run_id
            elif self.info.rank == 0:
                message = checkpoints.fresh_start_conflict(output_dir, uri, local, remote)
            distributed.raise_first_error(message)
            self.run_id = distributed.gather(run_id)[0]  # rank 0's
            return None
        return self._resume_point(output_dir, uri, local, remote, job_args)

    def _resume_point(self, output_dir: str, uri: str | None, local: list, remote: list, job_args):
        """--resume: the newest checkpoint every rank can read (its own disk, or S3), fetched where missing."""
        from training import checkpoint_s3, checkpoints, distributed

        local_by_rank = distributed.gather(local)
        hosts = distributed.hosts()
        chosen, error = None, None
        if self.info.rank == 0:
            chosen = checkpoints.choose_resume(local_by_rank, remote)
            if chosen is None and (remote or any(local_by_rank)):
                error = (f"--resume: no checkpoint is readable by every rank "
                         f"({checkpoints.describe_readable(local_by_rank, remote, hosts)}); "
                         + ("the workers fetch checkpoints from --checkpoint_uri, so one must be complete there; "
                            if uri else "pass --checkpoint_uri s3://... so every node can fetch one, or use an "
                            "--output_dir every node shares; ")
                         + "or start afresh without --resume in another --output_dir")
        distributed.raise_first_error(error)
        chosen = distributed.gather(chosen)[0]  # rank 0 decides
        if chosen is None:
            self.run_id = distributed.gather(checkpoints.new_run_id())[0]
            if self.info.rank == 0:
                log.warning("--resume: no complete checkpoint in %s%s; starting from step 0 as run %s",
                            output_dir, f" or {uri}" if uri else "", self.run_id)
            return None
        self.run_id = chosen.run_id or distributed.gather(checkpoints.new_run_id())[0]
        path = os.path.join(output_dir, f"checkpoint-{chosen.step}")
        error = None
        if self.info.local_rank == 0 and chosen.key not in {f.key for f in local}:
            location = f"{uri.rstrip('/')}/checkpoint-{chosen.step}"
            try:  # not on this node's disk, so on S3 (every rank can read the chosen one)
                checkpoint_s3.download_checkpoint(self.s3(), location, path)
                fetched, why = checkpoints.inspect_local(path)
                if fetched is None or fetched.key != chosen.key:
                    raise checkpoints.CheckpointError(why or f"it is run {fetched.run_id}'s, not run {chosen.run_id}'s")
                log.warning("downloaded checkpoint %d from %s", chosen.step, location)
            except Exception as exc:  # noqa: BLE001 - reported by rank 0 for every rank
                error = f"--resume: download of checkpoint-{chosen.step} from {location} failed: {exc}"
        distributed.raise_first_error(error)
        self._check_rank_states(path, chosen.step, allow=job_args.resume_without_rank_state)
        if self.info.rank == 0:
            log.info("resuming from %s (step %d of run %s, chosen from %s: the newest checkpoint every rank can "
                     "read)", path, chosen.step, self.run_id, chosen.location)
        return path, chosen

    def _check_rank_states(self, path: str, step: int, *, allow: bool) -> None:
        """Every rank's random state must be in the checkpoint it continues (or the world size changed, or `allow`):
        else one line from rank 0 stops every rank before training."""
        from training import checkpoints, distributed

        world = self.info.world_size
        has = os.path.isfile(os.path.join(path, checkpoints.rank_state_name(self.info.rank, world)))
        missing = [rank for rank, found in enumerate(distributed.gather(has)) if not found]
        error = None
        if self.info.rank == 0 and missing:
            written_by = (checkpoints.read_manifest(path) or {}).get("world_size")
            error = checkpoints.rank_state_refusal(step=step, missing=missing, world_size=world, written_by=written_by)
            if error is None or allow:
                log.warning("checkpoint-%d has no random state for rank(s) %s (written by %s rank(s), resumed on %d): "
                            "they start new random streams", step, ", ".join(map(str, missing)),
                            written_by if isinstance(written_by, int) else "an unknown number of", world)
                error = None
        distributed.raise_first_error(error)
