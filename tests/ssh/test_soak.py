"""The soak in short (bench/soak.py, docs/benchmarks.md): three faults on one detached `fab train --managed`
run on the session's cluster, observed only through `fab status --json` and the run's files, with no fab
process left after the hand-off:

- the checkpoint store answers 503 SlowDown and 500 InternalError to every request (held until an upload
  met it): the upload waits and retries, nothing half-written is left in the bucket;
- the master's output filesystem (a tmpfs in its own mount namespace) is full (held until a checkpoint met
  it): that checkpoint is not saved (no manifest, never resumed from), the job trains on;
- the supervisor's process is killed (SIGKILL): its respawner starts it again, it carries on from its state
  file with the same job.

The run completes its steps, no fault costs more than one checkpoint interval of steps, and nothing is left:
no process or mount of the run, no checkpoint object the run no longer needs. Its fidelity against one
undisturbed run of the same settings (the soak's baseline): no fault changed the job, so every one of its
logged losses equals the baseline's at the same step.

Budget: one supervised run of 320 steps of the demo (a batch of 4 a rank) with three short faults, then its
baseline (about a minute and a half).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.ssh.conftest import REPO_ROOT

pytestmark = [pytest.mark.ssh, pytest.mark.mpi, pytest.mark.slow]

KINDS = ("store-errors", "disk-full", "supervisor-kill")
STEPS, INTERVAL = 320, 20


def test_a_short_soak_completes_through_three_kinds_of_fault(installed_cluster, tmp_path):
    report_path = tmp_path / "soak.json"
    done = subprocess.run([sys.executable, "bench/soak.py", "--cluster", installed_cluster.name, "--nodes", "3",
                           "--kinds", ",".join(KINDS), "--faults", "3", "--steps", str(STEPS), "--checkpoint-steps",
                           str(INTERVAL), "--batch-size", "4", "--examples", "1000", "--hold", "3", "--settle", "5",
                           "--baselines", "1", "--json", str(report_path)],
                          cwd=REPO_ROOT, env=installed_cluster.env(), capture_output=True, text=True, timeout=900)
    print(done.stdout[-6000:], done.stderr[-3000:])
    report = json.loads(report_path.read_text())
    assert done.returncode == 0 and report["problems"] == [], report["problems"]
    assert report["status"] == "completed" and report["steps"] == STEPS and report["jobs"] == 1
    assert "completed" in report["status_seen"] and report["last_status_poll"]["exit"] == 0
    faults = {f["kind"]: f for f in report["faults"]}
    assert sorted(faults) == sorted(KINDS) and all(f["fired_at_s"] is not None for f in faults.values())
    for fault in faults.values():
        assert fault["steps_redone"] == 0 and not fault["job_changed"], fault
        assert fault["training_again_s"] is not None, fault
    assert faults["disk-full"]["checkpoints_not_saved"], faults["disk-full"]
    kill = faults["supervisor-kill"]
    assert kill["supervisor"].startswith("restarted (pid "), kill
    assert any("was killed by SIGKILL" in line for line in kill["supervisor_lines"])
    assert any("carrying on from its state file: running" in line for line in kill["supervisor_lines"])
    assert report["checkpoint_objects_not_needed"] == 0 and len(report["checkpoint_objects"]["kept_checkpoints"]) == 2
    assert report["processes_left"] == report["mounts_left"] == report["files_left"] == []
    fidelity = report["fidelity"]
    assert fidelity["baselines"] == 1 and fidelity["after_recoveries"] == [], fidelity
    assert fidelity["first_job"] == {"steps": STEPS, "equal": STEPS, "first_difference": None}, fidelity
