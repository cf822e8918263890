"""The scripts people bring, unchanged, on the local cluster: an accelerate `*_no_trainer.py` script
with a plain `Accelerator()`, a `Trainer` script shaped like Hugging Face's `run_glue.py` resumed
after a spot notice (its workdir's own cluster.py and training package shadowing
nothing of the toolkit's), a plain DDP script written for torchrun under both launchers; each prints the
world it saw and whether its ranks' parameters agree after training. And a script that never forms
a world: `fab train` says each rank trained alone and exits TRAINED_ALONE, unless --independent-ranks.

Budget: about 3 minutes on a 2-core machine (two nodes of the session's 3-node cluster, eight short jobs of two
ranks each).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cluster.job.jobplan import LOCAL_OUTPUT_ROOT
from cluster.job.worldcheck import INDEPENDENT_OPTION, TRAINED_ALONE
from tests.ssh.test_user_script import ONE_THREAD, fab, train_through_a_notice, write

pytestmark = [pytest.mark.ssh, pytest.mark.mpi, pytest.mark.slow]

# Every script ends by printing "world W rank R agree True|False": the sum of its parameters
# all-reduced (MAX and MIN) across the ranks; equal only when every rank applied the same gradients.
NO_TRAINER = '''
import argparse, os
import torch
from accelerate import Accelerator

parser = argparse.ArgumentParser()
parser.add_argument("--output_dir", required=True)
parser.add_argument("--resume_from_checkpoint", default=None)
parser.add_argument("--steps", type=int, default=3)
args = parser.parse_args()

accelerator = Accelerator()
torch.manual_seed(accelerator.process_index)  # different starting weights: only DDP's broadcast makes them agree
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(64, 8, generator=torch.Generator().manual_seed(0)),
                                      torch.randn(64, 1))
loader = torch.utils.data.DataLoader(data, batch_size=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
if args.resume_from_checkpoint:
    accelerator.load_state(args.resume_from_checkpoint)
    accelerator.print(f"resumed from {args.resume_from_checkpoint}")
for step, (x, y) in zip(range(args.steps), loader):
    loss = torch.nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    losses = accelerator.gather(loss.detach().reshape(1))
    accelerator.print(f"step {step} losses of {losses.numel()} ranks: {losses.tolist()}")
accelerator.save_state(os.path.join(args.output_dir, "state"))
total = sum(p.detach().sum() for p in model.parameters()).reshape(1)
high, low = accelerator.reduce(total.clone(), "max"), -accelerator.reduce(-total, "max")  # (reduce has no "min")
agree = bool(torch.allclose(high, low))
print(f"world {accelerator.num_processes} rank {accelerator.process_index} agree {agree} "
      f"({accelerator.distributed_type})", flush=True)
'''

RUN_GLUE = '''
import os, time
from dataclasses import dataclass, field
import torch
import torch.distributed as dist
from transformers import (BertConfig, BertForSequenceClassification, HfArgumentParser, Trainer, TrainerCallback,
                          TrainingArguments)
from xeon_cluster.callbacks import SpotNoticeCallback

@dataclass
class ModelArguments:
    hidden_size: int = field(default=16)

class Slow(TrainerCallback):  # the first run's steps last long enough for the notice to land well before the end
    def on_step_end(self, args, state, control, **kw):
        if not args.resume_from_checkpoint:  # the resumed run, which gets no notice, need not wait
            time.sleep(0.3)
        if state.is_world_process_zero:
            print(f"training step {state.global_step}", flush=True)

class Data(torch.utils.data.Dataset):
    def __len__(self): return 4000
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, 64, (8,), generator=g), "labels": i % 2}

model_args, training_args = HfArgumentParser((ModelArguments, TrainingArguments)).parse_args_into_dataclasses()
config = BertConfig(vocab_size=64, hidden_size=model_args.hidden_size, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=32)
spot = SpotNoticeCallback()
trainer = Trainer(model=BertForSequenceClassification(config), args=training_args, train_dataset=Data(),
                  callbacks=[Slow(), spot])
trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
total = sum(p.detach().sum() for p in trainer.model.parameters()).reshape(1)
high, low = total.clone(), total.clone()
dist.all_reduce(high, dist.ReduceOp.MAX); dist.all_reduce(low, dist.ReduceOp.MIN)
print(f"world {training_args.world_size} rank {training_args.process_index} agree {bool(torch.allclose(high, low))} "
      f"stopped at step {trainer.state.global_step}, notice saved at {spot.saved_at}, by signal {spot.signalled}",
      flush=True)
'''

DDP = '''
import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group()  # as a script written for torchrun does: env://, the default backend
local_rank = int(os.environ["LOCAL_RANK"])
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)  # different starting weights and data per rank
model = DDP(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    optimizer.zero_grad(); loss.backward(); optimizer.step()
total = sum(p.detach().sum() for p in model.parameters()).reshape(1)
high, low = total.clone(), total.clone()
dist.all_reduce(high, dist.ReduceOp.MAX); dist.all_reduce(low, dist.ReduceOp.MIN)
print(f"world {world} rank {rank} local_rank {local_rank} agree {bool(torch.allclose(high, low))}", flush=True)
dist.barrier()  # no rank tears gloo down while another still uses it
dist.destroy_process_group()
'''

ALONE = '''
import os
import torch
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
model(torch.randn(4, 8)).sum().backward()
print(f"rank {os.environ['RANK']} trained by itself", flush=True)
'''


def worlds(out: str, size: int) -> list[int]:
    """The ranks that printed `world SIZE rank R ... agree True` (ranks' lines may be glued together)."""
    return sorted(int(r) for r in re.findall(rf"world {size} rank (\d+)(?: local_rank \d+)? agree True", out))


@pytest.fixture(scope="module")
def cluster(installed_cluster):
    return installed_cluster


def test_accelerate_no_trainer_script_with_a_plain_accelerator_trains_as_one_world_and_resumes(cluster, tmp_path):
    work = write(tmp_path / "work", {"train_no_trainer.py": NO_TRAINER})
    out_dir = f"{LOCAL_OUTPUT_ROOT}/{cluster.name}/no-trainer"
    first = fab(cluster, "train", "--nodes", "2", *ONE_THREAD, "--script", str(work / "train_no_trainer.py"),
                "--output-dir", out_dir, "--args", f"--output_dir {out_dir}")
    out = first.stdout + first.stderr
    assert first.returncode == 0, out
    assert worlds(out, 2) == [0, 1] and out.count("(DistributedType.MULTI_CPU)") == 2, out
    assert "losses of 2 ranks" in out and "world: all 2 ranks joined one process group of 2" in out, out
    assert (Path(out_dir) / "state").is_dir(), out
    again = fab(cluster, "train", "--nodes", "2", *ONE_THREAD, "--script", str(work / "train_no_trainer.py"),
                "--output-dir", out_dir, "--args", f"--output_dir {out_dir} --resume_from_checkpoint {out_dir}/state")
    out = again.stdout + again.stderr
    assert again.returncode == 0 and f"resumed from {out_dir}/state" in out and worlds(out, 2) == [0, 1], out


def test_run_glue_shaped_trainer_script_resumes_after_a_spot_notice(cluster, tmp_path):
    # the workdir's own cluster.py and training package shadow nothing of the toolkit's on the nodes
    work = write(tmp_path / "work", {"run_glue.py": RUN_GLUE, "cluster.py": "raise ImportError('user cluster.py')\n",
                                     "training/__init__.py": "raise ImportError('user training package')\n"})
    out_dir = f"{LOCAL_OUTPUT_ROOT}/{cluster.name}/run-glue"
    args = ["--output_dir", out_dir, "--max_steps", "30", "--per_device_train_batch_size", "4", "--save_strategy",
            "no", "--report_to", "none", "--logging_steps", "1000"]
    code, out = train_through_a_notice(cluster, tmp_path, 8112, ["--script", str(work / "run_glue.py"),
                                                                 "--output-dir", out_dir, "--", *args], nodes=2)
    assert code == 0, out
    saved = [int(n) for n in re.findall(r"notice saved at (\d+)", out)]
    assert len(saved) == 2 and len(set(saved)) == 1 and 3 <= saved[0] < 30, out  # every rank, the same step
    assert worlds(out, 2) == [0, 1], out
    # rank 0 (node0's, the one node with a notice) was signalled by its watcher; rank 1 agreed with it
    assert re.search(r"\brank 0 agree True stopped at step \d+, notice saved at \d+, by signal True", out), out
    checkpoint = f"{out_dir}/checkpoint-{saved[0]}"
    assert (Path(checkpoint) / "trainer_state.json").is_file(), out
    resumed = fab(cluster, "train", "--nodes", "2", *ONE_THREAD, "--script", str(work / "run_glue.py"),
                  "--output-dir", out_dir, "--args", " ".join([*args, "--resume_from_checkpoint", checkpoint]))
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out
    steps = [int(n) for n in re.findall(r"training step (\d+)", out)]
    assert steps and min(steps) == saved[0] + 1 and "stopped at step 30" in out and worlds(out, 2) == [0, 1], out


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun"])
def test_a_plain_ddp_script_written_for_torchrun_runs_under_either_launcher(cluster, tmp_path, launcher):
    work = write(tmp_path / "work", {"ddp.py": DDP})
    result = fab(cluster, "train", "--nodes", "2", *ONE_THREAD, "--launcher", launcher, "--script",
                 str(work / "ddp.py"))
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert worlds(out, 2) == [0, 1] and "world: all 2 ranks joined one process group of 2" in out, out


def test_ranks_that_never_form_a_world_fail_the_job_unless_independent_ranks_are_asked_for(cluster, tmp_path):
    work = write(tmp_path / "work", {"alone.py": ALONE})
    alone = fab(cluster, "train", "--nodes", "2", *ONE_THREAD, "--script", str(work / "alone.py"))
    out = alone.stdout + alone.stderr
    assert alone.returncode == TRAINED_ALONE, out
    assert "each rank trained alone: 2 times the work, no speed-up" in out and "rank 1 trained by itself" in out, out
    meant = fab(cluster, "train", "--nodes", "2", *ONE_THREAD, "--script", str(work / "alone.py"), INDEPENDENT_OPTION)
    out = meant.stdout + meant.stderr
    assert meant.returncode == 0 and "each rank trained alone" in out, out
