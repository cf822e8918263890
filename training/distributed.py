"""torch.distributed for the job: backend choice, start-up, agreement between ranks, shutdown.

transformers 5 and accelerate 1.13+ no longer know the `ccl` backend, so the job initialises the
process group itself before TrainingArguments is built; accelerate then finds it initialised and
uses it as it is.
"""

from __future__ import annotations

import importlib
import logging
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from training.errors import BadInput
from training.ranks import RankInfo

log = logging.getLogger(__name__)

CCL_MODULE = "oneccl_bindings_for_pytorch"


def choose_backend(requested: str) -> tuple[str, str]:
    """(backend, why). Importing the oneCCL bindings registers the `ccl` backend with torch."""
    if requested == "gloo":
        return "gloo", "requested with --dist_backend gloo"
    try:
        module = importlib.import_module(CCL_MODULE)
    except ImportError as exc:
        if requested == "ccl":
            raise BadInput(f"--dist_backend ccl: {CCL_MODULE} does not import here ({exc}); install the "
                           "'intel' software profile (fab setup --profile intel) or use --dist_backend gloo") from None
        return "gloo", f"{CCL_MODULE} not installed"
    version = getattr(module, "__version__", "unknown version")
    return "ccl", f"{CCL_MODULE} {version} imported"


def init(info: RankInfo, backend: str, timeout_minutes: float = 30.0) -> None:
    """Start the default process group (env:// rendezvous on MASTER_ADDR:MASTER_PORT)."""
    dist.init_process_group(backend=backend, init_method="env://", rank=info.rank,
                            world_size=info.world_size, timeout=timedelta(minutes=timeout_minutes))


def active() -> bool:
    return dist.is_available() and dist.is_initialized()


def destroy() -> None:
    """Without this a rank sometimes aborts at interpreter exit (docs/design.md, "The training job")."""
    if active():
        dist.destroy_process_group()


def barrier() -> None:
    if active():
        dist.barrier()


def max_over_ranks(values: list[int]) -> list[int]:
    """Element-wise maximum of small integer vectors over all ranks (identical result everywhere)."""
    if not active():
        return list(values)
    tensor = torch.tensor(values, dtype=torch.int64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [int(v) for v in tensor.tolist()]


def world_size() -> int:
    """The process group's size (1 without one)."""
    return dist.get_world_size() if active() else 1


def gather(obj) -> list:
    """Every rank's `obj`, in rank order, on every rank."""
    if not active():
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def first_error(message: str | None) -> str | None:
    """Agree on failure: the first rank's message (prefixed with its rank and host) or None.

    Every rank must call this at the same point; all of them get the same answer, so all stop
    together and rank 0 alone prints.
    """
    messages = gather(None if message is None else (socket.gethostname(), message))
    for rank, entry in enumerate(messages):
        if entry is not None:
            host, text = entry
            return text if rank == 0 else f"on rank {rank} ({host}): {text}"
    return None


def raise_first_error(message: str | None) -> None:
    """`first_error`, raised as BadInput on every rank when any rank had one (same call point on all)."""
    agreed = first_error(message)
    if agreed is not None:
        raise BadInput(agreed)


def hosts() -> list[str]:
    return gather(socket.gethostname())
