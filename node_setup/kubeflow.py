"""The plans of cluster/job/k8s.py and cluster/job/trainjob.py as Kubeflow manifests: typed models, then YAML.

Both kinds are built from their project's own Python models: the PyTorchJob from the training
operator SDK's (`kubeflow-training` 1.9.4: `kubeflow.training.models`, with the `kubernetes`
client's `V1PodTemplateSpec` and below), the TrainJob from Kubeflow Trainer's (`kubeflow-trainer-api`
2.3.0: `kubeflow_trainer_api.models`, pydantic; the pod's volumes, mounts and security contexts are
made with the `kubernetes` client's models, as for the PyTorchJob, and read into Trainer's, which
validate them). Your program's workdir is a `kubernetes` V1ConfigMap ahead of the job in the same
file. `to_yaml` serialises them (the APIs' field names, no nulls), `documents` reads a file back
into the same models (what the tests round-trip).

What the training operator adds when it makes the PyTorchJob's pods (per worker pod, no Master
replica): a headless Service named like the pod (so `<job>-worker-0`, the rendezvous host,
resolves), the restart policy copied into the pod, PYTHONUNBUFFERED, PET_NNODES (non-elastic) or
the elastic PET_* variables (PET_RDZV_ENDPOINT, PET_RDZV_BACKEND, PET_NNODES=MIN:MAX,
PET_MAX_RESTARTS, PET_RDZV_ID). torchrun reads PET_* as defaults of its options; the command carries
the same values explicitly, so both agree (tests/k8s_operator.py computes them from a manifest).
What Trainer's torch policy adds to a TrainJob's pods: cluster/job/trainjob.py (tests/k8s_trainer.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

from cluster.job import k8s, trainjob
from cluster.job.k8s import K8sJobError, K8sJobPlan, PodPlan, WorkdirConfigMap
from cluster.job.trainjob import TrainJobPlan


def _volume(volume: k8s.Volume):
    from kubernetes import client as k

    if volume.kind == "claim":
        return k.V1Volume(name=volume.name,
                          persistent_volume_claim=k.V1PersistentVolumeClaimVolumeSource(claim_name=volume.source))
    if volume.kind == "memory":
        return k.V1Volume(name=volume.name, empty_dir=k.V1EmptyDirVolumeSource(medium="Memory",
                                                                               size_limit=volume.source))
    if volume.kind == "configmap":
        return k.V1Volume(name=volume.name, config_map=k.V1ConfigMapVolumeSource(name=volume.source))
    return k.V1Volume(name=volume.name, empty_dir=k.V1EmptyDirVolumeSource())


def _pod_parts(pod: PodPlan) -> dict[str, Any]:
    """The kubernetes models of the pod both APIs run: volumes, mounts, resources, environment."""
    from kubernetes import client as k

    quantities = {"cpu": pod.resources.cpu, "memory": pod.resources.memory}
    volumes = [_volume(v) for v in pod.volumes]
    if pod.workdir is not None:
        source = next(v.config_map for v in volumes if v.config_map is not None)
        source.items = [k.V1KeyToPath(key=key, path=path, mode=mode) for key, path, mode in pod.workdir.items]
    return dict(
        volumes=volumes,
        mounts=[k.V1VolumeMount(name=v.name, mount_path=v.mount, read_only=True if v.kind == "configmap" else None)
                for v in pod.volumes],
        resources=k.V1ResourceRequirements(requests=dict(quantities), limits=dict(quantities)),
        env=[k.V1EnvVar(name=key, value=value) for key, value in pod.env.items()],
        node_selector={k8s.INSTANCE_TYPE_LABEL: pod.resources.machine.name},
        # the claim's files belong to the job's group, so the non-root user can write there
        pod_security=k.V1PodSecurityContext(fs_group=k8s.RUN_AS_USER))


def pytorchjob(plan: K8sJobPlan):
    """The KubeflowOrgV1PyTorchJob of `plan`."""
    from kubeflow.training import models as m
    from kubernetes import client as k

    pod = plan.pod
    parts = _pod_parts(pod)
    init_containers = None
    if pod.prepare:
        init_containers = [k.V1Container(name=k8s.PREPARE_CONTAINER, image=pod.image, image_pull_policy="IfNotPresent",
                                         command=["sh", "-c", pod.prepare], working_dir=k8s.SCRATCH_MOUNT,
                                         volume_mounts=parts["mounts"], resources=parts["resources"],
                                         security_context=security_context())]
    container = k.V1Container(
        name=k8s.CONTAINER_NAME, image=pod.image, image_pull_policy="IfNotPresent", command=list(plan.command),
        working_dir=pod.working_dir, env=parts["env"],
        ports=[k.V1ContainerPort(name=k8s.PORT_NAME, container_port=plan.rdzv_port, protocol="TCP")],
        resources=parts["resources"], volume_mounts=parts["mounts"], security_context=security_context())
    template = k.V1PodTemplateSpec(
        metadata=k.V1ObjectMeta(labels=k8s.labels(plan.name)),
        spec=k.V1PodSpec(containers=[container], init_containers=init_containers, volumes=parts["volumes"],
                         node_selector=parts["node_selector"], security_context=parts["pod_security"]))
    elastic = None
    if plan.min_nodes is not None:
        elastic = m.KubeflowOrgV1ElasticPolicy(
            min_replicas=plan.min_nodes, max_replicas=plan.nodes, max_restarts=plan.torchrun.max_restarts,
            rdzv_backend="c10d", rdzv_host=plan.rdzv_host, rdzv_port=plan.rdzv_port, rdzv_id=plan.torchrun.rdzv_id)
    spec = m.KubeflowOrgV1PyTorchJobSpec(
        nproc_per_node=str(pod.layout.ranks_per_node), elastic_policy=elastic,
        run_policy=m.KubeflowOrgV1RunPolicy(backoff_limit=plan.restart_limit, clean_pod_policy="None"),
        pytorch_replica_specs={k8s.REPLICA_TYPE: m.KubeflowOrgV1ReplicaSpec(
            replicas=plan.nodes, restart_policy=k8s.RESTART_POLICY, template=template)})
    return m.KubeflowOrgV1PyTorchJob(api_version=k8s.API_VERSION, kind=k8s.KIND, spec=spec,
                                     metadata=k.V1ObjectMeta(name=plan.name, namespace=plan.namespace))


def train_job(plan: TrainJobPlan):
    """The TrainerV1alpha1TrainJob of `plan`: the Trainer fields, and the pod's volumes, mounts, security
    contexts, node selector and labels in one runtime patch (cluster/job/trainjob.py says why)."""
    from kubeflow_trainer_api import models as m

    pod = plan.pod
    parts = _pod_parts(pod)

    def trainer_model(cls, obj):  # a kubernetes client model read into Trainer's own (pydantic checks it)
        return cls.from_dict(to_dict(obj))

    def meta(**fields):
        return m.IoK8sApimachineryPkgApisMetaV1ObjectMeta(**fields)

    trainer = m.TrainerV1alpha1Trainer(
        image=pod.image, command=list(plan.command), args=list(plan.args),
        env=[trainer_model(m.IoK8sApiCoreV1EnvVar, e) for e in parts["env"]], num_nodes=plan.nodes,
        num_proc_per_node=plan.nproc_per_node,
        resources_per_node=trainer_model(m.IoK8sApiCoreV1ResourceRequirements, parts["resources"]))
    pod_patch = m.TrainerV1alpha1PodSpecPatch(
        volumes=[trainer_model(m.IoK8sApiCoreV1Volume, v) for v in parts["volumes"]],
        containers=[m.TrainerV1alpha1ContainerPatch(
            name=trainjob.CONTAINER_NAME,
            volume_mounts=[trainer_model(m.IoK8sApiCoreV1VolumeMount, v) for v in parts["mounts"]],
            security_context=trainer_model(m.IoK8sApiCoreV1SecurityContext, security_context()))],
        security_context=trainer_model(m.IoK8sApiCoreV1PodSecurityContext, parts["pod_security"]),
        node_selector=parts["node_selector"])
    patch = m.TrainerV1alpha1RuntimePatch(
        manager=trainjob.PATCH_MANAGER,
        training_runtime_spec=m.TrainerV1alpha1TrainingRuntimeSpecPatch(
            template=m.TrainerV1alpha1JobSetTemplatePatch(spec=m.TrainerV1alpha1JobSetSpecPatch(replicated_jobs=[
                m.TrainerV1alpha1ReplicatedJobPatch(
                    name=trainjob.REPLICATED_JOB, template=m.TrainerV1alpha1JobTemplatePatch(
                        spec=m.TrainerV1alpha1JobSpecPatch(template=m.TrainerV1alpha1PodTemplatePatch(
                            metadata=meta(labels=k8s.labels(plan.name)), spec=pod_patch))))]))))
    spec = m.TrainerV1alpha1TrainJobSpec(
        runtime_ref=m.TrainerV1alpha1RuntimeRef(name=plan.runtime, api_group=trainjob.API_GROUP,
                                                kind=trainjob.RUNTIME_KIND),
        trainer=trainer, runtime_patches=[patch])
    return m.TrainerV1alpha1TrainJob(api_version=trainjob.API_VERSION, kind=trainjob.KIND, spec=spec,
                                     metadata=meta(name=plan.name, namespace=plan.namespace,
                                                   labels=k8s.labels(plan.name)))


def security_context():
    """Every container's: the image's non-root user, no privilege escalation, no capabilities, a
    read-only root filesystem (the job writes to its volumes only), the runtime's seccomp profile."""
    from kubernetes import client as k

    return k.V1SecurityContext(
        run_as_non_root=True, run_as_user=k8s.RUN_AS_USER, run_as_group=k8s.RUN_AS_USER,
        allow_privilege_escalation=False, capabilities=k.V1Capabilities(drop=["ALL"]),
        read_only_root_filesystem=True, seccomp_profile=k.V1SeccompProfile(type="RuntimeDefault"))


