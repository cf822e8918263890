"""What Kubeflow Trainer (v2.3.0) makes of a TrainJob on the `torch-distributed` runtime, for the tests.

Read from Trainer's code (pkg/runtime/framework/plugins/torch/torch.go, jobset/jobset.go,
pkg/constants/constants.go) and the runtime (charts/kubeflow-trainer/files/runtimes/torch-distributed.yaml):
the runtime is one replicated Job `node` whose container `node` the Trainer fields fill (image,
command, args, env, resourcesPerNode); `numNodes` pods, indexed, with the host names
`<job>-node-0-<i>` under the JobSet's headless Service `<job>`. The torch policy upserts into that
container PET_NNODES (numNodes), PET_NPROC_PER_NODE (numProcPerNode; without it "auto", which on a
pod without GPUs becomes the CPU count of resourcesPerNode), PET_NODE_RANK (the pod's completion
index), PET_MASTER_ADDR (`<job>-node-0-0.<job>`) and PET_MASTER_PORT (29500), and the port 29500.

The admission checks of the same release a TrainJob must pass (webhook_problems): a runtime patch's
manager is a domain-prefixed path (`host/path`); it patches only the runtime's replicated jobs and
their existing containers (no new init container), and sets no env on the `node` container; the
trainer's env has none of torchrun's reserved names.
"""

from __future__ import annotations

import re

from cluster.job import trainjob

RUNTIME_CONTAINERS = {trainjob.REPLICATED_JOB: {trainjob.CONTAINER_NAME}}  # torch-distributed's only job and container
RESERVED = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_HTTP_PATH = re.compile(r"^[A-Za-z0-9/\-._~%!$&'()*+,;=:]+$")


def host_name(job, index: int) -> str:
    return f"{job.metadata.name}-{trainjob.REPLICATED_JOB}-0-{index}"


def trainer_env(job, index: int) -> dict[str, str]:
    """The PET_* variables the torch policy puts into pod `index`'s `node` container of `job` (a
    TrainerV1alpha1TrainJob)."""
    nodes = job.spec.trainer.num_nodes or 1
    if not 0 <= index < nodes:
        raise ValueError(f"trainer_env: pod {index} of {nodes}")
    procs = job.spec.trainer.num_proc_per_node
    if procs is None:  # "auto": the CPUs of resourcesPerNode on a pod without GPUs
        requests = job.spec.trainer.resources_per_node.requests or job.spec.trainer.resources_per_node.limits
        procs = max(1, int(requests["cpu"].actual_instance))
    name = job.metadata.name
    return {"PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": str(procs), "PET_NODE_RANK": str(index),
            "PET_MASTER_ADDR": f"{host_name(job, 0)}.{name}", "PET_MASTER_PORT": str(trainjob.MASTER_PORT)}


def webhook_problems(job) -> list[str]:
    """What Trainer's admission webhook (v2.3.0) refuses in `job` on the torch-distributed runtime."""
    out = []
    if job.spec.runtime_ref.name != trainjob.RUNTIME:
        out.append(f"runtimeRef {job.spec.runtime_ref.name!r}: only {trainjob.RUNTIME} is emulated")
    reserved = sorted(e.name for e in job.spec.trainer.env or () if e.name in RESERVED)
    if reserved:
        out.append(f"trainer.env must not have reserved envs: {reserved}")
    for patch in job.spec.runtime_patches or ():
        host, _, path = patch.manager.partition("/")
        if not (host and path and _SUBDOMAIN.match(host) and _HTTP_PATH.match(path)):
            out.append(f"manager {patch.manager!r}: must be a domain-prefixed path (such as acme.io/foo)")
        spec = patch.training_runtime_spec.template.spec if patch.training_runtime_spec else None
        for rjob in (spec.replicated_jobs or ()) if spec else ():
            containers = RUNTIME_CONTAINERS.get(rjob.name)
            if containers is None:
                out.append(f"replicated job {rjob.name!r} is not the runtime's")
                continue
            pod = rjob.template.spec.template.spec
            for init in pod.init_containers or ():
                out.append(f"initContainer {init.name!r} does not exist in the runtime job {rjob.name}")
            for container in pod.containers or ():
                if container.name not in containers:
                    out.append(f"container {container.name!r} does not exist in the runtime job {rjob.name}")
                elif container.env and container.name == trainjob.CONTAINER_NAME:
                    out.append(f"must not have envs for the {container.name} container")
    return out


