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
from cluster.job.jobplan import plan
from cluster.job.request import BuiltinJob, RunRequest
from cluster.job.launch import ENV_FILE, job_dir
from node_setup.job_lifecycle.transport import Answer


def _plan():
    inventory = Inventory.from_mapping({"name": "lab", "sockets": 1, "physical_cores": 4,
                                        "hosts": [{"name": f"node{i}", "address": f"10.0.0.{i + 2}"}
                                                  for i in range(2)]}, default_name="lab")
    return plan(RunRequest("20261126-101500-ab12", 2, BuiltinJob(max_steps=3), output_dir="runs/r1"), inventory)


class MasterDouble:
    """Fabric's connection to the master, as the lifecycle's Fabric transport uses it: files put, commands run."""

    def __init__(self):
        self.files: dict[str, str] = {}
        self.commands: list[str] = []

    def put(self, data: io.BytesIO, remote: str) -> None:
        self.files[remote.removesuffix(".xc-new")] = data.getvalue().decode()

    def run(self, command: str, **_) -> SimpleNamespace:
        self.commands.append(command)
        return SimpleNamespace(ok=True, exited=0, stdout="4242\n" if "setsid nohup" in command else "", stderr="")


def test_fab_and_the_supervisor_start_a_job_of_one_request_with_the_same_files_and_command(tmp_path, monkeypatch):
    from node_setup.job_lifecycle.steps import Lifecycle
    from node_setup.ssh.transport import FabricTransport
    from node_setup.supervisor.onmaster import ShellTransport

    inventory = _plan().inventory
    token = "hf_" + "a1B2" * 9
    request = RunRequest("20261126-101500-ab12", 2, BuiltinJob(max_steps=3), output_dir="runs/r1",
                         env=(("HF_TOKEN", token),))
    job = plan(request, inventory)
    master = MasterDouble()
    fab = FabricTransport(inventory, {"node0": master, "node1": MasterDouble()})
    assert Lifecycle(fab, lambda line: None).start(job, request) == 4242
    d = job_dir(job.job_id)
    assert master.commands[-1] == jobcommands.start_command(job)
    assert _unstamped({p.rsplit("/", 1)[1]: t for p, t in master.files.items() if p.startswith(d)}) == \
        _unstamped(jobcommands.job_files(job))
    # the --env value only in the env file, made 0600 before its first byte; never in a command or another file
    env_file = f"{d}/{ENV_FILE}"
    assert token in master.files[env_file] and f"chmod 600 {env_file}.xc-new" in " ".join(master.commands)
    assert not [c for c in master.commands if token in c]
    assert not [p for p, t in master.files.items() if token in t and p != env_file]

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / d).mkdir(parents=True)
    ran = []

    class Shell(ShellTransport):  # test double: the master's commands recorded, the start answered with a pid
        def run_one(self, node, command, timeout=120, data=None):
            ran.append(command)
            return Answer(node, 0, "4242\n")

    assert Lifecycle(Shell("node0", request.run_id), lambda line: None).start(job, request) == 4242
    assert ran[-1] == jobcommands.start_command(job)
    written = {name: (tmp_path / d / name).read_text() for name in jobcommands.job_files(job)}
    assert _unstamped(written) == _unstamped(jobcommands.job_files(job))
    assert (tmp_path / d / ENV_FILE).stat().st_mode & 0o777 == 0o600 and token in written[ENV_FILE]
    assert (tmp_path / d / "run.sh").stat().st_mode & 0o777 == 0o644 and token not in written["run.sh"]
    assert not [c for c in ran if token in c]


def _unstamped(files: dict[str, str]) -> dict:
    """The job's files with job.json read and its start time left out (the second it was written)."""
    return {name: ({k: v for k, v in json.loads(text).items() if k != "started"} if name == "job.json" else text)
            for name, text in files.items()}


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
