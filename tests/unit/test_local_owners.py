"""A machine shared with others: a local cluster records the checkout (and user) that made it; a bare
`--cluster local` refuses another checkout's, `local:NAME` uses it and says whose it is, `fab local-down`
and `fab local-up` leave it alone. A node down: the tasks get the nodes that are up, the down ones
shown as down with what brings them back (never `--replace`), and whether a replacement can come at all.

No local cluster runs here: the clusters are state files in a temporary config dir (the owner record is
data), and the nodes that are up are given; tests/ssh/test_local_cluster.py and
tests/ssh/test_supervised_run.py do the same on real ones.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from cluster.inventory import DOWN, ClusterSelectionError, Inventory
from node_setup.backends.local import LocalGroup, keeper_of, local_inventory, with_down_nodes
from node_setup.local import cluster as lc
from node_setup.local import keeper
from node_setup.local import state as local_state
from tests.fab_run import fab_in_process

ELSEWHERE = "/srv/alice/xeon-cluster"


def recorded(tmp_path, name: str, *, owner: str | None, nodes: int = 3) -> local_state.ClusterPaths:
    """A local cluster's state and inventory files, as local-up writes them, under the test's config dir."""
    paths = local_state.paths_for(name)
    state = local_state.ClusterState(
        name=name, bridge=local_state.bridge_name(name), subnet="10.239.1.0/24", bridge_address="10.239.1.1",
        data_dir=str(tmp_path / "data" / name), cluster_dir=str(paths.cluster_dir), key_path=str(paths.key_path),
        inventory_path=str(paths.inventory_path),
        nodes=[local_state.NodeState(name=f"node{i}", namespace=f"xc-{name}-n{i}", veth=f"xcv-x-{i}",
                                     address=f"10.239.1.{i + 2}", dir=str(tmp_path / "data" / name / f"node{i}"),
                                     sshd_config="/nonexistent/sshd_config") for i in range(nodes)])
    if owner is None:
        local_state.stamp_owner(state)
    else:
        state.owner_checkout, state.owner_user = owner, "alice"
    local_state.save_state(paths, state)
    inventory = local_state.build_inventory(state, sockets=1, physical_cores=2)
    paths.inventory_path.write_text(yaml.safe_dump(local_state.inventory_mapping(inventory), sort_keys=False))
    return paths


@pytest.fixture
def config_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path


def test_local_up_records_this_checkout_and_its_user():
    state = local_state.ClusterState(name="x", bridge="b", subnet="", bridge_address="", data_dir="/d",
                                     cluster_dir="/c", key_path="/c/k", inventory_path="/c/i")
    assert local_state.is_ours(state)  # a state file older than owners counts as anyone's
    local_state.stamp_owner(state)
    assert state.owner_checkout == local_state.this_checkout() and state.owner_user
    assert local_state.ClusterState.from_json(state.to_json()) == state
    state.owner_checkout = ELSEWHERE
    assert not local_state.is_ours(state)


def test_a_bare_cluster_local_refuses_another_checkouts_cluster_and_local_name_uses_it(config_home):
    recorded(config_home, "local", owner=ELSEWHERE)
    with pytest.raises(ClusterSelectionError) as refused:
        local_inventory(None)  # `--cluster local`
    line = str(refused.value)
    assert line.startswith("--cluster local: local cluster 'local' is not this checkout's: checkout "
                           f"{ELSEWHERE} (user alice) made it")
    assert "--cluster local:local" in line and "\n" not in line
    # named explicitly it gets past the owner (and on to whether its nodes run: none do here)
    with pytest.raises(ClusterSelectionError, match="is not running"):
        local_inventory("local")


def test_fab_with_a_bare_cluster_local_says_whose_it_is_in_one_line_and_exit_2(config_home):
    recorded(config_home, "local", owner=ELSEWHERE)
    for argv in (["status", "--cluster", "local"], ["local-reclaim", "node1", "--cluster", "local"]):
        ran = fab_in_process(*argv)
        assert ran.returncode == 2, ran.stdout + ran.stderr
        assert ran.stderr.strip().splitlines() == [ran.stderr.strip()]
        assert f"is not this checkout's: checkout {ELSEWHERE} (user alice) made it" in ran.stderr


def test_local_down_leaves_another_checkouts_cluster_alone_unless_forced(config_home):
    paths = recorded(config_home, "shared", owner=ELSEWHERE)
    ran = fab_in_process("local-down", "--name", "shared")
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert (f"error: local cluster 'shared' is not this checkout's: checkout {ELSEWHERE} (user alice) made it; "
            "left alone") in ran.stderr
    assert "`fab local-down --force --name shared` removes it anyway" in ran.stderr
    assert paths.state_path.exists() and paths.inventory_path.exists()
    with pytest.raises(local_state.LocalClusterError, match="not this checkout's"):
        lc.destroy(paths)
    assert paths.state_path.exists()


def test_local_up_leaves_another_checkouts_cluster_of_that_name_alone(config_home, monkeypatch):
    paths = recorded(config_home, "shared", owner=ELSEWHERE)
    monkeypatch.setattr(lc, "ensure_run_folder", lambda name: None)
    monkeypatch.setattr(lc.system, "check_host", lambda: None)
    for replace_it in (False, True):
        with pytest.raises(local_state.LocalClusterError) as refused:
            lc.create(2, "shared", replace=replace_it)
        assert f"is not this checkout's: checkout {ELSEWHERE} (user alice) made it; left alone" in str(refused.value)
        assert "`fab local-up --nodes 2 --name NAME`" in str(refused.value)
    # none of its nodes runs: no run to lose, so removing it by force is offered
    assert "`fab local-down --force --name shared`" in str(refused.value)
    assert json.loads(paths.state_path.read_text())["owner_checkout"] == ELSEWHERE


# ---------------------------------------------------------------- a node down


def inventory_of(nodes: int = 3) -> tuple[Inventory, local_state.ClusterState]:
    state = local_state.ClusterState(name="demo", bridge="b", subnet="10.239.1.0/24", bridge_address="10.239.1.1",
                                     data_dir="/d", cluster_dir="/c", key_path="/c/k", inventory_path="/c/i",
                                     nodes=[local_state.NodeState(name=f"node{i}", namespace=f"xc-demo-n{i}",
                                                                  veth=f"v{i}", address=f"10.239.1.{i + 2}",
                                                                  dir=f"/d/node{i}", sshd_config="/d/c")
                                            for i in range(nodes)])
    return local_state.build_inventory(state, sockets=1, physical_cores=2), state


def test_a_down_worker_is_left_out_and_shown_with_what_brings_it_back():
    inventory, state = inventory_of()
    got = with_down_nodes(inventory, state, {"node0": True, "node1": True, "node2": False}, None)
    assert [n.name for n in got.nodes] == ["node0", "node1"]
    assert [(n.name, n.state) for n in got.down] == [("node2", DOWN)]
    (note,) = got.notes
    assert note.startswith("local cluster 'demo': node2 down; no group keeper runs")
    assert "`fab local-up --nodes 3 --name demo` does, as a new machine" in note and "--replace" not in note
    assert note.endswith("working with the nodes that are up: node0, node1")
    with pytest.raises(ValueError, match=r"allowed 1 to 2 \(nodes available: node0, node1; down now: node2\)"):
        got.first(3)


def test_with_the_keeper_the_note_says_when_the_replacement_comes():
    inventory, state = inventory_of()
    state.nodes[1].reclaimed_at = 1000.0
    got = with_down_nodes(inventory, state, {"node0": True, "node1": False, "node2": True},
                          {"pid": 4242, "delay_s": 30.0}, now=1012.0)
    assert [n.name for n in got.nodes] == ["node0", "node2"] and [n.name for n in got.down] == ["node1"]
    assert ("node1 down; the group keeper (pid 4242) brings each back as a new machine 30 s after it went down "
            "(node1 in about 18 s)") in got.notes[0]


def test_a_down_master_stays_first_so_that_the_tasks_say_they_cannot_reach_it():
    inventory, state = inventory_of()
    got = with_down_nodes(inventory, state, {"node0": False, "node1": True, "node2": True}, None)
    assert [(n.name, n.state) for n in got.nodes] == [("node0", DOWN), ("node1", "running"), ("node2", "running")]
    assert got.down == () and got.master.name == "node0"
    assert "working with the nodes that are up: node1, node2" in got.notes[0]
    assert with_down_nodes(inventory, state, {n.name: True for n in state.nodes}, None) == inventory


# ---------------------------------------------------------------- whether a replacement can come


@pytest.fixture
def a_keeper():
    """A process that looks like the cluster `demo`'s group keeper in /proc (a test double of one)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "node_setup.local.keeper",
                                "demo", "30"])
    for _ in range(200):  # until it has exec'd (a fork shows its parent's command line)
        if b"node_setup.local.keeper" in Path(f"/proc/{process.pid}/cmdline").read_bytes():
            break
        time.sleep(0.01)
    yield process
    process.kill()
    process.wait()


