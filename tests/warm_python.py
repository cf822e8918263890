"""A warm interpreter for the tests' ranks: the job's process is forked from a server that has torch,
transformers, datasets and peft imported already (about 7 CPU-seconds a rank on a 2-core machine, more than
most tests' steps cost), and runs like a fresh `python -m training ARGS` would.

Two ways in. In tests/training, `python -m tests.warm_python -m training ARGS` (tests/training/conftest.py's
rank_command, the socket in XEON_TEST_WARM_PYTHON). On a local cluster's node, the node venv's own
`python -m training...` (a rank, the demo writer), `-m xeon_cluster.run` (a user's program) or `torchrun` (its
agent, whose workers are ranks): a .pth hook the tests put in the shared venv (install_node_hook) hands the start
over where the node's cluster data folder holds NODE_MARKER, naming the folder of servers that run the node venv's
interpreter (tests/ssh/warm_nodes.py); the job then enters the node's namespaces (network, hostname, mounts,
PIDs) before it starts. Everywhere else the hook does nothing.

The server (ending when its stdin closes) forks a monitor per request, and the monitor forks the job with the
caller's argv, environment, working directory and stdin/stdout/stderr (passed over the socket); the job runs
the module with runpy. Its exit status goes back to the caller, which exits with it; a signal the caller gets
is passed on (over the socket), and a caller that is gone (killed by mpirun, say) takes the job with it. Where
the server cannot stand in for a fresh interpreter the caller runs the real one: no server, another
interpreter, or import-time settings (PYTHONPATH, LD_PRELOAD, HF_*, ...) other than the server's;
OMP_NUM_THREADS, read when torch loads, is applied with torch.set_num_threads instead, PYTHONUNBUFFERED as -u.
"""

from __future__ import annotations

import io
import json
import os
import select
import signal
import socket
import sys

SOCKET_ENV = "XEON_TEST_WARM_PYTHON"  # the server's socket path, in the environment of tests/training's ranks
NODE_MARKER = ".xeon-test-warm-python"  # in a local cluster's data folder: the folder of its nodes' servers
BASE_SOCKET = "base.socket"  # in that folder: the server with no import-time settings, which starts the others
HOOK_MODULE = "xeon_test_warm_python"  # this file's name in the node venv, beside its .pth hook
USER_RUNNER = ("xeon_cluster.run",)  # what runs a user's program on a node (with runpy): started warm too
SCRIPTS = ("torchrun",)  # the node venv's console scripts started warm (torchrun's agent), by their file's name
NAMESPACES = ("net", "uts", "mnt", "pid")  # a node's, entered by its job in this order
# Settings read while the modules are imported (the OpenMP runtime at torch's load, the hub's offline flags
# at its import, the module path, the preloaded allocator): a request whose values differ runs the real
# interpreter. Not those read later (TORCHELASTIC_*, HF_TOKEN) or applied in the job (OMP_NUM_THREADS,
# PYTHONUNBUFFERED).
IMPORT_TIME_PREFIXES = ("PYTHON", "OMP_", "KMP_", "MKL_", "LD_", "HF_", "TRANSFORMERS", "TORCH", "PYTORCH",
                        "TOKENIZERS", "DATASETS", "XEON_TEST_DOUBLE")
RUN_TIME_NAMES = ("OMP_NUM_THREADS", "PYTHONUNBUFFERED", "HF_TOKEN")
RUN_TIME_PREFIXES = ("TORCHELASTIC_",)
PASSED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
MAX_MESSAGE = 1 << 20


def import_time_env(env: dict) -> dict:
    return {k: v for k, v in env.items()
            if k.startswith(IMPORT_TIME_PREFIXES) and k not in RUN_TIME_NAMES and not k.startswith(RUN_TIME_PREFIXES)}


# ------------------------------------------------------------------------------ the caller

def _real(argv: list[str]) -> None:
    os.execv(sys.executable, [sys.executable, *argv])