def read_workdir(workdir: WorkdirConfigMap) -> dict[str, bytes]:
    """key -> content of every distinct file, read from the workdir on this machine; K8sJobError when a
    file changed since its copy plan was made."""
    contents = {}
    for key, entry in workdir.contents.items():
        try:
            data = (Path(workdir.source) / entry.path).read_bytes()
        except OSError as exc:
            raise K8sJobError(f"--workdir: cannot read {entry.path} ({exc.strerror}); allowed: readable "
                              "files") from None
        if hashlib.sha256(data).hexdigest() != key:
            raise K8sJobError(f"--workdir: {entry.path} changed while the manifest was written; run it again")
        contents[key] = data
    return contents


def workdir_configmap(workdir: WorkdirConfigMap, namespace: str, job: str, contents: dict[str, bytes]):
    """The V1ConfigMap of your program's workdir: every distinct content once, as binaryData (base64)."""
    import base64

    from kubernetes import client as k

    return k.V1ConfigMap(api_version="v1", kind="ConfigMap",
                         metadata=k.V1ObjectMeta(name=workdir.name, namespace=namespace, labels=k8s.labels(job)),
                         binary_data={key: base64.b64encode(contents[key]).decode() for key in workdir.contents})


def manifests(plan: K8sJobPlan | TrainJobPlan, contents: dict[str, bytes] | None = None) -> list:
    """The objects `kubectl apply` gets, in order: your workdir's ConfigMap (if any), then the job."""
    job = pytorchjob(plan) if isinstance(plan, K8sJobPlan) else train_job(plan)
    if plan.pod.workdir is None:
        return [job]
    if contents is None:
        contents = read_workdir(plan.pod.workdir)
    return [workdir_configmap(plan.pod.workdir, plan.namespace, plan.name, contents), job]


