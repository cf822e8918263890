"""What a PyTorchJob of `fab k8s-job` runs, run here: each pod's command and environment, taken from
the rendered manifest, on a node of a local cluster (one node per pod), with what the training
operator and the kubelet would add (tests/k8s_operator.py), and the offline demo trains to exit 0.

The pods are emulated this way, and only this way:
- the operator's variables (PYTHONUNBUFFERED, PET_NNODES, the elastic PET_*) come from the
  manifest through tests/k8s_operator.py; nothing else of the node's environment is passed on
  (`env -i`, plus the PATH and HOME a container gets);
- cluster DNS: every node's /etc/hosts names every pod (`<job>-worker-<i>`, the operator's
  per-pod Service) and every node's hostname (a pod's hostname is its Service name, which the
  rendezvous hands to the other agents);
- volumes: the PVC is one directory every node sees, each pod's emptyDir its own directory, and a
  path under a volume's mountPath in the command, environment or workingDir is that directory's;
  /dev/shm is the node's own;
- the init container's command runs in each pod first, then the pods' commands run together.
The interpreter and torchrun are the node venv's, at the path the image has (cluster/node/profiles.py
venv_dir). The local cluster is this test's own (two nodes), so its hosts files may change.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.job import k8s
from node_setup import kubeflow
from tests.k8s_operator import MASTER_ONLY_VARIABLES, operator_env

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
JOB = "xc-pods"
PODS = 2
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.fixture(scope="module")
def pod_nodes(setup_runs, local_cluster_factory):
    """A 2-node local cluster of this module's own, with the cluster DNS of a PyTorchJob's pods.
    (`setup_runs`: the node venv under /opt, which every local node sees, is installed.)"""
    cluster = local_cluster_factory(PODS)
    names = [f"{node.address} {k8s.pod_name(JOB, i)} {node.name}" for i, node in enumerate(cluster.state.nodes)]
    for node in cluster.state.nodes:
        hosts = Path(node.dir) / "etc" / "hosts"  # bind-mounted as the node's /etc/hosts: rewrite in place
        hosts.write_text(hosts.read_text() + "".join(f"{line}\n" for line in names))
    yield cluster
    cluster.destroy()


def render(tmp_path: Path, *options: str) -> Path:
    out = tmp_path / "pytorchjob.yaml"
    result = subprocess.run([sys.executable, "-m", "fabric", "k8s-job", "--nodes", str(PODS), "--name", JOB,
                             "--image", "registry.example.com/xeon-cluster:test", "--pvc", "shared",
                             "--synthetic-examples", "200", "--ranks-per-node", "2", "--threads", "1",
                             "-o", str(out), *options], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def volume_dirs(spec, container, pvc: Path, pod_dir: Path) -> dict[str, Path]:
    """mountPath -> the directory that stands in for its volume in this pod (not /dev/shm)."""
    volumes = {v.name: v for v in spec.volumes}
    dirs = {}
    for mount in container.volume_mounts:
        volume = volumes[mount.name]
        if volume.persistent_volume_claim is not None:
            dirs[mount.mount_path] = pvc
        elif volume.empty_dir is not None and volume.empty_dir.medium != "Memory":
            dirs[mount.mount_path] = pod_dir / mount.name
        else:
            assert mount.mount_path == k8s.SHM_MOUNT, f"unexpected volume {mount.name}"
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    return dirs


def on_volume(value: str, dirs: dict[str, Path]) -> str:
    for mount, path in dirs.items():
        if value == mount or value.startswith(mount + "/"):
            return str(path) + value[len(mount):]
    return value


def pod_command(container, env: dict[str, str], dirs: dict[str, Path]) -> str:
    """The shell line a node runs for `container`: its workingDir, only its environment, its command."""
    assert all(mount not in word for mount in dirs for word in container.command if not word.startswith(mount)), \
        "a volume path inside a word would not be emulated"
    variables = {"PATH": CONTAINER_PATH, "HOME": "/root", **env}
    words = [on_volume(w, dirs) for w in container.command]
    assignments = [f"{key}={on_volume(value, dirs)}" for key, value in variables.items()]
    return (f"cd {shlex.quote(on_volume(container.working_dir, dirs))} && exec env -i "
            f"{shlex.join(assignments)} {shlex.join(words)}")


def ssh_argv(cluster, index: int, command: str) -> list[str]:
    node = cluster.state.nodes[index]
    return ["ssh", "-F", "none", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={cluster.known_hosts}", "-o", "IdentitiesOnly=yes",
            "-i", str(cluster.key_path), f"root@{node.address}", command]


def processes_under(marker: str) -> list[int]:
    """PIDs of processes whose command line holds `marker` (the test's own directory)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return [pid for pid in found if pid != os.getpid()]


@pytest.mark.parametrize("options", [(), ("--min-nodes", "1")], ids=["fixed", "elastic"])
def test_the_pods_of_a_rendered_manifest_train_with_the_operators_environment(pod_nodes, tmp_path, options):
    job = kubeflow.from_yaml(render(tmp_path, *options).read_text())
    workers = job.spec.pytorch_replica_specs[k8s.REPLICA_TYPE]
    spec = workers.template.spec
    (container,) = spec.containers
    (init,) = spec.init_containers
    assert workers.replicas == PODS and container.command[0].endswith("/bin/torchrun")
    container_env = {e.name: e.value for e in container.env}
    pvc = tmp_path / "pvc"
    lines, seen = [], []
    for index in range(PODS):
        injected = operator_env(job, index)
        assert not set(injected) & set(MASTER_ONLY_VARIABLES)  # workers only: torchrun's rendezvous sets those
        seen.append(injected)
        dirs = volume_dirs(spec, container, pvc, tmp_path / f"pod-{index}")
        prepared = pod_nodes.ssh(index, pod_command(init, {}, volume_dirs(spec, init, pvc, tmp_path / f"pod-{index}")),
                                 timeout=300)
        assert prepared.returncode == 0, prepared.stdout + prepared.stderr
        lines.append(pod_command(container, {**container_env, **injected}, dirs))
    if options:
        assert seen[0]["PET_NNODES"] == "1:2" and seen[0]["PET_RDZV_ENDPOINT"] == f"{JOB}-worker-0:29400"
    else:
        assert seen[0] == {"PYTHONUNBUFFERED": "1", "PET_NNODES": "2"}

    pods = [subprocess.Popen(ssh_argv(pod_nodes, i, line), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for i, line in enumerate(lines)]
    outputs = []
    try:
        deadline = time.monotonic() + 420
        for pod in pods:
            outputs.append(pod.communicate(timeout=max(1, deadline - time.monotonic()))[0])
    finally:
        for pid in processes_under(str(tmp_path)):  # whatever of this test's pods is still running
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pod in pods:
            if pod.poll() is None:
                pod.kill()
    logs = "\n".join(f"--- pod {i} (exit {p.returncode}) "
                     f"---\n{o[-6000:]}" for i, (p, o) in enumerate(zip(pods, outputs)))
    assert [p.returncode for p in pods] == [0] * PODS, logs

    output_dir = Path(on_volume(container.command[container.command.index("--output_dir") + 1], {k8s.WORK_MOUNT: pvc}))
    summary = json.loads((output_dir / "summary.json").read_text())
    assert summary["status"] == "completed", summary
    assert summary["world_size"] == PODS * int(job.spec.nproc_per_node) == 4, summary
    assert summary["nodes"] == PODS, summary