def status_injection(manifest: dict) -> dict:
    """The `node` pod of `manifest` (a TrainJob as a dict) after the runtime patch and what Trainer's
    TrainJobStatus plugin (v2.2 and later, pkg/runtime/framework/plugins/trainjobstatus/trainjobstatus.go
    EnforcePodSpec) upserts into it: STATUS_ENV into every trainer container's env, the read-only mount of
    STATUS_VOLUME at STATUS_MOUNT, and that projected volume (the service account token, a `ca.crt`)."""
    (patch,) = manifest["spec"]["runtimePatches"]
    (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = rjob["template"]["spec"]["template"]["spec"]
    url, ca, token = trainjob.STATUS_ENV
    name, namespace = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
    injected = {url: f"https://kubeflow-trainer-controller-manager.kubeflow-system.svc:10443/apis/"
                     f"trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status",
                ca: f"{trainjob.STATUS_MOUNT}/ca.crt", token: f"{trainjob.STATUS_MOUNT}/token"}
    containers = []
    for container in pod["containers"]:
        env = [e for e in manifest["spec"]["trainer"].get("env", []) if e["name"] not in injected]
        mounts = [m for m in container.get("volumeMounts", []) if m["name"] != trainjob.STATUS_VOLUME]
        containers.append({**container, "env": env + [{"name": k, "value": v} for k, v in injected.items()],
                           "volumeMounts": mounts + [{"name": trainjob.STATUS_VOLUME,
                                                      "mountPath": trainjob.STATUS_MOUNT, "readOnly": True}]})
    volumes = [v for v in pod.get("volumes", []) if v["name"] != trainjob.STATUS_VOLUME]
    volumes.append({"name": trainjob.STATUS_VOLUME, "projected": {"sources": [
        {"serviceAccountToken": {"audience": f"trainer.kubeflow.org/{namespace}/{name}",
                                 "expirationSeconds": 3600, "path": "token"}},
        {"configMap": {"name": f"{name}-tls-config", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}})
    return {**pod, "containers": containers, "volumes": volumes}


def status_problems(manifest: dict) -> list[str]:
    """What keeps the control plane's status injection from reaching the program in `manifest`'s pod: a value
    of the TrainJob's own that the upsert replaces, a volume name or mount path the injected ones collide with
    (the API server refuses a pod with two), a mount inside the injected one, and a token the program cannot
    read. The kubelet writes a projected token 0600, owned by the pod's FsUser: the one runAsUser every
    container has (pkg/volume/projected, pkg/volume/util FsUserFrom); with none, root owns it."""
    out = []
    pod = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0][
        "template"]["spec"]["template"]["spec"]
    taken = sorted(e["name"] for e in manifest["spec"]["trainer"].get("env", []) if e["name"] in trainjob.STATUS_ENV)
    if taken:
        out.append(f"trainer.env sets {taken}: the control plane replaces them")
    if any(v["name"] == trainjob.STATUS_VOLUME for v in pod.get("volumes", [])):
        out.append(f"volume {trainjob.STATUS_VOLUME!r} is the control plane's")
    for container in pod.get("containers", []):
        for mount in container.get("volumeMounts", []):
            path = mount["mountPath"]
            if path == trainjob.STATUS_MOUNT or path.startswith(trainjob.STATUS_MOUNT + "/"):
                out.append(f"mount {path!r} is at or inside the control plane's {trainjob.STATUS_MOUNT}")
    users = {(c.get("securityContext") or {}).get("runAsUser", (pod.get("securityContext") or {}).get("runAsUser"))
             for c in pod.get("containers", [])}
    if len(users) != 1 or None in users:
        out.append(f"the containers run as {sorted(map(str, users))}: no one FsUser, the token is root's 0600")
    return out
