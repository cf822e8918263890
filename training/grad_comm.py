"""Gradients on the wire: `--grad_comm bf16` halves the bytes each all-reduce sends.

Each DDP gradient bucket is cast to bf16 (divided by the world size), all-reduced with the job's
backend (gloo or ccl) and cast back into the fp32 bucket; the optimizer still steps in fp32. This
is torch's own bf16 compression (`default_hooks._compress_hook`); torch's `bf16_compress_hook`
itself refuses to register without CUDA and NCCL, a check by name that does not apply to CPU
backends, so the same compression is registered here under another name. The planner models the
same halving (cluster/cost/timemodel.py).

`none` is for measuring only (`fab bench`'s compute, training/bench.py): DDP keeps its lock-step
and its buckets, but each bucket is handed back as it is, so a step costs everything but the
gradient's all-reduce.
"""

from __future__ import annotations

from cluster.job.job_args import GRAD_COMM_MEASURE_ONLY


def bf16_cpu_compress_hook(process_group, bucket):
    """DDP communication hook: the bucket all-reduced in bf16."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks._compress_hook(torch.bfloat16, process_group, bucket)


def no_exchange_hook(process_group, bucket):
    """DDP communication hook for measuring only: the bucket's own gradient, not exchanged."""
    import torch

    done = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


HOOKS = {"bf16": bf16_cpu_compress_hook, GRAD_COMM_MEASURE_ONLY: no_exchange_hook}


def register(model, mode: str) -> bool:
    """Register `mode`'s hook on a DDP-wrapped model; False when there is nothing to do (fp32, or the
    model is not wrapped: a single process)."""
    from torch.nn.parallel import DistributedDataParallel

    if mode not in HOOKS or not isinstance(model, DistributedDataParallel):
        return False
    model.register_comm_hook(state=None, hook=HOOKS[mode])
    return True
