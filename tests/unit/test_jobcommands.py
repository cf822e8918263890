"""One job start for fab (node_setup/ssh/job.py, Fabric) and the run supervisor (plain ssh): the files
and the start command are cluster/job/jobcommands.py's, and both put the same ones on the master."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
from types import SimpleNamespace

from cluster.job import jobcommands
from cluster.inventory import Inventory
from cluster.job.jobplan import plan_job
from cluster.job.launch import job_dir


def _plan():
    inventory = Inventory.from_mapping({"name": "lab", "sockets": 1, "physical_cores": 4,
                                        "hosts": [{"name": f"node{i}", "address": f"10.0.0.{i + 2}"}
                                                  for i in range(2)]}, default_name="lab")
    return plan_job(inventory, nodes=2, training_args=["--max_steps", "3"], job_id="20261126-101500-ab12",
                    output_dir="runs/r1")


class MasterDouble:
    """Fabric's connection to the master, as node_setup/ssh/job.py uses it: files put and commands run."""

    def __init__(self):
        self.files: dict[str, str] = {}
        self.commands: list[str] = []

    def put(self, data: io.StringIO, remote: str) -> None:
        self.files[remote] = data.getvalue()

    def run(self, command: str, **_) -> SimpleNamespace:
        self.commands.append(command)
        return SimpleNamespace(ok=True, stdout="4242\n", stderr="")


def test_fab_and_the_supervisor_write_the_same_files_and_run_the_same_start(tmp_path, monkeypatch):
    from node_setup.ssh import job as fab_job
    from node_setup.supervisor.onmaster import Job, Nodes

    plan = _plan()
    master = MasterDouble()
    assert fab_job.start(master, plan) == 4242
    d = job_dir(plan.job_id)
    assert master.commands == [jobcommands.start_command(plan)]
    assert master.files == {f"{d}/{name}": text for name, text in jobcommands.job_files(plan).items()}

    monkeypatch.setenv("HOME", str(tmp_path))
    run = []

    class Shell:
        master = "node0"

        def run(self, node, command, timeout=120):
            run.append(command)
            if command.startswith("( mkdir -p "):
                return subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True)
            return subprocess.CompletedProcess([], 0, "4242\n", "")

    spec = {"run_id": "20261126-101500-cd34", "output_dir": "runs/r1", "training_args": ["--max_steps", "3"],
            "layout": {}, "inventory": plan.inventory.to_mapping()}
    job = Job(spec, Shell(), Nodes(Shell(), plan.inventory, "/venv/bin/python"), tmp_path)
    monkeypatch.setattr(Nodes, "known_keys", lambda self: {})
    monkeypatch.setattr(Nodes, "write_hosts", lambda self, nodes, keys: None)
    from cluster.run.supervision import Member

    job_id = job.launch([Member(n.name, n.address, None) for n in plan.inventory.nodes], resume=False, batch=None)
    theirs = job.plans[job_id]
    assert run[-1] == jobcommands.start_command(theirs)
    written = {name: (tmp_path / job_dir(job_id) / name).read_text() for name in ("hosts", "run.sh", "job.json")}
    assert written == jobcommands.job_files(theirs, supervised_run=spec["run_id"])
    assert json.loads(written["job.json"])["supervised_run"] == spec["run_id"]


def test_the_start_command_sets_the_link_starts_the_script_detached_and_prints_its_pid(tmp_path):
    plan = _plan()
    d = tmp_path / job_dir(plan.job_id)
    d.mkdir(parents=True)
    (d / "run.sh").write_text('echo "$$" > "$HOME/%s/pid"\nsleep 30\n' % job_dir(plan.job_id))  # a job script's pid
    result = subprocess.run(["sh", "-c", jobcommands.start_command(plan)], env={"HOME": str(tmp_path),
                            "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=30)
    pid = result.stdout.strip()
    try:
        assert result.returncode == 0 and pid.isdigit(), result
        assert (tmp_path / jobcommands.CURRENT).resolve() == d.resolve()
        assert subprocess.run(["ps", "-o", "sid=", "-p", pid], capture_output=True, text=True).stdout.strip() == pid
    finally:
        if pid.isdigit():
            os.killpg(int(pid), signal.SIGTERM)  # the script's own session and group: it and its sleep
