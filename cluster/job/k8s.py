"""The training job on Kubernetes, decided before it is written (pure): the pod every node runs, and
the Kubeflow training operator's PyTorchJob (kubeflow.org/v1) around it.

`plan_pod(...)` decides the pod both Kubeflow APIs run: its image, resources, rank layout,
environment, volumes, the program torchrun starts and what runs before it. `plan_pytorchjob(...)`
returns the PyTorchJob's K8sJobPlan; cluster/job/trainjob.py's `plan_trainjob(...)` the TrainJob's
(Kubeflow Trainer v2). node_setup/kubeflow.py turns either into the projects' typed models and YAML.
Everything the user gives is checked here, with a message that names the option, the value and
what is allowed.

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

Your own program (`--script`/`--module`, cluster/job/userjob.py): the workdir's copy plan (what
`fab train` would copy: credentials withheld, the script inside it) travels in a ConfigMap of the
job's own (`WorkdirConfigMap`, at most CONFIGMAP_LIMIT_BYTES of distinct file contents, the API
server's limit), mounted read-only at WORKDIR_SOURCE and copied into the pod's scratch volume
(WORKDIR) before torchrun starts, so the program may write beside itself, as on a node.

The pod's cores are not known in advance (the kubelet's CPU manager picks them), so the layout is
planned on a machine of the pod's size, unpinned (cluster/job/torchrun.py says what that leaves out).
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from typing import Any

from cluster.stack import catalog
from cluster.stack.catalog import InstanceType
from cluster.job import request, run_env
from cluster.job.demo import SyntheticData, synthetic_data
from cluster.job.launch import OUTPUT_DIR_VARIABLE, RESERVED_VARIABLES
from cluster.job.layout import Layout, plan_layout
from cluster.job.userjob import CopyPlan, FileEntry, UserProgram, human_bytes
from cluster.node.profiles import get_profile, venv_dir
from cluster.job.torchrun import TorchrunPlan, check_program, plan_torchrun, torchrun_env
# What --env may carry that belongs in a Kubernetes Secret: cluster/job/secrets.py decides (re-exported).
from cluster.job.secrets import secret_looking as secret_looking

# The two Kubeflow APIs `fab k8s-job --api` writes; the default is the v1 PyTorchJob (docs/kubernetes.md
# says why: every v1.9 operator runs it, it has elastic training, and the TrainJob this writes needs
# Trainer 2.3 or later).
API_PYTORCHJOB, API_TRAINJOB = "pytorchjob", "trainjob"
APIS = (API_PYTORCHJOB, API_TRAINJOB)
DEFAULT_API = API_PYTORCHJOB

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
PREPARE_CONTAINER = "prepare"  # the PyTorchJob's init container: the demo's data, the workdir's copy
LABEL_APP, LABEL_JOB = "app.kubernetes.io/name", "xeon-cluster/job"

KUBELET_RESERVE_CORES_PER_SOCKET = 1
MEMORY_RESERVE_PERCENT = 10
SHM_PERCENT = 12

# Inside every pod.
WORK_MOUNT = "/mnt/xeon-cluster"  # the PVC (--pvc), else an emptyDir: data, caches, checkpoints
SCRATCH_MOUNT = "/scratch"  # the pod's own emptyDir: the offline demo's model and data, the workdir's copy
SHM_MOUNT = "/dev/shm"
RUNS_DIR = "runs"  # the job's output under WORK_MOUNT: runs/<job name>
HF_HOME = f"{WORK_MOUNT}/cache/huggingface"  # hub and datasets caches on the volume
TMP_MOUNT = "/tmp"  # an emptyDir: the root filesystem is read-only
WORKDIR_SOURCE = "/etc/xeon-cluster/workdir"  # the workdir's ConfigMap, read-only
WORKDIR = f"{SCRATCH_MOUNT}/workdir"  # its copy, where your program starts
VOLUME_WORK, VOLUME_SCRATCH, VOLUME_SHM, VOLUME_TMP, VOLUME_OUTPUT = "work", "scratch", "dshm", "tmp", "output"
VOLUME_WORKDIR = "workdir"
RUN_AS_USER = 10001  # the image's user (docker/Dockerfile's USER), also its group and the pod's fsGroup

# A ConfigMap holds at most 1 MiB of data (the API server's limit, the sum of its values).
CONFIGMAP_LIMIT_BYTES = 1024 * 1024
CONFIGMAP_SUFFIX = "-workdir"
FILE_MODE, EXECUTABLE_MODE = 0o644, 0o755
# torchrun reads PET_<OPTION> as the default of each of its options; the operators set them.
TORCHRUN_ENV_PREFIX = "PET_"

# DNS-1035 label (a job's pods are <name>-worker-<i> or <name>-node-0-<i>, each also a host name).
_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")  # each pattern a whole match (fullmatch: no newline after)
NAME_MAX = 63 - len("-worker-") - 4  # room for 4 digits of replica index (the TrainJob's "-node-0-" is as long)
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_PVC = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# registry[:port]/path[:tag][@sha256:digest]: lower-case path components, as the distribution spec says.
_IMAGE = re.compile(r"(?=.{1,255}\Z)"
                    r"([A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]+)?/)?"
                    r"[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*"
                    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
                    r"(@sha256:[0-9a-f]{64})?")


class K8sJobError(ValueError):
    """An option the manifest cannot take; the message names it, the value and what is allowed."""


def check_api(value: str) -> str:
    if value not in APIS:
        raise K8sJobError(f"--api: {value!r} is not allowed; allowed: {API_PYTORCHJOB} (kubeflow.org/v1 PyTorchJob, "
                          f"the default) or {API_TRAINJOB} (Kubeflow Trainer v2's trainer.kubeflow.org TrainJob)")
    return value


def check_name(value: str, pods: str = "<name>-worker-<i>") -> str:
    if not _NAME.fullmatch(value or "") or len(value) > NAME_MAX:
        raise K8sJobError(f"--name: {value!r} is not allowed; allowed: lower-case letters, digits and '-', starting "
                          f"with a letter, up to {NAME_MAX} characters (its pods are {pods})")
    return value


def check_namespace(value: str) -> str:
    if not _NAMESPACE.fullmatch(value or "") or len(value) > 63:
        raise K8sJobError(f"--namespace: {value!r} is not allowed; allowed: a Kubernetes namespace (lower-case "
                          "letters, digits and '-', up to 63 characters)")
    return value


def check_pvc(value: str) -> str:
    if not _PVC.fullmatch(value or "") or len(value) > 253:
        raise K8sJobError(f"--pvc: {value!r} is not allowed; allowed: the name of a PersistentVolumeClaim in the "
                          "job's namespace (lower-case letters, digits, '-' and '.')")
    return value


def check_image(value: str) -> str:
    if not value:
        raise K8sJobError("--image: not given; allowed: the training image's reference, e.g. "
                          "registry.example.com/xeon-cluster:0.1.0 (build it from docker/Dockerfile)")
    if not _IMAGE.fullmatch(value):
        raise K8sJobError(f"--image: {value!r} is not an image reference; allowed: "
                          f"[REGISTRY/]NAME[:TAG][@sha256:DIGEST], "
                          "e.g. registry.example.com/xeon-cluster:0.1.0")
    return value


def check_nodes(nodes: int) -> int:
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise K8sJobError(f"--nodes: {nodes!r} is not allowed; give 1 or more (one pod per node)")
    return nodes


def check_env(env: dict[str, str], allow: tuple[str, ...] = ()) -> dict[str, str]:
    """--env checked as `fab train` checks it (cluster/job/run_env.py: variable names, one-line values, names
    that change how an interpreter, a shell or the loader starts only if `allow` names them), and without
    what the launch sets itself: the ranks' variables torchrun gives (RANK ...), the program's
    (XEON_CLUSTER_*), and torchrun's PET_* options (the operators set those)."""
    run_env.check_env(env, allow)
    for name in env:
        if name in RESERVED_VARIABLES or name.startswith(TORCHRUN_ENV_PREFIX):
            raise K8sJobError(f"--env: {name} is set by the launch itself (torchrun and the Kubeflow operators); "
                              f"allowed: any variable but {', '.join(RESERVED_VARIABLES)} and {TORCHRUN_ENV_PREFIX}*")
    return env


