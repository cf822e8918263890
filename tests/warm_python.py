"""A warm interpreter for the job's ranks in tests/training: `python -m tests.warm_python -m training ARGS`
runs like `python -m training ARGS`, but the job's process is forked from a server that has torch,
transformers, datasets and peft imported already (about 6 CPU-seconds a rank on a 2-core machine, more
than most tests' steps cost).

The server (one per pytest process, started at its first rank by tests/training/conftest.py, ending when
that process closes its stdin) forks a monitor per request, and the monitor forks the job with the caller's
argv, environment, working directory and stdin/stdout/stderr (passed over the socket); the job runs
`training/__main__.py` with runpy. Its exit status goes back to the caller, which exits with it; a signal
the caller gets is passed on, and a caller that is gone (killed by mpirun, say) takes the job with it.
Where the server cannot stand in for a fresh interpreter the caller execs the real one with the same
command: no server, another interpreter, or import-time settings (PYTHONPATH, OMP_*, HF_*, ...) other than
the server's. The local-cluster tests and the single-process job tests run the real interpreter.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys

SOCKET_ENV = "XEON_TEST_WARM_PYTHON"  # the server's socket path, in the environment of the tests' ranks
# Settings read while the modules are imported (the OpenMP runtime at torch's load, the hub's offline flags
# at its import, the module path): a request whose values differ runs the real interpreter.
IMPORT_TIME_PREFIXES = ("PYTHON", "OMP_", "KMP_", "MKL_", "LD_", "HF_", "TRANSFORMERS", "TORCH", "PYTORCH",
                        "TOKENIZERS", "DATASETS", "XEON_TEST_DOUBLE")
PASSED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
MAX_MESSAGE = 1 << 20


def import_time_env(env: dict) -> dict:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_PREFIXES)}


# ------------------------------------------------------------------------------ the caller

def _real(argv: list[str]) -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, PASSED_SIGNALS)  # a mask is kept across exec
    os.execv(sys.executable, [sys.executable, *argv])


def client(argv: list[str]) -> None:
    """Run `python ARGV` through the server, or as itself where the server cannot stand in."""
    path = os.environ.get(SOCKET_ENV, "")
    if not path or argv[:1] != ["-m"]:
        _real(argv)
    # held until the job's pid is known and they can be passed on (a signal before that would end this caller
    # alone, and the server would then kill the job instead of giving it the signal)
    signal.pthread_sigmask(signal.SIG_BLOCK, PASSED_SIGNALS)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "python": sys.executable}
        socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [0, 1, 2])  # the descriptors with it
        reader = conn.makefile("r")
        answer = json.loads(reader.readline() or "{}")
    except (OSError, ValueError):
        answer = {}
    if "pid" not in answer:  # refused (another interpreter, other import-time settings) or no server
        conn.close()
        _real(argv)
    pid = answer["pid"]

    def pass_on(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for signum in PASSED_SIGNALS:
        signal.signal(signum, pass_on)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, PASSED_SIGNALS)
    line = reader.readline()  # retried by Python across the signals passed on (PEP 475)
    status = json.loads(line) if line else {"signal": int(signal.SIGKILL)}
    if "signal" in status:
        signal.signal(status["signal"], signal.SIG_DFL)
        os.kill(os.getpid(), status["signal"])
    sys.exit(status.get("code", 1))


# ------------------------------------------------------------------------------ the server

def _warm_up() -> None:
    import datasets  # noqa: F401
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from transformers import (AutoModelForCausalLM, AutoModelForQuestionAnswering,  # noqa: F401
                              AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments)

    import training.train  # noqa: F401


def _job(request: dict, fds: list[int]) -> None:
    """In the forked job: become the caller's `python -m MODULE ARGS` (never returns)."""
    import runpy

    code = 1
    try:
        os.setpgid(0, 0)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        for signum in (*PASSED_SIGNALS, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        module, args = request["argv"][1], request["argv"][2:]
        sys.argv = [module, *args]
        sys.path[0] = request["cwd"]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - what a fresh interpreter would print
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _monitor(conn: socket.socket, request: dict, fds: list[int]) -> None:
    """In the forked monitor: fork the job, tell the caller its pid, then its end (never returns)."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _job(request, fds)
    for fd in fds:
        os.close(fd)
    status: dict = {}
    try:
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        while True:
            done, raw = os.waitpid(pid, os.WNOHANG)
            if done:
                status = ({"signal": os.WTERMSIG(raw)} if os.WIFSIGNALED(raw)
                          else {"code": os.WEXITSTATUS(raw)})
                break
            readable, _, _ = select.select([conn], [], [], 0.2)
            if readable and not conn.recv(1):  # the caller is gone: so is its job
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                os._exit(0)
        conn.sendall(json.dumps(status).encode() + b"\n")
    except OSError:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    os._exit(0)


def serve(path: str, warm_up: bool = True) -> None:
    if warm_up:
        _warm_up()
    own = import_time_env(dict(os.environ))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # monitors are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    while True:
        readable, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in readable and not os.read(sys.stdin.fileno(), 1):  # the pytest process is gone
            return
        if listener not in readable:
            continue
        conn, _ = listener.accept()
        fds: list[int] = []
        try:
            data, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 3)
            while data and not data.endswith(b"\n") and len(data) < MAX_MESSAGE:
                more = conn.recv(MAX_MESSAGE)
                if not more:
                    break
                data += more
            request = json.loads(data)
        except (OSError, ValueError):
            for fd in fds:
                os.close(fd)
            conn.close()
            continue
        if request.get("python") != sys.executable or import_time_env(request.get("env", {})) != own \
                or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            conn.sendall(b"{}\n")
            conn.close()
            continue
        if os.fork() == 0:
            listener.close()
            _monitor(conn, request, list(fds))
        for fd in fds:
            os.close(fd)
        conn.close()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2], warm_up="--cold" not in sys.argv[3:])
    else:
        client(sys.argv[1:])
