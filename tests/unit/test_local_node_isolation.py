"""What keeps a local node from the controller's files, short of starting one (tests/ssh/test_local_cluster.py
starts one): the folders hidden on it, and how the node's sshd is found among its init's children."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from node_setup.controller import config_root, secret_folders
from node_setup.job_history import path as job_history_path
from node_setup.local import system
from node_setup.local.state import DATA_ROOT_ENV, LocalClusterError


def test_the_hidden_folders_are_made_0700_absolute_and_named_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "config" / "xeon-cluster"
    hidden = system.hidden_folders([Path("config/xeon-cluster"), config], tmp_path / "data" / "c" / "node0")
    assert hidden == [str(config)]  # the relative name made absolute, and the folder named once
    assert config.is_dir() and config.stat().st_mode & 0o777 == 0o700


def test_a_data_folder_inside_a_folder_of_secrets_is_refused_in_one_line(tmp_path):
    config = tmp_path / "config"
    keys, local = secret_folders(config)
    with pytest.raises(LocalClusterError) as refused:
        system.hidden_folders([keys, local], local / "data" / "c" / "node0")
    assert DATA_ROOT_ENV in str(refused.value) and str(local) in str(refused.value)
    assert "\n" not in str(refused.value) and not config.exists()  # refused before anything is made


def test_only_the_folders_of_secrets_are_hidden_and_they_are_where_the_keys_are(tmp_path, monkeypatch):
    """The folders hidden on a node are where the key store and a local cluster's key live (not a list of
    its own): the cluster key pair, the run-spec key and a local cluster's controller key all lie inside them,
    and the rest of the config folder (job history, calibrations) does not."""
    from node_setup.ssh import keys
    from node_setup.local import state as local_state

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    hidden = secret_folders(config_root())
    secrets = [keys.ensure_cluster_key("c1").private_path, keys._spec_key_path(),
               local_state.paths_for("c1").key_path]
    assert all(any(path.is_relative_to(folder) for folder in hidden) for path in secrets), (secrets, hidden)
    assert not any(job_history_path("c1").is_relative_to(folder) for folder in hidden)
    # a data folder beside them, in the config folder, is allowed
    assert system.hidden_folders(hidden, config_root() / "data" / "c1" / "node0") == [str(f) for f in hidden]


def test_children_are_the_processes_whose_parent_is_the_pid(tmp_path):
    started = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(2)]
    try:
        mine = system.children(os.getpid())
        assert {p.pid for p in started} <= set(mine)
        assert system.children(started[0].pid) == []
    finally:
        for process in started:
            process.kill()
            process.wait()
