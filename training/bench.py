"""`python -m training.bench`: what `fab bench` runs on every rank (one rank per node).

Two measurements in one launch, every rank taking part (the launcher, rendezvous and backend are
those of the training job: training/ranks.py, training/distributed.py):

1. compute: for n = 1..N, the first n ranks each train the model for a few steps at once
   (forward, backward, clipped AdamW step; bf16 autocast when the CPU has it, as the job does),
   with no all-reduce, while the others wait; samples/s per node of the slowest of them;
2. all-reduce: for n = 2..N, the first n ranks all-reduce a whole gradient (the model's parameter
   count) cut into DDP's buckets, in fp32 and in bf16 (what `--grad_comm bf16` sends), and one
   tiny tensor; the median times give the payload bandwidth per node and the latency per ring step
   (cluster/timemodel.py: ring_fit).

Rank 0 writes the figures as JSON to --out; `fab bench` turns them into a calibration
(cluster/calibration.py). The default model is the offline demo's tiny DistilBERT
(training/synthetic.py), built in memory: nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

SYNTHETIC = "synthetic"


def _build_model(name: str):
    from transformers import AutoModelForQuestionAnswering, DistilBertConfig, DistilBertForQuestionAnswering

    if name == SYNTHETIC:
        from training.synthetic import MODEL_CONFIG, vocabulary

        config = DistilBertConfig(vocab_size=len(vocabulary()), pad_token_id=0, **MODEL_CONFIG)
        return DistilBertForQuestionAnswering(config), config.vocab_size
    model = AutoModelForQuestionAnswering.from_pretrained(name, local_files_only=True)
    return model, model.config.vocab_size


def _train_steps(model, vocab: int, batch: int, seq_len: int, steps: int, bf16: bool) -> float:
    """Seconds for `steps` training steps after 2 warm-up steps."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(5, vocab, (batch, seq_len))
    mask = torch.ones_like(ids)
    start_pos = torch.randint(0, seq_len, (batch,))
    end_pos = torch.clamp(start_pos + 2, max=seq_len - 1)
    model.train()

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(input_ids=ids, attention_mask=mask, start_positions=start_pos, end_positions=end_pos)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return time.perf_counter() - t0


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
    model, vocab = _build_model(o.model)
    params = sum(p.numel() for p in model.parameters())
    say = (lambda line: print(line, flush=True)) if rank == 0 else (lambda line: None)
    say(f"bench: {world} rank(s), backend {backend} ({why}), model {o.model} ({params} params), batch {o.batch}, "
        f"seq {o.seq_len}, bf16 {bf16}, threads {torch.get_num_threads()}")

    compute: dict[str, float] = {}
    for n in range(1, world + 1):
        dist.barrier()
        seconds = _train_steps(model, vocab, o.batch, o.seq_len, o.steps, bf16) if rank < n else 0.0
        slowest = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        compute[str(n)] = o.batch * o.steps / slowest.item()
        say(f"bench: compute with {n} node(s) busy: {compute[str(n)]:.1f} samples/s per node")

    from cluster.timemodel import ring_fit

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
                  "world_size": world, "compute": compute, "allreduce": allreduce}
        Path(o.out).parent.mkdir(parents=True, exist_ok=True)
        Path(o.out).write_text(json.dumps(result, indent=2) + "\n")
        say(f"bench: figures written to {o.out}")
    distributed.destroy()
    return 0


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)
    code = main()
    sys.stdout.flush()
    os._exit(code)
