"""The user's own program (cluster/job/userjob.py and its edges): the copy plan, the install plan, the
command every rank runs, and the shell that carries them out (rendered, shellchecked, run here)."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

from cluster.inventory import Inventory
from cluster.job.launch import RANK_WRAPPER, RESERVED_VARIABLES
from cluster.job.request import OwnProgram, RequestError
from cluster.node.profiles import PROFILES
from cluster.job.userjob import (FILE_STORE, WITHHELD_DOT, UserJobError, UserProgram, notice_signal, parse_requirements,
                             script_in_workdir, split_args)
from node_setup.ssh import requirements as reqs
from node_setup.ssh.workdir import WORKDIR_SH, scan
from tests.unit.test_jobplan import job_plan, job_request
from tests.unit.test_shell_scripts import shellcheck

STOCK = PROFILES["stock"]


def inventory(kind: str = "file") -> Inventory:
    return Inventory.from_mapping({"name": "lab", "user": "ubuntu", "instance_type": "r7iz.metal-16xl",
                                   "hosts": ["192.0.2.10", "192.0.2.11"]}, default_name="lab", kind=kind)


def test_the_scan_skips_git_caches_venvs_and_gitignored_files_and_hashes_the_rest(tmp_path):
    for rel, text in {"train.py": "print(1)\n", "lib/util.py": "x = 1\n", ".git/HEAD": "ref\n",
                      "lib/__pycache__/util.pyc": "b", "env/pyvenv.cfg": "home = /usr\n", "env/lib/x.py": "",
                      "data/big.bin": "0" * 100, "notes.log": "log\n", ".gitignore": "data/\n*.log\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    os.chmod(tmp_path / "train.py", 0o755)
    plan = scan(tmp_path)
    assert sorted(f.path for f in plan.files) == ["lib/util.py", "train.py"]
    assert set(plan.skipped) == {".git/", "env/", "data/", "notes.log", "lib/__pycache__/"}
    assert plan.withheld == ((".gitignore", WITHHELD_DOT),)  # a dot-file: withheld, and said so
    train = next(f for f in plan.files if f.path == "train.py")
    assert train.executable and train.stored_as.endswith(".x") and train.size == 9
    assert "train.py" in plan.manifest() and "\t" in plan.manifest()


def test_a_workdir_over_the_limit_names_its_largest_files(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"0" * 3000)
    (tmp_path / "small.py").write_text("x")
    with pytest.raises(UserJobError, match=r"--workdir: .* over the limit of 2\.0 KB; largest: model\.bin \(2\.9 KB\)"):
        scan(tmp_path, limit_bytes=2048)


def test_the_script_must_be_inside_the_workdir_and_args_split_like_a_shell():
    assert script_in_workdir("/w/sub/train.py", "/w") == "sub/train.py"
    with pytest.raises(UserJobError, match="--script: /elsewhere/train.py is outside the workdir /w"):
        script_in_workdir("/elsewhere/train.py", "/w")
    assert split_args("--name 'a b' --x=$(y)") == ["--name", "a b", "--x=$(y)"]
    with pytest.raises(UserJobError, match="--args: cannot split"):
        split_args("--name 'open")


@pytest.mark.parametrize("given, expected", [("", "SIGUSR1"), ("usr2", "SIGUSR2"), ("SIGTERM", "SIGTERM"),
                                             ("none", None)])
def test_notice_signals(given, expected):
    assert notice_signal(given) == expected


def test_an_unknown_notice_signal_is_refused():
    with pytest.raises(UserJobError, match="--notice-signal: 'KILL' is not allowed"):
        notice_signal("KILL")


def test_requirements_that_would_move_a_pin_are_refused_naming_the_package():
    plan = parse_requirements("# tools\npeft>=0.13  # adapters\ntorch>=2.10\n", "req.txt", STOCK)
    assert plan.requirements == ("peft>=0.13", "torch>=2.10") and "torch==2.13.0" in plan.constraints
    with pytest.raises(UserJobError, match=r"'torch==2\.12\.0' would change torch, pinned to 2\.13\.0"):
        parse_requirements("torch==2.12.0\n", "req.txt", STOCK)
    with pytest.raises(UserJobError, match=r"would change impi_rt, pinned to 2021\.18\.1"):
        parse_requirements("impi_rt<2021\n", "req.txt", STOCK)
    with pytest.raises(UserJobError, match="line 2: 'peft >=>= 1' does not parse"):
        parse_requirements("ok\npeft >=>= 1\n", "req.txt", STOCK)
    with pytest.raises(UserJobError, match="pip options are not allowed"):
        parse_requirements("--index-url http://x\n", "req.txt", STOCK)
    assert parse_requirements("a\n", "r", STOCK).digest != parse_requirements("b\n", "r", STOCK).digest


def test_a_user_program_runs_from_the_workdir_with_the_venv_python_and_its_own_variables():
    plan = job_plan(inventory(), 2, run_id="20260101-000000-abcd",
                    program=OwnProgram(script="sub/train.py", args=("--lr", "1e-4"), signal="SIGUSR2"))
    # through the runner that ends the rank cleanly (xeon_cluster/run.py), the program's words after `--`
    assert plan.launch.program == ("/opt/xeon-cluster/venv-stock/bin/python", "-m", "xeon_cluster.run", "--script",
                                   "sub/train.py", "--", "--lr", "1e-4")
    env = plan.launch.rank_env
    assert env["XEON_CLUSTER_WORKDIR"] == ".xeon-cluster/jobs/20260101-000000-abcd/workdir"
    assert env["XEON_CLUSTER_OUTPUT_DIR"] == plan.output_dir and env["XEON_CLUSTER_NOTICE_SIGNAL"] == "SIGUSR2"
    assert "--output_dir" not in plan.launch.program
    module = job_plan(inventory(), 1, program=OwnProgram(module="pkg.train", signal=None))
    assert module.launch.program[1:] == ("-m", "xeon_cluster.run", "--module", "pkg.train", "--")
    assert module.launch.rank_env["XEON_CLUSTER_NOTICE_SIGNAL"] == "none"
    assert UserProgram("sub/train.py", None, ("--lr", "1e-4")).describe() == "python sub/train.py --lr 1e-4"


def test_env_may_not_set_what_the_launch_sets():
    assert "RANK" in RESERVED_VARIABLES and "MASTER_PORT" in RESERVED_VARIABLES
    with pytest.raises(RequestError, match="--env: RANK is set by the launch itself"):
        job_request(1, env={"RANK": "3"})


def test_the_rank_wrapper_exports_what_torchrun_sets(tmp_path):
    env = {"HOME": str(tmp_path), "PATH": os.environ["PATH"], "XEON_CLUSTER_JOB": "j", "MASTER_ADDR": "127.0.0.1",
           "PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2",
           "GLOO_SOCKET_IFNAME": "lo"}
    out = subprocess.run(["sh", "-c", RANK_WRAPPER, "xeon-rank", "sh", "-c",
                          'echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $NODE_RANK $GROUP_RANK '
                          '$XEON_CLUSTER_NOTICE_FILE $(pwd)"'], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["5", "8", "1", "2", "2", "2", f"{tmp_path}/.xeon-cluster/jobs/j/notice", os.getcwd()]
    (tmp_path / "wd").mkdir()
    user = subprocess.run(["sh", "-c", RANK_WRAPPER, "xeon-rank", "sh", "-c", 'echo "$XEON_CLUSTER_OUTPUT_DIR $(pwd)"'],
                          env={**env, "MPI_LOCALRANKID": "1", "XEON_CLUSTER_WORKDIR": "wd",
                               "XEON_CLUSTER_OUTPUT_DIR": "runs/x"}, capture_output=True, text=True, check=True)
    assert user.stdout.split() == [f"{tmp_path}/runs/x", f"{tmp_path}/wd"]


def _workdir_sh(home, mode: str, job: str = "job") -> str:
    return subprocess.run(["sh", "-c", WORKDIR_SH, "xeon-cluster", mode, job, f"{job}/workdir"],
                          env={"HOME": str(home), "PATH": os.environ["PATH"]},
                          capture_output=True, text=True, check=True).stdout


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_the_workdir_script_stores_each_content_once_and_copies_it_into_the_job(tmp_path):
    code, tool, empty = _sha("print(1)\n"), _sha("#!/bin/sh\n"), _sha("")
    for job in ("job", "job2"):
        (tmp_path / job).mkdir()
        (tmp_path / job / "workdir.manifest").write_text(f"{code}\tsub/x.py\n{code}\ty.py\n{tool}.x\trun\n"
                                                         f"{empty}\tlog.txt\n{empty}\tother.txt\n")
    assert _workdir_sh(tmp_path, "missing").split() == sorted([code, tool + ".x", empty])
    store = tmp_path / FILE_STORE
    (store / (code + ".part")).write_text("print(1)\n")
    (store / (tool + ".x.part")).write_text("#!/bin/sh\n")
    (store / (empty + ".part")).write_text("")
    assert "copied 5 file(s)" in _workdir_sh(tmp_path, "link")
    work = tmp_path / "job" / "workdir"
    assert os.access(work / "run", os.X_OK) and _workdir_sh(tmp_path, "missing") == ""
    # the job writes into its files (as root would, whatever the mode): not into the store, not into
    # another file of the same content, not into the next job's copy
    assert len({(work / p).stat().st_ino for p in ("sub/x.py", "y.py", "log.txt", "other.txt")}) == 4
    (work / "y.py").write_text("changed by the job\n")
    with open(work / "log.txt", "a") as f:
        f.write("a job's log line\n")
    assert (work / "sub" / "x.py").read_text() == "print(1)\n" and (work / "other.txt").read_text() == ""
    _workdir_sh(tmp_path, "link", "job2")
    assert (tmp_path / "job2" / "workdir" / "y.py").read_text() == "print(1)\n"
    assert (tmp_path / "job2" / "workdir" / "log.txt").read_text() == ""


def test_a_stored_file_whose_content_changed_is_sent_again(tmp_path):
    code = _sha("print(1)\n")
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "workdir.manifest").write_text(f"{code}\tx.py\n")
    store = tmp_path / FILE_STORE
    store.mkdir(parents=True)
    (store / code).write_text("tampered\n")  # e.g. written through a hard link by an earlier version
    assert _workdir_sh(tmp_path, "missing").split() == [code] and not (store / code).exists()


@pytest.mark.parametrize("kind", ["local", "file"])
def test_the_requirements_script_passes_shellcheck_and_quotes_its_values(kind):
    inv = inventory(kind)
    if kind == "local":
        inv = Inventory.from_mapping({"name": "lab", "user": "root", "wheelhouse": "/var/cache/wh",
                                      "hosts": ["10.0.0.2"]}, default_name="lab", kind="local")
    text = reqs.node_script(inv, parse_requirements("peft>=0.13\n", "r", STOCK))
    shellcheck(text, f"install-requirements ({kind})")
    assert ("--find-links /var/cache/wh" in text) == (kind == "local") and "'peft>=0.13'" in text


def test_the_workdir_script_rendered_passes_shellcheck():
    shellcheck(WORKDIR_SH, "workdir")


