"""What the Kubeflow training operator (v1.9) adds to each worker pod of a PyTorchJob, for the tests.

Read from the operator's pod environment code (pkg/controller.v1/pytorch: envvar.go, elastic.go,
master.go): every container gets PYTHONUNBUFFERED; MASTER_ADDR/PET_MASTER_ADDR,
MASTER_PORT/PET_MASTER_PORT, WORLD_SIZE, RANK, PET_NODE_RANK and PET_NPROC_PER_NODE only when the
job has a Master replica (`fab k8s-job` writes workers only, so torchrun's c10d rendezvous gives
the ranks these); PET_NNODES always (the worker count, or MIN:MAX with an elastic policy); and with
an elastic policy PET_RDZV_ENDPOINT (rdzvHost, default `<job>-worker-0`, and rdzvPort, default the
`pytorchjob-port` of the worker container), PET_RDZV_BACKEND (default c10d), PET_MAX_RESTARTS,
PET_RDZV_ID when set. The operator also makes one headless Service per pod, named like the pod, so
`<job>-worker-<i>` resolves to that pod's address.
"""

from __future__ import annotations

from cluster.job import k8s

# Set by the operator only when the job has a Master replica.
MASTER_ONLY_VARIABLES = ("MASTER_ADDR", "PET_MASTER_ADDR", "MASTER_PORT", "PET_MASTER_PORT", "WORLD_SIZE", "RANK",
                         "PET_NODE_RANK", "PET_NPROC_PER_NODE")


def operator_env(job, index: int) -> dict[str, str]:
    """The variables the operator adds to worker `index`'s container of `job` (a KubeflowOrgV1PyTorchJob
    with Worker replicas only, as `fab k8s-job` writes it)."""
    spec = job.spec
    if set(spec.pytorch_replica_specs) != {k8s.REPLICA_TYPE}:
        raise ValueError(f"operator_env: replicas {sorted(spec.pytorch_replica_specs)}; only Worker is emulated")
    workers = spec.pytorch_replica_specs[k8s.REPLICA_TYPE]
    if not 0 <= index < workers.replicas:
        raise ValueError(f"operator_env: worker {index} of {workers.replicas}")
    env = {"PYTHONUNBUFFERED": "1"}
    elastic = spec.elastic_policy
    if elastic is None:
        env["PET_NNODES"] = str(workers.replicas)
        return env
    port = elastic.rdzv_port
    if port is None:
        container = next(c for c in workers.template.spec.containers if c.name == k8s.CONTAINER_NAME)
        port = next(p.container_port for p in container.ports or () if p.name == k8s.PORT_NAME)
    env["PET_RDZV_ENDPOINT"] = f"{elastic.rdzv_host or k8s.pod_name(job.metadata.name, 0)}:{port}"
    env["PET_RDZV_BACKEND"] = elastic.rdzv_backend or "c10d"
    env["PET_NNODES"] = (f"{elastic.min_replicas}:{elastic.max_replicas}"
                         if elastic.min_replicas is not None or elastic.max_replicas is not None
                         else str(workers.replicas))
    if elastic.max_restarts is not None:
        env["PET_MAX_RESTARTS"] = str(elastic.max_restarts)
    if elastic.rdzv_id is not None:
        env["PET_RDZV_ID"] = elastic.rdzv_id
    return env
