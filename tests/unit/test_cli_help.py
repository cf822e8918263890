"""`fab --help TASK`: the options in the task's groups, sorted within each, every value's kind shown
(node_setup/tasks/parsing.py). Runs Fabric's program on the project's tasks (what `fab` and
`xeon-cluster` run) in this process."""

from __future__ import annotations

import re

import pytest

from fabric import Config
from fabric.main import Fab

from node_setup.tasks import ns
from node_setup.tasks.executor import Executor

SPEC = re.compile(r"^  (-\w \S+, )?(--[\w\[\]-]+)(=\S+)?\s")


def task_help(name: str, capsys) -> str:
    program = Fab(name="xeon-cluster", binary="xeon-cluster", namespace=ns, executor_class=Executor,
                  config_class=Config)  # a fresh one per run: a Program keeps the last run's parse
    program.run(["xeon-cluster", "--help", name], exit=False)
    return capsys.readouterr().out


def sections(text: str) -> dict[str, list[str]]:
    """Title -> the long flags listed under it (in their printed order)."""
    found: dict[str, list[str]] = {}
    title = None
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            title = line[:-1]
            found[title] = []
        elif title is not None and (match := SPEC.match(line)):
            found[title].append(match.group(2).replace("[no-]", ""))
    return found


def test_train_help_is_grouped_like_accelerate_launch(capsys):
    groups = sections(task_help("train", capsys))
    assert list(groups)[:6] == ["Docstring", "Cluster", "Program", "Training", "Spot and recovery", "Output"]
    assert "--nodes" in groups["Cluster"] and "--script" in groups["Program"]
    assert "--batch-size" in groups["Training"] and "--managed" in groups["Spot and recovery"]
    assert "--output-dir" in groups["Output"]
    for title, flags in groups.items():
        assert flags == sorted(flags), title
    listed = [f for flags in groups.values() for f in flags]
    every = {f"--{a.names[0]}" for a in ns["train"].get_arguments()}
    assert sorted(listed) == sorted(every)  # each option once, none lost


def test_every_value_shows_its_kind_floats_and_durations_too(capsys):
    text = task_help("train", capsys)
    assert "-n INT, --nodes=INT" in text
    assert "--ddp-bucket-mb=FLOAT" in text
    assert "--wait-for-capacity=DURATION" in text and "--checkpoint-every=DURATION" in text
    assert re.search(r"^  --managed\s", text, re.M)  # a switch takes no value
    plan = task_help("plan", capsys)
    assert "--hourly-usd=FLOAT" in plan and "--[no-]placement-group" in plan


@pytest.mark.parametrize("name", ["plan", "autostop", "k8s-job"])
def test_other_tasks_list_their_options_sorted(name, capsys):
    groups = sections(task_help(name, capsys))
    for title, flags in groups.items():
        assert flags == sorted(flags), (name, title)
    listed = sorted(f for flags in groups.values() for f in flags)
    assert listed == sorted(f"--{a.names[0]}" for a in ns[name].get_arguments())
