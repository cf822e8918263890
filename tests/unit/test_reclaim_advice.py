"""`fab local-reclaim`'s last line: with the cluster's group keeper running (node_setup/local/keeper.py) it
says the keeper brings the node back, not to run `fab local-up` (which would race the keeper); the keeper is
found by its pid file and its command line, as `fab local-down` finds it."""

from __future__ import annotations

import subprocess
import sys

from node_setup.local import cluster as local_cluster
from node_setup.local import state as local_state
from node_setup.local.system import KEEPER_MODULE
from node_setup.tasks.local import after_reclaim


def test_the_keeper_is_found_by_its_pid_file_and_command_line_and_the_advice_follows(tmp_path):
    paths = local_state.paths_for("spot", config=tmp_path / "config", data=tmp_path / "data")
    paths.cluster_dir.mkdir(parents=True)
    assert local_cluster.keeper_pid(paths) is None  # no pid file
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", KEEPER_MODULE, "spot", "30"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", KEEPER_MODULE, "lab", "30"])
    try:
        pid_file = paths.cluster_dir / local_state.KEEPER_PID_FILE
        pid_file.write_text(f"{other.pid}\n")  # another cluster's keeper: not this one's
        assert local_cluster.keeper_pid(paths) is None
        pid_file.write_text(f"{stand_in.pid}\n")
        assert local_cluster.keeper_pid(paths) == stand_in.pid
    finally:
        for process in (stand_in, other):
            process.kill()
            process.wait()
    assert after_reclaim("node2", 3, "spot", keeper=True).startswith(
        "the cluster's group keeper brings node2 back as a new machine after its delay")
    assert after_reclaim("node2", 3, "spot", keeper=False) == (
        "bring it back as a new machine: fab local-up --nodes 3 --name spot")
