"""The runner every rank of `fab train --script/--module` runs its program through (xeon_cluster/run.py):
run as `python -m xeon_cluster.run` on small programs written here, next to plain `python`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from xeon_cluster import run as runner

ROOT = Path(__file__).resolve().parents[2]
# The toolkit (this checkout) is importable, as from the node's venv: its own `cluster` and `training`
# too, so a workdir's modules of those names have something to win against.
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(textwrap.dedent(text))
    return folder


def run(cwd: Path, *words: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`python -m xeon_cluster.run WORDS` from `cwd` (the job's workdir, as the rank wrapper starts it)."""
    return subprocess.run([sys.executable, "-m", runner.__name__, *words], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=timeout)


def plain(cwd: Path, *words: str) -> subprocess.CompletedProcess:
    """The same program under plain `python WORDS`."""
    return subprocess.run([sys.executable, *words], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=60)


SHOW = '''
import json, sys
import xeon_cluster
print(json.dumps({"name": __name__, "argv": sys.argv, "path0": sys.path[0], "file": __file__,
                  "toolkit": xeon_cluster.__file__}))
'''


def shown(result: subprocess.CompletedProcess) -> dict:
    import json

    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_a_script_runs_as_main_with_its_arguments_and_its_folder_first_on_the_path_as_python_runs_it(tmp_path):
    write(tmp_path, {"sub/show.py": SHOW})
    args = ["--name", "a b", "--", "-m", ""]
    got = shown(run(tmp_path, runner.SCRIPT_OPTION, "sub/show.py", runner.ARGS_SEPARATOR, *args))
    assert got["toolkit"] == str(ROOT / "xeon_cluster" / "__init__.py")  # this checkout's runner ran
    assert got["name"] == "__main__" and got["argv"][1:] == args
    assert got["path0"] == str(tmp_path / "sub")
    assert got["file"] == got["argv"][0] == str(tmp_path / "sub" / "show.py")
    python = shown(plain(tmp_path, "sub/show.py", *args))
    assert (python["name"], python["path0"], python["file"], python["argv"][1:]) == (
        got["name"], got["path0"], got["file"], got["argv"][1:])


def test_a_module_runs_as_python_m_runs_it(tmp_path):
    write(tmp_path, {"pkg/__init__.py": "", "pkg/show.py": SHOW})
    got = shown(run(tmp_path, runner.MODULE_OPTION, "pkg.show", runner.ARGS_SEPARATOR, "--epochs", "2"))
    assert got == {**shown(plain(tmp_path, "-m", "pkg.show", "--epochs", "2")), "toolkit": got["toolkit"]}
    assert got["name"] == "__main__" and got["argv"] == [str(tmp_path / "pkg" / "show.py"), "--epochs", "2"]
    assert got["path0"] == str(tmp_path)


def test_the_workdirs_own_training_package_and_cluster_module_are_the_ones_imported(tmp_path):
    user = {"training/__init__.py": 'WHOSE = "user"\n', "cluster.py": 'WHOSE = "user"\n',
            "train.py": "import cluster, training\nprint(cluster.WHOSE, training.WHOSE, cluster.__file__)\n"}
    write(tmp_path, {**user, "pkg/__init__.py": "", "pkg/train.py": user["train.py"]})
    for words in ([runner.SCRIPT_OPTION, "train.py"], [runner.MODULE_OPTION, "pkg.train"]):
        result = run(tmp_path, *words)
        assert result.returncode == 0, result.stderr
        assert result.stdout == f"user user {tmp_path / 'cluster.py'}\n", words


@pytest.mark.parametrize("body, code, stderr", [
    ("print('done')", 0, ""),
    ("import sys; sys.exit(7)", 7, ""),
    ("raise SystemExit", 0, ""),
    ("import sys; sys.exit('no data in /data')", 1, "no data in /data\n"),
])
def test_the_exit_code_is_the_programs(tmp_path, body, code, stderr):
    write(tmp_path, {"job.py": body})
    result, python = run(tmp_path, runner.SCRIPT_OPTION, "job.py"), plain(tmp_path, "job.py")
    assert (result.returncode, result.stderr) == (code, stderr) == (python.returncode, python.stderr)


def test_an_uncaught_exception_prints_pythons_own_traceback_and_exits_1(tmp_path):
    write(tmp_path, {"job.py": """
        def load():
            raise FileNotFoundError("no data in /data")
        load()
        """})
    result = run(tmp_path, runner.SCRIPT_OPTION, "job.py")
    assert result.returncode == 1
    assert result.stderr.startswith("Traceback (most recent call last):\n")
    assert "FileNotFoundError: no data in /data" in result.stderr and "runpy" not in result.stderr
    assert result.stderr == plain(tmp_path, "job.py").stderr  # no frame of the runner's or runpy's


def test_a_syntax_error_reads_as_pythons(tmp_path):
    write(tmp_path, {"job.py": "x = (\n"})
    result = run(tmp_path, runner.SCRIPT_OPTION, "job.py")
    assert result.returncode == 1 and "SyntaxError" in result.stderr
    assert result.stderr == plain(tmp_path, "job.py").stderr


