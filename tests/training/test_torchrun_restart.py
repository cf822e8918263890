"""torchrun's elastic restart with the environment the launch gives it (cluster/job/torchrun.py
torchrun_env): two agents on this machine's loopback, one rank each. In the first round rank 0 fails
after the world has formed; in the second it comes 4 s late. The second round must form a world. Under
torch's default (one store shared by every round) rank 1 may read the address rank 0 had in the first
round and fail with "Connection refused": it did in 2 of 3 runs here without the launch's AGENT_ENV.

Which round it is comes from a file the failing rank leaves, not from TORCHELASTIC_RESTART_COUNT: that
count is each agent's own (the failures it restarted after), and an agent whose rank is still ending when
the other agent rejoins restarts for the membership change, which counts nothing. Its rank then sees 0 in
the second round; a test that read the count as the round made that rank act out the first round again
(its second barrier failed once rank 0 had finished) and hung, the finished agent waiting at torch's
exit barrier and the other at a rendezvous only it had joined: 4 of 7 runs with the cores busy.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cluster.stack import catalog
from cluster.job.layout import plan_layout
from cluster.job.torchrun import torchrun_env
from tests.processes import run_together
from tests.training.conftest import free_port

pytestmark = pytest.mark.slow

PROGRAM = """\
import os, time
from datetime import timedelta
from pathlib import Path
import torch.distributed as dist
rank, failed = int(os.environ["RANK"]), Path("first-round-failed")  # in the agents' shared working directory
second_round = failed.exists()
if second_round and rank == 0:
    time.sleep(4)  # rank 0 comes late to the second round
dist.init_process_group("gloo", timeout=timedelta(seconds=30))
dist.barrier()
if not second_round:
    if rank == 0:
        failed.touch()
        os._exit(1)  # the first round fails once its world has formed
    dist.barrier()  # fails: rank 0 is gone
print(f"formed round=2 rank={rank} restart_count={os.environ['TORCHELASTIC_RESTART_COUNT']}", flush=True)
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
    agents = run_together([argv, argv], tmp_path / "agents", timeout=240, cwd=tmp_path, env=env)
    both = "\n".join(agent.stdout + agent.stderr for agent in agents)
    assert [agent.returncode for agent in agents] == [0, 0], both[-4000:]
    assert "formed round=2 rank=0" in both and "formed round=2 rank=1" in both, both[-4000:]
