"""The job every MPI rank runs: `python -m training [arguments]` (docs/training.md).

Order of events: ranks from the launcher's environment -> the job's own arguments -> process
group (ccl or gloo) -> every argument (TrainingArguments) -> checkpoints: the --checkpoint_uri
probe, the run's id and the resume point (the newest checkpoint every rank can read) -> tokenizer,
data, model (all ranks agree on any error) -> training with step timing, timed checkpoints and the
spot watcher -> final model, evaluation -> summary on rank 0 -> process group destroyed.
Exit codes are in cluster/exit_codes.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import sys
import time
import traceback
from typing import TYPE_CHECKING, Any, NamedTuple

from cluster import exit_codes
from training import ranks as rank_env
from training.errors import BadInput
from training.resume import RunCheckpoints
from xeon_cluster.run import record_outcome

if TYPE_CHECKING:
    from training import tasks

log = logging.getLogger("training")


def process_start_time() -> float:
    """Wall-clock time this process started (Linux /proc), so start-up imports are counted too."""
    try:
        with open("/proc/self/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of stat(5); fields[0] is field 3
        with open("/proc/stat") as handle:
            boot = next(int(line.split()[1]) for line in handle if line.startswith("btime"))
        return boot + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


def _configure_logging(rank: int) -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"%(asctime)s rank {rank} %(levelname)s %(name)s: %(message)s", force=True)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_warning() if rank == 0 else hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        import datasets

        datasets.disable_progress_bars()  # one bar per rank per map() drowns the log under mpirun
    except ImportError:  # pragma: no cover - both are dependencies of the job
        pass


def _weights_sha256(model) -> str:
    """A digest of every parameter and buffer, in name order: equal digests, equal models."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    return digest.hexdigest()


def schedule_at(scheduler, optimizer, step: int) -> None:
    """Put a learning-rate schedule loaded from a checkpoint at `step` (a resumed step re-expressed in another global
    batch), the optimizer's rates with it: a LambdaLR's (the Trainer's schedules) from its own functions."""
    scheduler.last_epoch = step
    if hasattr(scheduler, "lr_lambdas"):
        rates = [base * rule(step) for rule, base in zip(scheduler.lr_lambdas, scheduler.base_lrs, strict=True)]
        for group, rate in zip(optimizer.param_groups, rates, strict=True):
            group["lr"] = rate
        scheduler._last_lr = rates


class Trained(NamedTuple):
    """What training left for the finish: the Trainer, its callbacks, the loss and the resume point."""

    trainer: Any
    timer: Any  # training.callbacks.StepTimer
    spot: Any  # training.callbacks.SpotCheckpointCallback
    train_loss: float
    resumed: Any  # the checkpoint resumed from (training.checkpoints), or None


