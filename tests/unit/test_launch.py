"""The mpirun command and environment for every catalog instance type and every MPI flavour."""

import os
import shlex
import socket
import subprocess
import sys

import pytest

from cluster.stack import catalog
from cluster.job.launch import (ENV_FILE, FLAVOURS, HYDRA_IFACE_SETUP, JOB_MARKER, RANK_WRAPPER,
                                LaunchError, hostfile_text, master_port_for, plan_launch)
from cluster.job.layout import plan_layout
from tests.fab_run import ROOT
from xeon_cluster.run import OUTCOME_RECORD_PREFIX

TYPES = [catalog.CATALOG[name] for name in catalog.known_types()]
VENV = "/opt/xeon-cluster/venv-stock"
PROGRAM = [f"{VENV}/bin/python", "-m", "training", "--bf16"]
HOSTS = ["node0", "node1", "node2", "node3"]


def _plan(machine, flavour, hosts=HOSTS, **kw):
    backend = "ccl" if flavour == "intel-mpi-oneccl" else "gloo"
    layout = plan_layout(machine, backend=backend)
    return plan_launch(flavour=flavour, job_id="20260101-000000-abcd", hosts=hosts, master_addr="10.0.0.10",
                       layout=layout, program=PROGRAM, venv=VENV, **kw)


def _genv(argv):
    out = {}
    for i, arg in enumerate(argv):
        if arg == "-genv":
            out[argv[i + 1]] = argv[i + 2]
        if arg == "-x" and "=" in argv[i + 1]:
            key, _, value = argv[i + 1].partition("=")
            out[key] = value
    return out


