"""`fab clusters`: the local clusters' state files (two here, as `fab local-up` writes them; their nodes'
namespaces do not exist on this machine, so every node is down, as after a reboot) and an AWS stack's file,
not queried without --aws (EC2 with --aws: nothing here reaches AWS)."""

from __future__ import annotations

from cluster.cost.clusterlist import NOT_QUERIED
from node_setup.local import state as local_state
from node_setup.tasks.clusters import aws_rows
from tests.fab_run import fab_in_process

STACK = """config:
  aws:region: eu-west-1
  xeon-cluster:publicKey: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICECnqlEndt9BEuNRtVWwmWQcvgQq/FYgx/iofqx4Int you@laptop
  xeon-cluster:adminCidrs:
    - 203.0.113.7/32
  xeon-cluster:workerCount: 1
"""


def saved(name: str, nodes: int, *, owner: str = "") -> None:
    paths = local_state.paths_for(name)
    paths.cluster_dir.mkdir(parents=True)
    state = local_state.ClusterState(
        name=name, bridge=f"xcb-{name}", subnet="10.216.21.0/24", bridge_address="10.216.21.1",
        data_dir=str(paths.data_dir), cluster_dir=str(paths.cluster_dir), key_path="k", inventory_path="i",
        nodes=[local_state.NodeState(f"node{i}", f"xc-{name}-n{i}", f"xcv-{name}{i}", f"10.216.21.{i + 2}",
                                     str(paths.data_dir / f"node{i}"), "c", sshd_pid=1) for i in range(nodes)])
    local_state.stamp_owner(state)
    if owner:
        state.owner_checkout = owner
    local_state.save_state(paths, state)


def test_two_local_clusters_and_an_aws_stack_each_a_row(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    saved("local", 4)
    saved("bench8", 2, owner="/elsewhere/xeon-cluster")
    ran = fab_in_process("clusters", env={"XDG_CONFIG_HOME": str(tmp_path / "config")})
    assert ran.returncode == 0, ran.stdout + ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0] == "clusters this checkout knows:" and lines[1].split()[:6] == [
        "cluster", "kind", "state", "nodes", "spent", "so"]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == {"local", "local:bench8"}
    assert rows["local"][1:5] == ["local", "down", "4", "$0.00"] and rows["local:bench8"][1:5] == [
        "local", "down", "2", "$0.00"]
    assert "a local cluster has no price" in lines[2] and "/elsewhere/xeon-cluster" in lines[2] + lines[3]
    (tmp_path / "Pulumi.dev.yaml").write_text(STACK)
    (tmp_path / "Pulumi.example.yaml").write_text(STACK)  # the example is no stack
    [row] = aws_rows(query=False, root=tmp_path)
    assert (row.name, row.kind, row.state, row.nodes, row.spent_usd) == ("xeon-dev", "aws", NOT_QUERIED, 2, None)
    assert row.note == "stack dev (Pulumi.dev.yaml), eu-west-1"