def test_the_local_group_replaces_a_lost_node_only_while_its_keeper_runs(tmp_path, a_keeper):
    inventory, state = inventory_of()
    state.data_dir = str(tmp_path)
    group = LocalGroup(str(tmp_path))
    assert not group.replaces_lost()  # started without a keeper: no record at all
    record = keeper.group_record(state, {n.name: True for n in state.nodes}, 30.0)
    assert record["keeper"]["delay_s"] == 30.0
    (tmp_path / local_state.GROUP_FILE).write_text(json.dumps({**record, "keeper": {"pid": a_keeper.pid,
                                                                                     "delay_s": 30.0}}))
    assert group.replaces_lost()
    assert keeper_of(tmp_path) == {"pid": a_keeper.pid, "delay_s": 30.0}
    (tmp_path / local_state.GROUP_FILE).write_text(json.dumps({**record, "cluster": "other",
                                                                "keeper": {"pid": a_keeper.pid, "delay_s": 30.0}}))
    assert keeper_of(tmp_path) is None  # that pid keeps another cluster than the record's
    a_keeper.kill()
    a_keeper.wait()
    assert not group.replaces_lost()  # a keeper that ended replaces nothing


def test_groups_that_replace_nothing_say_so():
    from node_setup.backends.inventory import StaticGroup

    assert not StaticGroup([]).replaces_lost()