def _hand_over(path: str, argv: list[str], namespaces: tuple[str, ...] = ()) -> None:
    """Run `python ARGV` through the server at `path` and end this process as the job ended; returns only
    where the server cannot stand in (refused, or no server), with nothing changed."""
    # held until the job runs and they can be passed on (a signal before that would end this caller alone,
    # and the server would then kill the job instead of giving it the signal)
    held = signal.pthread_sigmask(signal.SIG_BLOCK, PASSED_SIGNALS)
    fds = [0, 1, 2]
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        fds += [os.open(f"/proc/self/ns/{name}", os.O_RDONLY) for name in namespaces]
        conn.connect(path)
        request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "python": sys.executable,
                   "namespaces": list(namespaces)}
        socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], fds)  # the descriptors with it
        reader = conn.makefile("r")
        answer = json.loads(reader.readline() or "{}")
    except (OSError, ValueError):
        answer = {}
    finally:
        for fd in fds[3:]:
            os.close(fd)
    if "pid" not in answer:  # refused (another interpreter, other import-time settings) or no server
        conn.close()
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        return

    def pass_on(signum, _frame):
        try:
            conn.sendall(bytes([signum]))
        except OSError:
            pass

    for signum in PASSED_SIGNALS:
        signal.signal(signum, pass_on)
    signal.pthread_sigmask(signal.SIG_SETMASK, held)
    line = reader.readline()  # retried by Python across the signals passed on (PEP 475)
    status = json.loads(line) if line else {"signal": int(signal.SIGKILL)}
    sys.stdout.flush()
    sys.stderr.flush()
    if "signal" in status:
        signal.signal(status["signal"], signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [status["signal"]])
        os.kill(os.getpid(), status["signal"])
    os._exit(status.get("code", 1))


def client(argv: list[str]) -> None:
    """Run `python ARGV` through the server, or as itself where the server cannot stand in."""
    path = os.environ.get(SOCKET_ENV, "")
    if path and argv[:1] == ["-m"]:
        _hand_over(path, argv)
    _real(argv)


def node_hook() -> None:
    """At the start of the node venv's interpreter (its .pth): hand a `python [-u] -m training...` (or the user
    program runner) over to the servers its cluster's data folder names, if any; otherwise return and let the
    interpreter go on."""
    argv = list(getattr(sys, "orig_argv", ())[1:])
    command = argv[1:] if argv[:1] == ["-u"] else argv
    module = command[1] if command[:1] == ["-m"] and len(command) > 1 else ""
    if not (module.split(".")[0] == "training" or module in USER_RUNNER
            or (command and not module and os.path.basename(command[0]) in SCRIPTS)):
        return
    try:  # the node's /root is a bind mount of <cluster data folder>/<node>/root
        with open("/proc/self/mountinfo") as mounts:
            root = next(line.split()[3] for line in mounts if line.split()[4] == "/root")
        with open(os.path.join(os.path.dirname(os.path.dirname(root)), NODE_MARKER)) as marker:
            folder = marker.read().strip()
    except (OSError, StopIteration, IndexError):
        return
    # the server for this start's import-time settings (once spawned), else the base server (which counts it)
    for name in (f"{settings_key(import_time_env(dict(os.environ)))}.socket", BASE_SOCKET):
        _hand_over(os.path.join(folder, name), argv, NAMESPACES)


def install_node_hook(site_packages: str) -> None:
    """Put this file and its .pth hook into a venv's site-packages (each written whole, then renamed)."""
    # site exec()s a .pth line in its own function's locals, which a comprehension there would not see
    for name, text in ((f"{HOOK_MODULE}.py", open(__file__).read()),
                       (f"{HOOK_MODULE}.pth", f'import sys; a = " ".join(getattr(sys, "orig_argv", ())[1:4]); '
                                              f'any(map(a.__contains__, {("training", *USER_RUNNER, *SCRIPTS)!r})) and '
                                              f'__import__("{HOOK_MODULE}").node_hook()\n')):
        target = os.path.join(site_packages, name)
        with open(f"{target}.{os.getpid()}.tmp", "w") as out:
            out.write(text)
        os.replace(f"{target}.{os.getpid()}.tmp", target)


# ------------------------------------------------------------------------------ the server

def _warm_up() -> None:
    import importlib
    import importlib.util

    import accelerate  # noqa: F401
    import datasets  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from transformers import (AutoModelForCausalLM, AutoModelForQuestionAnswering,  # noqa: F401
                              AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments)
    for optional in ("peft", "intel_extension_for_pytorch"):  # the LoRA job's; the intel profile's stack's
        if importlib.util.find_spec(optional):
            importlib.import_module(optional)


