"""The soak's decisions (bench/soak_plan.py): its seeded schedule, what a job's log says of its steps, its verdict."""

from __future__ import annotations

from collections import Counter

import pytest

from bench import soak_plan as plan

# rank 0's lines of a resumed job, as the master's job log holds them (mpirun's "[rank] " prefix)
RESUMED_LOG = ("[0] 2026-11-27 17:18:40,101 rank 0 INFO training.resume: resuming from /root/xc/soak/checkpoint-2272 "
               "(step 2272 of run 20261127T171214Z-5b38, chosen from s3://soak/soak: the newest checkpoint every rank "
               "can read)\n") + """\
[1] {'loss': '0.41', 'grad_norm': '0.3', 'learning_rate': '0.001', 'epoch': '15.5'}
[0] {'loss': '0.41', 'grad_norm': '0.3', 'learning_rate': '0.001', 'epoch': '15.5'}
[0] {'loss': '0.39', 'grad_norm': '0.3', 'learning_rate': '0.001', 'epoch': '15.51'}
[0] 2026-11-27 17:18:44,490 rank 0 INFO training.callbacks: checkpoint 2275 uploaded to s3://soak/soak/checkpoint-2275
[0] 2026-11-27 17:18:50,101 rank 0 ERROR training.callbacks: checkpoint 2300 upload to s3://soak/soak failed: SlowDown
[0] 2026-11-27 17:18:55,101 rank 0 ERROR training.callbacks: checkpoint 2325 not saved: no space left on the device
[2] {'loss': '0.37', 'grad_norm': '0.3', 'learning_rate': '0.001', 'epoch': '15.52'}
"""


def test_the_schedule_is_seeded_balanced_and_never_on_the_master():
    kinds = list(plan.KINDS)
    faults = plan.schedule(kinds, 16, 4, seed=7)
    assert faults == plan.schedule(kinds, 16, 4, seed=7) and faults != plan.schedule(kinds, 16, 4, seed=8)
    counts = Counter(f.kind for f in faults)
    assert set(counts) == set(kinds) and max(counts.values()) - min(counts.values()) <= 1
    assert {f.node for f in faults if f.kind in plan.ON_A_WORKER} <= {"node1", "node2", "node3"}
    assert all(f.node is None for f in faults if f.kind not in plan.ON_A_WORKER)
    fractions = [f.at_fraction for f in faults]
    assert fractions == sorted(fractions) and fractions[0] == plan.FIRST_AT and fractions[-1] == plan.LAST_AT
    assert all((f.hold_s > 0) == (plan.KINDS[f.kind][1] > 0) for f in faults)
    assert plan.default_count(30, kinds) == 14 and plan.default_count(3, kinds) == len(kinds)


@pytest.mark.parametrize("kinds, count, nodes, wrong", [
    ("reclaim,bogus", 4, 3, "--kinds"), ("reclaim,reclaim", 4, 3, "--kinds"), ("", 4, 3, "--kinds"),
    ("reclaim,silent,disk-full", 2, 3, "--faults"), ("partition", 2, 1, "--nodes")])
def test_a_schedule_that_cannot_be_made_names_the_setting(kinds, count, nodes, wrong):
    with pytest.raises(plan.PlanError) as raised:
        plan.schedule(plan.parse_kinds(kinds), count, nodes, seed=1)
    assert str(raised.value).startswith(f"{wrong}: ")


def test_a_job_log_gives_its_start_steps_losses_and_checkpoints():
    job = plan.JobSteps("j2")
    job.read(RESUMED_LOG.splitlines())
    assert (job.start, job.logged, job.last) == (2272, 2, 2274)  # rank 0's loss lines only
    assert job.losses == [0.41, 0.39] and job.uploaded == [2275] and job.not_saved == [2300, 2325]
    ended = plan.JobSteps("j1", start=2200, logged=85)  # it got to 2285 before the node went
    assert plan.steps_redone([ended], job) == 13 and plan.steps_redone([], job) == 0
    assert plan.final_loss([1.0] * 10 + [0.5] * 20) == 0.5 and plan.final_loss([]) is None