def test_a_node_that_cannot_see_the_keepers_pid_knows_it_runs_by_its_lock(tmp_path):
    """On a node (its own PID namespace) the record's pid names no process; the keeper's lock in the data
    directory, held while the keeper runs, says it runs, and once it ends, that nothing replaces a lost node."""
    inventory, state = inventory_of()
    record = keeper.group_record(state, {n.name: True for n in state.nodes}, 30.0)
    unseen = max(int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()) + 10_000
    (tmp_path / local_state.GROUP_FILE).write_text(json.dumps({**record, "keeper": {"pid": unseen, "delay_s": 30.0}}))
    assert keeper_of(tmp_path) is None  # neither its pid nor its lock: no keeper
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom pathlib import Path\n"
                               "from node_setup.local.system import holding_lock\n"
                               f"with holding_lock(Path({str(tmp_path / local_state.KEEPER_LOCK_FILE)!r})):\n"
                               "    print('held', flush=True); time.sleep(60)\n"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert keeper_of(tmp_path) == {"pid": unseen, "delay_s": 30.0}
        assert LocalGroup(str(tmp_path)).replaces_lost()
    finally:
        holder.kill()
        holder.wait()
    assert keeper_of(tmp_path) is None and not LocalGroup(str(tmp_path)).replaces_lost()  # its lock ended with it
