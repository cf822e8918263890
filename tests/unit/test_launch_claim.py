"""The launch claim (cluster/shell/job-claim.sh, run by node_setup/job_lifecycle/steps.py's `claim`): of two
launches at once exactly one passes, whatever their timing, because the busy check and the claim are one
step under flock(1) on the master; a claim of a job that started, or an old one, does not hold; only a
job's own claim is released. The shell runs here for real, with HOME a temporary folder standing for the
master's home."""

from __future__ import annotations

import subprocess
import threading
import time
from types import SimpleNamespace

import pytest

from cluster.job import jobcommands as jc
from cluster.job.launch import JOBS_DIR
from node_setup.job_lifecycle.steps import BUSY, Lifecycle, LifecycleError
from node_setup.job_lifecycle.transport import Answer

A, B = "20261201-101500-aaaa", "20261201-101500-bbbb"


class HereTransport:
    """Test double of the job lifecycle's transport: every node is this machine, HOME `home`, each command run
    by sh (as Fabric's and the supervisor's transports run it on a node)."""

    master = "node0"

    def __init__(self, home):
        self.home = home

    def run(self, nodes, command, *, timeout=None):
        done = subprocess.run(["sh", "-c", command], cwd=self.home, env=env_for(self.home), capture_output=True,
                              text=True, timeout=timeout)
        return [Answer(node, done.returncode, done.stdout + done.stderr) for node in nodes]


def env_for(home) -> dict[str, str]:
    return {"HOME": str(home), "PATH": "/usr/bin:/bin"}


def claim(home, job: str, ttl: object = jc.CLAIM_TTL_S) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", jc.CLAIM_SH, "xeon-cluster", job, str(ttl)], env=env_for(home),
                          capture_output=True, text=True, timeout=120)


def launch_both(life: Lifecycle) -> dict[str, object]:
    """Jobs A and B claimed by `life` from two threads released at once: {job: "claimed" or its LifecycleError}."""
    gate, results = threading.Barrier(2), {}

    def launch(job):
        gate.wait()
        try:
            life.claim(SimpleNamespace(job_id=job))
            results[job] = "claimed"
        except LifecycleError as exc:
            results[job] = exc

    threads = [threading.Thread(target=launch, args=(job,)) for job in (A, B)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def test_of_two_launches_at_once_exactly_one_claims(tmp_path):
    """Many rounds of two lifecycles claiming at the same instant (a barrier): each round exactly one goes on
    and the other gets the one busy line naming the winner (on the code before the claim both went on)."""
    for round_ in range(8):
        home = tmp_path / str(round_)
        home.mkdir()
        results = launch_both(Lifecycle(HereTransport(home), say=lambda line: None))
        winners = [job for job, r in results.items() if r == "claimed"]
        assert len(results) == 2 and len(winners) == 1, results
        loser = results[B if winners == [A] else A]
        assert isinstance(loser, LifecycleError) and loser.reason == BUSY, loser
        assert str(loser).startswith(f"cannot launch: another fab train is launching job {winners[0]} on node0"), loser

def test_a_claim_holds_until_its_job_starts_or_expires_and_only_its_own_is_released(tmp_path):
    assert claim(tmp_path, A).returncode == 0
    held = claim(tmp_path, B)
    assert held.returncode == 4 and held.stdout == f"xeon-cluster busy: {A} launching\n", held
    assert subprocess.run(["sh", "-c", jc.release_command(B)], env=env_for(tmp_path),
                          capture_output=True).returncode == 0
    assert claim(tmp_path, B).returncode == 4  # B's release left A's claim
    assert claim(tmp_path, A).returncode == 0  # a job may claim again (the supervisor's relaunch)
    (tmp_path / JOBS_DIR / A).mkdir(parents=True)
    (tmp_path / JOBS_DIR / A / "pid").write_text("12345\n")  # A started: the busy check's, not the claim's
    assert claim(tmp_path, B).returncode == 0
    assert claim(tmp_path, A, ttl=0).returncode == 0  # B's claim is older than a TTL of 0 s: it expired
    subprocess.run(["sh", "-c", jc.release_command(A)], env=env_for(tmp_path),
                   check=True)
    assert not (tmp_path / JOBS_DIR / "launch-claim").exists()


@pytest.mark.parametrize("text", ["garbage", "", f"{A} notanumber"])
def test_a_claim_file_that_is_not_one_is_taken_over_only_when_it_is_old(tmp_path, text):
    (tmp_path / JOBS_DIR).mkdir(parents=True)
    (tmp_path / JOBS_DIR / "launch-claim").write_text(text + "\n")  # its time reads as 0: long expired
    started = time.time()
    assert claim(tmp_path, B).returncode == 0
    who, when = (tmp_path / JOBS_DIR / "launch-claim").read_text().split()
    assert who == B and int(when) >= int(started)
