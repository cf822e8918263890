"""Idle auto-stop under the Pulumi mocks: every node terminates when it shuts itself down, and a bad
autoStopIdle stops the program before anything is registered."""

from __future__ import annotations

import pytest

from cluster.stack.spec import ConfigError
from tests.infra.conftest import GROUP, LAUNCH_TEMPLATE, minimal_config


@pytest.mark.parametrize("config", [{}, {"masterSpot": False, "workerSpot": False}, {"autoStopIdle": "off"}],
                         ids=["spot", "on-demand", "auto-stop off"])
def test_every_node_terminates_when_it_shuts_itself_down(harness, config):
    harness.run(minimal_config(workerCount=2, **config))
    nodes = harness.monitor.of_type(LAUNCH_TEMPLATE)  # the master's, the workers'
    assert sorted(n.name for n in nodes) == ["xeon-dev-master", "xeon-dev-worker"]
    assert {n.inputs.get("instanceInitiatedShutdownBehavior") for n in nodes} == {"terminate"}


def test_auto_stop_idle_is_a_known_setting(harness):
    harness.run(minimal_config(autoStopIdle="2h"))
    assert len(harness.monitor.of_type(GROUP)) == 2


@pytest.mark.parametrize("value", ["soon", "0", "8d"])
def test_bad_auto_stop_idle_names_key_value_and_allowed_and_registers_nothing(harness, value):
    with pytest.raises(ConfigError) as caught:
        harness.run(minimal_config(autoStopIdle=value))
    assert len(caught.value.problems) == 1
    problem = caught.value.problems[0]
    assert problem.startswith("autoStopIdle: ") and repr(value) in problem and "(or off)" in problem
    assert harness.monitor.registrations == []


def test_a_typo_of_it_is_reported_with_the_suggestion(harness):
    with pytest.raises(ConfigError, match="autoStopidle: not a setting.*did you mean autoStopIdle"):
        harness.run(minimal_config(autoStopidle="1h"))
