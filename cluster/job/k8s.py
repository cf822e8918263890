"""A Kubeflow PyTorchJob, decided before it is written (pure): names, pod resources, volumes, torchrun.

`plan_pytorchjob(...)` returns a K8sJobPlan; node_setup/kubeflow.py turns it into the training
operator's typed models and YAML. Everything the user gives is checked here, with a message that
names the option, the value and what is allowed.

Resources: one pod per node, requests equal to limits (guaranteed QoS). CPU is counted in whole
physical cores of the instance type (cluster/stack/catalog.py), each with all its hardware threads (a
Kubernetes CPU is a vCPU), minus KUBELET_RESERVE_CORES_PER_SOCKET physical cores per socket left
to the kubelet, the container runtime and the node's daemons (on EKS the default kube-reserved
CPU of a 64-vCPU node is about 0.25 vCPU; a whole core per socket covers it with DaemonSets and
keeps the sockets' halves equal). Memory: the instance's memory minus
MEMORY_RESERVE_PERCENT percent (kube-reserved, system-reserved, the eviction threshold). The
pod's /dev/shm is a memory emptyDir of SHM_PERCENT percent of that, counted inside the limit.

Security: the containers run as the image's own non-root user (RUN_AS_USER, docker/Dockerfile),
with no privilege escalation, no capabilities and a read-only root filesystem; what the job writes
goes to volumes: the work volume, the scratch volume, /tmp (an emptyDir; also the user's home),
and an emptyDir of its own for an --output_dir outside them. Values given with --env sit in the
manifest in clear text: `secret_looking` (cluster/job/secrets.py) names the secrets (the task warns).

The pod's cores are not known in advance (the kubelet's CPU manager picks them), so the layout is
planned on a machine of the pod's size, unpinned (cluster/job/torchrun.py says what that leaves out).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from cluster.stack import catalog
from cluster.stack.catalog import InstanceType
from cluster.job.job_args import SyntheticData, job_setting
from cluster.job.layout import Layout, plan_layout
from cluster.node.profiles import get_profile, venv_dir
from cluster.job.torchrun import TorchrunPlan, plan_torchrun
# What --env may carry that belongs in a Kubernetes Secret: cluster/job/secrets.py decides (re-exported).
from cluster.job.secrets import secret_looking as secret_looking

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
REPLICA_TYPE = "Worker"  # every pod is a worker; worker 0 hosts the rendezvous
CONTAINER_NAME = "pytorch"  # the operator reads its port from the container of this name
PORT_NAME = "pytorchjob-port"  # ... and of this name (elastic rendezvous endpoint, per-pod Service)
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
RESTART_POLICY = "OnFailure"
DEFAULT_RESTART_LIMIT = 3  # runPolicy.backoffLimit: container restarts in the whole job before it fails
DEFAULT_NAMESPACE = "default"
DEFAULT_NAME = "xeon-cluster-job"
DEFAULT_INSTANCE_TYPE = "r7iz.metal-16xl"

KUBELET_RESERVE_CORES_PER_SOCKET = 1
MEMORY_RESERVE_PERCENT = 10
SHM_PERCENT = 12

# Inside every pod.
WORK_MOUNT = "/mnt/xeon-cluster"  # the PVC (--pvc), else an emptyDir: data, caches, checkpoints
SCRATCH_MOUNT = "/scratch"  # the pod's own emptyDir: the offline demo's model and data
SHM_MOUNT = "/dev/shm"
RUNS_DIR = "runs"  # the job's output under WORK_MOUNT: runs/<job name>
HF_HOME = f"{WORK_MOUNT}/cache/huggingface"  # hub and datasets caches on the volume
TMP_MOUNT = "/tmp"  # an emptyDir: the root filesystem is read-only
VOLUME_WORK, VOLUME_SCRATCH, VOLUME_SHM, VOLUME_TMP, VOLUME_OUTPUT = "work", "scratch", "dshm", "tmp", "output"
RUN_AS_USER = 10001  # the image's user (docker/Dockerfile's USER), also its group and the pod's fsGroup

# DNS-1035 label (a job's pods are <name>-worker-<i>, each also a Service of that name).
_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
NAME_MAX = 63 - len("-worker-") - 4  # room for 4 digits of replica index
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_PVC = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# registry[:port]/path[:tag][@sha256:digest]: lower-case path components, as the distribution spec says.
_IMAGE = re.compile(r"^(?=.{1,255}$)"
                    r"([A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]+)?/)?"
                    r"[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*"
                    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
                    r"(@sha256:[0-9a-f]{64})?$")


class K8sJobError(ValueError):
    """An option the manifest cannot take; the message names it, the value and what is allowed."""


def check_name(value: str, option: str = "--name") -> str:
    if not _NAME.match(value or "") or len(value) > NAME_MAX:
        raise K8sJobError(f"{option}: {value!r} is not allowed; allowed: lower-case letters, digits and '-', starting "
                          f"with a letter, up to {NAME_MAX} characters (its pods are <name>-worker-<i>)")
    return value


def check_namespace(value: str) -> str:
    if not _NAMESPACE.match(value or "") or len(value) > 63:
        raise K8sJobError(f"--namespace: {value!r} is not allowed; allowed: a Kubernetes namespace (lower-case "
                          "letters, digits and '-', up to 63 characters)")
    return value


def check_pvc(value: str) -> str:
    if not _PVC.match(value or "") or len(value) > 253:
        raise K8sJobError(f"--pvc: {value!r} is not allowed; allowed: the name of a PersistentVolumeClaim in the "
                          "job's namespace (lower-case letters, digits, '-' and '.')")
    return value


def check_image(value: str) -> str:
    if not value:
        raise K8sJobError("--image: not given; allowed: the training image's reference, e.g. "
                          "registry.example.com/xeon-cluster:0.1.0 (build it from docker/Dockerfile)")
    if not _IMAGE.match(value):
        raise K8sJobError(f"--image: {value!r} is not an image reference; allowed: "
                          f"[REGISTRY/]NAME[:TAG][@sha256:DIGEST], "
                          "e.g. registry.example.com/xeon-cluster:0.1.0")
    return value


def instance_type(name: str) -> InstanceType:
    machine = catalog.lookup(name or "")
    if machine is None:
        raise K8sJobError(f"--instance-type: {name!r} is unknown; allowed: {', '.join(catalog.known_types())}")
    return machine


def secret_warning(names: list[str]) -> str:
    """The one line `fab k8s-job` prints when --env carries what looks like a secret (never its value)."""
    return (f"warning: --env {', '.join(names)}: looks like a secret, and the manifest holds it in clear text "
            "(anyone who can read the PyTorchJob or its pods reads it); use a Kubernetes Secret instead "
            "(env valueFrom.secretKeyRef) and leave it out of --env")


_MOUNT_PATH = re.compile(r"^(/[A-Za-z0-9_][A-Za-z0-9._-]*){2,}\Z")


def check_output_dir(path: str, venv: str) -> str:
    """An --output_dir outside the volumes becomes a mountPath: a plain path two or more levels deep
    that hides nothing of the image's venv."""
    parts = path.split("/")
    if not _MOUNT_PATH.match(path) or ".." in parts or venv == path or venv.startswith(path + "/"):
        raise K8sJobError(f"--output_dir: {path!r} is not allowed; allowed: a path relative to the working directory, "
                          f"one under {WORK_MOUNT}, or an absolute path of two or more plain folders (letters, "
                          f"digits, '.', '_', '-') that does not hold {venv} (it gets an emptyDir of its own)")
    return path


