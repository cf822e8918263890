"""tests/warm_python.py, the warm interpreter tests/training's ranks start from: a forked job gets the caller's
arguments, environment, working directory and output, its exit code and death by signal reach the caller, a
signal to the caller reaches the job, and a request with other import-time settings runs the real interpreter.
The server here skips the warm-up (`--cold`): what is checked is the hand-over, not the imports."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import warm_python

REPO = Path(__file__).resolve().parents[2]
PROGRAM = '''
import os, sys, time
print("pid", os.getpid(), "args", sys.argv[1:], "cwd", os.getcwd(), "flag", os.environ.get("FLAG"), flush=True)
if "--threads" in sys.argv:
    import torch
    print("threads", torch.get_num_threads(), flush=True)
if "--host" in sys.argv:
    import socket
    print("host", socket.gethostname())  # no flush: only `-u` gets it out before os._exit
    os._exit(0)
if "--wait" in sys.argv:
    time.sleep(60)
sys.exit(int(sys.argv[1]))
'''


def _server(tmp_path, warm_up: str):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "prog.py").write_text(PROGRAM)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'pkg'}:{REPO}"}
    env.pop(warm_python.SOCKET_ENV, None)
    env.pop("OMP_NUM_THREADS", None)
    path = str(tmp_path / "socket")
    proc = subprocess.Popen([sys.executable, "-m", "tests.warm_python", "--serve", path, warm_up], env=env,
                            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield {"env": {**env, warm_python.SOCKET_ENV: path}, "pid": proc.pid, "path": path}
    proc.stdin.close()
    proc.wait(timeout=10)


@pytest.fixture
def server(tmp_path):
    yield from _server(tmp_path, "--cold")


@pytest.fixture
def torch_server(tmp_path):
    yield from _server(tmp_path, "--torch")


def run(server, *args, env=None, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "tests.warm_python", "-m", "prog", *args],
                            env=env or server["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **kwargs)


def test_a_forked_job_gets_the_callers_arguments_environment_folder_and_exit_code(server, tmp_path):
    proc = run(server, "3", "a b", env={**server["env"], "FLAG": "on"}, cwd=tmp_path)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, err
    assert f"args ['3', 'a b'] cwd {tmp_path} flag on" in out, out
    assert int(out.split()[1]) != proc.pid  # not the caller: a fork of the server


def test_a_signal_reaches_the_job_and_its_death_the_caller(server):
    proc = run(server, "0", "--wait")
    pid = int(proc.stdout.readline().split()[1])
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGTERM
    assert not Path(f"/proc/{pid}").exists()  # its monitor reaped it before telling the caller


def test_a_killed_caller_takes_its_job_with_it(server):
    proc = run(server, "0", "--wait")
    pid = int(proc.stdout.readline().split()[1])
    proc.kill()
    proc.wait(timeout=10)
    deadline = time.time() + 10
    while Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]:
        assert time.time() < deadline, "the job outlived its killed caller"
        time.sleep(0.1)


def test_other_import_time_settings_run_the_real_interpreter(server):
    proc = run(server, "0", env={**server["env"], "KMP_AFFINITY": "compact"})
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and int(out.split()[1]) == proc.pid  # exec'd in place: the caller's own pid


def test_the_jobs_thread_count_is_its_own_omp_num_threads_though_torch_was_loaded_before(torch_server):
    for threads in ("1", "2"):
        proc = run(torch_server, "0", "--threads", env={**torch_server["env"], "OMP_NUM_THREADS": threads})
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert f"threads {threads}" in out and int(out.split()[1]) != proc.pid, out  # forked, not exec'd


def test_a_node_callers_namespaces_are_the_jobs_and_dash_u_keeps_its_output_unbuffered(server):
    """As the node hook hands a start over: the job takes the caller's hostname (its UTS namespace) and, under
    `-u`, writes what it prints at once."""
    hand_over = ("import sys; from tests import warm_python; "
                 f"warm_python._hand_over({server['path']!r}, ['-u', '-m', 'prog', '0', '--host'], ('uts',)); "
                 "print('not handed over')")
    done = subprocess.run(["unshare", "--uts", "sh", "-c", 'hostname xc-warm-test && exec "$@"', "sh",
                           sys.executable, "-c", hand_over], env=server["env"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("\nhost xc-warm-test\n") and "not handed over" not in done.stdout, done.stdout


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="a node's /root bind mount needs root")
def test_the_hook_in_a_node_venv_hands_a_training_start_over_and_leaves_others_alone(tmp_path):
    """The .pth hook install_node_hook puts into a venv, as a node's interpreter runs it: in a mount namespace whose
    /root is <data>/node0/root and <data> holds the marker, `python -m training.<module>` runs in the marker's
    server (a fork of it: its orig_argv), and `python -c` runs as itself, neither printing an error of site's."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    warm_python.install_node_hook(site)
    (tmp_path / "pkg" / "training").mkdir(parents=True)
    (tmp_path / "pkg" / "training" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "training" / "probe.py").write_text("import sys; print('argv', sys.orig_argv[1:3])\n")
    data, servers = tmp_path / "data", tmp_path / "servers"
    (data / "node0" / "root").mkdir(parents=True)
    servers.mkdir()
    (data / warm_python.NODE_MARKER).write_text(f"{servers}\n")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path / "pkg")}
    proc = subprocess.Popen([python, "-m", warm_python.HOOK_MODULE, "--serve", str(servers / warm_python.BASE_SOCKET),
                             "--cold"], env=env, cwd="/", stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        node = (f"mount --bind {shlex.quote(str(data / 'node0' / 'root'))} /root && cd / && "
                f"{shlex.quote(python)} -m training.probe && {shlex.quote(python)} -c 'print(\"plain\")'")
        done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", node], env=env,
                              capture_output=True, text=True, timeout=60)
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout == f"argv ['-m', '{warm_python.HOOK_MODULE}']\nplain\n", done.stdout
