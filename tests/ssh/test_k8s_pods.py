"""What a job of `fab k8s-job` runs, run here: each pod's commands and environment, taken from the
rendered manifest (a PyTorchJob or a TrainJob), on a node of a local cluster (one node per pod),
with what the Kubeflow operator and the kubelet would add, and the job ends 0: the offline demo
trains, or your own program (its workdir from the manifest's ConfigMap) forms one world.

The pods are emulated this way, and only this way:
- the operators' variables come from the manifest: the training operator's (PYTHONUNBUFFERED,
  PET_NNODES, the elastic PET_*) through tests/k8s_operator.py, Trainer's torch policy's (PET_NNODES,
  PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR/PORT) through tests/k8s_trainer.py; nothing
  else of the node's environment is passed on (`env -i`, plus the PATH and HOME a container gets);
- cluster DNS: every node's /etc/hosts names every pod (the PyTorchJob's `<job>-worker-<i>`, the
  operator's per-pod Service; the TrainJob's `<job>-node-0-<i>` and `<job>-node-0-<i>.<job>`, under
  the JobSet's headless Service) and every node's hostname (which the rendezvous hands to the others);
- volumes: the PVC is one directory every node sees (the module's jobs share it), each pod's emptyDir
  its own directory, a ConfigMap volume its items written as files of their modes into a directory of
  the pod's own, and a path under a volume's mountPath in the command, a `sh -c` script, the
  environment or workingDir is that directory's; /dev/shm is the node's own;
- a PyTorchJob's init container runs in each pod first, then the pods' commands run together (a
  TrainJob's command does its preparation itself).
The interpreter and torchrun are the node venv's, at the path the image has (cluster/node/profiles.py
venv_dir). The local cluster is this test's own (two nodes), so its hosts files may change.

Budget: four jobs of two pods on it: the demo (4 steps) as a fixed PyTorchJob of two ranks a pod (world
4), an elastic PyTorchJob and a TrainJob of one rank a pod (world 2 each), and your own program as a
TrainJob of two ranks a pod (world 4).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from cluster.job import k8s, trainjob
from node_setup import kubeflow
from tests.k8s_operator import MASTER_ONLY_VARIABLES, operator_env
from tests.processes import run_together
from tests.k8s_trainer import trainer_env, webhook_problems

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
JOB = "xc-pods"
PODS = 2
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Your own program: every rank adds its rank + 1 in one all_reduce; rank 0 writes what it saw.
PROGRAM = {
    "train.py": """import json, os, pathlib
import torch, torch.distributed as dist
from lib import helper
dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
pathlib.Path("written-by-%d.txt" % dist.get_rank()).write_text("beside the program")
if dist.get_rank() == 0:
    out = pathlib.Path(os.environ["XEON_CLUSTER_OUTPUT_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps({"world": dist.get_world_size(), "sum": total.item(),
                                                 "helper": helper.VALUE, "cwd": os.getcwd()}))