def instance_type(name: str) -> InstanceType:
    machine = catalog.lookup(name or "")
    if machine is None:
        raise K8sJobError(f"--instance-type: {name!r} is unknown; allowed: {', '.join(catalog.known_types())}")
    return machine


def secret_warning(names: list[str], kind: str = KIND) -> str:
    """The one line `fab k8s-job` prints when --env carries what looks like a secret (never its value)."""
    return (f"warning: --env {', '.join(names)}: looks like a secret, and the manifest holds it in clear text "
            f"(anyone who can read the {kind} or its pods reads it); use a Kubernetes Secret instead "
            "(env valueFrom.secretKeyRef) and leave it out of --env")


def labels(name: str) -> dict[str, str]:
    """The labels of the job's objects and pods (`kubectl get pods -l xeon-cluster/job=NAME`)."""
    return {LABEL_APP: "xeon-cluster", LABEL_JOB: name}


_MOUNT_PATH = re.compile(r"^(/[A-Za-z0-9_][A-Za-z0-9._-]*){2,}\Z")


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + "/")


def check_output_dir(path: str, venv: str) -> str:
    """An --output_dir outside the volumes becomes a mountPath: a plain path two or more levels deep
    that hides nothing of the image's venv and is not the workdir's read-only ConfigMap."""
    parts = path.split("/")
    if (not _MOUNT_PATH.match(path) or ".." in parts or _within(venv, path)
            or _within(path, WORKDIR_SOURCE) or _within(WORKDIR_SOURCE, path)):
        raise K8sJobError(f"--output_dir: {path!r} is not allowed; allowed: a path relative to the working directory, "
                          f"one under {WORK_MOUNT}, or an absolute path of two or more plain folders (letters, "
                          f"digits, '.', '_', '-') that does not hold {venv} or {WORKDIR_SOURCE} (it gets an "
                          "emptyDir of its own)")
    return path


