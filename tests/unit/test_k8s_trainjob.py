"""`fab k8s-job --api trainjob`: the Kubeflow Trainer v2 TrainJob (cluster/job/trainjob.py, node_setup/kubeflow.py).
Its schema validation is tests/unit/test_k8s_schemas.py; your own program in it test_k8s_own_program.py; the
pods' run tests/ssh/test_k8s_pods.py."""

from __future__ import annotations

import copy

import pytest
import yaml

from cluster.job import k8s, trainjob
from cluster.job.layout import KMP_BLOCKTIME
from cluster.node.profiles import TCMALLOC_PATH, get_profile, venv_dir
from node_setup import kubeflow
from tests.fab_run import fab_in_process
from tests import k8s_schema
from tests.k8s_trainer import status_injection, status_problems, trainer_env, webhook_problems

IMAGE = "registry.example.com/xeon-cluster:0.1.0"
TORCHRUN_OPTIONS = ("--nnodes", "--nproc-per-node", "--node-rank", "--master-addr", "--master-port", "--rdzv-backend",
                    "--rdzv-endpoint", "--rdzv-id", "--standalone")


def fab_k8s_job(*options: str) -> str:
    result = fab_in_process("k8s-job", "--api", "trainjob", "--image", IMAGE, *options)
    assert result.returncode == 0, result.stderr
    return result.stdout