dist.destroy_process_group()
""",
    "lib/__init__.py": "",
    "lib/helper.py": "VALUE = 'from the workdir'\n",
    ".env": "TOKEN=never-shipped\n",
}


@pytest.fixture(scope="module")
def pod_nodes(setup_runs, local_cluster_factory):
    """A 2-node local cluster of this module's own, with the cluster DNS of both APIs' pods.
    (`setup_runs`: the node venv under /opt, which every local node sees, is installed.)"""
    cluster = local_cluster_factory(PODS)
    names = [f"{node.address} {k8s.pod_name(JOB, i)} {trainjob.pod_name(JOB, i)} {trainjob.pod_name(JOB, i)}.{JOB} "
             f"{node.name}" for i, node in enumerate(cluster.state.nodes)]
    for node in cluster.state.nodes:
        hosts = Path(node.dir) / "etc" / "hosts"  # bind-mounted as the node's /etc/hosts: rewrite in place
        hosts.write_text(hosts.read_text() + "".join(f"{line}\n" for line in names))
    yield cluster
    cluster.destroy()


def render(tmp_path: Path, api: str, *options: str, ranks_per_node: int = 2) -> Path:
    out = tmp_path / "job.yaml"
    result = subprocess.run([sys.executable, "-m", "fabric", "k8s-job", "--api", api, "--nodes", str(PODS),
                             "--name", JOB, "--image", "registry.example.com/xeon-cluster:test", "--pvc", "shared",
                             "--ranks-per-node", str(ranks_per_node), "--threads", "1", "-o", str(out), *options],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


@dataclass
class Container:
    command: list[str]
    working_dir: str
    env: dict[str, str]
    mounts: list  # V1VolumeMount or Trainer's IoK8sApiCoreV1VolumeMount: name, mount_path


@dataclass
class Pod:
    volumes: dict  # name -> the volume model (persistent_volume_claim, empty_dir, config_map)
    init: Container | None
    main: Container
    injected: dict[str, str]


def pods(text: str) -> tuple[list[Pod], dict[str, bytes]]:
    """Each pod of the job in `text`, with what its operator adds, and the ConfigMap's contents by key."""
    *before, job = kubeflow.documents(text)
    contents = {k: base64.b64decode(v) for c in before for k, v in (c.binary_data or {}).items()}
    out = []
    if job.kind == k8s.KIND:
        workers = job.spec.pytorch_replica_specs[k8s.REPLICA_TYPE]
        spec = workers.template.spec
        (container,) = spec.containers
        env = {e.name: e.value for e in container.env}
        init = None
        if spec.init_containers:
            (first,) = spec.init_containers
            init = Container(list(first.command), first.working_dir, {}, first.volume_mounts)
        for index in range(workers.replicas):
            injected = operator_env(job, index)
            assert not set(injected) & set(MASTER_ONLY_VARIABLES)  # workers only: torchrun's rendezvous sets those
            out.append(Pod({v.name: v for v in spec.volumes}, init,
                           Container(list(container.command), container.working_dir, {**env, **injected},
                                     container.volume_mounts), injected))
        return out, contents
    assert webhook_problems(job) == []
    (patch,) = job.spec.runtime_patches
    pod = patch.training_runtime_spec.template.spec.replicated_jobs[0].template.spec.template.spec
    (container,) = pod.containers
    trainer = job.spec.trainer
    env = {e.name: e.value for e in trainer.env}
    for index in range(trainer.num_nodes):
        injected = trainer_env(job, index)
        out.append(Pod({v.name: v for v in pod.volumes}, None,
                       Container([*trainer.command, *trainer.args], "/", {**env, **injected}, container.volume_mounts),
                       injected))
    return out, contents


def volume_dirs(pod: Pod, container: Container, pvc: Path, pod_dir: Path, contents: dict[str, bytes]) -> dict:
    """mountPath -> the directory that stands in for its volume in this pod (not /dev/shm)."""
    dirs = {}
    for mount in container.mounts:
        volume = pod.volumes[mount.name]
        if volume.persistent_volume_claim is not None:
            dirs[mount.mount_path] = pvc
        elif volume.config_map is not None:
            folder = pod_dir / mount.name
            for item in volume.config_map.items:
                path = folder / item.path
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(contents[item.key])
                path.chmod(item.mode)
            dirs[mount.mount_path] = folder
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


def in_script(script: str, dirs: dict[str, Path]) -> str:
    """A `sh -c` script with every volume path in it on its directory (in one pass, the longest mountPath
    first)."""
    mounts = "|".join(re.escape(m) for m in sorted(dirs, key=len, reverse=True))
    return re.sub(rf"(?<![\w./-])({mounts})(?=/|\s|$)", lambda m: str(dirs[m.group(1)]), script)


def pod_command(container: Container, dirs: dict[str, Path]) -> str:
    """The shell line a node runs for `container`: its workingDir, only its environment, its command."""
    words = list(container.command)
    script = words[:2] == ["sh", "-c"]
    assert all(mount not in word for mount in dirs for i, word in enumerate(words)
               if not word.startswith(mount) and not (script and i == 2)), \
        "a volume path inside a word would not be emulated"
    if script:
        words[2] = in_script(words[2], dirs)
    words = [on_volume(w, dirs) for w in words]
    variables = {"PATH": CONTAINER_PATH, "HOME": "/root", **container.env}
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


@pytest.fixture(scope="module")
def claim(tmp_path_factory) -> Path:
    """The PVC: one directory every node sees, which this module's jobs share as a cluster's jobs share their claim
    (the demo's model made once on it, the hub cache kept); each job's runs folder is its own (run_pods)."""
    return tmp_path_factory.mktemp("pvc")


