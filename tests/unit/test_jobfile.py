"""The job file (`fab train -f job.yaml`): cluster/job/jobfile.py's merge, and the real `fab train -f ... --dry-run`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cluster.job.jobfile import JobFileError, resolve
from tests.fab_run import Ran, fab_in_process

ROOT = Path(__file__).resolve().parents[2]
OPTIONS = {"nodes": int, "batch_size": int, "lr": float, "dry_run": bool, "script": str, "args": str, "train_file": str,
           "pin": str, "epochs": str, "file": str}


def test_keys_with_dashes_or_underscores_set_the_options_by_their_kinds():
    got = resolve(OPTIONS, {"nodes": 4, "batch-size": 16, "lr": 3, "dry_run": True, "args": "--epochs 1",
                            "epochs": 2, "pin": False})
    assert got == {"nodes": 4, "batch_size": 16, "lr": 3.0, "dry_run": True, "args": "--epochs 1",
                   "epochs": "2", "pin": "off"}


def test_an_unknown_key_is_refused_by_name_with_a_suggestion():
    with pytest.raises(JobFileError) as err:
        resolve(OPTIONS, {"nodes": 2, "batchsize": 16}, where="job.yaml")
    assert str(err.value).startswith("job.yaml: unknown key 'batchsize'; did you mean 'batch-size'?")


def test_the_file_option_itself_is_not_a_key_of_the_file():
    with pytest.raises(JobFileError, match="'file' is not allowed in a job file; give --file on the command line"):
        resolve(OPTIONS, {"file": "other.yaml"}, refused=("file",))


@pytest.mark.parametrize("key, value, allowed", [
    ("nodes", "four", "a whole number"), ("nodes", True, "a whole number"), ("nodes", 2.5, "a whole number"),
    ("lr", "fast", "a number"), ("dry-run", "yes please", "true or false"), ("args", ["--a"], "text"),
    ("script", None, "text"),
])
def test_a_wrong_type_is_refused_naming_the_key_value_and_what_is_allowed(key, value, allowed):
    with pytest.raises(JobFileError) as err:
        resolve(OPTIONS, {key: value}, where="job.yaml")
    assert str(err.value) == f"job.yaml: {key}: {value!r} is not allowed; give {allowed}"


def test_the_command_line_wins_over_the_file():
    got = resolve(OPTIONS, {"nodes": 4, "batch-size": 16}, given={"nodes"})
    assert got == {"batch_size": 16}


def test_the_same_option_twice_and_a_file_that_is_no_mapping_are_refused():
    with pytest.raises(JobFileError, match="'batch-size' and 'batch_size' set the same option"):
        resolve(OPTIONS, {"batch_size": 1, "batch-size": 2})
    with pytest.raises(JobFileError, match="holds list; allowed: a mapping"):
        resolve(OPTIONS, ["nodes", 4])
    assert resolve(OPTIONS, None) == {}  # an empty file sets nothing


def test_paths_are_relative_to_the_files_folder():
    local = {"/jobs/proj/data/train.json"}
    got = resolve(OPTIONS, {"script": "src/train.py", "train_file": "data/train.json"}, folder="/jobs/proj",
                  paths=("script",), maybe_paths=("train_file",), exists=local.__contains__)
    assert got == {"script": "/jobs/proj/src/train.py", "train_file": "/jobs/proj/data/train.json"}
    # a data path with no such file here is a path on the nodes, kept as written; absolute paths are kept
    got = resolve(OPTIONS, {"script": "/abs/t.py", "train_file": "data/on-nodes.json"}, folder="/jobs/proj",
                  paths=("script",), maybe_paths=("train_file",), exists=local.__contains__)
    assert got == {"script": "/abs/t.py", "train_file": "data/on-nodes.json"}


# ----------------------------------------------------------------------------- the real program


INVENTORY = "name: lab\nuser: ubuntu\ninstance_type: r7iz.metal-16xl\nhosts: [192.0.2.10, 192.0.2.11]\n"


def fab_train(tmp_path: Path, *argv: str) -> Ran:
    return fab_in_process("train", *argv, env={**os.environ, "HOME": str(tmp_path / "home")})


def test_fab_train_dry_run_reads_the_job_file_and_the_command_line_overrides_it(tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "lab.yaml").write_text(INVENTORY)
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("print(1)\n")
    (project / "job.yaml").write_text("nodes: 2\nranks-per-node: 1\nscript: train.py\nargs: '--epochs 1'\n"
                                      "cluster: ../lab.yaml\n")
    result = fab_train(tmp_path, "-f", str(project / "job.yaml"), "--dry-run")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--script train.py -- --epochs 1" in result.stdout and "-n 2 -ppn 1" in result.stdout
    overridden = fab_train(tmp_path, "--file", str(project / "job.yaml"), "--dry-run", "--nodes", "1",
                           "--args", "--epochs 5")
    assert overridden.returncode == 0, overridden.stdout + overridden.stderr
    assert "-- --epochs 5" in overridden.stdout and "-n 1 -ppn 1" in overridden.stdout


def test_fab_train_refuses_a_bad_job_file_in_one_line_with_exit_2(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("nodes: 2\nbatchsize: 16\n")
    result = fab_train(tmp_path, "-f", str(job), "--dry-run")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {job}: unknown key 'batchsize'; did you mean 'batch-size'? (allowed: the options of the task, "
        "e.g. all-ranks, allow-busy, args, batch-size)"]
    job.write_text("nodes: [2\n")
    result = fab_train(tmp_path, "-f", str(job), "--dry-run")
    assert result.returncode == 2 and result.stderr.strip() == f"error: --file: {str(job)!r} is not YAML at line 2; " \
        "allowed: a mapping such as `nodes: 4`"
