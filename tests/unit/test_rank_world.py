"""Every rank's multi-CPU world: the variable the launch sets for accelerate (cluster/job/launch.py
CPU_WORLD_ENV, under mpirun and torchrun), the runner making a bare PartialState() read it, the
runner's record of the world each rank joined (xeon_cluster/run.py), and what `fab train` decides
from the records (cluster/job/worldcheck.py). Real torch and accelerate, in subprocesses."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cluster.stack import catalog
from cluster.job import worldcheck
from cluster.job.launch import CPU_WORLD_ENV, FLAVOURS, LaunchError, plan_launch
from cluster.job.layout import plan_layout
from cluster.job.torchrun import plan_torchrun_launch, torchrun_env
from xeon_cluster import run as runner

ROOT = Path(__file__).resolve().parents[2]
ENV = {k: v for k, v in os.environ.items()
       if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "ACCELERATE_USE_CPU", runner.RANK_DIR_VARIABLE)}
ENV["PYTHONPATH"] = str(ROOT)
MACHINE = catalog.lookup("r7iz.metal-16xl")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cwd: Path, script: str, env: dict, *args: str, through_runner: bool = True) -> subprocess.Popen:
    words = [runner.SCRIPT_OPTION, script, runner.ARGS_SEPARATOR, *args] if through_runner else [script, *args]
    argv = [sys.executable, "-m", runner.__name__, *words] if through_runner else [sys.executable, *words]
    return subprocess.Popen(argv, cwd=cwd, env={**ENV, "MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo", **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=180)
    return proc.returncode, out, err


# ---------------------------------------------------------------- the variable, in every rank's environment


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_every_mpirun_rank_is_told_it_runs_on_cpu(flavour):
    layout = plan_layout(MACHINE, backend="ccl" if flavour == "intel-mpi-oneccl" else "gloo")
    plan = plan_launch(flavour=flavour, job_id="j1", hosts=["n0", "n1"], master_addr="10.0.0.1", layout=layout,
                       program=["python", "x.py"], venv="/v")
    assert plan.rank_env["ACCELERATE_USE_CPU"] == "true"
    argv = list(plan.argv)
    if flavour == "openmpi":
        assert "ACCELERATE_USE_CPU=true" in [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    else:
        assert ["ACCELERATE_USE_CPU", "true"] in [argv[i + 1:i + 3] for i, a in enumerate(argv) if a == "-genv"]


def test_every_torchrun_rank_is_told_it_runs_on_cpu_and_env_overrides_it():
    layout = plan_layout(MACHINE, backend="gloo")
    assert torchrun_env(layout)["ACCELERATE_USE_CPU"] == "true"
    plan = plan_torchrun_launch(job_id="j1", hosts=["n0", "n1"], addresses=["10.0.0.1", "10.0.0.2"], layout=layout,
                                program=["python", "x.py"], venv="/v")
    assert "ACCELERATE_USE_CPU=true" in plan.node_commands["n1"]
    assert torchrun_env(layout, {"ACCELERATE_USE_CPU": "false"})["ACCELERATE_USE_CPU"] == "false"
    mpi = plan_launch(flavour="intel-mpi", job_id="j1", hosts=["n0"], master_addr="10.0.0.1", layout=layout,
                      program=["p"], venv="/v", extra_env={"ACCELERATE_USE_CPU": "false"})
    assert mpi.rank_env["ACCELERATE_USE_CPU"] == "false"


def test_the_rank_dir_is_the_launchs_own():
    layout = plan_layout(MACHINE, backend="gloo")
    with pytest.raises(LaunchError, match=f"--env: {runner.RANK_DIR_VARIABLE} is set by the launch itself"):
        plan_launch(flavour="intel-mpi", job_id="j1", hosts=["n0"], master_addr="10.0.0.1", layout=layout,
                    program=["p"], venv="/v", extra_env={runner.RANK_DIR_VARIABLE: "/tmp"})


ACCELERATE = '''
import sys
from accelerate import Accelerator, PartialState
state = Accelerator() if sys.argv[1] == "accelerator" else PartialState()
print(f"{state.distributed_type} {state.num_processes} {state.process_index}", flush=True)
'''


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["accelerator", "partial_state"])
def test_two_ranks_with_the_launchs_variable_form_one_multi_cpu_world_without_cpu_true(tmp_path, entry):
    pytest.importorskip("accelerate")
    (tmp_path / "acc.py").write_text(ACCELERATE)
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_PORT": port,
               runner.RANK_DIR_VARIABLE: str(tmp_path), **CPU_WORLD_ENV}
        procs.append(start(tmp_path, "acc.py", env, entry))
    results = [finish(p) for p in procs]
    for rank, (code, out, err) in enumerate(results):
        assert code == 0, err
        assert out.split() == ["DistributedType.MULTI_CPU", "2", str(rank)], (out, err)
        record = json.loads((tmp_path / f"{runner.WORLD_RECORD_PREFIX}{rank}.json").read_text())
        assert record == {"rank": rank, "expected": 2, "joined": True, "largest": 2}


@pytest.mark.slow
def test_partial_state_reads_the_variable_only_through_the_runner(tmp_path):
    pytest.importorskip("accelerate")
    (tmp_path / "acc.py").write_text(ACCELERATE.replace("sys.argv[1]", "'partial_state'"))
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_PORT": str(free_port()), **CPU_WORLD_ENV}
    plain = finish(start(tmp_path, "acc.py", env, through_runner=False))
    assert plain[1].split()[0] == "DistributedType.NO", plain  # accelerate itself: PartialState ignores it
    ran = finish(start(tmp_path, "acc.py", {**env, "MASTER_PORT": str(free_port())}))
    assert ran[1].split()[0] == "DistributedType.MULTI_CPU", ran
    without = finish(start(tmp_path, "acc.py", {k: v for k, v in env.items() if k not in CPU_WORLD_ENV}))
    assert without[1].split()[0] == "DistributedType.NO", without  # the runner adds nothing of its own


# ---------------------------------------------------------------- the record of the world joined


@pytest.mark.parametrize("body, largest", [
    ("print('no torch.distributed here')", 0),
    ("""
     import torch.distributed as dist
     from torch.distributed import init_process_group
     init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # a world of one, not of two
     dist.destroy_process_group()
     """, 1),
])
def test_a_rank_that_never_joined_a_group_of_world_size_records_so(tmp_path, body, largest):
    if largest:
        pytest.importorskip("torch")
    (tmp_path / "alone.py").write_text(textwrap.dedent(body))
    code, out, err = finish(start(tmp_path, "alone.py", {"RANK": "1", "WORLD_SIZE": "2",
                                                         runner.RANK_DIR_VARIABLE: str(tmp_path)}))
    assert code == 0, err
    record = json.loads((tmp_path / f"{runner.WORLD_RECORD_PREFIX}1.json").read_text())
    assert record == {"rank": 1, "expected": 2, "joined": False, "largest": largest}


# ---------------------------------------------------------------- the verdict


def records(*joined: bool, largest=None) -> dict[int, dict]:
    return {r: {"rank": r, "expected": len(joined), "joined": j, "largest": len(joined) if j else (largest or 0)}
            for r, j in enumerate(joined)}


def test_ranks_that_all_joined_pass():
    found = worldcheck.verdict(records(True, True, True), 3)
    assert found.code == 0 and found.lines == ("world: all 3 ranks joined one process group of 3",)


def test_ranks_that_never_joined_fail_with_the_plain_message_unless_independent():
    found = worldcheck.verdict(records(False, False), 2)
    assert found.code == worldcheck.TRAINED_ALONE != 0
    assert found.lines[0] == ("each rank trained alone: 2 times the work, no speed-up "
                              "(every rank of 2 never initialised torch.distributed)")
    assert worldcheck.INDEPENDENT_OPTION in found.lines[1]
    meant = worldcheck.verdict(records(False, False), 2, independent=True)
    assert meant.code == 0 and meant.lines[0] == found.lines[0]


def test_one_rank_alone_fails_and_is_named():
    found = worldcheck.verdict(records(True, False, True, largest=1), 3)
    assert found.code == worldcheck.TRAINED_ALONE and "rank(s) 1 of 3 formed a group of 1 at most" in found.lines[0]


def test_missing_records_are_said_but_do_not_fail_and_one_rank_needs_no_world():
    found = worldcheck.verdict({0: records(True, True)[0]}, 2)
    assert found.code == 0 and found.lines[0].startswith("world: no record from rank(s) 1 ")
    assert worldcheck.verdict({}, 1) == worldcheck.Verdict(0, ())


def test_records_are_read_from_the_nodes_listings_and_lines_without_a_file_are_nothing():
    found = worldcheck.parse_records([
        ("node0", 'world-0.json\t{"rank": 0, "expected": 2, "joined": true, "largest": 2}\n\n'),
        ("node1", 'garbage\nworld-1.json\t{"rank": 1, "expected": 2, "joined": false, "largest": 0}\n')])
    assert sorted(found.by_rank) == [0, 1] and found.problems == ()


# What a rank's own code may leave in the ranks folder instead of the runner's record: each is left out
# with one line naming the node and the file, and `fab train` ends with its verdict, never a traceback.
HOSTILE = [
    ('{"rank": 1, "expected": 2, "joined": false, "largest": "x"}', "largest 'x', allowed a whole number"),
    ('{"rank": 1, "expected": 2, "joined": false, "largest": 1e400}', "not JSON (the number 1e400 is out of range"),
    ('{"rank": 1, "expected": 2, "joined": false, "largest": [2]}', "largest [2], allowed a whole number"),
    ('{"rank": 1, "expected": 2, "joined": false, "largest": NaN}', "not JSON (NaN is not a number JSON allows)"),
    ('{"rank": 1.5, "expected": 2, "joined": false, "largest": 0}', "rank 1.5, allowed a whole number"),
    ('{"rank": true, "expected": 2, "joined": false, "largest": 0}', "rank True, allowed a whole number"),
    ('{"rank": -1, "expected": 2, "joined": false, "largest": 0}', "rank -1, allowed a whole number"),
    ('{"rank": 1, "expected": 2, "joined": "yes", "largest": 0}', "joined 'yes', allowed true or false"),
    ('{"rank": 1, "expected": 0, "joined": false, "largest": 0}', "expected 0, allowed a whole number of 1"),
    ('{"rank": 1, "expected": 2, "joined": false}', "no largest"),
    ('[1, 2]', "not a JSON object but list"), ('"\\u001b[2J"', "not a JSON object but str"),
    ("[" * 100_000, "not JSON"), ('{"rank": 1', "not JSON"),
]


@pytest.mark.parametrize("content, why", HOSTILE, ids=[str(i) for i in range(len(HOSTILE))])
def test_a_malformed_record_is_one_line_naming_the_node_and_file_never_a_traceback(content, why):
    good = 'world-0.json\t{"rank": 0, "expected": 2, "joined": true, "largest": 2}'
    found = worldcheck.parse_records([("node0", good), ("node1", f"world-1.json\t{content}")],
                                     ".xeon-cluster/jobs/j1/ranks")
    (line,) = found.problems
    assert line.startswith("world: node1: .xeon-cluster/jobs/j1/ranks/world-1.json is not a world record (")
    assert why in line and line.endswith("; left out") and len(line) < 300 and "\x1b" not in line
    assert list(found.by_rank) == [0]
    verdict = worldcheck.verdict(found.by_rank, 2)  # rank 1 has no record now: said, not fatal
    assert verdict.code == 0 and verdict.lines[0].startswith("world: no record from rank(s) 1 ")


def test_a_file_name_with_escape_and_bidirectional_characters_reaches_the_terminal_without_them():
    name = "world-\x1b]0;owned\x07\u202egnp.json"
    found = worldcheck.parse_records([("node1", f"{name}\t{{}}")])
    (line,) = found.problems
    assert "\x1b" not in line and "\u202e" not in line and "\x07" not in line
    assert line.startswith("world: node1: world-gnp.json is not a world record (no rank, ")


def test_the_nodes_listing_keeps_one_line_per_file_whatever_its_name_and_content(tmp_path):
    from node_setup.ssh.world import listing_command, records_folder

    folder = tmp_path / records_folder("j1")
    folder.mkdir(parents=True)
    (folder / "world-0.json").write_text('{"rank": 0, "expected": 2,\n "joined": true, "largest": 2}')
    (folder / 'world-1\n{"rank": 1, "expected": 2, "joined": true, "largest": 2}\t.json').write_text("x")
    (folder / "world-2.json").write_text("y" * (worldcheck.RECORD_BYTES * 3))
    (folder / "world-3.json").mkdir()  # not a file: not listed
    out = subprocess.run(["sh", "-c", listing_command("j1")], env={**ENV, "HOME": str(tmp_path)},
                         capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert len(lines) == 3 and all(line.count("\t") == 1 for line in lines)
    assert len(lines[2]) == len("world-2.json\t") + worldcheck.RECORD_BYTES
    found = worldcheck.parse_records([("node0", out)])
    assert list(found.by_rank) == [0]  # the record split over two lines is still one; the forged one is not
    forged, long = found.problems
    assert forged.startswith('world: node0: world-1?{"rank": 1, "expected": 2,') and "is not a world record" in forged
    assert long.startswith("world: node0: world-2.json is not a world record (not JSON")


class _Listing:
    """Test double for a node's connection: `run` answers with the listing given, or raises."""

    def __init__(self, stdout: str = "", error: Exception | None = None):
        self.stdout, self.error = stdout, error

    def run(self, command, **kwargs):
        if self.error:
            raise self.error
        return self


def test_read_records_names_an_unreadable_node_and_a_malformed_record_and_returns_the_rest():
    from node_setup.ssh.world import read_records

    conns = {"node0": _Listing('world-0.json\t{"rank": 0, "expected": 2, "joined": true, "largest": 2}\n'),
             "node1": _Listing('world-1.json\t{"rank": 1, "expected": 2, "joined": true, "largest": [2]}\n'),
             "node2": _Listing(error=OSError("reset by \x1b[31mpeer"))}
    records, lines = read_records(conns, "j1")
    assert list(records) == [0]
    assert lines == ["world: cannot read the records on node2: OSError: reset by peer",
                     "world: node1: .xeon-cluster/jobs/j1/ranks/world-1.json is not a world record (largest [2], "
                     "allowed a whole number of 0 to 1000000); left out"]