def run_pods(pod_nodes, pvc: Path, tmp_path: Path, text: str) -> tuple[list[Pod], list[dict[str, Path]]]:
    """Every pod of the job, each on its node: the init container first, then all pods' commands
    together; asserts they all end 0. Returns the pods and each pod's volume directories. The claim's
    runs folder is cleared first: a job of the same name would resume from the one before."""
    found, contents = pods(text)
    assert len(found) == PODS
    shutil.rmtree(pvc / k8s.RUNS_DIR, ignore_errors=True)
    lines, all_dirs = [], []
    for index, pod in enumerate(found):
        pod_dir = tmp_path / f"pod-{index}"
        dirs = volume_dirs(pod, pod.main, pvc, pod_dir, contents)
        all_dirs.append(dirs)
        if pod.init is not None:
            prepared = pod_nodes.ssh(index, pod_command(pod.init, volume_dirs(pod, pod.init, pvc, pod_dir, contents)),
                                     timeout=300)
            assert prepared.returncode == 0, prepared.stdout + prepared.stderr
        lines.append(pod_command(pod.main, dirs))
    try:
        started = run_together([ssh_argv(pod_nodes, i, line) for i, line in enumerate(lines)], tmp_path / "pod-logs",
                               timeout=420)
    finally:
        for pid in processes_under(str(tmp_path)):  # whatever of this test's pods is still running
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    logs = "\n".join(f"--- pod {i} (exit {p.returncode}) ---\n{(p.stdout + p.stderr)[-6000:]}"
                     for i, p in enumerate(started))
    assert [p.returncode for p in started] == [0] * PODS, logs
    return found, all_dirs


# Two ranks per pod only where that is what is checked: the fixed PyTorchJob's torchrun starts
# --nproc-per-node 2 in each pod (world 4); the others one rank a pod (world 2), what differs among them
# being the environment their operator injects (a TrainJob's two ranks a pod, from its PET_NPROC_PER_NODE,
# form one world in test_your_own_program_runs_from_the_workdirs_configmap_in_one_world).
@pytest.mark.parametrize("api, options, ranks_per_node",
                         [(k8s.API_PYTORCHJOB, (), 2), (k8s.API_PYTORCHJOB, ("--min-nodes", "1"), 1),
                          (k8s.API_TRAINJOB, (), 1)],
                         ids=["pytorchjob-fixed", "pytorchjob-elastic", "trainjob"])
def test_the_pods_of_a_rendered_manifest_train_with_the_operators_environment(pod_nodes, claim, tmp_path, api, options,
                                                                              ranks_per_node):
    text = render(tmp_path, api, "--synthetic-examples", "200", "--max-steps", "4", *options,
                  ranks_per_node=ranks_per_node).read_text()
    found, dirs = run_pods(pod_nodes, claim, tmp_path, text)
    main = found[0].main
    if options:
        assert found[0].injected["PET_NNODES"] == "1:2" and \
            found[0].injected["PET_RDZV_ENDPOINT"] == f"{JOB}-worker-0:29400"
    elif api == k8s.API_PYTORCHJOB:
        assert found[0].injected == {"PYTHONUNBUFFERED": "1", "PET_NNODES": "2"}
    else:
        assert found[1].injected["PET_NODE_RANK"] == "1" and found[1].injected["PET_MASTER_ADDR"] == \
            f"{JOB}-node-0-0.{JOB}" and found[1].injected["PET_NPROC_PER_NODE"] == str(ranks_per_node)
    output_dir = Path(on_volume(main.command[main.command.index("--output_dir") + 1], dirs[0]))
    summary = json.loads((output_dir / "summary.json").read_text())
    assert summary["status"] == "completed", summary
    assert summary["world_size"] == PODS * ranks_per_node, summary
    assert summary["nodes"] == PODS, summary


def test_your_own_program_runs_from_the_workdirs_configmap_in_one_world(pod_nodes, claim, tmp_path):
    """A TrainJob's: its command copies the workdir (a PyTorchJob's init container runs the same copy
    command, as it runs the demo's preparation above; tests/unit/test_k8s_own_program.py)."""
    workdir = tmp_path / "program"
    for path, text in PROGRAM.items():
        (workdir / path).parent.mkdir(parents=True, exist_ok=True)
        (workdir / path).write_text(text)
    text = render(tmp_path, k8s.API_TRAINJOB, "--script", str(workdir / "train.py")).read_text()
    assert "path: .env" not in text  # withheld, as fab train withholds it
    _, dirs = run_pods(pod_nodes, claim, tmp_path, text)
    result = json.loads((claim / k8s.RUNS_DIR / JOB / "result.json").read_text())
    copies = [Path(on_volume(k8s.WORKDIR, pod_dirs)) for pod_dirs in dirs]
    assert result.pop("cwd") in [str(c) for c in copies]  # rank 0's pod's own copy
    assert result == {"world": PODS * 2, "sum": 1.0 + 2 + 3 + 4, "helper": "from the workdir"}
    written = []
    for copied in copies:  # each pod's own copy: its two ranks wrote beside the program
        written.append(sorted(p.name for p in copied.glob("written-by-*.txt")))
        assert (copied / "lib" / "helper.py").is_file() and not (copied / ".env").exists()
    assert [len(w) for w in written] == [2, 2] and sorted(sum(written, [])) == [f"written-by-{r}.txt" for r in range(4)]
