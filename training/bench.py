"""`python -m training.bench`: what `fab bench` runs on every rank (one rank per node).

Two measurements in one launch, every rank taking part (the launcher, rendezvous and backend are
those of the training job: training/ranks.py, training/distributed.py):

1. compute: for n = 1..N, the first n ranks each run the training job itself (`python -m
   training` in a child process: its Trainer, data loading, collation and callbacks, bf16 when
   the CPU has it, as the job does) for a few steps, together as a world of n with
   `--grad_comm none` (DDP's lock-step, no gradient exchanged), while the others wait; samples/s
   per node of the slowest, from the job's own mean step time (its first, warm-up step left out).
   A plain training loop would miss the Trainer's and DDP's work per step, which is as large as
   the compute for a small model, and the waiting for the slowest rank each step;
2. all-reduce: for n = 2..N, the first n ranks all-reduce a whole gradient (the model's parameter
   count) cut into DDP's buckets, in fp32 and in bf16 (what `--grad_comm bf16` sends), and one
   tiny tensor; the median times give the payload bandwidth per node and the latency per ring step
   (cluster/cost/timemodel.py: ring_fit).

3. compile (with --compile, slow: a minute of compile on a small machine): rank 0 alone runs the job
   eager and then with `--compile on` (torch's compile caches off: a cold compile, what a fresh node
   pays); the steady steps and the compile time (the compiled run's time to its first step less the
   eager run's) go to the calibration's compile block.

Rank 0 writes the figures as JSON to --out; `fab bench` turns them into a calibration
(cluster/cost/calibration.py). The default model is the offline demo's tiny DistilBERT
(training/synthetic.py), built in memory: nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from cluster.job.job_args import GRAD_COMM_MEASURE_ONLY

SYNTHETIC = "synthetic"
# torch's switch that turns its compile caches off (torch/compiler/config.py: force_disable_caches)
COLD_COMPILE_VARIABLE = "TORCHINDUCTOR_FORCE_DISABLE_CACHES"


def _build_model(name: str):
    """The model, for its parameter count (the gradient the all-reduces carry)."""
    from transformers import AutoModelForQuestionAnswering, DistilBertConfig, DistilBertForQuestionAnswering

    if name == SYNTHETIC:
        from training.synthetic import MODEL_CONFIG, vocabulary

        config = DistilBertConfig(vocab_size=len(vocabulary()), pad_token_id=0, **MODEL_CONFIG)
        return DistilBertForQuestionAnswering(config)
    return AutoModelForQuestionAnswering.from_pretrained(name, local_files_only=True)


# The launcher's variables (training/ranks.py) and rendezvous: the child job must see a world of one.
_LAUNCHER_PREFIXES = ("PMI_", "OMPI_", "MPI_LOCAL", "HYDI_", "HYDRA_", "TORCHELASTIC_")
_RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _alone(env) -> dict[str, str]:
    """`env` without what would make the child job join the launcher's world."""
    return {k: v for k, v in env.items() if k not in _RANK_VARIABLES and not k.startswith(_LAUNCHER_PREFIXES)}


