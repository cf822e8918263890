"""cluster/run/recovery.py: the decisions of `fab train --managed` (pure), and its bad input through the real `fab`."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.run import recovery as rc
from tests.fab_run import fab_in_process

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- the batch on a new number of ranks


@pytest.mark.parametrize("per_rank, accumulation, before, after, expected", [
    (16, 1, 4, 2, (16, 2)),  # accumulation alone keeps it
    (16, 1, 4, 1, (16, 4)),
    (16, 1, 3, 2, (12, 2)),  # 48 over 2 ranks: a smaller per-rank batch with accumulation
    (16, 2, 2, 4, (16, 1)),  # more ranks: less accumulation
    (16, 1, 3, 3, (16, 1)),  # the same ranks: unchanged
    (8, 3, 2, 4, (6, 2)),    # 48 over 4 ranks: 12 each, the largest divisor up to 8 is 6
])
def test_batch_keeps_the_global_batch_exactly_when_an_integer_accumulation_allows(per_rank, accumulation, before,
                                                                                  after, expected):
    plan = rc.batch_for(per_rank=per_rank, accumulation=accumulation, ranks_before=before, ranks=after)
    assert (plan.per_rank, plan.accumulation) == expected
    assert plan.exact and plan.per_rank * plan.accumulation * after == per_rank * accumulation * before
    assert plan.per_rank <= per_rank  # never more memory per rank
    assert plan.describe(per_rank, accumulation).startswith(f"global batch {per_rank * accumulation * before} kept")


def test_batch_that_cannot_be_kept_says_in_one_line_what_changed():
    plan = rc.batch_for(per_rank=16, accumulation=1, ranks_before=5, ranks=3)  # 80 does not divide over 3 ranks
    assert not plan.exact and plan.per_rank == 16 and plan.global_batch == 96
    line = plan.describe(16, 1)
    assert "\n" not in line
    assert line == ("global batch 80 cannot be kept exactly on 3 rank(s): per-rank batch 16 -> 16, gradient "
                    "accumulation 1 -> 2 on 3 rank(s) gives 96 (+16 samples per step); the job keeps its place in "
                    "the data (samples seen), so its step count changes")


def test_batch_refuses_nonsense():
    with pytest.raises(ValueError):
        rc.batch_for(per_rank=0, accumulation=1, ranks_before=2, ranks=1)


def test_a_relaunchs_batch_replaces_the_jobs_own_when_its_command_line_is_made():
    """The typed override (cluster/job/jobplan.py's Restart): the per-rank batch and the accumulation replace
    --batch-size and the batch settings of --extra, nothing else of the job's arguments changes."""
    from cluster.inventory import Inventory
    from cluster.job.jobplan import Restart, plan
    from cluster.job.train_options import request_from_options

    inventory = Inventory.from_mapping({"name": "lab", "sockets": 1, "physical_cores": 4,
                                        "hosts": ["192.0.2.10", "192.0.2.11", "192.0.2.12"]}, default_name="lab")
    request = request_from_options(dict(batch_size=16, extra="--global_batch_size=48 --gradient_accumulation_steps 1 "
                                        "--learning_rate 3e-5"), inventory, run_id="20261126-101500-ab12")[0]
    batch = rc.batch_for(per_rank=16, accumulation=1, ranks_before=3, ranks=2)
    args = list(plan(request, inventory, nodes=2, restart=Restart(batch=batch)).training_args)
    assert args[args.index("--per_device_train_batch_size") + 1] == "12"
    assert args[args.index("--gradient_accumulation_steps") + 1] == "2"
    assert "--global_batch_size=48" not in " ".join(args) and args.count("--gradient_accumulation_steps") == 1
    assert "--learning_rate" in args and "--resume" in args
    unchanged = list(plan(request, inventory, nodes=2).training_args)
    assert unchanged[unchanged.index("--per_device_train_batch_size") + 1] == "16" and "--resume" not in unchanged


# ---------------------------------------------------------------- after the wait: full, survivors or stop


@pytest.mark.parametrize("wanted, available, min_nodes, expected", [
    (3, 3, 1, rc.FULL), (3, 4, 1, rc.FULL), (3, 2, 2, rc.SURVIVORS), (3, 2, 1, rc.SURVIVORS),
    (3, 1, 2, rc.TOO_FEW), (4, 0, 1, rc.TOO_FEW),
])
def test_next_step(wanted, available, min_nodes, expected):
    assert rc.next_step(wanted, available, min_nodes) == expected


def test_work_lost_and_the_record():
    assert rc.work_lost_seconds(23, 23, 0.2) == 0.0  # the notice's checkpoint: nothing lost
    assert rc.work_lost_seconds(30, 20, 0.5) == 5.0
    assert rc.work_lost_seconds(None, 20, 0.5) is None
    record = rc.recovery_record(number=1, at=0, cause="spot notice", step=20, exit_code=75, nodes_lost=["node2"],
                                nodes_after=["node0", "node1"], seconds_lost=0.0, seconds_waiting=7.74)
    assert record["at"] == "1970-01-01T00:00:00Z" and record["seconds_waiting"] == 7.7
    merged = rc.merge_recoveries({"status": "completed", "recoveries": ["stale"]}, [record])
    assert merged["recoveries"] == [record] and merged["status"] == "completed"


# ---------------------------------------------------------------- settings


def test_wait_durations_and_zero():
    assert rc.parse_wait("1h30m") == 5400 and rc.parse_wait("90") == 90 and rc.parse_wait("0s") == 0
    for bad in ("soon", "-5m"):
        with pytest.raises(rc.RecoveryError, match=f"^--wait-for-capacity: '{bad}' is not a duration"):
            rc.parse_wait(bad)


INVENTORY = "name: lab\nuser: ubuntu\ninstance_type: r7iz.metal-16xl\nhosts: [192.0.2.10, 192.0.2.11]\n"


@pytest.mark.parametrize("argv, line", [
    (["--managed", "--max-recoveries", "-2"], "error: --max-recoveries: -2 is not allowed; give 0 or more"),
    (["--managed", "--min-nodes", "3"], "error: --min-nodes: 3 is not allowed; allowed 1 to 2 (the job's nodes)"),
    (["--managed", "--wait-for-capacity", "1d"], "error: --wait-for-capacity: '1d' is not a duration"),
    (["--wait-for-capacity", "10m"], "error: --wait-for-capacity: only with --managed"),
    (["--managed", "--launcher", "torchrun"], "error: --managed: not with --launcher torchrun"),
])
def test_fab_train_managed_bad_input_is_one_line_and_exit_2(tmp_path, argv, line):
    """Against an inventory of documentation addresses (never reached: every case stops first)."""
    inventory = tmp_path / "lab.yaml"
    inventory.write_text(INVENTORY)
    result = fab_in_process("train", "-c", str(inventory), *argv)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), result.stderr
    assert "Traceback" not in result.stderr