@pytest.mark.parametrize("machine", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_command_for_every_type_and_flavour(machine, flavour):
    plan = _plan(machine, flavour)
    argv = list(plan.argv)
    assert argv[0] == "mpirun"
    assert plan.world_size == 4 * machine.sockets
    # the program runs last, through the rank wrapper, with its arguments untouched
    assert argv[-len(PROGRAM):] == PROGRAM
    assert argv[-len(PROGRAM) - 4:-len(PROGRAM)] == ["sh", "-c", RANK_WRAPPER, "xeon-rank"]
    env = _genv(argv)
    assert env["OMP_NUM_THREADS"] == str(plan.layout.threads_per_rank)
    assert int(env["OMP_NUM_THREADS"]) * plan.layout.ranks_per_node <= machine.physical_cores
    assert env["LD_PRELOAD"].endswith("libtcmalloc.so.4")
    assert plan.env["MASTER_ADDR"] == "10.0.0.10"
    assert plan.env[JOB_MARKER] == plan.job_id
    if flavour == "openmpi":
        assert argv[argv.index("-np") + 1] == str(plan.world_size)
        assert argv[argv.index("--map-by") + 1] == f"ppr:{machine.sockets}:node"
        assert argv[argv.index("--mca") + 1:argv.index("--mca") + 3] == ["mpi_yield_when_idle", "1"]
        for key in ("MASTER_ADDR", "MASTER_PORT", "PATH", JOB_MARKER):  # forwarded by name
            assert argv[argv.index(key) - 1] == "-x"
        assert plan.hostfile.splitlines()[0] == f"node0 slots={machine.sockets}"
    else:
        assert argv[argv.index("-n") + 1] == str(plan.world_size)
        assert argv[argv.index("-ppn") + 1] == str(machine.sockets)
        assert "-prepend-rank" in argv
        assert plan.hostfile.splitlines() == HOSTS
    if flavour == "intel-mpi":
        assert plan.env["I_MPI_ROOT"] == VENV
        assert plan.env["PATH"].startswith(f"{VENV}/bin:")
        assert plan.env["LD_LIBRARY_PATH"].startswith(f"{VENV}/lib")
        assert plan.env["FI_PROVIDER_PATH"] == f"{VENV}/lib"
        assert plan.setup == (HYDRA_IFACE_SETUP,)
    if flavour == "intel-mpi-oneccl":
        assert any("env/setvars.sh" in line for line in plan.setup)
        assert env["CCL_WORKER_COUNT"] == str(plan.layout.ccl_workers)
        assert env["CCL_ATL_TRANSPORT"] == "ofi"
        assert len(env["CCL_WORKER_AFFINITY"].split(",")) == plan.layout.ccl_workers * machine.sockets
    # big machines busy-poll; only small ones sleep
    assert "I_MPI_WAIT_MODE" not in env


def test_rank_to_node_map_is_block_order():
    plan = _plan(catalog.lookup("r7iz.metal-16xl"), "intel-mpi", hosts=["a", "b"])
    assert plan.rank_hosts == ("a", "a", "b", "b")


def test_small_nodes_wait_instead_of_polling():
    layout = plan_layout(catalog.custom("local", 1, 2), backend="gloo", pin=False)
    plan = plan_launch(flavour="intel-mpi", job_id="j", hosts=["n0", "n1", "n2"], master_addr="10.9.0.2",
                       layout=layout, program=["python"], venv=VENV)
    assert _genv(plan.argv)["I_MPI_WAIT_MODE"] == "1"
    assert plan.world_size == 3


def test_master_port_differs_per_job_and_stays_in_range():
    ports = {master_port_for(f"job-{i}") for i in range(200)}
    assert len(ports) > 150
    assert all(29500 <= p < 31500 for p in ports)
    assert master_port_for("same") == master_port_for("same")
    plan = _plan(catalog.lookup("c6i.16xlarge"), "intel-mpi", master_port=40000)
    assert plan.env["MASTER_PORT"] == "40000"


def test_extra_env_overrides_layout_and_bad_names_are_refused():
    plan = _plan(catalog.lookup("c6i.16xlarge"), "intel-mpi", extra_env={"OMP_NUM_THREADS": "4", "FI_PROVIDER": "tcp"})
    env = _genv(plan.argv)  # the user's values come from the job's env file, by name: none is on the command line
    assert "OMP_NUM_THREADS" not in env and "FI_PROVIDER" not in env
    assert "-genvall" in plan.argv  # mpirun's environment, where the job script put them, goes to every rank
    assert plan.user_env == {"OMP_NUM_THREADS": "4", "FI_PROVIDER": "tcp"}
    with pytest.raises(LaunchError, match="not a valid variable name"):
        _plan(catalog.lookup("c6i.16xlarge"), "intel-mpi", extra_env={"A-B": "1"})


def test_errors_name_setting_and_allowed_values():
    machine = catalog.lookup("c6i.16xlarge")
    with pytest.raises(LaunchError, match="allowed: intel-mpi, intel-mpi-oneccl, openmpi"):
        _plan(machine, "mpich")
    with pytest.raises(LaunchError, match="repeat"):
        _plan(machine, "intel-mpi", hosts=["a", "a"])
    with pytest.raises(LaunchError, match="MASTER_PORT"):
        _plan(machine, "intel-mpi", master_port=80)


def test_openmpi_as_root_needs_the_flag():
    plan = _plan(catalog.lookup("c6i.16xlarge"), "openmpi", run_as_root=True)
    assert "--allow-run-as-root" in plan.argv


def test_hostfile_text():
    assert hostfile_text(["m", "w"], "intel-mpi", 2) == "m\nw\n"
    assert hostfile_text(["m", "w"], "openmpi", 2) == "m slots=2\nw slots=2\n"


FAKE_MPIRUN = """#!/bin/sh
for a in "$@"; do printf '%s\\0' "$a"; done > "$HOME/mpirun.args"
env -0 > "$HOME/mpirun.env"
exit 7
"""


def run_job_script(tmp_path, flavour, *, job_id="20260101-000000-abcd", master_addr="127.0.0.1", extra_env=None,
                   node_env=None, mpirun=FAKE_MPIRUN):
    """Run the job script of a one-node plan with a fake `mpirun` (and python) in a fake venv.

    Returns (plan, completed process, mpirun's argv, mpirun's environment).
    """
    home, venv, ccl = tmp_path / "home", tmp_path / "venv", tmp_path / "ccl"
    (venv / "bin").mkdir(parents=True)
    (ccl / "env").mkdir(parents=True)
    (venv / "bin" / "mpirun").write_text(mpirun)
    # what the oneCCL setup runs: the venv's python finds the bindings, their setvars.sh is sourced
    (venv / "bin" / "python").write_text(f"#!/bin/sh\necho {shlex.quote(str(ccl))}\n")
    (ccl / "env" / "setvars.sh").write_text('echo "$#" > "$HOME/setvars.args"; export CCL_FROM_SETVARS=1\n')
    for tool in ("mpirun", "python"):
        (venv / "bin" / tool).chmod(0o755)
    layout = plan_layout(catalog.custom("test", 1, 2), backend="ccl" if flavour == "intel-mpi-oneccl" else "gloo")
    plan = plan_launch(flavour=flavour, job_id=job_id, hosts=["node0"], master_addr=master_addr, layout=layout,
                       program=["python", "-m", "training"], venv=str(venv), extra_env=extra_env)
    (home / plan.job_dir).mkdir(parents=True)
    script = home / plan.job_dir / "run.sh"
    script.write_text(plan.script())
    (home / plan.job_dir / ENV_FILE).write_text(plan.env_file())
    env = {"HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", **(node_env or {})}
    done = subprocess.run(["sh", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30)
    args = (home / "mpirun.args").read_bytes().decode().split("\0")[:-1] if (home / "mpirun.args").exists() else None
    mpi_env = None
    if (home / "mpirun.env").exists():
        mpi_env = dict(item.split("=", 1) for item in (home / "mpirun.env").read_bytes().decode().split("\0") if item)
    return plan, done, args, mpi_env


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_job_script_runs_mpirun_and_records_pid_log_and_exit_code(tmp_path, flavour):
    plan, done, args, env = run_job_script(tmp_path, flavour)
    subprocess.run(["sh", "-n"], input=plan.script(), text=True, check=True)
    d = tmp_path / "home" / plan.job_dir
    assert done.returncode == 7, done.stdout + done.stderr
    assert (d / "exit_code").read_text() == "7\n" and (d / "pid").read_text().strip().isdigit()
    log = (d / "log").read_text()
    assert f"job {plan.job_id} started" in log and "1 ranks, 1 per node, MASTER_ADDR=127.0.0.1" in log
    assert f"job {plan.job_id} exited with code 7" in log
    assert args == list(plan.argv[1:])  # mpirun got the plan's argv, word for word
    venv = str(tmp_path / "venv")
    assert {k: env[k] for k in plan.exports} == plan.exports
    assert env["PATH"].startswith(plan.prepends["PATH"] + ":/usr/local/bin")
    if flavour == "intel-mpi":
        assert env["LD_LIBRARY_PATH"] == f"{venv}/lib"  # no empty entry when the node had none
        assert env["I_MPI_ROOT"] == venv
    if flavour == "openmpi":
        assert "I_MPI_HYDRA_IFACE" not in env
    else:
        assert env["I_MPI_HYDRA_IFACE"] == "lo"  # the interface holding MASTER_ADDR
    if flavour == "intel-mpi-oneccl":
        assert env["CCL_FROM_SETVARS"] == "1"
        assert (tmp_path / "home" / "setvars.args").read_text() == "0\n"  # not mpirun's argv
    # the readable line hides the wrapper but keeps everything else
    assert "<rank-wrapper>" in plan.command_line() and RANK_WRAPPER not in plan.command_line()


def test_job_script_extends_the_nodes_own_path_and_library_path(tmp_path):
    plan, done, _, env = run_job_script(tmp_path, "intel-mpi", node_env={"LD_LIBRARY_PATH": "/node/lib"})
    venv = tmp_path / "venv"
    assert env["LD_LIBRARY_PATH"] == f"{venv}/lib:/node/lib"
    assert env["PATH"] == f"{venv}/bin:{venv}/bin/libfabric:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
    assert plan.env["PATH"] == f"{venv}/bin:{venv}/bin/libfabric:$PATH"  # as `fab train --dry-run` shows it


def test_values_reach_the_job_script_literally_and_nothing_runs(tmp_path):
    """MASTER_ADDR, the job id and `--env` values are data: `$(...)` and backticks do not run."""
    evil = {"EVIL": "$(touch pwned-env)", "TICKS": "`touch pwned-ticks`", "QUOTES": "it's \"$HOME\" ${PATH}"}
    for flavour in FLAVOURS:
        root = tmp_path / flavour
        root.mkdir()
        plan, done, args, env = run_job_script(root, flavour, job_id="j$(touch pwned-job)`touch pwned-job2`",
                                               master_addr="10.0.0.1$(touch pwned-addr)", extra_env=evil)
        assert not list(tmp_path.rglob("pwned*")), f"{flavour}: a value ran as a command"
        assert done.returncode == 7, done.stdout + done.stderr
        assert env["MASTER_ADDR"] == "10.0.0.1$(touch pwned-addr)"
        assert env["XEON_CLUSTER_JOB"] == "j$(touch pwned-job)`touch pwned-job2`"
        assert args == list(plan.argv[1:])
        for key, value in evil.items():  # in mpirun's environment, passed on by name; no value in argv or run.sh
            assert env[key] == value
            assert (["-x", key] if flavour == "openmpi" else ["-genvall", "sh"]) in [
                args[i:i + 2] for i in range(len(args))]
            assert value not in " ".join(args) and value not in plan.script()
        for text in (plan.script(), RANK_WRAPPER):
            assert subprocess.run(["sh", "-n"], input=text, text=True).returncode == 0


def test_rank_wrapper_records_pid_and_runs_program(tmp_path):
    env = {"HOME": str(tmp_path), "XEON_CLUSTER_JOB": "j9", "PMI_RANK": "5", "MASTER_ADDR": "127.0.0.1",
           "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}
    record_file = tmp_path / ".xeon-cluster/jobs/j9/ranks/rank-5"
    # the program lives until its record is written, so that the record holds its process group
    program = ["sh", "-c", 'while [ ! -s "$0" ]; do sleep 0.05; done; echo "$$ $GLOO_SOCKET_IFNAME"', str(record_file)]
    out = subprocess.run(["sh", "-c", RANK_WRAPPER, "xeon-rank", *program],
                         env=env, capture_output=True, text=True, check=True, timeout=30)
    pid, iface = out.stdout.split()
    assert record_file.read_text().split() == [pid, str(os.getpgrp()), socket.gethostname()]
    assert iface == "lo"  # the interface holding MASTER_ADDR


def test_a_job_whose_rank_0_ended_interrupted_ends_interrupted_whatever_mpirun_returned(tmp_path):
    """Rank 0 checkpointed at a spot notice and ended 75 (cluster/exit_codes.py INTERRUPTED); mpirun then
    returned 255 (a reclaimed node gone): the job's exit_code is 75, what `fab jobs` shows as interrupted, and
    the launcher's 255 is kept beside it. A failure that is not rank 0's interruption keeps mpirun's code."""
    from cluster.exit_codes import INTERRUPTED

    for rank_0, expected in ((f"exit {INTERRUPTED}", INTERRUPTED), ("exit 1", 255)):
        # a stand-in mpirun: rank 0 under the real rank wrapper, then the launcher's own code
        mpirun = (f"#!/bin/sh\nPMI_RANK=0 sh -c {shlex.quote(RANK_WRAPPER)} xeon-rank sh -c {shlex.quote(rank_0)}\n"
                  "exit 255\n")
        plan, done, _, _ = run_job_script(tmp_path / str(expected), "openmpi", mpirun=mpirun)
        d = tmp_path / str(expected) / "home" / plan.job_dir
        assert done.returncode == expected, done.stdout + done.stderr
        assert (d / "exit_code").read_text() == f"{expected}\n"
        assert (d / "ranks" / "exit-0").read_text() == rank_0.split()[1] + "\n"
        assert (d / "launcher_exit_code").exists() == (expected == INTERRUPTED)
        if expected == INTERRUPTED:
            assert (d / "launcher_exit_code").read_text() == "255\n"
            assert "rank 0 ended with code 75 (interrupted); the launcher returned 255" in (d / "log").read_text()


def test_a_rank_0_killed_during_its_exit_after_recording_its_interruption_ends_the_job_interrupted(tmp_path):
    """As seen on a local cluster: rank 0 logged its spot-notice stop with checkpoint saved, the other node's rank
    ended first, and mpirun killed rank 0 during its exit and returned 255 (no exit 75 of rank 0's). The outcome
    the built-in job records before its exit (xeon_cluster/run.py record_outcome, the real one here) is the
    job's: exit_code 75, the launcher's 255 beside it."""
    from cluster.exit_codes import INTERRUPTED

    program = (f"from xeon_cluster.run import record_outcome; record_outcome({INTERRUPTED}); "
               "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    rank_0 = f"PYTHONPATH={shlex.quote(str(ROOT))} {shlex.quote(sys.executable)} -c {shlex.quote(program)}"
    mpirun = (f"#!/bin/sh\nPMI_RANK=0 sh -c {shlex.quote(RANK_WRAPPER)} xeon-rank sh -c {shlex.quote(rank_0)}\n"
              "exit 255\n")
    plan, done, _, _ = run_job_script(tmp_path, "openmpi", mpirun=mpirun)
    d = tmp_path / "home" / plan.job_dir
    assert done.returncode == INTERRUPTED, done.stdout + done.stderr
    assert (d / "ranks" / "exit-0").read_text() == "137\n"  # killed: the wrapper saw no 75
    assert (d / "ranks" / f"{OUTCOME_RECORD_PREFIX}0").read_text() == f"{INTERRUPTED}\n"
    assert (d / "exit_code").read_text() == f"{INTERRUPTED}\n" and (d / "launcher_exit_code").read_text() == "255\n"


def test_rank_wrapper_records_a_program_that_ended_at_once_with_its_host_in_place(tmp_path):
    """The record's fields keep their places when the program is gone (reaped) before its group was read."""
    env = {"HOME": str(tmp_path), "XEON_CLUSTER_JOB": "j9", "PMI_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}
    for _ in range(20):  # each run may read the group before or after the program is reaped
        subprocess.run(["sh", "-c", RANK_WRAPPER, "xeon-rank", "true"], env=env, check=True, timeout=30)
        pid, pgid, host = (tmp_path / ".xeon-cluster/jobs/j9/ranks/rank-0").read_text().split()
        assert pid.isdigit() and pgid in (str(os.getpgrp()), "-") and host == socket.gethostname()


def test_rank_wrapper_treats_master_addr_as_data(tmp_path):
    env = {"HOME": str(tmp_path), "XEON_CLUSTER_JOB": "j$(touch pwned-job)", "PMI_RANK": "0",
           "MASTER_ADDR": "10.0.0.1$(touch pwned-addr)`touch pwned-ticks`", "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}
    out = subprocess.run(["sh", "-c", RANK_WRAPPER, "xeon-rank", "true"], env=env, cwd=tmp_path,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / ".xeon-cluster/jobs/j$(touch pwned-job)/ranks/rank-0").exists()
    assert not list(tmp_path.rglob("pwned*"))