class Job:
    """One rank's run. `run()` returns an exit code; `close()` always runs afterwards."""

    def __init__(self, info: rank_env.RankInfo, argv: list[str], started: float):
        self.info = info
        self.argv = argv
        self.started = started
        self.watcher = None
        self.task = None  # the --task's object (training/tasks.py), chosen once the arguments are read
        self.settings: dict = {}
        self.store = None  # the run's checkpoints (training/resume.py), set once the arguments are read
        self.flops = None  # the model FLOPs and the node's peak (training/mfu.py), set before training

    # ---- start-up ----

    def _start_distributed(self, job_args) -> None:
        from training import distributed

        if not self.info.distributed:
            self.settings.update(backend=None, backend_reason="single process")
            return
        rank_env.rendezvous(os.environ, self.info)
        backend, reason = distributed.choose_backend(job_args.dist_backend)
        distributed.init(self.info, backend)
        self.settings.update(backend=backend, backend_reason=reason)

    def _hardware_settings(self, training_args, bf16_reason: str, ipex, flags: frozenset[str]) -> dict:
        import torch

        from training import hardware

        libraries = hardware.loaded_libraries()
        return {
            "bf16": bool(training_args.bf16),
            "bf16_reason": bf16_reason,
            "ipex": getattr(ipex, "__version__", "loaded") if ipex is not None else None,
            "threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "allocator": hardware.allocator(libraries),
            "ld_preload": os.environ.get("LD_PRELOAD"),
            "openmp_runtime": hardware.openmp_runtime(libraries),
            "cpu_model": hardware.cpu_model(),
            "cpu_features": sorted(f for f in hardware.REPORTED_FLAGS if f in flags),
            "physical_cores": hardware.physical_cores(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        }

    def _log_settings(self) -> None:
        s = self.settings
        log.info("world size %d (%s), backend %s (%s); bf16 %s (%s); ipex %s; threads per rank %d "
                 "(OMP_NUM_THREADS=%s); allocator %s; %s; CPU features %s",
                 self.info.world_size, self.info.launcher, s["backend"], s["backend_reason"],
                 "on" if s["bf16"] else "off", s["bf16_reason"], s["ipex"] or "off", s["threads"],
                 s["omp_num_threads"], s["allocator"], s["openmp_runtime"], ", ".join(s["cpu_features"]) or "none")

    # ---- data and model ----

    def _prepare(self, parsed) -> tasks.Prepared:
        """Tokenizer, datasets, features and model; raises BadInput for anything the user can fix."""
        from training import data, modeling, tasks

        model_args, data_args = parsed.model, parsed.data
        tokenizer = modeling.load_tokenizer(model_args, data_args.task)
        train_raw, eval_raw, source = data.load_splits(data_args, model_args.cache_dir)
        train_name = data_args.train_file or f"dataset {data_args.dataset_name} split {data_args.train_split}"
        columns = data.check_columns(train_raw, data_args, train_name)
        if eval_raw is not None:
            eval_name = (data_args.validation_file
                         or f"dataset {data_args.dataset_name} split {data_args.validation_split}")
            data.check_columns(eval_raw, data_args, eval_name)
        train_raw = data.limit(train_raw, data_args.max_train_samples)
        eval_raw = None if data_args.max_eval_samples == 0 else data.limit(eval_raw, data_args.max_eval_samples)
        if eval_raw is not None and len(eval_raw) == 0:
            eval_raw = None
        train_features, eval_raw, eval_features, model = self.task.prepare(train_raw, eval_raw, tokenizer,
                                                                            parsed, columns)
        sample = train_features.select(range(min(10000, len(train_features))))
        masks = sample["attention_mask"]
        return tasks.Prepared(tokenizer=tokenizer, source=source, train_examples=len(train_raw),
                              train_features=train_features, eval_raw=eval_raw, eval_features=eval_features,
                              model=model, tokens_per_sample=sum(map(sum, masks)) / max(1, len(masks)),
                              parameters=sum(p.numel() for p in model.parameters()),
                              trainable_parameters=sum(p.numel() for p in model.parameters() if p.requires_grad))

    def _agreed(self, stage):
        """Run `stage()` on every rank; if any rank raises BadInput, all raise the first message."""
        from training import distributed

        result, message = None, None
        try:
            result = stage()
        except BadInput as exc:
            message = str(exc)
        distributed.raise_first_error(message)
        return result

    # ---- evaluation ----

    def _evaluate(self, trainer, parsed, prepared: tasks.Prepared) -> dict | None:
        """The task's metrics on rank 0 (None elsewhere, and when there is no evaluation data)."""
        if prepared.eval_features is None:
            return None
        started = time.time()
        output = trainer.predict(self.task.predict_inputs(prepared.eval_features))  # every rank takes part
        if self.info.rank != 0:
            return None
        scores = self.task.scores(output, prepared.eval_raw, prepared.eval_features, parsed.data)
        result = {k: round(v, 4) for k, v in scores.items()}
        result["eval_examples"] = len(prepared.eval_raw)
        result["eval_seconds"] = round(time.time() - started, 2)
        return result

    # ---- the run: start-up, data, training, finish ----

    def run(self) -> int:
        parsed, ipex = self._start_up()
        self.store = RunCheckpoints(self.info, self._agreed)
        resume = self.store.start(parsed)
        prepared = self._data(parsed)
        trained = self._train(parsed, prepared, ipex, resume)
        return self._finish(parsed, prepared, trained)

    def _start_up(self) -> tuple[Any, Any]:
        """Arguments, process group, hardware settings and IPEX: (parsed arguments, ipex or None)."""
        from training import args as job_arguments

        _model, _data, job_args = job_arguments.parse_job_arguments(self.argv)
        self._start_distributed(job_args)

        from training import accelerators, hardware

        flags = hardware.cpu_flags()
        bf16_supported, bf16_reason = hardware.bf16_support(flags)
        parsed = job_arguments.parse_all(self.argv, bf16_supported=bf16_supported)
        if parsed.bf16_explicit:
            bf16_reason = f"set with --bf16 ({bf16_reason})"
        job_arguments.apply_global_batch(parsed.job, parsed.training, self.info.world_size)
        job_arguments.apply_ddp_settings(parsed.job, parsed.training)
        ipex = accelerators.load_ipex(parsed.job.use_ipex)
        self.settings.update(self._hardware_settings(parsed.training, bf16_reason, ipex, flags))
        self.settings["launcher"] = self.info.launcher
        if self.info.rank == 0:
            self._log_settings()
        return parsed, ipex

    def _data(self, parsed) -> tasks.Prepared:
        """The task's data and model, agreed on by every rank."""
        from training import tasks

        self.task = tasks.for_name(parsed.data.task)
        prepared = self._agreed(lambda: self._prepare(parsed))
        if self.info.rank == 0:
            log.info("%d training examples -> %d features of up to %d tokens (%.1f real tokens on average); "
                     "%s evaluation examples", prepared.train_examples, len(prepared.train_features),
                     parsed.data.max_seq_length, prepared.tokens_per_sample,
                     len(prepared.eval_raw) if prepared.eval_raw is not None else "no")
        return prepared

    def _train(self, parsed, prepared: tasks.Prepared, ipex, resume) -> Trained:
        """Spot watcher, then Trainer.train (from the resume point, if any) until done or interrupted."""
        from training import hardware, imds

        self.flops = self._model_flops(parsed, prepared)
        self._compile_setting(parsed, prepared)
        trainer, timer, spot = self._trainer(parsed, prepared, ipex)
        resume_path, resumed = (resume if resume else (None, None))
        if resume_path is None and parsed.training.resume_from_checkpoint:  # Trainer's own flag: a path
            resume_path = parsed.training.resume_from_checkpoint
        if resumed is not None:
            self._continue_in_place(trainer, spot, resume_path, resumed.step, parsed.training)

        if imds.watch_enabled(parsed.job.spot_watch, on_ec2=hardware.on_ec2()):
            self.watcher = imds.InterruptionWatcher(imds.ImdsClient(imds.endpoint()), parsed.job.spot_poll_seconds)
            self.watcher.start()
            spot.watcher = self.watcher
            if self.info.rank == 0:
                log.info("spot watcher polling %s every %gs", imds.endpoint(), parsed.job.spot_poll_seconds)

        train_output = trainer.train(resume_from_checkpoint=resume_path)
        if self.watcher is not None:
            self.watcher.stop()
        return Trained(trainer, timer, spot, train_output.training_loss, resumed)

    def _continue_in_place(self, trainer, spot, path: str, step: int, training_args) -> None:
        """Continue at the checkpoint's place in the data, in this job's steps (training/resume.py data_position)."""
        from training import checkpoints, distributed, resume

        global_batch = (training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps
                        * self.info.world_size)
        mine = resume.data_position(checkpoints.read_manifest(path) or {}, step, global_batch)
        position = resume.DataPosition(*distributed.gather(tuple(mine))[0])  # rank 0's: every rank the same step
        spot.position = position
        if position.step != step:
            trainer.rebased_step = position.step
            if self.info.rank == 0:
                log.warning("the global batch is now %d: checkpoint-%d (%d samples seen) continues as step %d of this "
                            "batch, at the same place in the data", global_batch, step, position.samples,
                            position.step)

    def _compile_setting(self, parsed, prepared: tasks.Prepared) -> None:
        """--compile decided (auto: from the run's steps and fab bench's estimate) before the Trainer exists."""
        import math

        from training import args as job_arguments

        t = parsed.training
        per_step = t.per_device_train_batch_size * self.info.world_size * t.gradient_accumulation_steps
        steps = t.max_steps if t.max_steps > 0 else math.ceil(
            math.ceil(len(prepared.train_features) / per_step) * t.num_train_epochs)
        reason = job_arguments.resolve_compile(parsed.job, t, steps)
        self.settings.update(compile=bool(t.torch_compile), compile_reason=reason)
        if self.info.rank == 0:
            log.info("torch.compile %s (%s)", "on" if t.torch_compile else "off", reason)

    def _model_flops(self, parsed, prepared: tasks.Prepared):
        """The model FLOPs per sample and, on rank 0, the node's peak (training/mfu.py)."""
        from training import distributed, mfu

        nodes = len(set(distributed.hosts())) if self.info.distributed else 1  # every rank takes part
        training_args = parsed.training
        global_batch = (training_args.per_device_train_batch_size * self.info.world_size
                        * training_args.gradient_accumulation_steps)
        peak = mfu.node_peak(bool(training_args.bf16), parsed.job.instance_type) if self.info.rank == 0 else None
        figures = mfu.model_flops(prepared.model, task=parsed.data.task, max_seq_length=parsed.data.max_seq_length,
                                  tokens_per_sample=prepared.tokens_per_sample, global_batch=global_batch,
                                  nodes=nodes, peak=peak)
        if self.info.rank == 0:
            log.info("model FLOPs %.3g per sample (%d tokens); peak %s", figures.per_sample, figures.seq_len,
                     peak.describe() if peak else "not known (no lscpu, no catalogued --instance_type)")
        return figures

    def _finish(self, parsed, prepared: tasks.Prepared, trained: Trained) -> int:
        """Final model and evaluation (unless interrupted), weights digests, the summary on rank 0 (both wait for a
        full disk's space for a while: training/checkpoints.py's when_space)."""
        from training import checkpoints, distributed, summary

        output_dir = parsed.training.output_dir
        interrupted = trained.spot.interrupted_at is not None
        final_model, eval_metrics = None, None
        if not interrupted:
            checkpoints.when_space(lambda: trained.trainer.save_model(output_dir), output_dir, "the final model")
            final_model = output_dir if self.info.rank == 0 else None
            eval_metrics = self._evaluate(trained.trainer, parsed, prepared)
        # the log history, `fab report`'s curves (rank 0 writes it: Trainer.save_state), interrupted or not
        checkpoints.when_space(trained.trainer.save_state, output_dir, "trainer_state.json")
        digests = distributed.gather(_weights_sha256(trained.trainer.model))
        hosts = distributed.hosts()
        if self.info.rank == 0:
            report = summary.build_summary(
                parsed=parsed, prepared=prepared, world_size=self.info.world_size, hosts=hosts,
                state=trained.trainer.state, timer=trained.timer, spot=trained.spot, train_loss=trained.train_loss,
                eval_metrics=eval_metrics, resumed=trained.resumed, final_model=final_model, digests=digests,
                settings=self.settings, versions=summary.software_versions(), started=self.started, now=time.time(),
                run_id=self.store.run_id, model_flops=self.flops)
            checkpoints.when_space(lambda: summary.write_summary(report, output_dir), output_dir, "summary.json")
            print(json.dumps(report, indent=2), flush=True)
            for error in report["checkpoint_upload_errors"]:
                log.error("checkpoint %d was not uploaded (%s): it exists only in %s on this node",
                          error["step"], error["error"], output_dir)
            if interrupted:
                log.warning("stopped at step %d after an interruption notice; %s; rerun with --resume to continue "
                            "(exit code %d)", trained.spot.interrupted_at, summary.interruption_checkpoint(report),
                            exit_codes.INTERRUPTED)
        if interrupted:  # the job script keeps it if the launcher kills this rank during its exit
            record_outcome(exit_codes.INTERRUPTED)
        distributed.barrier()
        return exit_codes.INTERRUPTED if interrupted else exit_codes.OK

    def _trainer(self, parsed, prepared: tasks.Prepared, ipex):
        from transformers import Trainer

        from training import accelerators, checkpoints, grad_comm
        from training.callbacks import SpotCheckpointCallback, StepTimer
        from training.mfu import FlopsLogger

        training_args = parsed.training
        bf16 = bool(training_args.bf16)

        class XeonTrainer(Trainer):
            """Trainer that applies ipex.optimize to the model and its optimizer before DDP wraps them, that
            registers --grad_comm's hook on the DDP model before the first backward, that never leaves an
            old manifest in a checkpoint folder it writes again (an abandoned branch's checkpoint-N after a
            resume from an earlier step): the folder is incomplete until on_save, and that trains on when a
            full disk cannot hold a checkpoint (on_save then completes none: training/callbacks.py)."""

            _ipex_applied = False
            _comm_hook_checked = False
            rebased_step: int | None = None  # the resumed step in this job's global batch (Job._continue_in_place)

            def _init_training_state(self, max_steps, num_update_steps_per_epoch, *args, **kwargs):
                epochs, skipped = super()._init_training_state(max_steps, num_update_steps_per_epoch, *args, **kwargs)
                if self.rebased_step is None:
                    return epochs, skipped
                self.state.global_step = self.rebased_step
                skipped = 0 if self.args.ignore_data_skip else (
                    self.rebased_step % num_update_steps_per_epoch * self.args.gradient_accumulation_steps)
                return self.rebased_step // num_update_steps_per_epoch, skipped

            def _load_optimizer_and_scheduler(self, checkpoint):
                super()._load_optimizer_and_scheduler(checkpoint)
                if checkpoint is not None and self.rebased_step is not None:
                    schedule_at(self.lr_scheduler, self.optimizer, self.rebased_step)

            def training_step(self, model, *args, **kwargs):
                if not self._comm_hook_checked:  # `model` is DDP-wrapped from here on; no backward has run yet
                    if grad_comm.register(model, parsed.job.grad_comm):
                        log.info("gradient communication %s (DDP communication hook)", parsed.job.grad_comm)
                    self._comm_hook_checked = True
                return super().training_step(model, *args, **kwargs)

            def _save_checkpoint(self, model, trial):
                folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
                try:
                    os.remove(os.path.join(folder, checkpoints.MANIFEST))
                except FileNotFoundError:
                    pass
                try:
                    super()._save_checkpoint(model, trial)
                except Exception as exc:  # a full disk is the failure training goes on after: no checkpoint here
                    why = checkpoints.disk_full(exc, folder)
                    if why is None:
                        raise
                    spot.not_saved(why)

            def create_optimizer(self, *args, **kwargs):  # transformers 5 passes the model, 4.56 nothing
                optimizer = super().create_optimizer(*args, **kwargs)
                if ipex is not None and not self._ipex_applied:
                    self.model, self.optimizer = accelerators.optimize(ipex, self.model, self.optimizer, bf16=bf16)
                    self.model_wrapped = self.model
                    self._ipex_applied = True
                    optimizer = self.optimizer
                return optimizer

        timer = StepTimer()
        spot = SpotCheckpointCallback(rank=self.info.rank, checkpoint_minutes=parsed.job.checkpoint_minutes,
                                      checkpoint_uri=parsed.job.checkpoint_uri, s3_client_factory=self.store.s3,
                                      run_id=self.store.run_id, keep=self.store.keep)
        trainer = XeonTrainer(model=prepared.model, args=training_args, train_dataset=prepared.train_features,
                              processing_class=prepared.tokenizer, data_collator=self.task.collator(prepared.tokenizer),
                              callbacks=[timer, spot] + ([FlopsLogger(timer, self.flops)] if self.flops else []))
        return trainer, timer, spot

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
        if "torch.distributed" in sys.modules:
            from training import distributed

            distributed.destroy()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    started = process_start_time()
    try:
        info = rank_env.detect(os.environ)
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    _configure_logging(info.rank)
    if info.distributed:  # a lone process must not look distributed to accelerate (LOCAL_RANK)
        os.environ.update(info.torch_env())
    job = Job(info, argv, started)
    try:
        return job.run()
    except BadInput as exc:
        if info.rank == 0:
            print(f"error: {exc}", file=sys.stderr, flush=True)
        return exit_codes.BAD_INPUT
    except Exception:
        print(f"rank {info.rank} ({socket.gethostname()}) failed:\n{traceback.format_exc()}",
              file=sys.stderr, flush=True)
        return exit_codes.FAILED
    finally:
        job.close()


if __name__ == "__main__":
    sys.exit(main())
