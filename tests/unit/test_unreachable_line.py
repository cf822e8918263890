"""A task that connects to a node nobody answers on: one line naming the host and what to check, exit 3.

The node is 127.0.0.1 on a loopback port this test holds bound but never listens on (refused at
once); the tasks run in-process through the `xeon-cluster` program, which shares `fab`'s executor.
"""

from __future__ import annotations

import socket

import pytest

from node_setup.tasks.common import UNREACHABLE
from node_setup.tasks.program import program


@pytest.fixture
def silent_node(tmp_path):
    """An inventory whose only node is a loopback port that refuses connections."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused, and no one else gets it
    port = holder.getsockname()[1]
    inventory = tmp_path / "gone.yaml"
    inventory.write_text(f"name: gone\nuser: root\nhosts:\n  - name: node0\n    address: 127.0.0.1:{port}\n"
                         "    private_address: 127.0.0.1\n")
    yield inventory, port
    holder.close()


@pytest.mark.parametrize("task", [["logs"], ["stop"], ["get", "--to", "copy"]])
def test_an_unreachable_master_is_one_line_and_exit_3(capsys, tmp_path, monkeypatch, silent_node, task):
    inventory, port = silent_node
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ended:
        program.run(["xeon-cluster", *task, "--cluster", str(inventory)])
    err = capsys.readouterr().err
    assert ended.value.code == UNREACHABLE, err
    assert err.strip().splitlines() == [
        f"error: unreachable: root@127.0.0.1:{port}: Connection refused (is sshd running and port {port} open?)"]


def test_autostop_s_duration_options_get_past_parsing_to_the_node(capsys, tmp_path, monkeypatch, silent_node):
    """`--idle 10s --poll 1s` are valid: the task goes on to the (silent) node and fails there, not on its options."""
    inventory, port = silent_node
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ended:
        program.run(["xeon-cluster", "autostop", "--idle", "10s", "--poll", "1s", "--cluster", str(inventory)])
    out = capsys.readouterr()
    assert ended.value.code not in (0, 2), out.err
    assert "--poll" not in out.err and "--idle" not in out.err
    assert f"127.0.0.1:{port}" in out.out + out.err
