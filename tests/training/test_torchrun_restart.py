"""torchrun's elastic restart with the environment the launch gives it (cluster/job/torchrun.py
torchrun_env): two agents on this machine's loopback, one rank each. In the first round rank 0 fails
after the world has formed; in the second it comes 4 s late. The second round must form a world. Under
torch's default (one store shared by every round) rank 1 may read the address rank 0 had in the first
round and fail with "Connection refused": it did in 2 of 3 runs here without the launch's AGENT_ENV."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cluster.stack import catalog
from cluster.job.layout import plan_layout
from cluster.job.torchrun import torchrun_env
from tests.training.conftest import free_port

pytestmark = pytest.mark.slow

PROGRAM = """\
import os, time
from datetime import timedelta
import torch.distributed as dist
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if attempt == 1 and rank == 0:
    time.sleep(4)  # rank 0 comes late to the second round
dist.init_process_group("gloo", timeout=timedelta(seconds=30))
dist.barrier()
if attempt == 0:
    if rank == 0:
        os._exit(1)  # the first round fails once its world has formed
    dist.barrier()  # fails: rank 0 is gone
print(f"formed attempt={attempt} rank={rank}", flush=True)
"""


def test_a_restarted_round_forms_its_world_when_rank_zero_comes_late(tmp_path):
    program = tmp_path / "late.py"
    program.write_text(PROGRAM)
    layout = plan_layout(catalog.lookup("c6i.16xlarge"), backend="gloo", ranks_per_node=1, threads_per_rank=1,
                         preload=())
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **torchrun_env(layout)}
    torchrun = Path(sys.executable).with_name("torchrun")
    port = free_port()
    argv = [str(torchrun), "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"restart{port}", "--max-restarts", "1",
            "--monitor-interval", "0.5", "--local-addr", "127.0.0.1", str(program)]
    agents = [subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True) for _ in range(2)]
    try:
        outs = [agent.communicate(timeout=90)[0] for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
    both = "\n".join(outs)
    assert [agent.returncode for agent in agents] == [0, 0], both[-4000:]
    assert "formed attempt=1 rank=0" in both and "formed attempt=1 rank=1" in both, both[-4000:]