def patched_pod(manifest: dict) -> dict:
    (patch,) = manifest["spec"]["runtimePatches"]
    (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert rjob["name"] == "node"
    return rjob["template"]["spec"]["template"]


@pytest.fixture(scope="module")
def text() -> str:
    return fab_k8s_job("--nodes", "4", "--pvc", "xeon-data", "--checkpoint-every", "30m", "--checkpoint-uri",
                       "s3://my-bucket/ckpt", "--", "--learning_rate", "3e-5")


def test_the_trainjob_references_the_torch_runtime_and_round_trips_through_trainers_models(text):
    manifest = yaml.safe_load(text)
    assert (manifest["apiVersion"], manifest["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert manifest["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                              "name": "torch-distributed"}
    (job,) = kubeflow.documents(text)
    assert type(job).__name__ == "TrainerV1alpha1TrainJob"
    assert type(job.spec.trainer.resources_per_node).__name__ == "IoK8sApiCoreV1ResourceRequirements"
    assert kubeflow.to_dict(job) == manifest  # nothing lost or renamed on the way back
    assert webhook_problems(job) == []


def test_nodes_ranks_and_resources_come_from_the_layout(text):
    trainer = yaml.safe_load(text)["spec"]["trainer"]
    assert trainer["numNodes"] == 4 and trainer["image"] == IMAGE
    assert trainer["numProcPerNode"] == 2  # one rank per socket; left out, the policy would start one per vCPU
    resources = trainer["resourcesPerNode"]
    assert resources["requests"] == resources["limits"] == {"cpu": "60", "memory": "460Gi"}  # guaranteed QoS
    env = {e["name"]: e["value"] for e in trainer["env"]}
    assert env["OMP_NUM_THREADS"] == "15" and env["LD_PRELOAD"] == TCMALLOC_PATH
    assert env["HF_HOME"].startswith(k8s.WORK_MOUNT + "/")


def test_the_torch_policy_gives_torchrun_its_rendezvous_and_the_command_contradicts_none_of_it(text):
    manifest = yaml.safe_load(text)
    trainer = manifest["spec"]["trainer"]
    args = trainer["args"]
    assert args[0] == f"{venv_dir(get_profile('stock'))}/bin/torchrun"
    assert args[1:3] == ["-m", "training"]
    assert not set(args[:args.index("-m")]) & set(TORCHRUN_OPTIONS)  # every one of them from PET_*
    (job,) = kubeflow.documents(text)
    for index in (0, 3):
        injected = trainer_env(job, index)
        assert injected["PET_NNODES"] == "4" and injected["PET_NPROC_PER_NODE"] == "2"
        assert injected["PET_NODE_RANK"] == str(index)
        assert injected["PET_MASTER_ADDR"] == f"{k8s.DEFAULT_NAME}-node-0-0.{k8s.DEFAULT_NAME}"
        assert injected["PET_MASTER_PORT"] == str(trainjob.MASTER_PORT)
    assert not [e for e in trainer["env"] if e["name"].startswith("PET_")]
    # the built-in job: a restarted pod resumes; the checkpoint settings reach it
    for words in (["--resume"], ["--checkpoint_minutes", "30"], ["--checkpoint_uri", "s3://my-bucket/ckpt"],
                  ["--output_dir", f"{k8s.WORK_MOUNT}/runs/{k8s.DEFAULT_NAME}"], ["--learning_rate", "3e-5"]):
        at = args.index(words[0])
        assert args[at:at + len(words)] == words


def test_the_command_goes_to_the_working_directory_and_execs_torchrun(text):
    command = yaml.safe_load(text)["spec"]["trainer"]["command"]
    assert command == ["sh", "-c", f'cd {k8s.WORK_MOUNT} && exec "$@"', trainjob.SHELL_NAME]
    demo = yaml.safe_load(fab_k8s_job("--synthetic-examples", "300"))["spec"]["trainer"]
    script = demo["command"][2]
    assert script.startswith(f"cd {k8s.SCRATCH_MOUNT} && ( ") and "training.synthetic" in script
    assert script.endswith(f') && cd {k8s.SCRATCH_MOUNT} && exec "$@"')
    train_file = demo["args"][demo["args"].index("--train_file") + 1]
    assert train_file.startswith("xeon-cluster-data/synthetic-qa-300/")  # relative to /scratch, where it was made


def test_the_pod_is_the_pytorchjobs_pod_in_a_runtime_patch(text):
    manifest = yaml.safe_load(text)
    (patch,) = manifest["spec"]["runtimePatches"]
    assert patch["manager"] == trainjob.PATCH_MANAGER
    pod = patched_pod(manifest)
    v1 = yaml.safe_load(fab_in_process("k8s-job", "--image", IMAGE, "--nodes", "4", "--pvc", "xeon-data").stdout)
    v1_pod = v1["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    (v1_container,) = v1_pod["spec"]["containers"]
    assert pod["metadata"] == v1_pod["metadata"] == {"labels": k8s.labels(k8s.DEFAULT_NAME)}
    for key in ("volumes", "nodeSelector", "securityContext"):
        assert pod["spec"][key] == v1_pod["spec"][key], key
    (container,) = pod["spec"]["containers"]
    assert container == {"name": "node", "securityContext": v1_container["securityContext"],
                         "volumeMounts": v1_container["volumeMounts"]}
    assert {"name": "work", "persistentVolumeClaim": {"claimName": "xeon-data"}} in pod["spec"]["volumes"]


@pytest.mark.parametrize("profile, expected", [
    ("stock", {"OMP_NUM_THREADS": "15", "LD_PRELOAD": TCMALLOC_PATH, "KMP_BLOCKTIME": KMP_BLOCKTIME}),
    ("intel", {"OMP_NUM_THREADS": "13", "LD_PRELOAD": TCMALLOC_PATH, "KMP_BLOCKTIME": KMP_BLOCKTIME,
               "CCL_WORKER_COUNT": "2", "CCL_ATL_TRANSPORT": "ofi"}),
])
def test_the_profiles_settings_are_in_every_pod(profile, expected):
    trainer = yaml.safe_load(fab_k8s_job("--nodes", "2", "--profile", profile))["spec"]["trainer"]
    env = {e["name"]: e["value"] for e in trainer["env"]}
    assert {k: env.get(k) for k in expected} == expected
    assert trainer["args"][0] == f"{venv_dir(get_profile(profile))}/bin/torchrun"
    assert not [k for k in env if k.startswith("I_MPI_")]


@pytest.mark.parametrize("options, message", [
    (("--min-nodes", "2", "--nodes", "3"), "--min-nodes: 2 is not allowed with --api trainjob"),
    (("--max-restarts", "2"), "--max-restarts: 2 is not allowed with --api trainjob"),
    (("--name", "A"), "--name: 'A' is not allowed"),
    (("--env", "PET_NNODES=3"), "--env: PET_NNODES is set by the launch itself"),
    (("--env", "KUBEFLOW_TRAINER_SERVER_URL=https://x"), "--env: KUBEFLOW_TRAINER_SERVER_URL is set by Trainer's "
                                                         "control plane in a TrainJob"),
    (("--", "--output_dir", "/var/run/secrets/kubeflow/trainer/out"),
     "--output_dir: '/var/run/secrets/kubeflow/trainer/out' is not allowed with --api trainjob"),
])
def test_what_a_trainjob_cannot_take_is_one_line_and_exit_2(options, message):
    result = fab_in_process("k8s-job", "--api", "trainjob", "--image", IMAGE, *options)
    assert result.returncode == 2 and not result.stdout
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {message}"), line


def test_an_unknown_api_is_one_line_and_exit_2():
    result = fab_in_process("k8s-job", "--api", "tfjob", "--image", IMAGE)
    assert result.returncode == 2 and result.stderr.startswith("error: --api: 'tfjob' is not allowed; allowed: "
                                                               "pytorchjob")


@pytest.mark.parametrize("options", [
    ("--nodes", "4", "--pvc", "xeon-data"),
    ("--", "--output_dir", "/var/run/out"),  # an emptyDir of its own beside the control plane's mount
])
def test_the_control_planes_progress_injection_reaches_the_program_and_the_pod_stays_valid(options):
    """Trainer's TrainJobStatus plugin (emulated: tests/k8s_trainer.py status_injection) upserts its status
    server's env, token mount and projected volume into the pod: nothing of the TrainJob's collides with them
    or is replaced by them, the token is readable by the program's one user, the pod with them validates
    against the TrainJob's schema, and torchrun gets the URL beside the torch policy's PET_* (it passes its
    environment to the ranks, whose built-in job then reports with --report_to kubeflow)."""
    text = fab_k8s_job(*options)
    manifest = yaml.safe_load(text)
    assert status_problems(manifest) == []
    pod = status_injection(manifest)
    (node,) = pod["containers"]
    assert [m["mountPath"] for m in node["volumeMounts"]].count(trainjob.STATUS_MOUNT) == 1
    assert len({m["mountPath"] for m in node["volumeMounts"]}) == len(node["volumeMounts"])
    assert len({v["name"] for v in pod["volumes"]}) == len(pod["volumes"])
    injected = copy.deepcopy(manifest)
    rjob = injected["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    rjob["template"]["spec"]["template"]["spec"] = {**pod, "containers": [
        {k: v for k, v in node.items() if k != "env"}]}  # the webhook's rule: no env in the patch
    assert k8s_schema.problems(injected) == []
    env = {e["name"]: e["value"] for e in node["env"]}
    (job,) = kubeflow.documents(text)
    env.update(trainer_env(job, 0))
    assert env[trainjob.STATUS_ENV[0]].endswith(f"/trainjobs/{manifest['metadata']['name']}/status")
    assert env["PET_NNODES"] == str(job.spec.trainer.num_nodes)
    assert manifest["spec"]["trainer"]["command"][-1] == trainjob.SHELL_NAME and 'exec "$@"' in " ".join(
        manifest["spec"]["trainer"]["command"])  # sh execs torchrun: the environment goes on


def test_a_pod_whose_token_the_program_cannot_read_or_whose_values_collide_is_a_problem():
    """status_problems finds what it is there to find (a container without the one runAsUser, a taken name)."""
    manifest = yaml.safe_load(fab_k8s_job())
    pod = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0][
        "template"]["spec"]["template"]["spec"]
    del pod["containers"][0]["securityContext"]["runAsUser"]
    pod["volumes"].append({"name": trainjob.STATUS_VOLUME, "emptyDir": {}})
    manifest["spec"]["trainer"]["env"].append({"name": trainjob.STATUS_ENV[2], "value": "/x"})
    assert len(status_problems(manifest)) == 3


def test_the_profiles_transformers_says_whether_the_pod_reports_progress():
    """KubeflowCallback came with transformers 4.57: the stock profile's has it, the intel profile's 4.56 not."""
    assert get_profile("stock").pin_of("transformers") >= "5" and trainjob.has_progress_callback("stock")
    assert get_profile("intel").pin_of("transformers").startswith("4.56.")
    assert not trainjob.has_progress_callback("intel")


def test_fab_k8s_job_says_when_the_profiles_transformers_reports_no_progress(tmp_path):
    for profile, noted in (("stock", False), ("intel", True)):
        out = tmp_path / f"{profile}.yaml"
        result = fab_in_process("k8s-job", "--api", "trainjob", "--image", IMAGE, "--profile", profile,
                                "--output", str(out))
        assert result.returncode == 0, result.stderr
        assert ("reports no progress to the TrainJob's status" in result.stdout) == noted, result.stdout
