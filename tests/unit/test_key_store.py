"""The controller's key store (node_setup/ssh/keys.py) holding only one half of a cluster's key pair: the
fab tasks that need the pair stop with one line naming the file to remove and exit code 2, before any node
is reached (node_setup/tasks/executor.py), and make nothing. The Pulumi program's side is in
tests/infra/test_bad_config.py. The tasks run in this process through the `xeon-cluster` program against an
inventory file of documentation addresses (never reached)."""

from __future__ import annotations

import pytest

from node_setup.ssh import keys
from tests.fab_run import fab_in_process

INVENTORY = "name: lab\nuser: ubuntu\ninstance_type: r7iz.metal-16xl\nhosts: [192.0.2.10, 192.0.2.11]\n"
HALVES = ("id_ed25519", "id_ed25519.pub")


@pytest.fixture
def store(tmp_path, monkeypatch):
    """Cluster lab's key directory in a config directory of the test's own."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return keys.cluster_dir("lab")


@pytest.fixture
def inventory(tmp_path) -> str:
    path = tmp_path / "lab.yaml"
    path.write_text(INVENTORY)
    return str(path)


def half_pair(store, half: str):
    """Only `half` of the pair in the store; (its path, the path of the missing half)."""
    there = store / half
    there.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHalf xeon-cluster:lab\n" if half.endswith(".pub")
                     else "-----BEGIN OPENSSH PRIVATE KEY-----\nhalf\n-----END OPENSSH PRIVATE KEY-----\n")
    return there, store / next(h for h in HALVES if h != half)


@pytest.mark.parametrize("half", HALVES)
def test_the_refusal_names_the_one_file_to_remove(store, half):
    there, missing = half_pair(store, half)
    with pytest.raises(keys.KeyStoreError) as caught:
        keys.ensure_cluster_key("lab")
    line = str(caught.value)
    assert f"remove {there} and rerun" in line and f"({missing.name} is missing)" in line
    assert f" {missing} " not in line  # only the file that is there is named for removal
    assert "\n" not in line
    assert not missing.exists()  # nothing made: the half that is there is not completed with a new other half


@pytest.mark.parametrize("half", HALVES)
def test_fab_distribute_stops_in_one_line_with_exit_2(store, inventory, half):
    there, missing = half_pair(store, half)
    ran = fab_in_process("distribute", "--cluster", inventory)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1
    assert ran.stderr.startswith("error: cluster key of 'lab': ") and f"remove {there} and rerun" in ran.stderr
    assert "Traceback" not in ran.stderr + ran.stdout
    assert not missing.exists()


def test_fab_autostop_stops_in_one_line_with_exit_2(store, inventory, monkeypatch):
    """`fab autostop` distributes the cluster key after refreshing the service on every node: a broken key
    store is the store's line and exit 2, not folded into the task's own "could not record" line (exit 3)."""
    from node_setup.ssh import autostop as remote

    there, _ = half_pair(store, "id_ed25519")
    # test double: the service refreshed on every node (the inventory's documentation addresses are never reached)
    monkeypatch.setattr(remote, "install", lambda conns: [])
    ran = fab_in_process("autostop", "--cluster", inventory)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1
    assert ran.stderr.startswith("error: cluster key of 'lab': ") and f"remove {there} and rerun" in ran.stderr


def test_a_fab_that_looks_while_another_makes_the_pair_waits_for_both_halves(store, monkeypatch):
    """Two fab runs meet a store with no pair: the one that makes it writes the private half, then the public;
    the other, looking in between, must get the whole pair, not the half-pair refusal."""
    import threading

    private_written, looked = threading.Event(), threading.Event()
    write_new = keys._write_new

    def slow_write_new(path, data, mode):  # the maker stops right after the private half is there
        made = write_new(path, data, mode)
        private_written.set()
        looked.wait(timeout=0.5)  # time for the other run to look, if nothing makes it wait
        return made

    monkeypatch.setattr(keys, "_write_new", slow_write_new)
    maker = threading.Thread(target=keys.ensure_cluster_key, args=("lab",))
    maker.start()
    assert private_written.wait(timeout=10)
    monkeypatch.setattr(keys, "_write_new", write_new)
    try:
        found = keys.ensure_cluster_key("lab")
    finally:
        looked.set()
        maker.join(timeout=10)
    assert found.public_key.startswith("ssh-ed25519 ") and found.private_key.startswith("-----BEGIN OPENSSH")