def _job_step_seconds(model: str, batch: int, seq_len: int, steps: int, bf16: bool, workdir: Path,
                      peers: dict[str, str], compiled: bool = False) -> tuple[float, float]:
    """(mean steady step time, time to the first step) of the training job for `steps` + 1 steps, with
    no gradient exchanged, in the world `peers` describes (torchrun's variables; empty: a world of one),
    compiled or eager.

    The data is the offline demo's (training/synthetic.py); with a model directory, that model
    trains on it with its own tokenizer. Nothing is downloaded.
    """
    import subprocess

    env = _alone(os.environ)

    def child(*command: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", *command], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise RuntimeError(f"`python -m {command[0]}` alone exited {done.returncode}:\n{tail}")
        return done

    # written by a child too: with a process group up, transformers saves a model on rank 0 only
    made = child("training.synthetic", "--out", str(workdir / "demo"), "--examples", str(batch * (steps + 1)))
    args = list(json.loads(made.stdout)["args"])
    if model != SYNTHETIC:
        args[args.index("--model_name_or_path") + 1] = model
    i = args.index("--validation_file")
    del args[i:i + 2]  # no evaluation: only the steps are timed
    args[args.index("--max_seq_length") + 1] = str(seq_len)
    args[args.index("--doc_stride") + 1] = str(seq_len // 4)
    out = workdir / "job"
    env.update(peers)
    if compiled:  # a cold compile, as a fresh node pays it: no compile cache of an earlier run
        env[COLD_COMPILE_VARIABLE] = "1"
    child("training", *args, "--per_device_train_batch_size", str(batch), "--max_steps", str(steps + 1),
          "--output_dir", str(out), "--bf16", "true" if bf16 else "false", "--grad_comm", GRAD_COMM_MEASURE_ONLY,
          "--compile", "on" if compiled else "off")
    if peers.get("RANK", "0") != "0":
        return 0.0, 0.0  # in lock-step every rank's step is the same; rank 0 of the child's world writes the summary
    summary = json.loads((out / "summary.json").read_text())
    return summary["step_time_seconds"]["mean"], summary["time_to_first_step_seconds"]


def compile_figures(eager: tuple[float, float], compiled: tuple[float, float]) -> dict[str, float]:
    """The calibration's compile block from the (steady step, time to the first step) of an eager and a compiled
    run: the compile is the compiled run's wait for its first step beyond the eager run's (at least 1 ms)."""
    return {"eager_step_s": eager[0], "compiled_step_s": compiled[0], "compile_s": max(compiled[1] - eager[1], 0.001)}


def _allreduce_times(group, params: int, bucket_bytes: int, dtype, repeats: int) -> float:
    """Median seconds to all-reduce `params` gradients cut into DDP's buckets (sized in fp32)."""
    import torch
    import torch.distributed as dist

    per_bucket = max(1, bucket_bytes // 4)
    sizes = [min(per_bucket, params - i) for i in range(0, params, per_bucket)]
    buffers = [torch.ones(n, dtype=dtype) for n in sizes]
    times = []
    for i in range(repeats + 1):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        for b in buffers:
            dist.all_reduce(b, group=group)
        if i:  # the first is a warm-up (connections, allocations)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file rank 0 writes the figures to")
    parser.add_argument("--model", default=SYNTHETIC, help="synthetic (the offline demo's) or a model directory")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq_len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bucket_mb", type=float, default=25.0)
    parser.add_argument("--dist_backend", default="auto")
    parser.add_argument("--bf16", default="auto", choices=("auto", "on", "off"))
    parser.add_argument("--compile", action="store_true", help="also time the job compiled on rank 0 alone")
    o = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    from training import distributed, hardware
    from training.ranks import detect, rendezvous

    info = detect(os.environ)
    addr, port = rendezvous(os.environ, info)
    os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port), RANK=str(info.rank), WORLD_SIZE=str(info.world_size))
    backend, why = distributed.choose_backend(o.dist_backend)
    distributed.init(info, backend, timeout_minutes=10)
    rank, world = dist.get_rank(), dist.get_world_size()
    flags = hardware.cpu_flags()
    bf16 = o.bf16 == "on" or (o.bf16 == "auto" and hardware.bf16_support(flags)[0])
    torch.manual_seed(0)
    model = _build_model(o.model)
    params = sum(p.numel() for p in model.parameters())
    say = (lambda line: print(line, flush=True)) if rank == 0 else (lambda line: None)
    say(f"bench: {world} rank(s), backend {backend} ({why}), model {o.model} ({params} params), batch {o.batch}, "
        f"seq {o.seq_len}, bf16 {bf16}, threads {torch.get_num_threads()}")

    compute: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="xeon-bench-") as scratch:
        for n in range(1, world + 1):
            dist.barrier()
            seconds, problem = 0.0, None
            if rank < n:
                peers = {} if n == 1 else {"RANK": str(rank), "WORLD_SIZE": str(n), "LOCAL_RANK": "0",
                                           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": addr,
                                           "MASTER_PORT": str(port + n)}  # the bench's own port + n
                try:
                    seconds = _job_step_seconds(o.model, o.batch, o.seq_len, o.steps, bf16, Path(scratch) / str(n),
                                                peers)[0]
                except (RuntimeError, OSError, ValueError, KeyError) as exc:
                    problem = f"rank {rank}: {exc}"
            distributed.raise_first_error(problem)
            slowest = torch.tensor([seconds], dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            compute[str(n)] = o.batch / slowest.item()
            say(f"bench: compute with {n} node(s) busy: {compute[str(n)]:.1f} samples/s per node "
                f"(the job's step: {slowest.item() * 1e3:.1f} ms)")

        compile_block = None
        if o.compile:
            problem = None
            if rank == 0:
                try:
                    say("bench: the job alone, eager and then compiled (the compile takes a while) ...")
                    runs = [_job_step_seconds(o.model, o.batch, o.seq_len, o.steps, bf16,
                                              Path(scratch) / f"compile-{flag}", {}, compiled=flag)
                            for flag in (False, True)]
                    compile_block = compile_figures(*runs)
                    say(f"bench: step eager {compile_block['eager_step_s'] * 1e3:.1f} ms, compiled "
                        f"{compile_block['compiled_step_s'] * 1e3:.1f} ms, compile {compile_block['compile_s']:.1f} s")
                except (RuntimeError, OSError, ValueError, KeyError, TypeError) as exc:
                    problem = f"rank 0: {exc}"
            distributed.raise_first_error(problem)

    from cluster.cost.timemodel import ring_fit

    allreduce: dict[str, dict] = {}
    bucket_bytes = int(o.bucket_mb * 2**20)
    for n in range(2, world + 1):
        group = dist.new_group(list(range(n)))  # every rank takes part in making every group
        fits = {}
        if rank < n:
            small = _allreduce_times(group, 1, bucket_bytes, torch.float32, o.repeats)
            for name, dtype, size in (("fp32", torch.float32, 4), ("bf16", torch.bfloat16, 2)):
                big = _allreduce_times(group, params, bucket_bytes, dtype, o.repeats)
                buckets = max(1, -(-params * 4 // bucket_bytes))
                gbps, latency = ring_fit(n, params * size, big, small, buckets)
                fits[name] = {"gbps": gbps, "latency_s": latency, "seconds": big}
        dist.barrier()
        if rank == 0:
            allreduce[str(n)] = fits
            for name, fit in fits.items():
                say(f"bench: all-reduce {name} across {n} nodes: {fit['seconds'] * 1e3:.1f} ms, "
                    f"{fit['gbps']:.3f} Gbit/s per node, {fit['latency_s'] * 1e6:.0f} us per ring step")
    if rank == 0:
        result = {"model": o.model, "params": params, "batch": o.batch, "seq_len": o.seq_len, "steps": o.steps,
                  "bucket_mb": o.bucket_mb, "backend": backend, "bf16": bf16, "cpu": hardware.cpu_model(),
                  "cores": hardware.physical_cores(),
                  "world_size": world, "compute": compute, "allreduce": allreduce}
        if compile_block:
            result["compile"] = compile_block
        Path(o.out).parent.mkdir(parents=True, exist_ok=True)
        Path(o.out).write_text(json.dumps(result, indent=2) + "\n")
        say(f"bench: figures written to {o.out}")
    distributed.barrier()  # no rank tears gloo down while another still uses it (an abort otherwise)
    distributed.destroy()
    return 0


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)
    from training.errors import BadInput

    try:
        code = main()
    except BadInput as exc:  # a rank's child job failed: every rank says why and stops
        print(f"bench: {exc}", file=sys.stderr, flush=True)
        code = 1
    sys.stdout.flush()
    os._exit(code)
