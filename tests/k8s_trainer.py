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