def needs_own_volume(path: str, mounts: tuple[str, ...] = (WORK_MOUNT, TMP_MOUNT)) -> bool:
    """Whether the job's output directory `path` lies outside the writable volumes at `mounts` (then it
    gets an emptyDir): a relative path is under the working directory, which is a volume."""
    return path.startswith("/") and not any(_within(path, mount) for mount in mounts)


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
class WorkdirConfigMap:
    """The workdir's files as a ConfigMap: one key per distinct content (its SHA-256), one item per
    file (its path in the workdir and mode); the edge reads the contents from `source`."""

    name: str
    source: str  # the workdir on this machine (CopyPlan.workdir)
    files: tuple[FileEntry, ...]

    @property
    def contents(self) -> dict[str, FileEntry]:
        """key -> one file of that content (what the edge reads)."""
        return {f.digest: f for f in self.files}

    @property
    def data_bytes(self) -> int:
        """What the ConfigMap holds: every distinct content once."""
        return sum(f.size for f in self.contents.values())

    @property
    def items(self) -> tuple[tuple[str, str, int], ...]:
        """(key, path, mode) of every file, by path."""
        return tuple((f.digest, f.path, EXECUTABLE_MODE if f.executable else FILE_MODE)
                     for f in sorted(self.files, key=lambda f: f.path))

    @property
    def copy_command(self) -> str:
        """Shell that copies the mounted files into WORKDIR (the mount's top-level entries are the
        files and folders of the workdir; -L copies what the kubelet's links point at)."""
        tops = sorted({f.path.split("/", 1)[0] for f in self.files})
        sources = " ".join(shlex.quote(f"{WORKDIR_SOURCE}/{top}") for top in tops)
        return f"mkdir -p {shlex.quote(WORKDIR)} && cp -RL -- {sources} {shlex.quote(WORKDIR)}/"


def plan_workdir_configmap(job: str, copy: CopyPlan, script: str | None = None) -> WorkdirConfigMap:
    """The ConfigMap of a checked copy plan (cluster/job/userjob.py, with its credentials withheld);
    K8sJobError when it holds nothing, leaves the script out, or is over CONFIGMAP_LIMIT_BYTES."""
    files = tuple(copy.files)
    if not files:
        raise K8sJobError(f"--workdir: {copy.workdir} holds no file to copy; allowed: the folder of your program")
    if script is not None and script not in {f.path for f in files}:
        raise K8sJobError(f"--script: {script} is not copied (its name is withheld or ignored: see --workdir's "
                          f"copy plan); allowed: a script the workdir ships")
    odd = [f.path for f in files if f.path.startswith("..")]
    if odd:
        raise K8sJobError(f"--workdir: {odd[0]!r} starts with '..', which a ConfigMap item cannot; rename it or list "
                          "it in the workdir's .gitignore")
    plan = WorkdirConfigMap(f"{job}{CONFIGMAP_SUFFIX}", copy.workdir, files)
    if plan.data_bytes > CONFIGMAP_LIMIT_BYTES:
        largest = ", ".join(f"{f.path} ({human_bytes(f.size)})"
                            for f in sorted(plan.contents.values(), key=lambda f: -f.size)[:5])
        raise K8sJobError(f"--workdir: {copy.workdir} holds {human_bytes(plan.data_bytes)} to copy, over a "
                          f"ConfigMap's {human_bytes(CONFIGMAP_LIMIT_BYTES)} (the API server's limit); largest: "
                          f"{largest}; list what the program does not need in the workdir's .gitignore, and put "
                          f"data on the claim (--pvc, at {WORK_MOUNT})")
    return plan