def to_dict(obj) -> dict[str, Any]:
    """A kubernetes or training operator model (ApiClient's serialisation) or a Trainer model (its own)."""
    if hasattr(obj, "model_dump"):
        return obj.to_dict()
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(obj)


def to_yaml(*objects) -> str:
    return yaml.safe_dump_all([to_dict(o) for o in objects], sort_keys=False, width=120)


class _Response:  # what ApiClient.deserialize reads: the body, as JSON text
    def __init__(self, data: dict):
        self.data = json.dumps(data)


def from_dict(data: dict):
    """One manifest read back into its models: a PyTorchJob (the training operator SDK's), a TrainJob
    (Trainer's) or a ConfigMap (the kubernetes client's)."""
    kind = (data.get("apiVersion"), data.get("kind"))
    if kind == (k8s.API_VERSION, k8s.KIND):
        from kubeflow.training.api_client import ApiClient

        return ApiClient().deserialize(_Response(data), "KubeflowOrgV1PyTorchJob")
    if kind == (trainjob.API_VERSION, trainjob.KIND):
        from kubeflow_trainer_api import models as m

        return m.TrainerV1alpha1TrainJob.from_dict(data)
    if kind == ("v1", "ConfigMap"):
        from kubernetes.client import ApiClient as CoreClient

        return CoreClient().deserialize(_Response(data), "V1ConfigMap")
    raise ValueError(f"not a manifest fab k8s-job writes: apiVersion {kind[0]!r}, kind {kind[1]!r}")


def documents(text: str) -> list:
    """Every manifest of a file `fab k8s-job` wrote, in its models."""
    return [from_dict(d) for d in yaml.safe_load_all(text) if d is not None]

