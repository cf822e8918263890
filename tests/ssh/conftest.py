"""Real local clusters (network namespaces + sshd) for the tests that need SSH, MPI or Fabric.

Fixtures:
    local_cluster            session-scoped, 3 running nodes; share it, do not break it
    local_cluster_factory    session-scoped callable: ``local_cluster_factory(nodes)`` gives a new,
                             separate cluster (e.g. to stop one node's sshd); every cluster it made
                             is removed at session end, or earlier with ``cluster.destroy()``

Each cluster has a unique name per session (``t<random>-<n>``) and keeps its config dir (key,
inventory, state) and node directories under pytest's temporary directory, so concurrent test
sessions and the user's own `fab local-up` never collide. Teardown goes by the recorded names and
PIDs only. Tests here skip with the reason when the machine cannot run a local cluster.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from cluster.inventory import Inventory
from node_setup.backends.files import load_inventory_file
from node_setup.local import cluster as lc
from node_setup.local import state as local_state
from node_setup.local import system as local_system
from tests.ssh.warm_nodes import WarmNodes


def local_cluster_unavailable() -> str | None:
    """Why a local cluster cannot run here, or None."""
    if not sys.platform.startswith("linux"):
        return f"local cluster needs Linux network namespaces (this is {sys.platform})"
    if os.geteuid() != 0:
        return "local cluster needs root (network namespaces, bind mounts)"
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux"), ("ssh", "openssh-client"),
                          ("ssh-keygen", "openssh-client")):
        if not shutil.which(tool):
            return f"`{tool}` not found (install {package})"
    if not os.access(local_system.SSHD, os.X_OK):
        return f"{local_system.SSHD} not found (install openssh-server)"
    probe = f"xc-probe-{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` is not permitted here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@dataclass
class RunningLocalCluster:
    """A local cluster made for tests, with what tests need to reach it."""

    state: local_state.ClusterState
    paths: local_state.ClusterPaths
    config_home: Path  # XDG_CONFIG_HOME under which its key, inventory and state live
    data_root: Path
    known_hosts: Path  # every node's recorded host key, by address and alias (the test's own file)
    warm: WarmNodes | None = None

    def start_jobs_warm(self) -> None:
        """Its nodes' `python -m training...` from this session's warm servers, once the node venv exists
        (tests/ssh/warm_nodes.py); called again after a setup that made the venv."""
        if self.warm:
            self.warm.mark(self.state.data_dir)

    @property
    def name(self) -> str:
        return self.paths.name

    @property
    def inventory_path(self) -> Path:
        return self.paths.inventory_path

    @property
    def key_path(self) -> Path:
        return self.paths.key_path

    @property
    def cluster_arg(self) -> str:
        """What to pass as `--cluster` (the inventory file path; works with any environment)."""
        return str(self.paths.inventory_path)

    @property
    def inventory(self) -> Inventory:
        """As `--cluster` finds it: the local backend's facts (shared cores, the shared output root)."""
        return load_inventory_file(self.paths.inventory_path)

    def env(self) -> dict[str, str]:
        """Environment for a `fab` subprocess that should find this cluster as `--cluster local:NAME`."""
        return {**os.environ, "XDG_CONFIG_HOME": str(self.config_home), local_state.DATA_ROOT_ENV: str(self.data_root)}

    def write_known_hosts(self, path: Path) -> Path:
        path.write_text(self.state.known_hosts_text())
        return path

    def ssh(self, index: int, command: str, known_hosts: Path | None = None,
            timeout: float = 30, input: str | None = None) -> subprocess.CompletedProcess:
        """Run `command` on node `index` with the system ssh client, host keys checked strictly
        against `known_hosts` (default: the recorded host keys), with `input` on its stdin."""
        node = self.state.nodes[index]
        known_hosts = known_hosts or self.known_hosts
        return subprocess.run(
            ["ssh", "-F", "none", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
             "-o", f"UserKnownHostsFile={known_hosts}", "-o", "ConnectTimeout=10", "-o", "IdentitiesOnly=yes",
             "-i", str(self.key_path), f"root@{node.address}", command],
            input=input, capture_output=True, text=True, timeout=timeout)

    def stop_sshd(self, index: int) -> None:
        """Stop node `index`'s sshd (by its recorded PID): the node becomes unreachable by SSH."""
        node = self.state.nodes[index]
        local_system.stop_pids([node.sshd_pid])

    def destroy(self) -> bool:
        return lc.destroy(self.paths)


@pytest.fixture(scope="session")
def local_cluster_factory(tmp_path_factory):
    reason = local_cluster_unavailable()
    if reason:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("xc-local")
    session_tag = secrets.token_hex(3)
    made: list[RunningLocalCluster] = []
    warm = WarmNodes()

    def make(nodes: int = 3) -> RunningLocalCluster:
        name = f"t{session_tag}-{len(made)}"
        config_home, data = base / "config", base / "data"
        paths = local_state.paths_for(name, config=config_home / "xeon-cluster", data=data)
        state = lc.create(nodes, name, paths=paths)
        known_hosts = base / f"{name}.known_hosts"
        known_hosts.write_text(state.known_hosts_text())
        cluster = RunningLocalCluster(state=state, paths=paths, config_home=config_home, data_root=data,
                                      known_hosts=known_hosts, warm=warm)
        cluster.start_jobs_warm()
        made.append(cluster)
        return cluster

    yield make
    failures = []
    for cluster in made:  # every cluster gets its teardown, even if one fails
        try:
            cluster.destroy()
        except local_state.LocalClusterError as exc:
            failures.append(str(exc))
    if failures:
        pytest.fail("local cluster teardown incomplete: " + " | ".join(failures))


@pytest.fixture(scope="session")
def local_cluster(local_cluster_factory) -> RunningLocalCluster:
    return local_cluster_factory(3)


# ---------------------------------------------------------------- FAB-SETUP: the session's cluster, set up

REPO_ROOT = Path(__file__).resolve().parents[2]
FAB = [sys.executable, "-m", "fabric"]


def run_fab(cluster: RunningLocalCluster, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """`fab <args> --cluster <cluster's inventory>` from the repo root, in the cluster's environment."""
    return subprocess.run([*FAB, *args, "--cluster", cluster.cluster_arg], cwd=REPO_ROOT, env=cluster.env(),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def setup_runs(local_cluster) -> dict[str, subprocess.CompletedProcess]:
    """`fab setup` then `fab distribute` on the session's 3-node cluster, once per session.

    The first setup of a fresh machine fills the wheelhouse and builds the shared venv in
    /opt/xeon-cluster (a few minutes); later sessions find both done and take seconds.
    """
    runs = {"setup": run_fab(local_cluster, "setup", timeout=1800)}
    if runs["setup"].returncode != 0:
        pytest.fail(f"fab setup failed (exit "
                    f"{runs['setup'].returncode}):\n{runs['setup'].stdout}\n{runs['setup'].stderr}")
    local_cluster.start_jobs_warm()
    runs["distribute"] = run_fab(local_cluster, "distribute", timeout=120)
    if runs["distribute"].returncode != 0:
        pytest.fail(f"fab distribute failed:\n{runs['distribute'].stdout}\n{runs['distribute'].stderr}")
    return runs


@pytest.fixture(scope="session")
def installed_cluster(local_cluster, setup_runs) -> RunningLocalCluster:
    """The session's 3-node local cluster with the stock profile installed (`fab setup`) and the
    cluster key, ssh config, known_hosts and ~/hosts distributed (`fab distribute`)."""
    return local_cluster
