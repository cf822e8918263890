"""The `fab` tasks: thin modules that parse options, call node_setup's rooms and print.

One module per group of tasks (setup, train, jobs, remote, local, costs, images, lifecycle, k8s, bench, autostop);
`common` holds what they share (the cluster option, exit codes, help texts, option parsing).
Beside them, what some tasks call: `managed` (`fab train --managed`'s supervisor), `spend` (the
planned and actual cost lines), `executor` (arguments after `--` go to the training program) and
`program` (the `xeon-cluster` command). May import everything in node_setup and `cluster/`; the heavy
imports (boto3, Fabric connections) happen inside the tasks that need them, so `fab --list` and a local
cluster never import boto3.
"""

from invoke import Collection

from node_setup.tasks import (autostop, bench, clusters, costs, images, jobs, k8s, lifecycle, local, parsing, remote,
                              report, setup, train)

parsing.install()  # misspelt tasks and options: one line, a suggestion, exit 2

ns = Collection()
for module in (setup, train, jobs, remote, report, local, clusters, costs, images, lifecycle, k8s, bench, autostop):
    for task in module.TASKS:
        ns.add_task(task, name=getattr(module, "TASK_NAMES", {}).get(task.name))
