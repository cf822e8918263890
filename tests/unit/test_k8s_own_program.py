"""`fab k8s-job --script/--module`: your own program on Kubernetes, for both APIs. The workdir's copy plan is
`fab train`'s (node_setup/ssh/workdir.py: credentials withheld), carried in a ConfigMap ahead of the job
(cluster/job/k8s.py WorkdirConfigMap) and copied into the pod's scratch volume before torchrun starts."""

from __future__ import annotations

import base64
import hashlib
import os
import stat
import subprocess

import pytest
import yaml

from cluster.job import k8s
from node_setup.ssh.workdir import scan
from tests.fab_run import fab_in_process

IMAGE = "registry.example.com/xeon-cluster:0.1.0"


@pytest.fixture
def workdir(tmp_path):
    root = tmp_path / "program"
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('training')\n")
    (root / "train.py").chmod(0o755)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "main.py").write_text("print('main')\n")
    (root / "pkg" / "copy.txt").write_text("print('main')\n")  # the same content as main.py: stored once
    (root / ".env").write_text("TOKEN=x\n")  # withheld, as fab train withholds it
    (root / "id_rsa").write_text("key\n")
    return root


def documents(*options: str) -> list[dict]:
    result = fab_in_process("k8s-job", "--image", IMAGE, *options)
    assert result.returncode == 0, result.stderr
    return list(yaml.safe_load_all(result.stdout))


def pod_of(api: str, job: dict) -> tuple[dict, dict]:
    """(pod spec, the training container's fields) of either API (a TrainJob's pod is its runtime patch)."""
    if api == k8s.API_PYTORCHJOB:
        spec = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
        return spec, spec["containers"][0]
    (patch,) = job["spec"]["runtimePatches"]
    spec = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return spec, {**job["spec"]["trainer"], **spec["containers"][0]}


@pytest.mark.parametrize("api", k8s.APIS)
def test_the_workdir_travels_in_a_configmap_without_what_fab_train_withholds(api, workdir):
    configmap, job = documents("--api", api, "--script", str(workdir / "train.py"))
    assert configmap["metadata"] == {"labels": k8s.labels(k8s.DEFAULT_NAME), "name": "xeon-cluster-job-workdir",
                                     "namespace": "default"}
    data = {key: base64.b64decode(value) for key, value in configmap["binaryData"].items()}
    assert all(hashlib.sha256(content).hexdigest() == key for key, content in data.items())
    spec, container = pod_of(api, job)
    (volume,) = [v for v in spec["volumes"] if v["name"] == k8s.VOLUME_WORKDIR]
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    items = {i["path"]: i for i in volume["configMap"]["items"]}
    assert sorted(items) == ["pkg/__init__.py", "pkg/copy.txt", "pkg/main.py", "train.py"]  # no .env, no id_rsa
    assert {path: data[i["key"]] for path, i in items.items()} == {
        path: (workdir / path).read_bytes() for path in items}
    assert len(data) == 3  # main.py and copy.txt share one key
    assert items["train.py"]["mode"] == 0o755 and items["pkg/main.py"]["mode"] == 0o644
    assert {"mountPath": k8s.WORKDIR_SOURCE, "name": k8s.VOLUME_WORKDIR, "readOnly": True} in container["volumeMounts"]


