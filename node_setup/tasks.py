"""The `fab` task collection; each task lives in the module that does its work."""

from invoke import Collection

from node_setup import cost_tasks, job_tasks, local_tasks, setup_tasks

ns = Collection()
for module in (setup_tasks, job_tasks, local_tasks, cost_tasks):
    for task in module.TASKS:
        ns.add_task(task)
