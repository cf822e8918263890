"""`fab train --launcher torchrun` decided in cluster/ (pure), the rank wrapper run for real as a
child process here, and what the job's log tells `fab train` about a failed rank."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time

import pytest

from cluster.stack import catalog
from cluster.inventory import Inventory
from cluster.job.joblog import failure_report, first_failure
from cluster.job.logstream import assemble
from cluster.job.launch import ENV_FILE, RANK_WRAPPER, LaunchError, env_pairs
from cluster.job.layout import plan_layout
from cluster.job.request import RequestError
from cluster.job.torchrun import CPUS_VARIABLE, NODE_VARIABLE, plan_torchrun_launch
from tests.unit.test_jobplan import job_plan, job_request

JOB = "20261123-120000-abcd"
PATH = "/usr/bin:/bin:/usr/sbin:/sbin"


def inventory(n: int = 3) -> Inventory:
    return Inventory.from_mapping({"name": "lab", "user": "ubuntu", "instance_type": "r7iz.metal-16xl",
                                   "hosts": [f"192.0.2.{10 + i}" for i in range(n)]}, default_name="lab", kind="file")


def launch(**kw):
    layout = plan_layout(catalog.lookup("r7iz.metal-16xl"), backend="gloo")
    return plan_torchrun_launch(job_id=JOB, hosts=["node0", "node1"], addresses=["10.0.0.10", "10.0.0.11"],
                                layout=layout, program=["/v/bin/python", "-m", "training"], venv="/v", **kw)


def test_every_node_runs_torchrun_with_its_own_address_and_the_masters_rendezvous():
    plan = launch(extra_env={"HF_TOKEN": "x'y $(touch pwned)"})
    assert list(plan.node_commands) == ["node0", "node1"]
    for node, address in (("node0", "10.0.0.10"), ("node1", "10.0.0.11")):
        words = shlex.split(plan.node_commands[node])
        assert words[:4] == ["cd", "&&", "echo", "$$"]  # the agent's pid, for fab stop
        argv = words[words.index("/v/bin/torchrun"):]
        assert argv[argv.index("--local-addr") + 1] == address
        assert argv[argv.index("--rdzv-endpoint") + 1] == f"10.0.0.10:{plan.master_port}"
        assert argv[argv.index("--rdzv-id") + 1] == JOB and argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--no-python") + 1:][:4] == ["sh", "-c", RANK_WRAPPER, "xeon-rank"]
        assigned = dict(w.split("=", 1) for w in words[words.index("env") + 1:words.index("/v/bin/torchrun")])
        assert assigned[NODE_VARIABLE] == node and "HF_TOKEN" not in assigned  # from the env file on stdin
        assert words[words.index("env") - 4:words.index("env") - 1] == [".", "/dev/stdin", "&&"]
        assert assigned["XEON_CLUSTER_JOB"] == JOB and not any(k.startswith("I_MPI_") for k in assigned)
    # pinned (bare metal): each local rank's cores reach the wrapper, threads packed inside them
    assert plan.rank_env[CPUS_VARIABLE] == " ".join([",".join(map(str, range(16))), ",".join(map(str, range(16, 32)))])
    assert "KMP_AFFINITY" in plan.rank_env


def test_the_torchrun_job_script_passes_shellcheck_and_keeps_values_literal(tmp_path):
    script = launch(extra_env={"HF_TOKEN": "x'y $(touch pwned)"}).script()
    assert script.startswith("#!/bin/bash\n")
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    if shutil.which("shellcheck"):
        result = subprocess.run(["shellcheck", "--severity=style", "-"], input=script, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout


def run_one_node_job(tmp_path, torchrun_body: str, program: list[str], **plan_args):
    """The torchrun job script run for real on a one-node plan of `program`, with a stand-in torchrun (a sh
    script of `torchrun_body`) in a fake venv: (the plan, the job's directory, the finished script)."""
    home, venv = tmp_path / "home", tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = venv / "bin" / "torchrun"
    fake.write_text(f"#!/bin/sh\n{torchrun_body}\n")
    fake.chmod(0o755)
    layout = plan_layout(catalog.custom("test", 1, 2), backend="gloo")
    plan = plan_torchrun_launch(job_id=JOB, hosts=["node0"], addresses=["127.0.0.1"], layout=layout,
                                program=program, venv=str(venv), **plan_args)
    d = home / plan.job_dir
    d.mkdir(parents=True)
    (d / "run.sh").write_text(plan.script())
    (d / ENV_FILE).write_text(plan.env_file())
    done = subprocess.run(["bash", str(d / "run.sh")], env={"HOME": str(home), "PATH": PATH}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    return plan, d, done


def test_the_torchrun_job_script_gives_torchrun_the_env_files_values_and_no_command_line_holds_them(tmp_path):
    """The job script run for real on a one-node plan, a fake torchrun in a fake venv: the --env value
    reaches torchrun's environment (from the job's env file, on the node command's stdin) and is in
    neither torchrun's argv, the node command, nor run.sh."""
    secret = "hf_" + "Zq9" * 12 + " $(touch pwned)"
    # the stand-in torchrun records its argv and its environment, NUL-separated
    records = 'printf "%s\\0" "$@" > "$HOME/torchrun.args"\nenv -0 > "$HOME/torchrun.env"'
    plan, d, done = run_one_node_job(tmp_path, records, ["python3", "x.py"], extra_env={"HF_TOKEN": secret})
    home = tmp_path / "home"
    assert (d / "exit_code").read_text() == "0\n", (d / "log").read_text() + done.stderr
    env = dict(item.split("=", 1) for item in (home / "torchrun.env").read_text().split("\0") if item)
    assert env["HF_TOKEN"] == secret and env[NODE_VARIABLE] == "node0"
    assert not list(tmp_path.rglob("pwned*"))
    assert secret not in (home / "torchrun.args").read_text()
    assert secret not in plan.node_commands["node0"] and secret not in plan.script()


def test_elastic_runs_of_the_builtin_job_always_resume_and_mpirun_refuses_elastic_options():
    elastic = job_plan(inventory(), 3, max_steps=5, launcher="torchrun", min_nodes=2)
    assert elastic.launch.torchrun.nnodes == "2:3" and "--resume" in elastic.launch.program
    assert elastic.metadata()["launcher"] == "torchrun"
    fixed = job_plan(inventory(), 3, max_steps=5, launcher="torchrun")
    assert "--resume" not in fixed.launch.program and "--max-restarts" not in fixed.launch.argv
    with pytest.raises(RequestError, match="--min-nodes: only with --launcher torchrun"):
        job_request(3, min_nodes=2)
    with pytest.raises(RequestError, match="--launcher: 'srun' is not allowed; choose mpirun or torchrun"):
        job_request(3, launcher="srun")
    with pytest.raises(LaunchError, match="--env: XEON_CLUSTER_CPUS is set by the launch itself"):
        job_plan(inventory(), 3, launcher="torchrun", env={CPUS_VARIABLE: "0"})


def test_env_pairs_is_one_parser_for_every_task():
    assert env_pairs("A=1 'B=two words' C=") == {"A": "1", "B": "two words", "C": ""}
    with pytest.raises(LaunchError, match="--env: 'NOPE' is not KEY=VALUE"):
        env_pairs("A=1 NOPE")
    with pytest.raises(LaunchError, match="--env: cannot split"):
        env_pairs("A='open")


def test_grad_comm_and_bucket_size_reach_the_job_checked():
    from cluster.job.request import BuiltinJob

    args = job_plan(inventory(), 2, grad_comm="bf16", ddp_bucket_mb=12.5).training_args
    assert args[args.index("--grad_comm"):args.index("--grad_comm") + 4] == ("--grad_comm", "bf16",
                                                                            "--ddp_bucket_mb", "12.5")
    assert "--grad_comm" not in job_plan(inventory(), 2).training_args
    for option, value in (("grad_comm", "fp16"), ("ddp_bucket_mb", 0), ("ddp_bucket_mb", -3),
                          ("ddp_bucket_mb", float("inf")), ("ddp_bucket_mb", "lots")):
        with pytest.raises(RequestError, match=f"--{option.replace('_', '-')}: {value!r} is not allowed"):
            BuiltinJob(**{option: value})


def wrapper(tmp_path, program: list[str], **env) -> subprocess.Popen:
    base = {"HOME": str(tmp_path), "PATH": PATH, "XEON_CLUSTER_JOB": "j", "MASTER_ADDR": "127.0.0.1",
            "GLOO_SOCKET_IFNAME": "lo"}
    return subprocess.Popen(["sh", "-c", RANK_WRAPPER, "xeon-rank", *program], env={**base, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_the_wrapper_names_a_failed_rank_and_exits_with_its_code(tmp_path):
    proc = wrapper(tmp_path, ["sh", "-c", "echo working; exit 7"], PMI_RANK="1")
    out = proc.communicate(timeout=30)[0]
    assert proc.returncode == 7, out
    pid = (tmp_path / ".xeon-cluster/jobs/j/ranks/rank-1").read_text().split()[0]
    line = f"[xeon-cluster] rank 1 on host {os.uname().nodename} (pid {pid}): exited with code 7"
    assert out.splitlines() == ["working", line]
    assert failure_report(f"[0] fine\n[1] {line}\n", ["node0", "node1"], 255) == [
        f"rank 1 on node node1 (host {os.uname().nodename}, pid {pid}): exit code 7"]
    ok = wrapper(tmp_path, ["true"], PMI_RANK="0")
    assert ok.communicate(timeout=30)[0] == "" and ok.returncode == 0


def test_under_torchrun_the_wrapper_labels_lines_and_forwards_signals_to_the_program(tmp_path):
    # The handler writes with os.write: the signal may arrive while print('ready') is still inside
    # stdout's buffered writer, and a print from the handler would then fail as a reentrant call.
    program = ["python3", "-c", "import os, signal, sys, time\n"
               "signal.signal(signal.SIGUSR1, lambda *a: os.write(1, b'got USR1\\n'))\n"
               "print('ready', flush=True)\n"
               "time.sleep(60)"]
    proc = wrapper(tmp_path, program, RANK="4", WORLD_SIZE="6", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2",
                   GROUP_RANK="2", TORCHELASTIC_RUN_ID="x", **{NODE_VARIABLE: "node2"})
    assert proc.stdout.readline() == "[node2 r4] ready\n"
    os.kill(proc.pid, signal.SIGUSR1)  # to the wrapper: it passes the signal on
    assert proc.stdout.readline() == "[node2 r4] got USR1\n"
    time.sleep(0.2)
    os.kill(proc.pid, signal.SIGTERM)
    rest = proc.communicate(timeout=30)[0]
    assert proc.returncode == 128 + signal.SIGTERM, rest
    assert rest.startswith("[node2 r4] [xeon-cluster] rank 4 on node node2 (pid ") and \
        rest.rstrip().endswith("killed by signal 15"), rest
    (failure,) = [first_failure(rest, [])]
    assert (failure.rank, failure.node, failure.signal, failure.code) == (4, "node2", 15, 143)
    out = assemble("[node2 r4] hello\n[node2 torchrun] agent\nplain\n", [], "torchrun", notes=False)
    assert [line.split("] ", 1)[0].split() for line in out] == [["[node2", "r4"], ["[node2", "torchrun"],
                                                                 ["[torchrun"]]


@pytest.mark.skipif(not shutil.which("taskset"), reason="needs taskset (util-linux)")
def test_with_pinning_each_local_rank_runs_on_its_own_cores(tmp_path):
    proc = wrapper(tmp_path, ["sh", "-c", "grep Cpus_allowed_list /proc/self/status"], RANK="1", LOCAL_RANK="1",
                   LOCAL_WORLD_SIZE="2", **{CPUS_VARIABLE: "0 0", NODE_VARIABLE: "n"})
    out = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0 and out.split() == ["[n", "r1]", "Cpus_allowed_list:", "0"], out


@pytest.mark.parametrize("rank_0, expected", [
    ("exit 75", 75),  # rank 0 checkpointed at a spot notice and ended INTERRUPTED
    ('echo 75 > "$XEON_CLUSTER_RANK_DIR/{prefix}0"; kill -9 $$', 75),  # its recorded outcome, then killed
    ("exit 3", 1),  # a failure of the program's own: torchrun's code stays the job's
])
def test_a_torchrun_job_whose_rank_0_ended_interrupted_ends_interrupted_whatever_torchrun_returned(
        tmp_path, rank_0, expected):
    """The torchrun job script run for real on a one-node plan, a stand-in torchrun that runs rank 0 under the real
    rank wrapper and then returns 1 (what torchrun returns for any failed worker): the job's exit_code is rank 0's
    75 (`fab jobs`: interrupted) and the launcher's 1 kept beside it; any other failure keeps torchrun's code."""
    from cluster.exit_codes import INTERRUPTED
    from xeon_cluster.run import OUTCOME_RECORD_PREFIX

    assert INTERRUPTED == 75
    _, d, done = run_one_node_job(tmp_path, 'while [ "$1" != --no-python ]; do shift; done; shift\nRANK=0 "$@"\nexit 1',
                                  ["sh", "-c", rank_0.format(prefix=OUTCOME_RECORD_PREFIX)])
    log = (d / "log").read_text()
    assert done.returncode == expected, log + done.stderr
    assert (d / "exit_code").read_text() == f"{expected}\n", log
    assert (d / "launcher_exit_code").exists() == (expected == INTERRUPTED), log
    if expected == INTERRUPTED:
        assert (d / "launcher_exit_code").read_text() == "1\n"
        assert "rank 0 ended with code 75 (interrupted); the launcher returned 1" in log