@pytest.mark.parametrize("api", k8s.APIS)
def test_every_rank_runs_the_program_through_the_runner_from_the_pods_copy(api, workdir):
    _, job = documents("--api", api, "--nodes", "2", "--script", str(workdir / "train.py"), "--args",
                       '--epochs 2 --name "run one"', "--", "--seed", "3")
    spec, container = pod_of(api, job)
    words = container["command"] if api == k8s.API_PYTORCHJOB else container["args"]
    at = words.index("-m")
    assert words[at:] == ["-m", "xeon_cluster.run", "--script", "train.py", "--", "--epochs", "2", "--name", "run one",
                        "--seed", "3"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["XEON_CLUSTER_OUTPUT_DIR"] == f"{k8s.WORK_MOUNT}/runs/{k8s.DEFAULT_NAME}"
    copy_command = k8s.plan_workdir_configmap(k8s.DEFAULT_NAME, scan(workdir)).copy_command
    if api == k8s.API_PYTORCHJOB:
        assert container["workingDir"] == k8s.WORKDIR
        (init,) = spec["initContainers"]
        assert init["command"] == ["sh", "-c", copy_command] and init["workingDir"] == k8s.SCRATCH_MOUNT
        assert init["volumeMounts"] == container["volumeMounts"]
    else:
        assert container["command"][2] == f'cd {k8s.SCRATCH_MOUNT} && ( {copy_command} ) && cd {k8s.WORKDIR} && ' \
                                          'exec "$@"'
    module_job = documents("--api", api, "--module", "pkg.main", "--workdir", str(workdir))[-1]
    _, module_container = pod_of(api, module_job)
    words = module_container["command"] if api == k8s.API_PYTORCHJOB else module_container["args"]
    assert words[words.index("-m"):] == ["-m", "xeon_cluster.run", "--module", "pkg.main", "--"]


def test_the_copy_command_rebuilds_the_workdir_from_the_kubelets_configmap_volume(workdir, tmp_path):
    plan = k8s.plan_workdir_configmap("job", scan(workdir))
    # The kubelet's layout of a ConfigMap volume with items: the files under a timestamped folder,
    # `..data` a link to it, and each top-level name a link into `..data`.
    mount = tmp_path / "mount"
    stamped = mount / "..2026_01_01_00_00_00.000000001"
    for key, path, mode in plan.items:
        target = stamped / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((workdir / plan.contents[key].path).read_bytes())
        target.chmod(mode)
    (mount / "..data").symlink_to(stamped.name)
    for top in {path.split("/")[0] for _, path, _ in plan.items}:
        (mount / top).symlink_to(f"..data/{top}")
    scratch = tmp_path / "scratch"
    command = plan.copy_command.replace(k8s.WORKDIR_SOURCE, str(mount)).replace(k8s.SCRATCH_MOUNT, str(scratch))
    subprocess.run(["sh", "-c", command], check=True, timeout=30)
    copied = scratch / "workdir"
    found = sorted(str(p.relative_to(copied)) for p in copied.rglob("*") if not p.is_dir())
    assert found == ["pkg/__init__.py", "pkg/copy.txt", "pkg/main.py", "train.py"]
    for path in found:
        assert not os.path.islink(copied / path) and (copied / path).read_bytes() == (workdir / path).read_bytes()
    assert os.stat(copied / "train.py").st_mode & stat.S_IXUSR and not os.stat(copied / "pkg/main.py").st_mode & 0o111
    (copied / "out.txt").write_text("the program may write beside itself")


@pytest.mark.parametrize("api", k8s.APIS)
@pytest.mark.parametrize("case, message", [
    ("big", "--workdir: {workdir} holds 1.1 MB to copy, over a ConfigMap's 1.0 MB"),
    ("builtin", "--epochs: an option of the built-in job, not allowed with --script/--module"),
    ("args alone", "--args: only with --script or --module"),
    ("withheld script", "--script: .hidden.py is not copied"),
    ("outside", "--script: {workdir.parent}/elsewhere.py is outside the workdir"),
    ("reserved env", "--env: XEON_CLUSTER_OUTPUT_DIR is set by the launch itself"),
])
def test_what_your_program_cannot_take_is_one_line_and_exit_2(api, case, message, workdir):
    script = str(workdir / "train.py")
    options = {
        "big": ("--script", script),
        "builtin": ("--script", script, "--epochs", "2"),
        "args alone": ("--args", "--epochs 2"),
        "withheld script": ("--script", str(workdir / ".hidden.py"), "--workdir", str(workdir)),
        "outside": ("--script", str(workdir / ".." / "elsewhere.py"), "--workdir", str(workdir)),
        "reserved env": ("--script", script, "--env", "XEON_CLUSTER_OUTPUT_DIR=/x"),
    }[case]
    (workdir / ".hidden.py").write_text("print('hidden')\n")
    (workdir.parent / "elsewhere.py").write_text("print('elsewhere')\n")
    if case == "big":
        (workdir / "weights.bin").write_bytes(os.urandom(1024 * 1024 + 100 * 1024))
    result = fab_in_process("k8s-job", "--api", api, "--image", IMAGE, *options)
    assert result.returncode == 2 and not result.stdout, result.stdout
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: " + message.format(workdir=workdir)), line