@dataclass(frozen=True)
class Volume:
    """One volume of the pod and where every container mounts it: `kind` "claim" (`source` the claim),
    "empty" (an emptyDir), "memory" (an emptyDir in memory, `source` its size) or "configmap"."""

    name: str
    mount: str
    kind: str
    source: str = ""


@dataclass(frozen=True)
class PodPlan:
    """The pod every node runs, whichever Kubeflow API makes it."""

    image: str
    resources: PodResources
    layout: Layout
    torchrun: str  # the image's torchrun
    program: tuple[str, ...]  # what torchrun starts: -m training ARGS, or -m xeon_cluster.run --script ...
    env: dict[str, str]  # the container's environment: the ranks' (torchrun's), the caches', the program's
    working_dir: str
    output_dir: str
    volumes: tuple[Volume, ...]
    prepare: str = ""  # shell run in SCRATCH_MOUNT before torchrun in every pod: the demo's data, the workdir's copy
    workdir: WorkdirConfigMap | None = None

    @property
    def pvc(self) -> str | None:
        return next((v.source for v in self.volumes if v.kind == "claim"), None)


def plan_pod(*, name: str, image: str, training_args: list[str] | tuple[str, ...] = (), output_dir: str,
             instance: str, profile: str = "stock", synthetic: SyntheticData | None = None, cores: int | None = None,
             ranks_per_node: int | None = None, threads_per_rank: int | None = None,
             ccl_workers: int | None = None, pvc: str | None = None, extra_env: dict[str, str] | None = None,
             allow_env: tuple[str, ...] = (), user: UserProgram | None = None,
             copy: CopyPlan | None = None) -> PodPlan:
    """The pod of the built-in job (`python -m training` + `training_args`, complete: `pod_options` makes them
    with `output_dir` and --resume), or with `user` and `copy` of your own program (its workdir in a
    ConfigMap, WorkdirConfigMap), on a node of type `instance`; `output_dir` gets a volume of its own when
    it lies outside the others.

    `synthetic` (cluster/job/demo.synthetic_data, made with the image's Python): every pod writes the
    offline demo into its own scratch volume first and the job trains on it (`training_args` point
    there, relative to the working directory). Your program gets its output directory as
    XEON_CLUSTER_OUTPUT_DIR.
    """
    image = check_image(image)
    pvc = check_pvc(pvc) if pvc else None
    env_given = check_env(dict(extra_env or {}), allow_env)
    if (user is None) != (copy is None):
        raise K8sJobError("--script/--module: your program and its workdir's copy plan come together")
    resources = pod_resources(instance_type(instance), cores)
    prof = get_profile(profile)
    venv = venv_dir(prof)
    layout = plan_layout(resources.pod_machine(), backend=prof.backend, ranks_per_node=ranks_per_node,
                         threads_per_rank=threads_per_rank, ccl_workers=ccl_workers, pin=False)
    volumes = [Volume(VOLUME_WORK, WORK_MOUNT, "claim", pvc) if pvc else Volume(VOLUME_WORK, WORK_MOUNT, "empty"),
               Volume(VOLUME_SHM, SHM_MOUNT, "memory", resources.shm), Volume(VOLUME_TMP, TMP_MOUNT, "empty")]
    workdir, prepare, own_env = None, "", {}
    if user is not None and copy is not None:
        workdir = plan_workdir_configmap(name, copy, user.script)
        working_dir, prepare = WORKDIR, workdir.copy_command
        program = tuple(user.argv(f"{venv}/bin/python")[1:])
        own_env = {OUTPUT_DIR_VARIABLE: output_dir, "PYTHONUNBUFFERED": "1"}
        volumes += [Volume(VOLUME_SCRATCH, SCRATCH_MOUNT, "empty"),
                    Volume(VOLUME_WORKDIR, WORKDIR_SOURCE, "configmap", workdir.name)]
    else:
        program = check_program(("-m", "training", *training_args))
        working_dir = WORK_MOUNT
        if synthetic:
            working_dir, prepare = SCRATCH_MOUNT, synthetic.prepare
            volumes.append(Volume(VOLUME_SCRATCH, SCRATCH_MOUNT, "empty"))
    writable = tuple(v.mount for v in volumes if v.kind != "configmap" and v.mount != SHM_MOUNT)
    if needs_own_volume(output_dir, writable):
        volumes.append(Volume(VOLUME_OUTPUT, check_output_dir(output_dir, venv), "empty"))
    env = {**torchrun_env(layout, env_given), "HF_HOME": HF_HOME, **own_env}
    return PodPlan(image=image, resources=resources, layout=layout, torchrun=f"{venv}/bin/torchrun", program=program,
                   env=env, working_dir=working_dir, output_dir=output_dir, volumes=tuple(volumes), prepare=prepare,
                   workdir=workdir)


