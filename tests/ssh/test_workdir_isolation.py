"""`fab train --script` on a 2-node local cluster: a workdir holding (fake) credentials and a link
out of it ships none of them, and what one job writes into its copy of the workdir reaches neither
another file of the same content nor the next job (the nodes' file store is copied from, not
linked to).

Budget: about a minute on a 2-core machine once the node venv exists (two short jobs).
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

from cluster.job.userjob import FILE_STORE, WITHHELD_DOT, WITHHELD_LINK
from tests.ssh.conftest import run_fab

pytestmark = [pytest.mark.ssh, pytest.mark.mpi, pytest.mark.slow]

FAKE_SECRET = "fake-secret-for-the-test"
# Every rank: the files it sees, the shipped files' contents, then it writes into two of them.
JOB = '''
import os
import torch.distributed as dist
dist.init_process_group("gloo")  # one world, as a training script forms it
names = sorted(os.path.relpath(os.path.join(d, f), ".") for d, _, fs in os.walk(".") for f in fs)
seen = {n: open(n).read() for n in ("config.txt", "a.txt", "b.txt")}
with open("config.txt", "a") as f:
    f.write("written by a job\\n")
with open("a.txt", "a") as f:  # an empty file: the same content, and digest, as b.txt
    f.write("written by a job\\n")
seen["b.txt after writing a.txt"] = open("b.txt").read()
print(f"rank {os.environ['RANK']} saw {names!r} {seen!r}", flush=True)
dist.barrier()  # no rank tears gloo down while another still uses it
dist.destroy_process_group()
'''


@pytest.fixture(scope="module")
def cluster(local_cluster_factory):
    made = local_cluster_factory(2)
    for args, timeout in ((("setup",), 1800), (("distribute",), 120)):
        result = run_fab(made, *args, timeout=timeout)
        if result.returncode != 0:
            pytest.fail(f"fab {args[0]} failed (exit {result.returncode}):\n{result.stdout}\n{result.stderr}")
    yield made
    made.destroy()


def seen_by_ranks(out: str) -> dict[int, tuple[list[str], dict[str, str]]]:
    found = re.findall(r"rank (\d) saw (\[.*?\]) (\{.*?\})", out)
    return {int(rank): (ast.literal_eval(names), ast.literal_eval(seen)) for rank, names, seen in found}


def test_credentials_and_links_out_stay_here_and_one_job_cannot_change_the_next(cluster, tmp_path):
    work = tmp_path / "work"
    for rel, text in {"train.py": JOB, "config.txt": "original\n", "a.txt": "", "b.txt": "",
                      ".aws/credentials": f"[default]\naws_secret_access_key = {FAKE_SECRET}\n",
                      ".ssh/id_ed25519": f"{FAKE_SECRET}\n", ".env": f"TOKEN={FAKE_SECRET}\n"}.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(textwrap.dedent(text))
    (tmp_path / "outside.txt").write_text(f"{FAKE_SECRET}\n")
    (work / "leak.txt").symlink_to(tmp_path / "outside.txt")

    expected_seen = {"config.txt": "original\n", "a.txt": "", "b.txt": "", "b.txt after writing a.txt": ""}
    for run in ("first", "second"):
        result = run_fab(cluster, "train", "--nodes", "2", "--threads", "1", "--script", str(work / "train.py"),
                         timeout=300)
        out = result.stdout + result.stderr
        assert result.returncode == 0, out
        assert f"  not copied, {WITHHELD_DOT}: .aws/, .env, .ssh/" in out, out
        assert f"  not copied, {WITHHELD_LINK}: leak.txt" in out, out
        ranks = seen_by_ranks(out)
        assert sorted(ranks) == [0, 1], out
        for rank, (names, seen) in ranks.items():
            assert names == ["a.txt", "b.txt", "config.txt", "train.py"], (run, rank, out)
            assert seen == expected_seen, (run, rank, out)  # the earlier job's writes are not here

    for node in cluster.state.nodes:
        home = Path(node.dir) / "root"
        store = home / FILE_STORE
        assert store.is_dir() and not any(FAKE_SECRET in p.read_text(errors="replace")
                                          for p in store.iterdir() if p.is_file()), node.name
        assert not any(FAKE_SECRET in p.read_text(errors="replace")
                       for p in (home / ".xeon-cluster" / "jobs").rglob("*") if p.is_file()), node.name

