"""Which rank am I: the launcher's environment mapped to one RankInfo (pure, no torch).

Intel MPI and MPICH (hydra) set PMI_RANK/PMI_SIZE/MPI_LOCALRANKID/MPI_LOCALNRANKS, Open MPI sets
OMPI_COMM_WORLD_*, torchrun sets RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE. The first launcher
whose rank variable is present wins; torch.distributed and accelerate then read the RANK family,
which `torch_env` returns so every library agrees on the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from training.errors import BadInput

# (launcher, rank, world size, local rank, local world size)
LAUNCHER_VARIABLES = (
    ("intel-mpi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("open-mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
)


@dataclass(frozen=True)
class RankInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1  # 0 when the launcher does not say how many ranks share the node
    launcher: str = "none"

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def torch_env(self) -> dict[str, str]:
        """The RANK family of variables that torch.distributed and accelerate read."""
        return {"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size),
                "LOCAL_RANK": str(self.local_rank),
                "LOCAL_WORLD_SIZE": str(self.local_world_size or 1)}


def _int(env: Mapping[str, str], name: str, default: int | None) -> int:
    value = env.get(name)
    if value is None or value == "":
        if default is None:
            raise BadInput(f"{name} is not set although the launcher set the other rank variables; "
                           "launch with mpirun, mpiexec or torchrun, which set it")
        return default
    try:
        return int(value)
    except ValueError:
        raise BadInput(f"{name}={value!r} is not an integer; it must be set by the launcher "
                       "(mpirun/torchrun), do not set it by hand") from None


def detect(env: Mapping[str, str]) -> RankInfo:
    """RankInfo from the first launcher whose variables are present; a single process otherwise."""
    for launcher, rank_var, size_var, local_var, local_size_var in LAUNCHER_VARIABLES:
        if env.get(rank_var, "") == "":
            continue
        rank = _int(env, rank_var, None)
        world = _int(env, size_var, None)
        local_rank = _int(env, local_var, 0)
        local_world = _int(env, local_size_var, 1 if world == 1 else 0)  # 0: launcher did not say
        if world < 1:
            raise BadInput(f"{size_var}={world} must be at least 1")
        if not 0 <= rank < world:
            raise BadInput(f"{rank_var}={rank} is outside 0..{world - 1} ({size_var}={world})")
        return RankInfo(rank, world, local_rank, local_world, launcher)
    return RankInfo()


def rendezvous(env: Mapping[str, str], info: RankInfo) -> tuple[str, int]:
    """MASTER_ADDR and MASTER_PORT for a multi-rank job; BadInput naming what to set if missing."""
    if not info.distributed:
        return env.get("MASTER_ADDR") or "127.0.0.1", int(env.get("MASTER_PORT") or 29500)
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not env.get(name)]
    if missing:
        raise BadInput(
            f"{' and '.join(missing)} not set for a {info.world_size}-rank job ({info.launcher}): "
            "export MASTER_ADDR=<rank 0's node address> and MASTER_PORT=<a free TCP port, one per job> "
            "and pass them to every rank (Intel MPI: -genv; Open MPI: -x); `fab train` sets both")
    port_text = env["MASTER_PORT"]
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise BadInput(f"MASTER_PORT={port_text!r} is not a TCP port; allowed 1-65535")
    return env["MASTER_ADDR"], int(port_text)