@dataclass(frozen=True)
class K8sJobPlan:
    """The PyTorchJob: `nodes` Worker pods (no Master), each running `torchrun` at a c10d rendezvous on
    worker 0; elastic (the operator's elasticPolicy) with `min_nodes`."""

    name: str
    namespace: str
    nodes: int
    min_nodes: int | None
    pod: PodPlan
    torchrun: TorchrunPlan
    restart_limit: int

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


def pod_options(run: request.RunRequest, *, name: str, profile: str, pvc: str | None = None) -> dict[str, Any]:
    """plan_pod's program, output directory, layout and environment for the run request `run`
    (cluster/job/request.py; both APIs): the output directory is the request's, default
    WORK_MOUNT/RUNS_DIR/<name>; the built-in job's arguments are made as `fab train` makes them
    (cluster/job/jobplan.py's builtin_arguments, with --resume: a restarted pod continues the newest
    checkpoint in its output directory, a fresh start when there is none) and its offline demo with the
    image's Python (with a `pvc`, which every pod mounts at WORK_MOUNT, its model made once there for all
    pods); or your program and its workdir's copy plan."""
    from cluster.job.jobplan import Restart, builtin_arguments

    layout = run.layout
    output_dir = run.output_dir or f"{WORK_MOUNT}/{RUNS_DIR}/{name}"
    common: dict[str, Any] = dict(output_dir=output_dir, ranks_per_node=layout.ranks_per_node,
                                  threads_per_rank=layout.threads_per_rank, ccl_workers=layout.ccl_workers,
                                  extra_env=run.env_map(), allow_env=run.allow_env)
    own = run.own
    if own is not None:
        return {**common, "user": own.program, "copy": own.copy}
    job = run.builtin
    assert job is not None  # a request runs the built-in job or your program
    shared = WORK_MOUNT if pvc else None
    args = builtin_arguments(run, output_dir=output_dir, instance_type=None, restart=Restart(resume=True),
                             shared_root=shared)
    demo = synthetic_data(job.demo.task, job.demo.examples, f"{venv_dir(get_profile(profile))}/bin/python",
                          shared) if job.demo else None
    return {**common, "training_args": args, "synthetic": demo}


def plan_pytorchjob(run: request.RunRequest, *, image: str, name: str = DEFAULT_NAME,
                    namespace: str = DEFAULT_NAMESPACE, instance: str = DEFAULT_INSTANCE_TYPE, profile: str = "stock",
                    cores: int | None = None, pvc: str | None = None,
                    restart_limit: int | None = None) -> K8sJobPlan:
    """The whole PyTorchJob of the run request `run` on its node count of pods: the pod (plan_pod, from
    `pod_options`) and torchrun's rendezvous; the request's launcher's minimum node count makes it elastic."""
    name, namespace = check_name(name), check_namespace(namespace)
    nodes = check_nodes(run.nodes)
    limit = check_restart_limit(restart_limit)
    pod = plan_pod(name=name, image=image, instance=instance, profile=profile, cores=cores, pvc=pvc,
                   **pod_options(run, name=name, profile=profile, pvc=pvc))
    min_nodes = run.launcher.min_nodes
    run_ = plan_torchrun(layout=pod.layout, nodes=nodes, program=pod.program, rdzv_host=pod_name(name, 0),
                         rdzv_id=name, min_nodes=min_nodes, max_restarts=run.launcher.max_restarts,
                         torchrun=pod.torchrun)
    return K8sJobPlan(name=name, namespace=namespace, nodes=nodes, min_nodes=min_nodes, pod=pod, torchrun=run_,
                      restart_limit=limit)
