"""The job every MPI rank runs: `python -m training [arguments]` (see README.md, "The training job").

Order of events: ranks from the launcher's environment -> the job's own arguments -> process
group (ccl or gloo) -> every argument (TrainingArguments) -> tokenizer, data, model (all ranks
agree on any error) -> resume point -> training with step timing, timed checkpoints and the spot
watcher -> final model, evaluation -> summary on rank 0 -> process group destroyed.
Exit codes are in training/exit_codes.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import socket
import sys
import time
import traceback
from importlib import metadata

from training import exit_codes
from training import ranks as rank_env
from training.errors import BadInput

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


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _weights_sha256(model) -> str:
    """A digest of every parameter and buffer, in name order: equal digests, equal models."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    return digest.hexdigest()


def _features(dataset, tokenize, kwargs: dict):
    """`dataset` tokenised in batches by `tokenize(batch, **kwargs)`, keeping only its output columns."""
    return dataset.map(tokenize, batched=True, remove_columns=dataset.column_names, fn_kwargs=kwargs)


class Job:
    """One rank's run. `run()` returns an exit code; `close()` always runs afterwards."""

    def __init__(self, info: rank_env.RankInfo, argv: list[str], started: float):
        self.info = info
        self.argv = argv
        self.started = started
        self.watcher = None
        self.settings: dict = {}

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

    # ---- data and model ----

    def _prepare(self, parsed):
        """Tokenizer, datasets, features and model; raises BadInput for anything the user can fix."""
        from transformers import set_seed

        from training import classification, data, modeling, qa

        model_args, data_args, training_args = parsed.model, parsed.data, parsed.training
        task = data_args.task
        tokenizer = modeling.load_tokenizer(model_args, task)
        train_raw, eval_raw, source = data.load_splits(data_args, model_args.cache_dir)
        train_name = data_args.train_file or f"dataset {data_args.dataset_name} split {data_args.train_split}"
        columns = data.check_columns(train_raw, data_args, train_name)
        if eval_raw is not None:
            eval_name = data_args.validation_file or f"dataset {data_args.dataset_name} split {data_args.validation_split}"
            data.check_columns(eval_raw, data_args, eval_name)
        train_raw = data.limit(train_raw, data_args.max_train_samples)
        eval_raw = None if data_args.max_eval_samples == 0 else data.limit(eval_raw, data_args.max_eval_samples)
        if eval_raw is not None and len(eval_raw) == 0:
            eval_raw = None
        prepared = {"tokenizer": tokenizer, "source": source, "train_examples": len(train_raw),
                    "eval_raw": eval_raw, "eval_features": None}
        length, stride = data_args.max_seq_length, data_args.doc_stride
        if task == "qa":
            if "id" not in train_raw.column_names:
                train_raw = train_raw.add_column("id", [f"train-{i}" for i in range(len(train_raw))])
            if eval_raw is not None and "id" not in eval_raw.column_names:
                eval_raw = eval_raw.add_column("id", [f"eval-{i}" for i in range(len(eval_raw))])
                prepared["eval_raw"] = eval_raw
            kwargs = {"tokenizer": tokenizer, "max_seq_length": length, "doc_stride": stride}
            prepared["train_features"] = _features(train_raw, qa.prepare_train_features, kwargs)
            if eval_raw is not None:
                prepared["eval_features"] = _features(eval_raw, qa.prepare_eval_features, kwargs)
            set_seed(training_args.seed)  # the freshly initialised QA head is the same on every rank
            prepared["model"] = modeling.load_model(model_args, task)
        else:
            labels = classification.label_names(train_raw, eval_raw, data_args.label_column)
            label_ids = {label: i for i, label in enumerate(labels)}
            kwargs = {"tokenizer": tokenizer, "columns": columns, "label_column": data_args.label_column,
                      "label_ids": label_ids, "max_seq_length": length}
            prepared["train_features"] = _features(train_raw, classification.tokenize_pairs, kwargs)
            if eval_raw is not None:
                prepared["eval_features"] = _features(eval_raw, classification.tokenize_pairs, kwargs)
            set_seed(training_args.seed)
            prepared["model"] = modeling.load_model(model_args, task, num_labels=len(labels), label_names=labels)
        sample = prepared["train_features"].select(range(min(10000, len(prepared["train_features"]))))
        masks = sample["attention_mask"]
        prepared["tokens_per_sample"] = sum(map(sum, masks)) / max(1, len(masks))
        return prepared

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

    # ---- resume ----

    def _resume_path(self, parsed):
        from training import checkpoints, distributed

        job_args, output_dir = parsed.job, parsed.training.output_dir
        uri = job_args.checkpoint_uri
        client = checkpoints.s3_client() if uri else None
        found = None
        error = None
        if self.info.rank == 0:
            try:
                found = checkpoints.choose_resume(output_dir, uri, client)
            except Exception as exc:
                error = (f"--resume: could not look for checkpoints in {output_dir}"
                         f"{' or ' + uri if uri else ''}: {type(exc).__name__}: {exc}")
        distributed.raise_first_error(error)
        found = distributed.gather(found)[0]  # rank 0 decides
        if found is None:
            if self.info.rank == 0:
                log.warning("--resume: no complete checkpoint in %s%s; starting from step 0",
                            output_dir, f" or {uri}" if uri else "")
            return None
        path = os.path.join(output_dir, f"checkpoint-{found.step}")
        error = None
        if self.info.local_rank == 0 and not checkpoints.local_complete(path):
            if uri:
                try:
                    checkpoints.download_checkpoint(client, f"{uri.rstrip('/')}/checkpoint-{found.step}", path)
                    log.warning("downloaded checkpoint %d from %s", found.step, uri)
                except Exception as exc:
                    error = f"--resume: download of checkpoint {found.step} from {uri} failed: {exc}"
            else:
                error = (f"--resume: checkpoint-{found.step} is not in {output_dir} on this node; pass "
                         "--checkpoint_uri s3://... so every node can fetch it, or use a shared --output_dir")
        distributed.raise_first_error(error)
        if self.info.rank == 0:
            log.info("resuming from %s (step %d, chosen from %s)", path, found.step, found.location)
        return path, found

    # ---- evaluation ----

    def _evaluate(self, trainer, parsed, prepared) -> dict | None:
        import numpy as np

        from training import metrics, qa

        eval_features = prepared["eval_features"]
        if eval_features is None:
            return None
        data_args = parsed.data
        started = time.time()
        if data_args.task == "qa":
            output = trainer.predict(qa.eval_model_inputs(eval_features))
            if self.info.rank != 0:
                return None
            start_logits, end_logits = output.predictions
            answers = qa.postprocess_predictions(prepared["eval_raw"], eval_features, start_logits, end_logits,
                                                 data_args.n_best_size, data_args.max_answer_length)
            scores = metrics.squad_scores(answers, qa.references(prepared["eval_raw"]))
        else:
            output = trainer.predict(eval_features)
            if self.info.rank != 0:
                return None
            predictions = np.argmax(output.predictions, axis=-1).tolist()
            labels = output.label_ids.tolist()
            kept = [(p, t) for p, t in zip(predictions, labels) if t != -100]
            scores = metrics.classification_scores([p for p, _ in kept], [t for _, t in kept])
        result = {k: round(v, 4) for k, v in scores.items()}
        result["eval_examples"] = len(prepared["eval_raw"])
        result["eval_seconds"] = round(time.time() - started, 2)
        return result

    # ---- the run ----

    def run(self) -> int:
        from training import args as job_arguments

        _model, _data, job_args = job_arguments.parse_job_arguments(self.argv)
        self._start_distributed(job_args)

        from training import accelerators, distributed, hardware, imds
        from training.summary import logged_losses, step_time_stats, throughput

        flags = hardware.cpu_flags()
        bf16_supported, bf16_reason = hardware.bf16_support(flags)
        parsed = job_arguments.parse_all(self.argv, bf16_supported=bf16_supported)
        if parsed.bf16_explicit:
            bf16_reason = f"set with --bf16 ({bf16_reason})"
        training_args = parsed.training
        job_arguments.apply_global_batch(parsed.job, training_args, self.info.world_size)
        ipex = accelerators.load_ipex(parsed.job.use_ipex)
        self.settings.update(self._hardware_settings(training_args, bf16_reason, ipex, flags))
        self.settings["launcher"] = self.info.launcher
        if self.info.rank == 0:
            s = self.settings
            log.info("world size %d (%s), backend %s (%s); bf16 %s (%s); ipex %s; threads per rank %d "
                     "(OMP_NUM_THREADS=%s); allocator %s; %s; CPU features %s",
                     self.info.world_size, self.info.launcher, s["backend"], s["backend_reason"],
                     "on" if s["bf16"] else "off", bf16_reason, s["ipex"] or "off", s["threads"],
                     s["omp_num_threads"], s["allocator"], s["openmp_runtime"], ", ".join(s["cpu_features"]) or "none")

        prepared = self._agreed(lambda: self._prepare(parsed))
        if self.info.rank == 0:
            log.info("%d training examples -> %d features of up to %d tokens (%.1f real tokens on average); "
                     "%s evaluation examples", prepared["train_examples"], len(prepared["train_features"]),
                     parsed.data.max_seq_length, prepared["tokens_per_sample"],
                     len(prepared["eval_raw"]) if prepared["eval_raw"] is not None else "no")
        trainer, timer, spot = self._trainer(parsed, prepared, ipex)

        resume = self._resume_path(parsed) if parsed.job.resume else None
        resume_path, resumed = (resume if resume else (None, None))
        if resume_path is None and training_args.resume_from_checkpoint:  # Trainer's own flag: a path
            resume_path = training_args.resume_from_checkpoint

        if imds.watch_enabled(parsed.job.spot_watch, on_ec2=hardware.on_ec2()):
            self.watcher = imds.InterruptionWatcher(imds.ImdsClient(imds.endpoint()), parsed.job.spot_poll_seconds)
            self.watcher.start()
            spot.watcher = self.watcher
            if self.info.rank == 0:
                log.info("spot watcher polling %s every %gs", imds.endpoint(), parsed.job.spot_poll_seconds)

        train_output = trainer.train(resume_from_checkpoint=resume_path)
        interrupted = spot.interrupted_at is not None
        if self.watcher is not None:
            self.watcher.stop()

        final_model = None
        eval_metrics = None
        if not interrupted:
            trainer.save_model(training_args.output_dir)
            if self.info.rank == 0:
                final_model = training_args.output_dir
            eval_metrics = self._evaluate(trainer, parsed, prepared)
        digests = distributed.gather(_weights_sha256(trainer.model))
        hosts = distributed.hosts()

        if self.info.rank == 0:
            state = trainer.state
            global_batch = (training_args.per_device_train_batch_size * self.info.world_size
                            * training_args.gradient_accumulation_steps)
            steps_run = len(timer.step_seconds)
            train_seconds = (timer.last_step_end - timer.train_begin) if timer.last_step_end else 0.0
            losses = logged_losses(state.log_history)
            summary = {
                "status": "interrupted" if interrupted else "completed",
                "exit_code": exit_codes.INTERRUPTED if interrupted else exit_codes.OK,
                "task": parsed.data.task,
                "model": parsed.model.model_name_or_path,
                "data": prepared["source"],
                "world_size": self.info.world_size,
                "nodes": len(set(hosts)),
                "hosts": hosts,
                "per_rank_batch_size": training_args.per_device_train_batch_size,
                "gradient_accumulation_steps": training_args.gradient_accumulation_steps,
                "global_batch_size": global_batch,
                "train_examples": prepared["train_examples"],
                "train_features": len(prepared["train_features"]),
                "tokens_per_sample": round(prepared["tokens_per_sample"], 2),
                "max_seq_length": parsed.data.max_seq_length,
                "start_step": timer.start_step,
                "steps": state.global_step,
                "max_steps": state.max_steps,
                "steps_this_run": steps_run,
                "epoch": round(state.epoch or 0.0, 4),
                "train_seconds": round(train_seconds, 3),
                **throughput(steps_run, global_batch, train_seconds, prepared["tokens_per_sample"],
                             self.info.world_size),
                "step_time_seconds": step_time_stats(timer.step_seconds),
                "time_to_first_step_seconds": (round(timer.first_step_end - self.started, 3)
                                               if timer.first_step_end else None),
                "wall_seconds": round(time.time() - self.started, 3),
                "train_loss": round(train_output.training_loss, 5) if steps_run else None,
                "first_logged_loss": losses[0] if losses else None,
                "last_logged_loss": losses[-1] if losses else None,
                "metrics": eval_metrics,
                "resumed_from": ({"step": resumed.step, "location": resumed.location} if resumed else None),
                "interruption": ({"step": spot.interrupted_at, "seen_by_rank": spot.notice_rank}
                                 if interrupted else None),
                "checkpoints": spot.saved,
                "final_model": final_model,
                "weights_sha256_per_rank": digests,
                "settings": {
                    **self.settings,
                    "checkpoint_minutes": parsed.job.checkpoint_minutes,
                    "checkpoint_uri": parsed.job.checkpoint_uri,
                    "spot_watch": self.watcher is not None,
                    "versions": {"python": platform.python_version(),
                                 **{p: _version(p) for p in ("torch", "transformers", "accelerate", "datasets",
                                                             "intel-extension-for-pytorch", "oneccl-bind-pt",
                                                             "impi-rt")}},
                },
            }
            os.makedirs(training_args.output_dir, exist_ok=True)
            path = os.path.join(training_args.output_dir, "summary.json")
            with open(path + ".tmp", "w") as handle:
                json.dump(summary, handle, indent=2)
            os.replace(path + ".tmp", path)
            print(json.dumps(summary, indent=2), flush=True)
            if interrupted:
                log.warning("stopped at step %d after an interruption notice; checkpoint saved; "
                            "rerun with --resume to continue (exit code %d)", spot.interrupted_at,
                            exit_codes.INTERRUPTED)
        distributed.barrier()
        return exit_codes.INTERRUPTED if interrupted else exit_codes.OK

    def _trainer(self, parsed, prepared, ipex):
        from transformers import DataCollatorWithPadding, Trainer, default_data_collator

        from training import accelerators
        from training.callbacks import SpotCheckpointCallback, StepTimer

        training_args = parsed.training
        bf16 = bool(training_args.bf16)

        class XeonTrainer(Trainer):
            """Trainer that applies ipex.optimize to the model and its optimizer before DDP wraps them."""

            _ipex_applied = False

            def create_optimizer(self, model=None):
                optimizer = super().create_optimizer(model)
                if ipex is not None and not self._ipex_applied:
                    self.model, self.optimizer = accelerators.optimize(ipex, self.model, self.optimizer, bf16=bf16)
                    self.model_wrapped = self.model
                    self._ipex_applied = True
                    optimizer = self.optimizer
                return optimizer

        timer = StepTimer()
        spot = SpotCheckpointCallback(rank=self.info.rank, checkpoint_minutes=parsed.job.checkpoint_minutes,
                                      checkpoint_uri=parsed.job.checkpoint_uri)
        tokenizer = prepared["tokenizer"]
        collator = default_data_collator if parsed.data.task == "qa" else DataCollatorWithPadding(tokenizer)
        trainer = XeonTrainer(model=prepared["model"], args=training_args, train_dataset=prepared["train_features"],
                              processing_class=tokenizer, data_collator=collator, callbacks=[timer, spot])
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