def test_the_verdict_names_what_the_done_when_does_not_allow():
    fault = plan.Outcome(plan.Fault(1, "silent", 0.5, "node1", 0.0), fired_at_s=10.0, at_step=100,
                         training_again_s=40.0, steps_redone=30, interval_steps=25)
    report = {"status": "completed", "faults": [fault.as_json()], "processes_left": [], "namespaces_left": [],
              "mounts_left": [], "files_left": [], "checkpoint_objects_not_needed": 0}
    assert plan.verdict(report) == ["fault 1 (silent): 30 steps redone, more than one checkpoint interval (25)"]
    fault.steps_redone = 25
    assert plan.verdict({**report, "faults": [fault.as_json()]}) == []
    unfired = plan.Outcome(plan.Fault(2, "reclaim", 0.9, "node2", 0.0)).as_json()
    problems = plan.verdict({**report, "status": "failed", "faults": [fault.as_json(), unfired],
                             "namespaces_left": ["xc-soak1-n0"], "checkpoint_objects_not_needed": 3})
    assert problems == ["the run ended 'failed', not completed", "1 fault(s) never fired (the run ended first)",
                        "namespaces left: ['xc-soak1-n0']", "checkpoint objects the run no longer needs: 3"]
    table = plan.table([fault, plan.Outcome(plan.Fault(2, "reclaim", 0.9, "node2", 0.0))]).splitlines()
    assert table[2].startswith("| 1 | silent | node1 | 0 | 10 (100) |") and table[2].endswith("| 25 (25) |")
    assert table[3].startswith("| 2 | reclaim | node2 | 0 | not fired |")


def test_fidelity_compares_the_run_with_undisturbed_runs_step_by_step():
    """Up to the first recovery every logged loss equals the baseline's; each later job's first step equals the
    baseline's at that step when its world size is the baseline's, and is not compared otherwise."""
    baseline = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]
    first = plan.JobSteps("j1", world=3, losses=[0.9, 0.8, 0.7, 0.6, 0.5], logged=5)  # lost after step 5
    resumed = plan.JobSteps("j2", start=4, world=3, losses=[0.5, 0.4, 0.3, 0.2], logged=4)
    smaller = plan.JobSteps("j3", start=6, world=2, losses=[0.33, 0.2], logged=2)
    report = plan.fidelity([first, resumed, smaller], [baseline, [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.31, 0.22]], 3,
                           final=0.25)
    assert report["first_job"] == {"steps": 5, "equal": 5, "first_difference": None}
    assert [(e["job"], e["step"], e["equal"]) for e in report["after_recoveries"]] == [("j2", 5, True),
                                                                                       ("j3", 7, None)]
    assert report["final_loss_spread"][0] <= report["final_loss_spread"][1] and "final_within_spread" in report
    assert plan.fidelity_problems(report) == []
    drifted = plan.JobSteps("j2", start=4, world=3, losses=[0.51], logged=1)
    wrong = plan.fidelity([plan.JobSteps("j1", world=3, losses=[0.9, 0.81], logged=2), drifted], [baseline], 3,
                          final=0.5)
    assert plan.fidelity_problems(wrong) == [
        "the first job's loss differs from the undisturbed run's from step 2 (1 of 2 steps equal)",
        "job j2's first step 5 logged loss 0.51, the undisturbed run 0.5"]
    assert plan.fidelity([first], [], None, final=None) == {"baselines": 0}


def test_a_job_log_gives_its_world_size():
    job = plan.JobSteps("j1")
    job.read(["[0] 2026-11-27 17:18:40,101 rank 0 INFO training: world size 3 (intel-mpi), backend gloo (auto)"])
    assert job.world == 3
