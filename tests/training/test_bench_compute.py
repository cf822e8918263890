"""training/bench.py measures compute with the job itself, run alone: the child must see a world of one."""

from __future__ import annotations

import pytest

from training.bench import _alone
from training.ranks import detect

LAUNCHED = {
    "intel-mpi": {"PMI_RANK": "1", "PMI_SIZE": "3", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1",
                  "HYDI_CONTROL_FD": "7"},
    "open-mpi": {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                 "OMPI_COMM_WORLD_LOCAL_SIZE": "1"},
    "torchrun": {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                 "TORCHELASTIC_RUN_ID": "x"},
}


@pytest.mark.parametrize("launcher", sorted(LAUNCHED))
def test_the_child_job_leaves_the_launchers_world(launcher):
    env = {**LAUNCHED[launcher], "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "29500", "OMP_NUM_THREADS": "4",
           "PATH": "/usr/bin"}
    assert detect(env).world_size > 1  # as launched
    alone = _alone(env)
    info = detect(alone)
    assert (info.world_size, info.rank, info.launcher) == (1, 0, "none")
    assert "MASTER_ADDR" not in alone and "MASTER_PORT" not in alone
    assert alone["OMP_NUM_THREADS"] == "4" and alone["PATH"] == "/usr/bin"  # the rank's thread settings stay


def _ddp_grads(rank: int, port: int, mode: str, out: str) -> None:
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from training import grad_comm

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1, bias=False))
    grad_comm.register(model, mode)
    model(torch.full((1, 4), float(rank + 1))).sum().backward()
    torch.save(model.module.weight.grad, f"{out}/{rank}.pt")
    dist.barrier()
    # Ends here, without gloo's teardown: under load it aborts a rank now and then ("terminate called
    # without an active exception"), which is torch's exit, not the behaviour under test.
    os._exit(0)


@pytest.mark.slow
@pytest.mark.parametrize("mode, exchanged", [("none", False), ("fp32", True)])
def test_measure_only_mode_keeps_each_ranks_own_gradient(tmp_path, mode, exchanged):
    import socket

    import torch
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_ddp_grads, args=(port, mode, str(tmp_path)), nprocs=2, join=True)
    g0, g1 = torch.load(tmp_path / "0.pt"), torch.load(tmp_path / "1.pt")
    if exchanged:  # averaged: (1 + 2) / 2 on both ranks
        assert torch.allclose(g0, g1) and torch.allclose(g0, torch.full((1, 4), 1.5))
    else:  # each rank's own input
        assert torch.allclose(g0, torch.full((1, 4), 1.0)) and torch.allclose(g1, torch.full((1, 4), 2.0))