def needs_own_volume(path: str) -> bool:
    """Whether the job's output directory `path` lies outside every volume (then it gets an emptyDir):
    a relative path is under the working directory, which is a volume."""
    if not path.startswith("/"):
        return False
    return not any(path == mount or path.startswith(mount + "/") for mount in (WORK_MOUNT, SCRATCH_MOUNT, TMP_MOUNT))


@dataclass(frozen=True)
class PodResources:
    machine: InstanceType
    cores: int  # physical cores the pod gets
    memory_gib: int
    shm_gib: int

    @property
    def cpu(self) -> str:
        """The CPU quantity: every hardware thread of the pod's physical cores."""
        return str(self.cores * self.machine.threads_per_core)

    @property
    def memory(self) -> str:
        return f"{self.memory_gib}Gi"

    @property
    def shm(self) -> str:
        return f"{self.shm_gib}Gi"

    def pod_machine(self) -> InstanceType:
        """The machine the layout is planned on: the pod's cores, the instance's sockets."""
        sockets = self.machine.sockets if self.cores % self.machine.sockets == 0 else 1
        return catalog.custom(f"{self.machine.name} pod ({self.cores} of {self.machine.physical_cores} cores)",
                              sockets=sockets, physical_cores=self.cores, vcpus=int(self.cpu),
                              bf16=self.machine.bf16)


def most_cores(machine: InstanceType) -> int:
    return machine.physical_cores - KUBELET_RESERVE_CORES_PER_SOCKET * machine.sockets


