"""`fab k8s-job`: the training job as a Kubeflow PyTorchJob (`--api pytorchjob`, the default) or TrainJob
(`--api trainjob`) manifest (docs/kubernetes.md), planned from the options it shares with `fab train` and
written to `-o FILE` or stdout. Connects to nothing; exit 0 written, 2 bad input.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from cluster.job import k8s, trainjob
from cluster.job.job_args import JobArgsError
from cluster.job.jobplan import new_job_id
from cluster.job.k8s import K8sJobError
from cluster.job.launch import LaunchError, env_pairs
from cluster.job.layout import LayoutError
from cluster.job.request import RequestError
from cluster.job.train_options import k8s_request
from cluster.job.userjob import NO_SIGNAL, UserJobError, human_bytes
from cluster.node.profiles import PROFILES
from cluster.job.torchrun import DEFAULT_MAX_RESTARTS, TorchrunError
from node_setup.tasks import job_options
from node_setup.tasks.common import Unset, fail, given, task
from node_setup.tasks.job_options import DEFAULTS as D


@task(help={
    **job_options.HELP,
    "api": f"which Kubeflow API: {k8s.API_PYTORCHJOB} (the training operator's kubeflow.org/v1 PyTorchJob, the "
           f"default) or {k8s.API_TRAINJOB} (Kubeflow Trainer v2.3+'s TrainJob on the {trainjob.RUNTIME} runtime)",
    "nodes": "worker pods, one per node (default 1)",
    "image": "the training image (built from docker/Dockerfile and pushed), e.g. "
             "registry.example.com/xeon-cluster:0.1.0",
    "instance-type": f"the nodes' EC2 instance type, matched by the node selector {k8s.INSTANCE_TYPE_LABEL} "
                     f"(default {k8s.DEFAULT_INSTANCE_TYPE})",
    "cores": f"physical cores per pod (default all but {k8s.KUBELET_RESERVE_CORES_PER_SOCKET} per socket, left to "
             "the kubelet); CPU requests = limits = these cores' hardware threads",
    "profile": f"software profile of the image: {' or '.join(sorted(PROFILES))} (default stock)",
    "name": f"the job's name, also the rendezvous id and the output folder (default {k8s.DEFAULT_NAME})",
    "namespace": f"its namespace (default {k8s.DEFAULT_NAMESPACE})",
    "pvc": f"PersistentVolumeClaim mounted at {k8s.WORK_MOUNT} in every pod: data, caches, checkpoints "
           "(ReadWriteMany, so every pod sees rank 0's checkpoints); default an emptyDir, lost with the pod",
    "min-nodes": "elastic: train on as few as M pods (torchrun's M:N range, the operator's elasticPolicy; "
                 f"--api {k8s.API_PYTORCHJOB} only)",
    "max-restarts": f"restarts before the job fails: the container restarts of the whole job (runPolicy.backoffLimit, "
                    f"default {k8s.DEFAULT_RESTART_LIMIT}) and, elastic, torchrun's restarts of the ranks "
                    f"(default {DEFAULT_MAX_RESTARTS}; --api {k8s.API_PYTORCHJOB} only: a TrainJob's runtime decides)",
    "output": "write the manifest to this file (default: stdout)",
    "script": "run your own training script (a .py file in --workdir) on every rank instead of the built-in job; "
              f"the workdir goes in a ConfigMap (at most {human_bytes(k8s.CONFIGMAP_LIMIT_BYTES)})",
    "module": "run `python -m MODULE` (found in --workdir or the image's venv) on every rank instead of the built-in "
              "job",
    "args": "arguments of your --script/--module, split like a shell would (arguments after `--` are added)",
    "workdir": "folder of your program, copied into every pod (default: the script's folder; with --module the "
               "current folder); what `fab train` withholds (dot-files, credentials, links out) stays here",
    "model": "model id, or a directory relative to the volume (--model_name_or_path)",
    "train-file": f"training data (.json/.jsonl), a path relative to {k8s.WORK_MOUNT}",
    "validation-file": "evaluation data, like --train-file",
    "checkpoint-uri": "s3://bucket/prefix every checkpoint is uploaded to (and a restarted pod resumes from)",
    "extra": "more `python -m training` arguments (with --script/--module: your program's), verbatim, e.g. "
             "--extra '--learning_rate 3e-5' (arguments after `--` are added here)",
    "ranks-per-node": "override ranks per pod (default one per socket)",
    "threads": "override OpenMP threads per rank (default the rank's share of the pod's cores minus CCL workers)",
    "env": "extra environment for every rank, e.g. --env 'CCL_LOG_LEVEL=info' (in clear text in the manifest: "
           "never a secret; what cluster/job/secrets.py takes for one, by name or value, gets a warning); names "
           "that change how an interpreter, a shell or the loader starts (PYTHON*, LD_*, PATH ...) only with "
           "--allow-env",
})
def k8s_job(c, api=k8s.DEFAULT_API, nodes=1, image="", instance_type=k8s.DEFAULT_INSTANCE_TYPE,
            cores=Unset(int, "all but the kubelet's"), profile="stock", name=k8s.DEFAULT_NAME,
            namespace=k8s.DEFAULT_NAMESPACE, pvc="", min_nodes=D["min_nodes"], max_restarts=D["max_restarts"],
            output="",
            script="", module="", args="", workdir="", task="", model="", dataset="", dataset_config="",
            train_file="", validation_file="", epochs=D["epochs"], batch_size=D["batch_size"], bf16=D["bf16"],
            checkpoint_every=D["checkpoint_every"], checkpoint_uri="", max_steps=D["max_steps"], extra=D["extra"],
            ranks_per_node=D["ranks_per_node"], threads=D["threads"], ccl_workers=D["ccl_workers"], env=D["env"],
            allow_env=D["allow_env"], synthetic_examples=D["synthetic_examples"]):
    """Write a Kubeflow PyTorchJob or TrainJob (torchrun in every pod) for the training job; connects to nothing."""
    from node_setup import kubeflow

    if profile not in PROFILES:
        raise fail(f"--profile: {profile!r} is unknown; allowed: {', '.join(sorted(PROFILES))}")
    options = job_options.plain(dict(
        nodes=nodes, task=task, model=model, dataset=dataset, dataset_config=dataset_config, train_file=train_file,
        validation_file=validation_file, epochs=epochs, batch_size=batch_size, bf16=bf16,
        checkpoint_every=checkpoint_every, checkpoint_uri=checkpoint_uri, max_steps=max_steps, extra=extra,
        ranks_per_node=ranks_per_node, threads=threads, ccl_workers=ccl_workers, env=env, allow_env=allow_env,
        synthetic_examples=synthetic_examples, min_nodes=min_nodes, max_restarts=max_restarts, script=script,
        module=module, args=args, workdir=workdir))
    try:
        k8s.check_api(api)
        own = job_options.own_program(dataclasses.replace(options, notice_signal=NO_SIGNAL), profile)  # no notice
        run = k8s_request(options, run_id=new_job_id(), own=own)
        common = dict(image=image, name=name, namespace=namespace, instance=instance_type, profile=profile,
                      cores=cores or None, pvc=pvc or None, restart_limit=max_restarts if given(max_restarts) else None)
        plan: k8s.K8sJobPlan | trainjob.TrainJobPlan
        if api == k8s.API_TRAINJOB:
            plan = trainjob.plan_trainjob(run, **common)
        else:
            plan = k8s.plan_pytorchjob(run, **common)
        text = kubeflow.to_yaml(*kubeflow.manifests(plan))
    except (K8sJobError, LayoutError, TorchrunError, LaunchError, JobArgsError, UserJobError, RequestError,
            ValueError) as exc:
        raise fail(str(exc)) from None
    kind = k8s.KIND if api == k8s.API_PYTORCHJOB else trainjob.KIND
    secrets = k8s.secret_looking(env_pairs(env))
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


# `fab --help k8s-job` in these groups (node_setup/tasks/parsing.py), each sorted.
k8s_job.option_groups = job_options.groups(
    cluster=("api", "nodes", "image", "instance-type", "cores", "profile", "name", "namespace", "pvc"),
    program=("script", "module", "args", "workdir"),
    output=("output",),
)

TASKS = [k8s_job]
