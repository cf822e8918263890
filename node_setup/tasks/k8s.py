"""`fab k8s-job`: the training job as a Kubeflow PyTorchJob manifest (docs/kubernetes.md).

Plans the job (cluster/job/k8s.py: pod resources, layout, torchrun) from the same job options as
`fab train`, renders it with the training operator's SDK models (node_setup/kubeflow.py) and
writes the YAML to `-o FILE` or stdout. Connects to nothing. Exit codes: 0 written; 2 bad input
(one line naming the option, the value and what is allowed).
"""

from __future__ import annotations

import sys
from pathlib import Path

from cluster.job import k8s
from cluster.job.job_args import (SYNTHETIC_BATCH_SIZE, SYNTHETIC_EPOCHS, JobArgsError, synthetic_data,
                              training_arguments)
from cluster.job.k8s import K8sJobError
from cluster.job.launch import LaunchError, env_pairs
from cluster.job.layout import LayoutError
from cluster.node.profiles import PROFILES, get_profile, venv_dir
from cluster.job.torchrun import DEFAULT_MAX_RESTARTS, TorchrunError
from node_setup.tasks.common import Unset, duration_or_off, fail, given, task


@task(help={
    "nodes": "worker pods, one per node (default 1)",
    "image": "the training image (built from docker/Dockerfile and pushed), e.g. "
             "registry.example.com/xeon-cluster:0.1.0",
    "instance-type": f"the nodes' EC2 instance type, matched by the node selector {k8s.INSTANCE_TYPE_LABEL} "
                     f"(default {k8s.DEFAULT_INSTANCE_TYPE})",
    "cores": f"physical cores per pod (default all but {k8s.KUBELET_RESERVE_CORES_PER_SOCKET} per socket, left to "
             "the kubelet); CPU requests = limits = these cores' hardware threads",
    "profile": f"software profile of the image: {' or '.join(sorted(PROFILES))} (default stock)",
    "name": f"the PyTorchJob's name, also the rendezvous id and the output folder (default {k8s.DEFAULT_NAME})",
    "namespace": f"its namespace (default {k8s.DEFAULT_NAMESPACE})",
    "pvc": f"PersistentVolumeClaim mounted at {k8s.WORK_MOUNT} in every pod: data, caches, checkpoints "
           "(ReadWriteMany, so every pod sees rank 0's checkpoints); default an emptyDir, lost with the pod",
    "min-nodes": "elastic: train on as few as M pods (torchrun's M:N range, the operator's elasticPolicy)",
    "max-restarts": f"restarts before the job fails: the container restarts of the whole job (runPolicy.backoffLimit, "
                    f"default {k8s.DEFAULT_RESTART_LIMIT}) and, elastic, torchrun's restarts of the ranks "
                    f"(default {DEFAULT_MAX_RESTARTS})",
    "output": "write the manifest to this file (default: stdout)",
    "task": "training task: qa or classification (training default qa)",
    "model": "model id, or a directory relative to the volume (--model_name_or_path)",
    "dataset": "hub dataset name (default squad for qa, glue/mrpc for classification)",
    "dataset-config": "hub dataset configuration (e.g. mrpc)",
    "train-file": f"training data (.json/.jsonl), a path relative to {k8s.WORK_MOUNT}",
    "validation-file": "evaluation data, like --train-file",
    "epochs": "number of training epochs, a whole number (--num_train_epochs; for part of one: --max-steps)",
    "batch-size": "batch size per rank (--per_device_train_batch_size)",
    "bf16": "auto (on when the CPU has AMX/AVX512-BF16), on or off",
    "checkpoint-every": "save a checkpoint this often, e.g. 30m or 1h (off: only at the end)",
    "checkpoint-uri": "s3://bucket/prefix every checkpoint is uploaded to (and a restarted pod resumes from)",
    "max-steps": "stop after N optimizer steps",
    "extra": "more `python -m training` arguments, verbatim, e.g. --extra '--learning_rate 3e-5' "
             "(arguments after `--` are added here)",
    "ranks-per-node": "override ranks per pod (default one per socket)",
    "threads": "override OpenMP threads per rank (default the rank's share of the pod's cores minus CCL workers)",
    "ccl-workers": "override oneCCL workers per rank (intel profile only)",
    "env": "extra environment for every rank, e.g. --env 'CCL_LOG_LEVEL=info' (in clear text in the manifest: "
           "never a secret; what cluster/job/secrets.py takes for one, by name or value, gets a warning)",
    "synthetic-examples": "train the offline demo (a tiny model and data every pod makes first) with N examples",
})
def k8s_job(c, nodes=1, image="", instance_type=k8s.DEFAULT_INSTANCE_TYPE, cores=Unset(int, "all but the kubelet's"),
            profile="stock", name=k8s.DEFAULT_NAME, namespace=k8s.DEFAULT_NAMESPACE, pvc="", min_nodes=Unset(int),
            max_restarts=Unset(int), output="", task="", model="", dataset="", dataset_config="", train_file="",
            validation_file="", epochs=Unset(int, "the job's"), batch_size=Unset(int, "the job's"), bf16="auto",
            checkpoint_every=Unset(duration_or_off), checkpoint_uri="", max_steps=Unset(int), extra="",
            ranks_per_node=Unset(int, "one per socket"), threads=Unset(int, "the rank's cores"), ccl_workers=Unset(int),
            env="", synthetic_examples=Unset(int)):
    """Write a Kubeflow PyTorchJob (torchrun in every pod) for the training job; connects to nothing."""
    from node_setup import kubeflow

    if profile not in PROFILES:
        raise fail(f"--profile: {profile!r} is unknown; allowed: {', '.join(sorted(PROFILES))}")
    options = dict(task_name=task, model=model, dataset=dataset, dataset_config=dataset_config,
                   train_file=train_file, validation_file=validation_file)
    from node_setup.tasks.train import checkpoint_minutes

    examples = synthetic_examples if given(synthetic_examples) else None
    try:
        demo = None
        if examples is not None:
            if model or dataset or train_file:
                raise JobArgsError("--synthetic-examples: the offline demo brings its own model and data; leave out "
                                   "--model, --dataset and --train-file, or drop --synthetic-examples")
            demo = synthetic_data(task, examples, f"{venv_dir(get_profile(profile))}/bin/python")
            options.update(demo.options)
            epochs, batch_size = epochs or SYNTHETIC_EPOCHS, batch_size or SYNTHETIC_BATCH_SIZE
            extra = f"{demo.recommended} {extra}".strip()
        args = training_arguments(**options, epochs=epochs or None, batch_size=batch_size or None, bf16=bf16,
                                  checkpoint_minutes=checkpoint_minutes(checkpoint_every),
                                  checkpoint_uri=checkpoint_uri, max_steps=max_steps or None, extra=extra)
        plan = k8s.plan_pytorchjob(
            image=image, nodes=nodes, training_args=args, name=name, namespace=namespace, instance=instance_type,
            profile=profile, synthetic=demo, cores=cores or None, ranks_per_node=ranks_per_node or None,
            threads_per_rank=threads or None, ccl_workers=ccl_workers if given(ccl_workers) else None,
            min_nodes=min_nodes or None,
            max_restarts=max_restarts if given(max_restarts) and given(min_nodes) else None,
            pvc=pvc or None, restart_limit=max_restarts if given(max_restarts) else None,
            extra_env=env_pairs(env, "CCL_LOG_LEVEL=info"))
    except (K8sJobError, LayoutError, TorchrunError, LaunchError, JobArgsError, ValueError) as exc:
        raise fail(str(exc)) from None
    secrets = k8s.secret_looking(env_pairs(env))
    if secrets:
        print(k8s.secret_warning(secrets), file=sys.stderr)
    text = kubeflow.to_yaml(kubeflow.pytorchjob(plan))
    if not output:
        print(text, end="")
        return
    try:
        Path(output).write_text(text)
    except OSError as exc:
        raise fail(f"--output: cannot write {output!r} ({exc.strerror}); allowed: a writable file path") from None
    print(f"wrote {output}: PyTorchJob {plan.namespace}/{plan.name}, {plan.nodes} pod(s) of {plan.resources.cores} "
          f"cores ({plan.resources.cpu} CPU, {plan.resources.memory}), {plan.layout.ranks_per_node} rank(s) x "
          f"{plan.layout.threads_per_rank} threads per pod" + ("; note: no --pvc: checkpoints live in an emptyDir "
                                                               "and go with the pod" if not plan.pvc else ""))


# `fab --help k8s-job` in these groups (node_setup/tasks/parsing.py), each sorted.
k8s_job.option_groups = {
    "cluster": ("nodes", "image", "instance-type", "cores", "profile", "name", "namespace", "pvc"),
    "program": ("ranks-per-node", "threads", "ccl-workers", "env"),
    "training": ("task", "model", "dataset", "dataset-config", "train-file", "validation-file", "epochs", "batch-size",
                 "max-steps", "bf16", "synthetic-examples", "extra"),
    "spot and recovery": ("min-nodes", "max-restarts"),
    "output": ("output", "checkpoint-every", "checkpoint-uri"),
}

TASKS = [k8s_job]