def _job(request: dict, fds: list[int]) -> None:
    """In the forked job: become the caller's `python -m MODULE ARGS` or `python SCRIPT ARGS` (never returns)."""
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
        if "torch" in sys.modules and os.environ.get("OMP_NUM_THREADS", "").isdigit():
            sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        argv = request["argv"]
        if argv[0] == "-u" or os.environ.get("PYTHONUNBUFFERED"):  # unbuffered, as `python -u` makes them
            argv = argv[1:] if argv[0] == "-u" else argv
            sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
            sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True,
                                          errors="backslashreplace")
        if argv[0] == "-m":
            sys.argv = argv[1:]
            sys.path[0] = request["cwd"]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:  # a script (one of SCRIPTS), as `python SCRIPT ARGS` runs it
            sys.argv = argv
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
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


def _setns(fd: int) -> None:
    if hasattr(os, "setns"):  # Python 3.12
        os.setns(fd, 0)
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, 0) != 0:
        raise OSError(ctypes.get_errno(), "setns")


def _monitor(conn: socket.socket, request: dict, fds: list[int]) -> None:
    """In the forked monitor: enter the caller's namespaces, fork the job, tell the caller it runs, pass on
    the signals it sends (a byte each), then tell it the job's end (never returns)."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        for fd in fds[3:]:  # the PID namespace last: it is the job's, not the monitor's
            _setns(fd)
    except OSError:
        conn.sendall(b"{}\n")
        os._exit(0)
    pid = os.fork()
    if pid == 0:
        conn.close()
        for fd in fds[3:]:  # a held namespace would outlive its node
            os.close(fd)
        _job(request, fds[:3])
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
            if not readable:
                continue
            passed = conn.recv(16)
            if not passed:  # the caller is gone: so is its job
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                os._exit(0)
            for signum in passed:
                if signum in PASSED_SIGNALS:
                    os.kill(pid, signum)
        conn.sendall(json.dumps(status).encode() + b"\n")
    except OSError:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    os._exit(0)


def settings_key(settings: dict) -> str:
    """The name of the node server for these import-time settings (its socket: <key>.socket)."""
    import hashlib

    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def serve(path: str, warm_up: str = "", spawn: bool = False) -> None:
    """Serve at `path` until stdin closes. With `spawn` (the node servers), the second start refused for the
    same import-time settings starts a server for those settings beside this one (its socket, named by
    settings_key, appears once it is warm; it ends with this server)."""
    own = import_time_env(dict(os.environ))  # as started: importing torch sets TORCHINDUCTOR_CACHE_DIR
    if warm_up == "--torch":
        import torch  # noqa: F401
    elif warm_up != "--cold":
        _warm_up()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # monitors (and spawned servers) are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    refused: dict[str, int] = {}
    spawned = []  # their stdin: when this server ends, so do they
    while True:
        readable, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in readable and not os.read(sys.stdin.fileno(), 1):  # the pytest process is gone
            return
        if listener not in readable:
            continue
        conn, _ = listener.accept()
        fds: list[int] = []
        try:
            data, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 3 + len(NAMESPACES))
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
        settings = import_time_env(request.get("env", {}))
        if request.get("python") != sys.executable or settings != own \
                or len(fds) != 3 + len(request.get("namespaces", ())):
            for fd in fds:
                os.close(fd)
            conn.sendall(b"{}\n")
            conn.close()
            with open(os.path.join(os.path.dirname(path), "refused.log"), "a") as log:  # what ran cold
                log.write(json.dumps({"argv": request.get("argv", [])[:3], "settings": settings}) + "\n")
            key = settings_key(settings)
            refused[key] = refused.get(key, 0) + 1
            if spawn and refused[key] == 2 and request.get("python") == sys.executable:
                import subprocess

                env = {"PATH": os.environ.get("PATH", ""), "LANG": "C.UTF-8", "HOME": os.environ.get("HOME", "/"),
                       **settings}
                spawned.append(subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "--serve",
                     os.path.join(os.path.dirname(path), f"{key}.socket")], env=env, cwd="/",
                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            continue
        if os.fork() == 0:
            listener.close()
            _monitor(conn, request, list(fds))
        for fd in fds:
            os.close(fd)
        conn.close()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2], next((a for a in sys.argv[3:] if a in ("--cold", "--torch")), ""),  # what to import
              spawn="--spawn" in sys.argv[3:])
    else:
        client(sys.argv[1:])
