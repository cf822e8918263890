"""`fab train`'s and `fab k8s-job`'s options come from one declaration (cluster/job/train_options.py's JobOptions):
what a user types reaches the task body as the typed value, each task takes exactly the declared options, and a
job file reads the same keys."""

from __future__ import annotations

import dataclasses

import pytest
from invoke import Collection, Program

from cluster.job.train_options import SAME, JobOptions
from node_setup.tasks import job_options
from node_setup.tasks.common import Unset
from node_setup.tasks.k8s import k8s_job
from node_setup.tasks.train import train

DECLARED = [f for f in dataclasses.fields(JobOptions) if "cli" in f.metadata]
TRAIN_OWN = {"cluster", "region", "dry_run", "all_ranks", "file"}
K8S_OWN = {"api", "image", "instance_type", "cores", "profile", "name", "namespace", "pvc", "output"}


def _parsed(*words: str) -> JobOptions:
    """The JobOptions a task made by job_task hands its body for these command-line words."""
    got = []

    @job_options.job_task(job_options.TRAIN, own={})
    def probe(c, options):
        got.append(options)

    Program(namespace=Collection(probe), name="probe").run(["probe", "probe", *words], exit=False)
    return got[0]


def test_typed_values_reach_the_body_and_what_is_left_out_is_none():
    options = _parsed("--nodes", "3", "--epochs", "2", "--checkpoint-every", "30m", "--wait-for-capacity", "off",
                      "--ddp-bucket-mb", "12.5", "--managed", "--model", "m", "--launcher", "torchrun")
    assert (options.nodes, options.epochs, options.checkpoint_every, options.wait_for_capacity,
            options.ddp_bucket_mb, options.managed, options.model, options.launcher) == (
        3, 2, 1800.0, 0.0, 12.5, True, "m", "torchrun")
    left_out = _parsed()
    assert left_out.batch_size is None and left_out.checkpoint_every is None and left_out.resume is False
    assert left_out.bf16 == "auto" and left_out.workdir_limit_mb == JobOptions().workdir_limit_mb


@pytest.mark.parametrize("field", DECLARED, ids=[f.name for f in DECLARED])
def test_each_declared_option_is_an_option_of_the_tasks_that_take_it(field):
    cli = field.metadata["cli"]
    name = field.name.replace("_", "-")
    for task, takes, help_text in ((train, True, cli.help),
                                   (k8s_job, cli.k8s is not None, cli.help if cli.k8s == SAME else cli.k8s)):
        arguments = {a.name.replace("_", "-"): a for a in task.get_arguments()}
        if task is k8s_job and field.name in K8S_OWN:
            continue  # `fab k8s-job --name` is the Kubernetes job's name, an option of its own
        assert (name in arguments) == takes, (task.name, name)
        if takes:
            assert arguments[name].help == help_text
            assert not isinstance(arguments[name].default, Unset) or arguments[name].default.default == cli.unset
            assert any(name in names for names in task.option_groups.values())


def test_a_task_has_no_option_its_declaration_does_not_name():
    declared = {f.name for f in DECLARED}
    for task, own in ((train, TRAIN_OWN), (k8s_job, K8S_OWN)):
        names = {a.name.replace("-", "_") for a in task.get_arguments()}
        assert names - declared <= own and own <= names


def test_a_job_files_path_keys_are_the_declared_ones():
    paths = {f.name for f in DECLARED if f.metadata["cli"].path == "path"}
    maybe = {f.name for f in DECLARED if f.metadata["cli"].path == "maybe"}
    assert set(train.job_file_paths) == paths == {"script", "workdir", "requirements"}
    assert set(train.job_file_maybe_paths) == maybe | {"cluster"}