def test_an_uncaught_keyboard_interrupt_ends_by_sigint_as_python_does(tmp_path):
    write(tmp_path, {"job.py": "raise KeyboardInterrupt\n"})
    result = run(tmp_path, runner.SCRIPT_OPTION, "job.py")
    assert result.returncode == plain(tmp_path, "job.py").returncode == -signal.SIGINT
    assert result.stderr.endswith("KeyboardInterrupt\n")


@pytest.mark.parametrize("body, code", [("pass", 0), ("import sys; sys.exit(3)", 3), ("1 / 0", 1)])
def test_exit_runs_atexit_handlers_waits_for_threads_and_keeps_what_was_written(tmp_path, body, code):
    write(tmp_path, {"job.py": f"""
        import atexit, threading, time
        from concurrent.futures import ThreadPoolExecutor
        left_open = open("unclosed.txt", "w")
        left_open.write("written, never closed")  # (buffered: lost if nothing flushes it)
        def late():
            time.sleep(0.5)
            open("thread.txt", "w").write("the thread ended")
        threading.Thread(target=late).start()
        pool = ThreadPoolExecutor(2)  # never shut down: its idle workers must not hold the exit
        pool.submit(time.sleep, 0.1)
        atexit.register(lambda: print("atexit handler ran", flush=False))
        {body}
        """})
    result = run(tmp_path, runner.SCRIPT_OPTION, "job.py", timeout=30)
    assert result.returncode == code, result.stderr
    assert result.stdout == "atexit handler ran\n"
    assert (tmp_path / "unclosed.txt").read_text() == "written, never closed"
    assert (tmp_path / "thread.txt").read_text() == "the thread ended"


# A stand-in torch (a workdir package named torch): it records what the runner does with it.
FAKE_TORCH = {"torch/__init__.py": "open('torch-imported', 'w').close()\n",
              "torch/distributed.py": """
                  def is_available(): return True
                  def is_initialized(): return True
                  def destroy_process_group():
                      import os
                      assert os.path.exists("atexit-ran"), "the atexit handlers run first"
                      open("destroyed", "w").close()
                  """}


def test_a_process_group_left_by_the_program_is_destroyed_after_the_atexit_handlers(tmp_path):
    write(tmp_path, {**FAKE_TORCH, "job.py": "import atexit, torch.distributed\n"
                                             "atexit.register(lambda: open('atexit-ran', 'w').close())\n"})
    result = run(tmp_path, runner.SCRIPT_OPTION, "job.py")
    assert result.returncode == 0 and result.stderr == ""
    assert (tmp_path / "destroyed").exists()


def test_torch_is_not_imported_for_a_program_that_did_not(tmp_path):
    write(tmp_path, {**FAKE_TORCH, "job.py": "print('no torch here')\n"})
    result = run(tmp_path, runner.SCRIPT_OPTION, "job.py")
    assert result.returncode == 0 and result.stdout == "no torch here\n", result.stderr
    assert not (tmp_path / "torch-imported").exists() and not (tmp_path / "destroyed").exists()


def test_a_real_gloo_process_group_and_ddp_model_left_at_the_end_are_destroyed_and_the_rank_exits_0(tmp_path):
    pytest.importorskip("torch")
    write(tmp_path, {"job.py": """
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        model(torch.randn(2, 4)).sum().backward()
        print("trained", flush=True)
        """})
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(29000 + os.getpid() % 900),
           "GLOO_SOCKET_IFNAME": "lo"}
    result = subprocess.run([sys.executable, "-m", runner.__name__, runner.SCRIPT_OPTION, "job.py"], cwd=tmp_path,
                            env={**ENV, **env}, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout == "trained\n", result.stderr
    assert "destroy_process_group at exit failed" not in result.stderr, result.stderr


@pytest.mark.parametrize("words, message", [
    ([], "xeon_cluster.run: '' is not allowed first; allowed: python -m xeon_cluster.run --script PATH"),
    (["train.py"], "xeon_cluster.run: 'train.py' is not allowed first"),
    (["--script", "--", "x"], "--script: '--' is not a path"),
    (["--script", "job.py", "--lr", "1"], ("xeon_cluster.run: '--lr' after --script job.py; allowed: the program's "
                                           "arguments after '--'")),
    (["--script", "missing.py"], "--script: 'missing.py' does not exist in "),
    (["--module", "no_such_module_here"], "--module: no module named 'no_such_module_here' on the path"),
    (["--module", "no_such_package.train"], "--module: no module named 'no_such_package.train' on the path"),
])
def test_bad_usage_is_one_line_and_exit_2(tmp_path, words, message):
    write(tmp_path, {"job.py": "print('ran')\n"})
    result = run(tmp_path, *words)
    assert result.returncode == runner.BAD_USAGE_CODE == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(message), result.stderr
