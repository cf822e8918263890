"""What keeps a local node from the controller's files, short of starting one (tests/ssh/test_local_cluster.py
starts one): the folders hidden on it, and how the node's sshd is found among its init's children."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from node_setup.local import system
from node_setup.local.state import DATA_ROOT_ENV, LocalClusterError


def test_the_hidden_folders_are_made_0700_absolute_and_named_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "config" / "xeon-cluster"
    hidden = system.hidden_folders([Path("config/xeon-cluster"), config], tmp_path / "data" / "c" / "node0")
    assert hidden == [str(config)]  # the relative name made absolute, and the folder named once
    assert config.is_dir() and config.stat().st_mode & 0o777 == 0o700


def test_a_data_folder_inside_the_config_folder_is_refused_in_one_line(tmp_path):
    config = tmp_path / "config"
    with pytest.raises(LocalClusterError) as refused:
        system.hidden_folders([config], config / "local-data" / "c" / "node0")
    assert DATA_ROOT_ENV in str(refused.value) and str(config) in str(refused.value)
    assert "\n" not in str(refused.value) and not config.exists()  # refused before anything is made


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
