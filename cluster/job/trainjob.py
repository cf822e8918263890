"""The training job as a Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1), decided before it
is written (pure).

`plan_trainjob(run, ...)` returns the TrainJobPlan of a run request (cluster/job/request.py, as
`plan_pytorchjob` takes it): the pod of cluster/job/k8s.py (`plan_pod`: image, resources, layout,
environment, volumes, the program) run by the `torch-distributed`
ClusterTrainingRuntime (`runtimeRef`) on `nodes` nodes. node_setup/kubeflow.py turns it into
`kubeflow-trainer-api`'s models and YAML.

What the runtime's torch policy does with it (Trainer v2.3.0's torch plugin): one Job of `nodes`
pods named `<job>-node-0-<i>` under a headless Service `<job>`; into the `node` container it
puts PET_NNODES (`numNodes`), PET_NPROC_PER_NODE (`numProcPerNode`; left out it would be the CPU
count of `resourcesPerNode`, one rank per vCPU, so it is always given: the layout's ranks per
pod), PET_NODE_RANK (the pod's index), PET_MASTER_ADDR (`<job>-node-0-0.<job>`) and
PET_MASTER_PORT (29500). torchrun reads each PET_<OPTION> as its option's default, so the command
is the image's `torchrun` with no rendezvous options of its own: the static rendezvous at the
first pod that the policy describes (`--nnodes`, `--nproc-per-node` and the rest come from it).

What a TrainJob cannot say, and so how this one differs from the PyTorchJob:
- the pod's volumes, the `node` container's mounts and security context, the pod's security context,
  node selector and labels go in a runtime patch (`runtimePatches`, Trainer 2.3 and later; earlier
  releases spelled it podTemplateOverrides, which 2.3 removed), under PATCH_MANAGER;
- no init container can be added (a patch may only change the runtime's own containers) and no
  working directory set, so the container's command is `sh -c` that goes to the working directory,
  runs the preparation (the demo's data, the workdir's copy) and then execs torchrun (`args`);
- no elastic training (no node range in the API) and no restart limit (the runtime's Job and JobSet
  decide): `--min-nodes` and `--max-restarts` are refused.

Progress in the TrainJob's status (`status.trainerStatus`: percentage, time left, metrics; Trainer 2.2 and
later with the controller's TrainJobStatus feature gate and its plugin, as Trainer's progress guide
describes): the control plane injects into every trainer container
STATUS_ENV (its status server's URL, the paths of its CA and of a token), and mounts at STATUS_MOUNT a
projected volume STATUS_VOLUME (the service account token, issued for this TrainJob, and the CA). The spec
needs no field of its own; what it must leave the control plane: none of STATUS_ENV in `--env` (the
control plane's value would silently replace yours), no volume of that name, nothing mounted at or inside
STATUS_MOUNT (an --output_dir there), and a token the program can read (the kubelet writes it 0600 for the
one runAsUser every container has: k8s.RUN_AS_USER). The pod's transformers then reports from rank 0 (its
KubeflowCallback, transformers 4.57 and later, PROGRESS_TRANSFORMERS; the built-in job's --report_to
default is kubeflow when STATUS_ENV's URL is set, training/args.py); `progress_callback` says whether the
image's profile has it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from cluster.job import k8s
from cluster.job.k8s import K8sJobError, PodPlan, check_name, check_namespace, check_nodes, plan_pod, pod_options
from cluster.job.request import RunRequest
from cluster.node.profiles import get_profile

API_GROUP = "trainer.kubeflow.org"
API_VERSION = f"{API_GROUP}/v1alpha1"
KIND = "TrainJob"
RUNTIME = "torch-distributed"  # the ClusterTrainingRuntime Trainer installs for PyTorch
RUNTIME_KIND = "ClusterTrainingRuntime"
REPLICATED_JOB = "node"  # the runtime's replicated Job ...
CONTAINER_NAME = "node"  # ... and its container, which the Trainer fields and the PET_* variables go to
MASTER_PORT = 29500  # the torch policy's PET_MASTER_PORT (the port of the first pod's rendezvous)
PATCH_MANAGER = "xeon-cluster/fab-k8s-job"  # who owns the runtime patch (a domain-prefixed path)
SHELL_NAME = "xeon-cluster"  # $0 of the command's `sh -c`
# What Trainer's TrainJobStatus plugin puts into every trainer container (trainjobstatus.go).
STATUS_ENV = ("KUBEFLOW_TRAINER_SERVER_URL", "KUBEFLOW_TRAINER_SERVER_CA_CERT", "KUBEFLOW_TRAINER_SERVER_TOKEN")
STATUS_MOUNT = "/var/run/secrets/kubeflow/trainer"
STATUS_VOLUME = "kubeflow-trainer-token"
PROGRESS_TRANSFORMERS = (4, 57)  # the first transformers with KubeflowCallback


def pod_name(job: str, index: int) -> str:
    """The host name of node `index`'s pod (the JobSet's `<job>-<replicated job>-<job index>-<pod index>`)."""
    return f"{job}-{REPLICATED_JOB}-0-{index}"


@dataclass(frozen=True)
class TrainJobPlan:
    name: str
    namespace: str
    nodes: int
    pod: PodPlan
    runtime: str = RUNTIME
    progress_callback: bool = True  # the image's transformers reports progress to the TrainJob's status

    @property
    def nproc_per_node(self) -> int:
        return self.pod.layout.ranks_per_node

    @property
    def args(self) -> tuple[str, ...]:
        """torchrun and the program: the rendezvous is the torch policy's (PET_*)."""
        return (self.pod.torchrun, *self.pod.program)

    @property
    def command(self) -> tuple[str, ...]:
        """`sh -c` that goes to the working directory, prepares, and execs `args`."""
        steps = [f"cd {shlex.quote(k8s.SCRATCH_MOUNT)}", f"( {self.pod.prepare} )"] if self.pod.prepare else []
        steps += [f"cd {shlex.quote(self.pod.working_dir)}", 'exec "$@"']
        return ("sh", "-c", " && ".join(steps), SHELL_NAME)