def pod_resources(machine: InstanceType, cores: int | None = None) -> PodResources:
    """Requests (= limits) of one pod on a node of type `machine`; `cores` None: all but the reserve."""
    top = most_cores(machine)
    given = top if cores is None else cores
    if isinstance(given, bool) or not isinstance(given, int) or not 1 <= given <= top:
        raise K8sJobError(f"--cores: {given!r} is more than a pod can have on {machine.name} ({machine.physical_cores} "
                          f"physical cores, {KUBELET_RESERVE_CORES_PER_SOCKET} per socket left to the kubelet); "
                          f"allowed 1 to {top}")
    memory = machine.memory_gib - math.ceil(machine.memory_gib * MEMORY_RESERVE_PERCENT / 100)
    return PodResources(machine, given, memory, max(1, memory * SHM_PERCENT // 100))


@dataclass(frozen=True)
class K8sJobPlan:
    name: str
    namespace: str
    image: str
    nodes: int
    min_nodes: int | None
    resources: PodResources
    layout: Layout
    torchrun: TorchrunPlan
    env: dict[str, str]  # the container's environment: the ranks' (torchrun's) and the caches'
    working_dir: str
    output_dir: str
    pvc: str | None
    restart_limit: int
    init_command: tuple[str, ...] = ()  # run before torchrun in every pod (the offline demo's data)

    @property
    def output_volume(self) -> bool:
        """Whether the output directory needs an emptyDir of its own (it lies outside every volume)."""
        return needs_own_volume(self.output_dir)

    @property
    def command(self) -> tuple[str, ...]:
        return self.torchrun.argv

    @property
    def rdzv_port(self) -> int:
        return int(self.torchrun.rdzv_endpoint.rsplit(":", 1)[1])

    def pod_name(self, index: int) -> str:
        return pod_name(self.name, index)

    @property
    def rdzv_host(self) -> str:
        return pod_name(self.name, 0)


def pod_name(job: str, index: int) -> str:
    """The operator's name for worker `index`'s pod (and its headless Service, so other pods resolve it)."""
    return f"{job}-{REPLICA_TYPE.lower()}-{index}"


def check_restart_limit(value: int | None) -> int:
    limit = DEFAULT_RESTART_LIMIT if value is None else value
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise K8sJobError(f"--restart-limit: {limit!r} is not allowed; give 0 or more")
    return limit


def plan_pytorchjob(*, image: str, nodes: int, training_args: list[str], name: str = DEFAULT_NAME,
                    namespace: str = DEFAULT_NAMESPACE, instance: str = DEFAULT_INSTANCE_TYPE,
                    profile: str = "stock", synthetic: SyntheticData | None = None, cores: int | None = None,
                    ranks_per_node: int | None = None, threads_per_rank: int | None = None,
                    ccl_workers: int | None = None, min_nodes: int | None = None, max_restarts: int | None = None,
                    pvc: str | None = None, restart_limit: int | None = None,
                    extra_env: dict[str, str] | None = None) -> K8sJobPlan:
    """The whole PyTorchJob of the built-in job (`python -m training` + `training_args`) on `nodes` pods.

    `synthetic` (cluster/job/job_args.synthetic_data, made with the image's Python): every pod writes the
    offline demo into its own scratch volume first and the job trains on it (`training_args` point
    there, relative to the working directory). The job always gets `--resume`: a restarted pod
    continues from the newest checkpoint in its output directory on the volume (a fresh start when
    there is none).
    """
    image = check_image(image)
    name, namespace = check_name(name), check_namespace(namespace)
    pvc = check_pvc(pvc) if pvc else None
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise K8sJobError(f"--nodes: {nodes!r} is not allowed; give 1 or more (one pod per node)")
    limit = check_restart_limit(restart_limit)
    machine = instance_type(instance)
    resources = pod_resources(machine, cores)
    prof = get_profile(profile)
    layout = plan_layout(resources.pod_machine(), backend=prof.backend, ranks_per_node=ranks_per_node,
                         threads_per_rank=threads_per_rank, ccl_workers=ccl_workers, pin=False)
    args = list(training_args)
    output_dir = job_setting(args, "--output_dir")
    if output_dir is None:
        output_dir = f"{WORK_MOUNT}/{RUNS_DIR}/{name}"
        args += ["--output_dir", output_dir]
    if needs_own_volume(output_dir):
        check_output_dir(output_dir, venv_dir(prof))
    if "--resume" not in args:
        args.append("--resume")
    run = plan_torchrun(layout=layout, nodes=nodes, program=("-m", "training", *args), rdzv_host=pod_name(name, 0),
                        rdzv_id=name, min_nodes=min_nodes, max_restarts=max_restarts,
                        torchrun=f"{venv_dir(prof)}/bin/torchrun", extra_env=extra_env)
    return K8sJobPlan(name=name, namespace=namespace, image=image, nodes=nodes, min_nodes=min_nodes,
                      resources=resources, layout=layout, torchrun=run, env={**run.env, "HF_HOME": HF_HOME},
                      working_dir=SCRATCH_MOUNT if synthetic else WORK_MOUNT, output_dir=output_dir, pvc=pvc,
                      restart_limit=limit, init_command=("sh", "-c", synthetic.prepare) if synthetic else ())
