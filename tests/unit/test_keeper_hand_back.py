"""The local cluster's group keeper as the run supervisor's group (node_setup/local/keeper.py,
node_setup/backends/local.py): a worker the supervisor hands back is taken down so that the keeper brings
another machine in its place, and a new machine's console can be held back the way a metal instance lists
its host keys only at the end of a long boot. Files in a temporary data directory; taking a node down
(node_setup/local/cluster.py's reclaim, which kills a namespace's processes) is a recording test double
here: tests/ssh/test_supervised_run.py runs the keeper for real, with its console held back."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.run.supervision import Member
from node_setup.backends import local as local_backend
from node_setup.backends.local import LocalGroup
from node_setup.local import keeper
from node_setup.local import state as local_state
from node_setup.local.console import CONSOLE_FILE


def _node(data: Path, i: int) -> local_state.NodeState:
    node_dir = data / f"node{i}"
    node_dir.mkdir(parents=True, exist_ok=True)
    return local_state.NodeState(name=f"node{i}", namespace=f"xc-t-n{i}", veth=f"xcv-t-{i}", address=f"10.9.9.{i + 2}",
                                 dir=str(node_dir), sshd_config=str(node_dir / "etc" / "sshd_config"),
                                 instance_id=f"i-{i:017x}")


def _state(data: Path) -> local_state.ClusterState:
    return local_state.ClusterState(name="t", bridge="xcb-t", subnet="10.9.9.0/24", bridge_address="10.9.9.1",
                                    data_dir=str(data), cluster_dir=str(data / "config"), key_path="",
                                    inventory_path="", nodes=[_node(data, i) for i in range(3)])


def test_a_handed_back_worker_is_taken_down_once_and_a_stale_request_is_dropped(tmp_path, monkeypatch):
    state = _state(tmp_path)
    group = LocalGroup(str(tmp_path))
    monkeypatch.setattr(local_backend, "keeper_of", lambda data_dir, name=None: {"pid": 1, "delay_s": 10.0})
    (tmp_path / local_state.GROUP_FILE).write_text('{"cluster": "t", "members": []}')
    said = group.hand_back(Member("node2", "10.9.9.4", state.nodes[2].instance_id))
    assert said == "handed back: the group keeper takes it down and brings a new machine in its place"
    group.hand_back(Member("node1", "10.9.9.3", "i-00000000000000999"))  # a machine no longer there
    down = []
    monkeypatch.setattr(keeper.local_cluster, "reclaim",
                        lambda paths, name, *, silent, progress: down.append((name, silent)))
    lines: list[str] = []
    assert keeper.take_down_handed_back(local_state.paths_for("t"), state, lines.append) is True
    assert down == [("node2", True)]  # silent: down at once, as a terminated instance
    assert any("no worker is that machine now" in line for line in lines)
    assert not list(tmp_path.glob(f"{local_state.HANDBACK_PREFIX}*"))  # each request acted on once
    assert keeper.take_down_handed_back(local_state.paths_for("t"), state, lines.append) is False


def test_without_a_keeper_nothing_takes_a_handed_back_machine(tmp_path, monkeypatch):
    monkeypatch.setattr(local_backend, "keeper_of", lambda data_dir, name=None: None)
    (tmp_path / local_state.GROUP_FILE).write_text('{"cluster": "t", "members": []}')
    said = LocalGroup(str(tmp_path)).hand_back(Member("node2", "10.9.9.4", "i-00000000000000002"))
    assert said.startswith("nothing to hand it back to") and not list(tmp_path.glob("handback-*"))


def test_a_new_machines_console_is_held_back_then_shown(tmp_path):
    node = _node(tmp_path, 1)
    console = Path(node.dir) / CONSOLE_FILE
    console.write_text("ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----\n")
    keeper.hold_console(node)
    assert not console.exists()  # the supervisor reads no fingerprints: it waits
    keeper.release_console(node)
    assert console.read_text().startswith("ec2: -----BEGIN SSH HOST KEY FINGERPRINTS")


@pytest.mark.parametrize("value", ["-1", "3601", "soon"])
def test_a_bad_console_delay_is_one_line_naming_the_option(value):
    with pytest.raises(local_state.LocalClusterError, match=r"^--keeper-console-delay: .* allowed: seconds from 0"):
        keeper.validate_console_delay(value)
