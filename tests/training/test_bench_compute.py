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
