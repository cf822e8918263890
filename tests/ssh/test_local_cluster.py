"""The local cluster against real sshd in real network namespaces."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from node_setup.controller import secret_folders
from node_setup.local import cluster as lc
from node_setup.local import state as local_state
from node_setup.local import system as local_system

pytestmark = pytest.mark.ssh

REPO = Path(__file__).resolve().parents[2]


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {n["name"] for n in json.loads(out or "[]")}


def _link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", "dev", name], capture_output=True).returncode == 0


def test_nodes_have_own_hostname_home_and_recorded_host_keys(local_cluster, tmp_path):
    """ssh by key with strict host key checking against the recorded keys; own hostname and /root."""
    known_hosts = local_cluster.write_known_hosts(tmp_path / "known_hosts")
    marker = f"marker-{secrets.token_hex(4)}"
    nodes = local_cluster.state.nodes
    for i, node in enumerate(nodes):
        result = local_cluster.ssh(i, f"hostname; echo $HOME; echo {i} > /root/{marker}-{i}", known_hosts)
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == [node.name, "/root"]
        assert node.name == f"node{i}"
    for i, node in enumerate(nodes):
        # each node sees only the marker it wrote itself ...
        result = local_cluster.ssh(i, f"cd /root && ls -d {marker}-*", known_hosts)
        assert result.stdout.split() == [f"{marker}-{i}"]
        # ... which lives in that node's own directory on the host, not in the host's /root
        assert (Path(node.dir) / "root" / f"{marker}-{i}").read_text() == f"{i}\n"
    assert not list(Path("/root").glob(f"{marker}-*"))


def test_a_node_sees_no_controller_process_and_cannot_read_the_controllers_secrets(local_cluster, tmp_path):
    """A node has its own PID namespace and the controller's folders of secrets are empty on it: a process on
    node0 (what a rank is: a child of the node's sshd) finds no controller process in its /proc (not by the
    controller's PID, nor by its command line, nor through /proc/<pid>/root), and reads neither the cluster's
    controller key nor a key put in the controller's key store after the node started; a file elsewhere in
    the config folder (not a secret) it reads as the controller wrote it."""
    known_hosts = local_cluster.write_known_hosts(tmp_path / "known_hosts")
    marker = f"controller-{secrets.token_hex(4)}"
    config = local_cluster.config_home / "xeon-cluster"
    hidden = secret_folders(config)
    probe = hidden[0] / f"{marker}.key"  # the key store: every cluster's key pair, the run-spec key
    key = local_cluster.paths.key_path  # in the local clusters' folder
    assert all(any(p.is_relative_to(folder) for folder in hidden) for p in (probe, key))
    probe.parent.mkdir(parents=True, exist_ok=True)
    probe.write_text(f"{marker}\n")
    visible = config / f"{marker}.txt"  # beside the folders of secrets
    visible.write_text(f"{marker}-not-secret\n")
    controller = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", marker])
    try:
        for _ in range(200):  # the host sees it once the child has exec'd
            if marker.encode() in Path(f"/proc/{controller.pid}/cmdline").read_bytes():
                break
            time.sleep(0.05)
        assert marker.encode() in Path(f"/proc/{controller.pid}/cmdline").read_bytes()
        seen = local_cluster.ssh(0, f"cat /proc/{controller.pid}/cmdline /proc/{os.getpid()}/cmdline; "
                                    f"grep -l {marker} /proc/[0-9]*/cmdline; cat /proc/{controller.pid}/root{probe} "
                                    f"/proc/{controller.pid}/root{key}; echo done", known_hosts)
        listed = " ".join(map(str, hidden))
        files = local_cluster.ssh(0, f"cat {probe} {key}; for d in {listed}; do ls -A $d; done; echo done", known_hosts)
        other = local_cluster.ssh(0, f"cat {visible}", known_hosts)
    finally:
        controller.kill()
        controller.wait()
        probe.unlink()
        visible.unlink()
    assert key.read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY-----") and probe.parent.is_dir()  # here
    assert seen.stdout.splitlines()[-1:] == ["done"], seen.stdout + seen.stderr
    assert marker not in seen.stdout and "PRIVATE KEY" not in seen.stdout, seen.stdout
    assert files.stdout.split() == ["done"], files.stdout  # the folders of secrets are empty on the node
    assert other.stdout == f"{marker}-not-secret\n", other.stdout + other.stderr
    own = local_cluster.ssh(0, "readlink /proc/1/ns/pid /proc/self/ns/pid", known_hosts).stdout.split()
    assert len(set(own)) == 1 and own[0] != os.readlink("/proc/self/ns/pid")  # the node's own, not ours


def test_wrong_host_key_is_refused(local_cluster, tmp_path):
    """The recorded host keys are what the nodes present: node0's key under node1's address fails."""
    nodes = local_cluster.state.nodes
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"{nodes[1].address} {nodes[0].host_key}\n")
    result = local_cluster.ssh(1, "true", known_hosts)
    assert result.returncode == 255
    assert "HOST IDENTIFICATION HAS CHANGED" in result.stderr or "host key" in result.stderr.lower()


def test_nodes_reach_each_other(local_cluster, tmp_path):
    """From node0, every other node's sshd answers with the host key recorded for it."""
    local_cluster.write_known_hosts(tmp_path / "known_hosts")
    others = local_cluster.state.nodes[1:]
    result = local_cluster.ssh(0, "ssh-keyscan -T 5 -t ed25519 " + " ".join(n.address for n in others))
    assert result.returncode == 0, result.stderr
    scanned = {line.split()[0]: " ".join(line.split()[1:3]) for line in result.stdout.splitlines()
               if line and not line.startswith("#")}
    assert scanned == {n.address: n.host_key for n in others}


def test_fabric_connects_with_the_inventory(local_cluster, tmp_path):
    fabric = pytest.importorskip("fabric")
    from paramiko import RejectPolicy
    inventory = local_cluster.inventory
    known_hosts = local_cluster.write_known_hosts(tmp_path / "known_hosts")
    assert inventory.kind == "local" and inventory.user == "root" and inventory.profile == "stock"
    assert [n.address for n in inventory.nodes] == [n.address for n in local_cluster.state.nodes]
    node = inventory.nodes[2]
    config = fabric.Config(overrides={"run": {"in_stream": False}, "load_ssh_configs": False})
    with fabric.Connection(node.address, user=inventory.user, config=config, connect_timeout=10,
                           connect_kwargs={"key_filename": inventory.key_path, "look_for_keys": False,
                                           "allow_agent": False}) as conn:
        conn.client.load_host_keys(str(known_hosts))
        conn.client.set_missing_host_key_policy(RejectPolicy())
        assert conn.run("hostname", hide=True).stdout.strip() == node.name


def test_status_of_a_job_the_master_does_not_hold_is_one_line_and_exit_2(local_cluster):
    """`fab status --job ID` with a well-formed id of no job there: one line and exit 2 (as `fab logs` and `fab get`
    refuse it), before the table; not "not found" twice and exit 0."""
    missing = "20250101-000000-dead"
    status = subprocess.run([sys.executable, "-m", "fabric", "status", "--job", missing, "--cluster",
                             local_cluster.cluster_arg], cwd=REPO, env=local_cluster.env(), capture_output=True,
                            text=True, timeout=120)
    assert status.returncode == 2, status.stdout + status.stderr
    assert status.stdout == "", status.stdout
    assert status.stderr.strip().splitlines() == [f"error: --job: job '{missing}' is not on the master node0; "
                                                  "`fab jobs` lists the jobs there"], status.stderr


def test_local_up_refuses_a_running_cluster_and_replace_replaces(local_cluster_factory):
    cluster = local_cluster_factory(1)
    with pytest.raises(local_state.LocalClusterError, match="already up"):
        lc.create(1, cluster.name, paths=cluster.paths)
    old_pid = cluster.state.nodes[0].sshd_pid
    new_state = lc.create(2, cluster.name, paths=cluster.paths, replace=True)
    assert [n.name for n in new_state.nodes] == ["node0", "node1"]
    assert not local_system.process_alive(old_pid)
    assert lc.is_running(new_state)
    cluster.destroy()


def _node_pids_running(cluster, index: int, marker: str) -> list[int]:
    """The host's PIDs of node `index`'s processes whose command line holds `marker` (one that ended since the
    listing, such as the node's autostop loop's short commands, is not running)."""
    running = []
    for pid in local_system.namespace_pids(cluster.state.nodes[index].namespace):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                running.append(pid)
        except OSError:
            continue
    return running


def test_local_down_removes_exactly_what_local_up_made(local_cluster_factory, tmp_path):
    cluster = local_cluster_factory(2)
    state = cluster.state
    # on node0 a job that takes its SIGTERM (it writes where it was told) and one that ignores it
    told = tmp_path / "told"
    started = cluster.ssh(0, f"sh -c 'trap \"echo TERM > {told}; exit 0\" TERM; sleep 301 & wait' >/dev/null 2>&1 & "
                             "sh -c 'trap \"\" TERM; sleep 302' >/dev/null 2>&1 &")
    assert started.returncode == 0, started.stderr
    for _ in range(100):
        taking, ignoring = _node_pids_running(cluster, 0, "sleep 301"), _node_pids_running(cluster, 0, "sleep 302")
        if taking and ignoring:
            break
        time.sleep(0.05)
    assert taking and ignoring
    jobs = taking + ignoring
    # unrelated things, one named like a node of this cluster would be, must survive local-down
    unrelated = [f"xc-unrelated-{secrets.token_hex(3)}", local_state.namespace_name(cluster.name, 2)]
    for ns in unrelated:
        subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        pids = [n.sshd_pid for n in state.nodes]
        assert all(local_system.process_alive(p) for p in pids)
        assert {n.namespace for n in state.nodes} <= _namespaces()
        assert lc.destroy(cluster.paths) is True

        assert not any(local_system.process_alive(p) for p in pids + jobs)
        assert told.read_text() == "TERM\n"  # SIGTERM first, for whatever takes it
        assert not ({n.namespace for n in state.nodes} & _namespaces())
        assert not _link_exists(state.bridge)
        assert not any(_link_exists(n.veth) for n in state.nodes)
        assert not any(Path(n.dir).exists() for n in state.nodes)
        for path in (cluster.paths.state_path, cluster.paths.inventory_path, cluster.paths.key_path):
            assert not path.exists()
        assert set(unrelated) <= _namespaces()
        # a second run finds nothing to do and touches nothing
        assert lc.destroy(cluster.paths) is False
        assert set(unrelated) <= _namespaces()
    finally:
        for ns in unrelated:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_failed_local_up_cleans_up_after_itself(local_cluster_factory, monkeypatch):
    """A node that cannot start (namespace name taken) makes local-up remove what it made so far."""
    cluster = local_cluster_factory(1)
    cluster.destroy()
    blocker = local_state.namespace_name(cluster.name, 1)
    subprocess.run(["ip", "netns", "add", blocker], check=True)
    try:
        with pytest.raises(local_state.LocalClusterError, match=f"namespace {blocker} already exists"):
            lc.create(2, cluster.name, paths=cluster.paths)
        assert local_state.namespace_name(cluster.name, 0) not in _namespaces()
        assert not _link_exists(local_state.bridge_name(cluster.name))
        assert not cluster.paths.state_path.exists()
        assert blocker in _namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", blocker], capture_output=True)


def test_fab_local_up_and_down_cli(tmp_path):
    """The fab tasks end to end: progress, inventory under XDG_CONFIG_HOME, exit codes."""
    from tests.ssh.conftest import local_cluster_unavailable
    reason = local_cluster_unavailable()
    if reason:
        pytest.skip(reason)
    name = f"f{secrets.token_hex(3)}"
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "cfg"), local_state.DATA_ROOT_ENV: str(tmp_path / "data")}
    fab = [sys.executable, "-m", "fabric"]
    try:
        up = subprocess.run([*fab, "local-up", "--nodes", "2", "--name", name], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
        assert up.returncode == 0, up.stderr
        assert "node1: sshd up" in up.stdout
        # fab has exited; the nodes' sshd keep running without it
        paths = local_state.paths_for(name, config=tmp_path / "cfg" / "xeon-cluster", data=tmp_path / "data")
        state = local_state.load_state(paths)
        assert lc.is_running(state)
        assert all(local_system.port_open(n.address) for n in state.nodes)
        inventory = yaml.safe_load((tmp_path / "cfg" / "xeon-cluster" / "local" / name / "inventory.yaml").read_text())
        assert inventory["kind"] == "local" and len(inventory["hosts"]) == 2
        again = subprocess.run([*fab, "local-up", "--nodes", "2", "--name", name], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=60)
        assert again.returncode == 2 and "already up" in again.stderr
        dist = subprocess.run([*fab, "distribute", "--cluster", f"local:{name}"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120)
        assert dist.returncode == 0, dist.stdout + dist.stderr
        assert (tmp_path / "cfg" / "xeon-cluster" / "keys" / name).is_dir()
    finally:
        down = subprocess.run([*fab, "local-down", "--name", name], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=60)
    assert down.returncode == 0, down.stderr
    assert "removed" in down.stdout
    assert local_state.namespace_name(name, 0) not in _namespaces()
    # the cluster key pair distribute made goes with the cluster
    assert not (tmp_path / "cfg" / "xeon-cluster" / "keys" / name).exists()


def test_names_and_counts_are_validated():
    with pytest.raises(local_state.LocalClusterError, match="--nodes: 0 is not possible; allowed 1 to 64"):
        local_state.validate_node_count(0)
    with pytest.raises(local_state.LocalClusterError, match="--name: 'Bad_Name'"):
        local_state.validate_name("Bad_Name")
    assert all(len(local_state.veth_name("x" * 24, i)) <= 15 for i in range(local_state.MAX_NODES))
    assert len(local_state.bridge_name("x" * 24)) <= 15


def test_cluster_local_resolves_to_the_running_cluster(local_cluster_factory, monkeypatch):
    from node_setup.discovery import ClusterSelectionError, resolve_cluster
    cluster = local_cluster_factory(2)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(cluster.config_home))
    inventory = resolve_cluster(f"local:{cluster.name}")
    assert (inventory.kind, inventory.name, inventory.user) == ("local", cluster.name, "root")
    assert [(n.name, n.address) for n in inventory.nodes] == [(n.name, n.address) for n in cluster.state.nodes]
    assert inventory.key_path == str(cluster.key_path) and inventory.wheelhouse == local_state.DEFAULT_WHEELHOUSE
    assert inventory.physical_cores == local_system.machine_topology()[1]
    assert inventory.down == () and inventory.notes == ()
    # the master's sshd died: the cluster is still found (a run on node1 is not refused, nor wiped by advice
    # to --replace it); the master stays first, shown down, and `fab status` says it cannot be reached
    cluster.stop_sshd(0)
    inventory = resolve_cluster(f"local:{cluster.name}")
    assert [(n.name, n.state) for n in inventory.nodes] == [("node0", "down"), ("node1", "running")]
    assert f"`fab local-up --nodes 2 --name {cluster.name}` does" in inventory.notes[0]
    assert "--replace" not in inventory.notes[0]
    status = subprocess.run([sys.executable, "-m", "fabric", "status", "--cluster", f"local:{cluster.name}"], cwd=REPO,
                            env=cluster.env(), capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "the master node0 cannot be reached" in status.stdout and "no job started yet" not in status.stdout
    assert "note: local cluster" in status.stderr and "node0 down" in status.stderr
    # with no node left the cluster is not running; starting it again is local-up's, never --replace
    cluster.stop_sshd(1)
    with pytest.raises(ClusterSelectionError) as gone:
        resolve_cluster(f"local:{cluster.name}")
    assert f"local cluster '{cluster.name}' is not running" in str(gone.value)
    assert f"`fab local-up --nodes 2 --name {cluster.name}`" in str(gone.value) and "--replace" not in str(gone.value)
    cluster.destroy()
    with pytest.raises(ClusterSelectionError, match=f"no local cluster named '{cluster.name}' is up"):
        resolve_cluster(f"local:{cluster.name}")


def test_pick_subnet_avoids_every_taken_network():
    import ipaddress
    first = local_state.pick_subnet("demo", [])
    assert first.prefixlen == 24 and first.subnet_of(ipaddress.IPv4Network("10.0.0.0/8"))
    assert local_state.pick_subnet("demo", []) == first  # stable for a name
    # the name's own slot and a wide route over its neighbours are taken: the next free one is chosen
    wide = ipaddress.IPv4Network(f"{first.network_address}/20", strict=False)
    chosen = local_state.pick_subnet("demo", [first, wide, ipaddress.IPv4Network("192.0.2.0/24")])
    assert not chosen.overlaps(wide)


def test_check_host_refuses_non_root(monkeypatch):
    monkeypatch.setattr(local_system.os, "geteuid", lambda: 1000)
    with pytest.raises(local_state.LocalClusterError, match=r"needs root: run `sudo fab local-up"):
        local_system.check_host()


def test_known_hosts_text_lists_address_and_alias():
    node = local_state.NodeState(name="node0", namespace="xc-x-n0", veth="v0", address="10.200.0.2",
                                 dir="/d/node0", sshd_config="/d/node0/etc/sshd_config",
                                 host_key="ssh-ed25519 AAAAkey0")
    state = local_state.ClusterState(name="x", bridge="b", subnet="10.200.0.0/24", bridge_address="10.200.0.1",
                                     data_dir="/d", cluster_dir="/c", key_path="/c/k", inventory_path="/c/i",
                                     nodes=[node])
    assert state.known_hosts_text() == "10.200.0.2,node0 ssh-ed25519 AAAAkey0\n"
    assert local_state.ClusterState.from_json(state.to_json()) == state
