"""A K8sJobPlan (cluster/job/k8s.py) as the training operator's PyTorchJob: typed models, then YAML.

The models are the training operator's own SDK (`kubeflow-training`, `kubeflow.training.models`)
and the `kubernetes` client's (`V1PodTemplateSpec` and below); `to_yaml` serialises them with the
kubernetes ApiClient's `sanitize_for_serialization` (the API's field names, no nulls), and
`from_yaml` reads a manifest back into the same models (what the tests round-trip).

What the operator adds when it makes the pods (per worker pod, no Master replica): a headless
Service named like the pod (so `<job>-worker-0`, the rendezvous host, resolves), the restart
policy copied into the pod, PYTHONUNBUFFERED, PET_NNODES (non-elastic) or the elastic PET_*
variables (PET_RDZV_ENDPOINT, PET_RDZV_BACKEND, PET_NNODES=MIN:MAX, PET_MAX_RESTARTS,
PET_RDZV_ID). torchrun reads PET_* as defaults of its options; the command carries the same
values explicitly, so both agree (tests/k8s_operator.py computes them from a manifest).
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from cluster.job import k8s
from cluster.job.k8s import K8sJobPlan


def pytorchjob(plan: K8sJobPlan):
    """The KubeflowOrgV1PyTorchJob of `plan`."""
    from kubeflow.training import models as m
    from kubernetes import client as k

    res = plan.resources
    quantities = {"cpu": res.cpu, "memory": res.memory}
    resources = k.V1ResourceRequirements(requests=dict(quantities), limits=dict(quantities))
    tmp = k.V1VolumeMount(name=k8s.VOLUME_TMP, mount_path=k8s.TMP_MOUNT)
    mounts = [k.V1VolumeMount(name=k8s.VOLUME_WORK, mount_path=k8s.WORK_MOUNT),
              k.V1VolumeMount(name=k8s.VOLUME_SHM, mount_path=k8s.SHM_MOUNT), tmp]
    work = (k.V1Volume(name=k8s.VOLUME_WORK, persistent_volume_claim=k.V1PersistentVolumeClaimVolumeSource(
        claim_name=plan.pvc)) if plan.pvc else k.V1Volume(name=k8s.VOLUME_WORK, empty_dir=k.V1EmptyDirVolumeSource()))
    volumes = [work, k.V1Volume(name=k8s.VOLUME_SHM, empty_dir=k.V1EmptyDirVolumeSource(medium="Memory",
                                                                                         size_limit=res.shm)),
               k.V1Volume(name=k8s.VOLUME_TMP, empty_dir=k.V1EmptyDirVolumeSource())]
    if plan.output_volume:
        mounts.append(k.V1VolumeMount(name=k8s.VOLUME_OUTPUT, mount_path=plan.output_dir))
        volumes.append(k.V1Volume(name=k8s.VOLUME_OUTPUT, empty_dir=k.V1EmptyDirVolumeSource()))
    init_containers = None
    if plan.init_command:
        scratch = k.V1VolumeMount(name=k8s.VOLUME_SCRATCH, mount_path=k8s.SCRATCH_MOUNT)
        mounts.append(scratch)
        volumes.append(k.V1Volume(name=k8s.VOLUME_SCRATCH, empty_dir=k.V1EmptyDirVolumeSource()))
        init_containers = [k.V1Container(name="demo-data", image=plan.image, image_pull_policy="IfNotPresent",
                                         command=list(plan.init_command), working_dir=k8s.SCRATCH_MOUNT,
                                         volume_mounts=[scratch, tmp], resources=resources,
                                         security_context=security_context())]
    container = k.V1Container(
        name=k8s.CONTAINER_NAME, image=plan.image, image_pull_policy="IfNotPresent", command=list(plan.command),
        working_dir=plan.working_dir, env=[k.V1EnvVar(name=key, value=value) for key, value in plan.env.items()],
        ports=[k.V1ContainerPort(name=k8s.PORT_NAME, container_port=plan.rdzv_port, protocol="TCP")],
        resources=resources, volume_mounts=mounts, security_context=security_context())
    template = k.V1PodTemplateSpec(
        metadata=k.V1ObjectMeta(labels={"app.kubernetes.io/name": "xeon-cluster", "xeon-cluster/job": plan.name}),
        spec=k.V1PodSpec(containers=[container], init_containers=init_containers, volumes=volumes,
                         node_selector={k8s.INSTANCE_TYPE_LABEL: res.machine.name},
                         # the claim's files belong to the job's group, so the non-root user can write there
                         security_context=k.V1PodSecurityContext(fs_group=k8s.RUN_AS_USER)))
    elastic = None
    if plan.min_nodes is not None:
        elastic = m.KubeflowOrgV1ElasticPolicy(
            min_replicas=plan.min_nodes, max_replicas=plan.nodes, max_restarts=plan.torchrun.max_restarts,
            rdzv_backend="c10d", rdzv_host=plan.rdzv_host, rdzv_port=plan.rdzv_port, rdzv_id=plan.torchrun.rdzv_id)
    spec = m.KubeflowOrgV1PyTorchJobSpec(
        nproc_per_node=str(plan.layout.ranks_per_node), elastic_policy=elastic,
        run_policy=m.KubeflowOrgV1RunPolicy(backoff_limit=plan.restart_limit, clean_pod_policy="None"),
        pytorch_replica_specs={k8s.REPLICA_TYPE: m.KubeflowOrgV1ReplicaSpec(
            replicas=plan.nodes, restart_policy=k8s.RESTART_POLICY, template=template)})
    return m.KubeflowOrgV1PyTorchJob(api_version=k8s.API_VERSION, kind=k8s.KIND, spec=spec,
                                     metadata=k.V1ObjectMeta(name=plan.name, namespace=plan.namespace))


def security_context():
    """Every container's: the image's non-root user, no privilege escalation, no capabilities, a
    read-only root filesystem (the job writes to its volumes only), the runtime's seccomp profile."""
    from kubernetes import client as k

    return k.V1SecurityContext(
        run_as_non_root=True, run_as_user=k8s.RUN_AS_USER, run_as_group=k8s.RUN_AS_USER,
        allow_privilege_escalation=False, capabilities=k.V1Capabilities(drop=["ALL"]),
        read_only_root_filesystem=True, seccomp_profile=k.V1SeccompProfile(type="RuntimeDefault"))


def to_dict(job) -> dict[str, Any]:
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(job)


def to_yaml(job) -> str:
    return yaml.safe_dump(to_dict(job), sort_keys=False, width=120)


class _Response:  # what ApiClient.deserialize reads: the body, as JSON text
    def __init__(self, data: dict):
        self.data = json.dumps(data)


def from_yaml(text: str):
    """A manifest read back into the SDK's KubeflowOrgV1PyTorchJob (kubernetes models inside)."""
    from kubeflow.training.api_client import ApiClient

    return ApiClient().deserialize(_Response(yaml.safe_load(text)), "KubeflowOrgV1PyTorchJob")
