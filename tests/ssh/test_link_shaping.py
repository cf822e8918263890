"""`fab local-up --link-mbit`: each node's link limited with tc inside its namespace, removed by local-down."""

from __future__ import annotations

import secrets
import subprocess
import sys

import pytest

from node_setup.local import cluster as lc
from node_setup.local import state as local_state
from node_setup.local import system as local_system

pytestmark = [pytest.mark.ssh]  # local nodes in network namespaces, as `fab local-up` makes them

# One node sends this many bytes to another over TCP; the receiver prints the Mbit/s it saw.
PAYLOAD_BYTES = 3 * 2**20
LIMIT_MBIT = 40
PORT = 5901

RECEIVER = f"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", {PORT})); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); got = 0; t0 = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    t0 = t0 or time.monotonic(); got += len(b)
print(got * 8 / (time.monotonic() - t0) / 1e6, flush=True)
"""
SENDER = f"""
import socket, sys
c = socket.create_connection((sys.argv[1], {PORT}), timeout=30)
c.sendall(b"x" * {PAYLOAD_BYTES}); c.close()
"""


def _transfer_mbit(state: local_state.ClusterState) -> float:
    """Mbit/s of one TCP transfer from node1 to node0."""
    src, dst = state.nodes[1], state.nodes[0]
    receiver = subprocess.Popen(["ip", "netns", "exec", dst.namespace, sys.executable, "-c", RECEIVER],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout.readline().strip() == "ready"
        subprocess.run(["ip", "netns", "exec", src.namespace, sys.executable, "-c", SENDER, dst.address],
                       check=True, timeout=60)
        return float(receiver.stdout.readline())
    finally:
        receiver.wait(timeout=30)


def _qdiscs(namespace: str) -> str:
    return local_system.run(["ip", "netns", "exec", namespace, "tc", "qdisc", "show", "dev", "eth0"]).stdout


@pytest.fixture
def cluster_paths(tmp_path):
    from tests.ssh.conftest import local_cluster_unavailable

    reason = local_cluster_unavailable()
    if reason:
        pytest.skip(reason)
    paths = local_state.paths_for(f"s{secrets.token_hex(3)}", config=tmp_path / "cfg", data=tmp_path / "data")
    yield paths
    lc.destroy(paths)


def test_link_limit_shapes_transfers_and_local_down_removes_it(cluster_paths):
    free = lc.create(2, cluster_paths.name, paths=cluster_paths)
    assert free.link_mbit is None and "tbf" not in _qdiscs(free.nodes[1].namespace)
    unlimited = _transfer_mbit(free)

    state = lc.create(2, cluster_paths.name, paths=cluster_paths, replace=True, link_mbit=LIMIT_MBIT)
    recorded = local_state.load_state(cluster_paths)
    assert (recorded.link_mbit, recorded.link_delay_ms) == (LIMIT_MBIT, None)
    assert "tbf" in _qdiscs(state.nodes[1].namespace)
    shown = local_system.run(["ip", "-n", state.nodes[1].namespace, "-d", "link", "show", "dev", "eth0"]).stdout
    assert "gso_max_size 1500 " in shown  # one frame per packet: the small bucket never holds back a segment
    shaped = _transfer_mbit(state)
    # a loose band: TCP start-up and the bucket's first burst move it by a few percent
    assert 0.6 * LIMIT_MBIT <= shaped <= 1.25 * LIMIT_MBIT, (shaped, unlimited)
    assert unlimited > 3 * LIMIT_MBIT, (shaped, unlimited)

    lines: list[str] = []
    assert lc.destroy(cluster_paths, progress=lines.append)
    assert any("removed the link limit (40 Mbit/s per node)" in line for line in lines)
    assert state.nodes[0].namespace not in local_system.namespaces()


def test_link_delay_is_netem_under_the_rate_or_a_clear_refusal(cluster_paths):
    try:
        state = lc.create(2, cluster_paths.name, paths=cluster_paths, link_mbit=100, link_delay_ms=2)
    except local_state.LocalClusterError as exc:  # kernels without sch_netem (some containers' hosts)
        assert "--link-delay-ms: 2 needs the kernel's netem" in str(exc)
        assert not cluster_paths.state_path.exists()
        assert local_state.namespace_name(cluster_paths.name, 0) not in local_system.namespaces()
        return
    shown = _qdiscs(state.nodes[0].namespace)
    assert "tbf" in shown and "netem" in shown and "delay 2ms" in shown


def test_link_options_are_validated_before_anything_is_made(cluster_paths):
    for kwargs, message in (({"link_mbit": 0.5}, "--link-mbit: 0.5 is not allowed; allowed 1 to 100000"),
                            ({"link_mbit": float("nan")}, "--link-mbit: nan is not a number"),
                            ({"link_mbit": 100, "link_delay_ms": -1}, "--link-delay-ms: -1 is not allowed"),
                            ({"link_delay_ms": 5}, "--link-delay-ms: 5 given without --link-mbit")):
        with pytest.raises(local_state.LocalClusterError, match=message.replace(".", r"\.")):
            lc.create(2, cluster_paths.name, paths=cluster_paths, **kwargs)
    assert not cluster_paths.state_path.exists()
    assert local_state.namespace_name(cluster_paths.name, 0) not in local_system.namespaces()


def test_shaping_commands_act_inside_the_node_namespace_only():
    segments, tbf = local_state.link_shaping_commands("xc-a-n0", 1000, None)
    assert segments[:3] == ["ip", "-n", "xc-a-n0"] and segments[-2:] == ["gso_max_size", "1500"]
    assert tbf[:4] == ["ip", "netns", "exec", "xc-a-n0"]
    assert "rate" in tbf and tbf[tbf.index("rate") + 1] == "1000mbit"
    # the bucket holds 4 ms of traffic at the rate, never less than four frames
    assert int(tbf[tbf.index("burst") + 1]) == 500_000
    slow = local_state.link_shaping_commands("xc-a-n0", 2, None)[1]
    assert int(slow[slow.index("burst") + 1]) == 4 * 1514
    with_delay = local_state.link_shaping_commands("xc-a-n0", 10, 5)
    assert with_delay[2][with_delay[2].index("delay") + 1] == "5ms" and "parent" in with_delay[2]
