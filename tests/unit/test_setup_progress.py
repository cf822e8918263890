"""`fab setup` is never silent for minutes: while a step on a node runs without a line of news (pip installing
the profile, apt unpacking), node_setup/ssh/install.py says every HEARTBEAT_S that it still runs, since when.
The node is a test double of a Fabric connection whose install script is under way until the test has seen
the line it waits for."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from cluster.node.profiles import get_profile
from node_setup.ssh import install

PIP = "::xc:: progress venv pip install (profile stock): torch==2.13.0\n"


class SlowNode:
    """A node whose install prints that pip starts, then nothing until `release` is set."""

    host = "node1"

    def __init__(self):
        self.release = threading.Event()

    def run(self, command, *, out_stream=None, **options):
        if command.startswith("mkdir"):
            return SimpleNamespace(failed=False, stdout="", stderr="")
        out_stream.write(PIP)
        released = self.release.wait(timeout=20)
        tail = "::xc:: step venv changed stock installed\n::xc:: done 1\n"
        out_stream.write(tail)
        return SimpleNamespace(failed=not released, stdout=PIP + tail, stderr="", exited=0 if released else 1)

    def put(self, *args, **kwargs):
        pass


def test_a_long_step_without_news_gets_a_line_saying_it_still_runs(monkeypatch):
    monkeypatch.setattr(install, "HEARTBEAT_S", 0.05)
    node, said = SlowNode(), []

    def progress(line: str) -> None:
        said.append(line)
        if len(said) == 3:  # the step's own line, then two saying it still runs
            node.release.set()

    result = install.install_profile(node, get_profile("stock"), project_wheel=False, progress=progress)
    assert result.ok and result.changed and node.release.is_set()
    assert said[0] == "venv: pip install (profile stock): torch==2.13.0"
    for line in said[1:3]:
        assert line.startswith("venv: still working, ") and \
            line.endswith(" since: venv: pip install (profile stock): torch==2.13.0"), said
    assert said[-1] == "venv changed: stock installed"  # and quiet after the step ended
