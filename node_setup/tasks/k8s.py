"""`fab k8s-job`: the training job as a Kubeflow PyTorchJob or TrainJob manifest (docs/kubernetes.md), planned
from the options it shares with `fab train`, written to `-o FILE` or stdout; connects to nothing."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any, Callable

from cluster.job import k8s, trainjob
from cluster.job.jobplan import new_job_id
from cluster.job.launch import env_pairs
from cluster.job.train_options import CLUSTER, OUTPUT, Cli, JobOptions, k8s_request
from cluster.job.userjob import NO_SIGNAL, human_bytes
from cluster.node.profiles import PROFILES
from node_setup.tasks import job_options
from node_setup.tasks.common import Unset, fail


@job_options.job_task(job_options.K8S, own={
    "api": (k8s.DEFAULT_API, Cli(CLUSTER, f"which Kubeflow API: {k8s.API_PYTORCHJOB} (the training operator's "
                                 f"kubeflow.org/v1 PyTorchJob, the default) or {k8s.API_TRAINJOB} (Kubeflow Trainer "
                                 f"v2.3+'s TrainJob on the {trainjob.RUNTIME} runtime)")),
    "image": ("", Cli(CLUSTER, "the training image (built from docker/Dockerfile and pushed), e.g. "
                      "registry.example.com/xeon-cluster:0.1.0")),
    "instance_type": (k8s.DEFAULT_INSTANCE_TYPE, Cli(CLUSTER, "the nodes' EC2 instance type, matched by the "
                                                     f"node selector {k8s.INSTANCE_TYPE_LABEL} (default "
                                                     f"{k8s.DEFAULT_INSTANCE_TYPE})")),
    "cores": (Unset(int, "all but the kubelet's"), Cli(CLUSTER, "physical cores per pod (default all but "
                                                       f"{k8s.KUBELET_RESERVE_CORES_PER_SOCKET} per socket, left to "
                                                       "the kubelet); CPU requests = limits = these cores' hardware "
                                                       "threads")),
    "profile": ("stock", Cli(CLUSTER, f"software profile of the image: {' or '.join(sorted(PROFILES))} "
                             "(default stock)")),
    "name": (k8s.DEFAULT_NAME, Cli(CLUSTER, "the job's name, also the rendezvous id and the output folder "
                                   f"(default {k8s.DEFAULT_NAME})")),
    "namespace": (k8s.DEFAULT_NAMESPACE, Cli(CLUSTER, f"its namespace (default {k8s.DEFAULT_NAMESPACE})")),
    "pvc": ("", Cli(CLUSTER, f"PersistentVolumeClaim mounted at {k8s.WORK_MOUNT} in every pod: data, caches, "
                    "checkpoints (ReadWriteMany, so every pod sees rank 0's checkpoints); default an emptyDir, lost "
                    "with the pod")),
    "output": ("", Cli(OUTPUT, "write the manifest to this file (default: stdout)")),
})
def k8s_job(c, options: JobOptions, api: str, image: str, instance_type: str, cores: Any, profile: str, name: str,
            namespace: str, pvc: str, output: str):
    """Write a Kubeflow PyTorchJob or TrainJob (torchrun in every pod) for the training job; connects to nothing."""
    from node_setup import kubeflow

    if profile not in PROFILES:
        raise fail(f"--profile: {profile!r} is unknown; allowed: {', '.join(sorted(PROFILES))}")
    try:
        k8s.check_api(api)
        own = job_options.own_program(dataclasses.replace(options, notice_signal=NO_SIGNAL), profile)  # no notice
        run = k8s_request(options, run_id=new_job_id(), own=own)
        planner: Callable[..., k8s.K8sJobPlan | trainjob.TrainJobPlan] = (
            trainjob.plan_trainjob if api == k8s.API_TRAINJOB else k8s.plan_pytorchjob)
        plan = planner(run, image=image, name=name, namespace=namespace, instance=instance_type, profile=profile,
                       cores=cores or None, pvc=pvc or None, restart_limit=options.max_restarts)
        text = kubeflow.to_yaml(*kubeflow.manifests(plan))
    except ValueError as exc:  # cluster/'s refusals (K8sJobError, RequestError ...): one line each
        raise fail(str(exc)) from None
    kind = k8s.KIND if api == k8s.API_PYTORCHJOB else trainjob.KIND
    secrets = k8s.secret_looking(env_pairs(options.env or ""))
    if secrets:
        print(k8s.secret_warning(secrets, kind), file=sys.stderr)
    if not output:
        print(text, end="")
        return
    try:
        Path(output).write_text(text)
    except OSError as exc:
        raise fail(f"--output: cannot write {output!r} ({exc.strerror}); allowed: a writable file path") from None
    pod = plan.pod
    workdir_note = ""
    if pod.workdir is not None:
        workdir_note = (f"; the workdir in ConfigMap {pod.workdir.name} ({len(pod.workdir.files)} file(s), "
                        f"{human_bytes(pod.workdir.data_bytes)}): kubectl apply --server-side -f {output}")
    print(f"wrote {output}: {kind} {plan.namespace}/{plan.name}, {plan.nodes} pod(s) of {pod.resources.cores} "
          f"cores ({pod.resources.cpu} CPU, {pod.resources.memory}), {pod.layout.ranks_per_node} rank(s) x "
          f"{pod.layout.threads_per_rank} threads per pod" + workdir_note
          + ("; note: no --pvc: checkpoints live in an emptyDir and go with the pod" if not pod.pvc else "")
          + ("; note: this profile's transformers reports no progress to the TrainJob's status"
             if isinstance(plan, trainjob.TrainJobPlan) and not plan.progress_callback else ""))


TASKS = [k8s_job]