def plan_trainjob(run: RunRequest, *, image: str, name: str = k8s.DEFAULT_NAME,
                  namespace: str = k8s.DEFAULT_NAMESPACE, instance: str = k8s.DEFAULT_INSTANCE_TYPE,
                  profile: str = "stock", cores: int | None = None, pvc: str | None = None,
                  restart_limit: int | None = None) -> TrainJobPlan:
    """The whole TrainJob of the run request `run` on its node count of pods: the pod (cluster/job/k8s.py
    plan_pod, from `pod_options`: the built-in job or your program) under the torch-distributed runtime.
    Elastic training (the request's minimum node count) and a restart limit are refused: the runtime decides."""
    for option, value in (("--min-nodes", run.launcher.min_nodes), ("--max-restarts", restart_limit)):
        if value is not None:
            raise K8sJobError(f"{option}: {value!r} is not allowed with --api {k8s.API_TRAINJOB}; a TrainJob has no "
                              f"elastic training and its runtime decides the restarts; allowed: --api "
                              f"{k8s.API_PYTORCHJOB} (elasticPolicy, runPolicy.backoffLimit)")
    name = check_name(name, pods=f"<name>-{REPLICATED_JOB}-0-<i>")
    namespace = check_namespace(namespace)
    nodes = check_nodes(run.nodes)
    for variable in run.env_map():
        if variable in STATUS_ENV:
            raise K8sJobError(f"--env: {variable} is set by Trainer's control plane in a TrainJob (its status "
                              f"server, for progress); allowed: any variable but {', '.join(STATUS_ENV)}")
    pod = plan_pod(name=name, image=image, instance=instance, profile=profile, cores=cores, pvc=pvc,
                   **pod_options(run, name=name, profile=profile, pvc=pvc))
    for volume in pod.volumes:
        if volume.mount == STATUS_MOUNT or volume.mount.startswith(STATUS_MOUNT + "/"):
            raise K8sJobError(f"--output_dir: {pod.output_dir!r} is not allowed with --api {k8s.API_TRAINJOB}: "
                              f"Trainer's control plane mounts its status token at {STATUS_MOUNT}; allowed: a "
                              "path outside it")
    return TrainJobPlan(name=name, namespace=namespace, nodes=nodes, pod=pod,
                        progress_callback=has_progress_callback(profile))


def has_progress_callback(profile: str) -> bool:
    """Whether the profile's transformers has KubeflowCallback (PROGRESS_TRANSFORMERS and later)."""
    pin = get_profile(profile).pin_of("transformers") or ""
    numbers = tuple(int(part) for part in pin.split(".")[:2] if part.isdigit())
    return len(numbers) == 2 and numbers >= PROGRESS_TRANSFORMERS
