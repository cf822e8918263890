"""Read the stack's Pulumi config once and turn it into a validated ClusterSpec.

Pulumi hands config to the program as strings (objects and arrays as JSON text). This module only
collects the values of this project's namespace; `ClusterSpec.from_config` decides what they mean
and reports every problem at once. A key in this project's namespace that the program does not
know (usually a typo) is reported too, since Pulumi itself would silently ignore it.
"""

from __future__ import annotations

import json
from typing import Any

import pulumi
from pulumi.runtime import config as runtime_config

from cluster.node import autostop
from cluster.stack.config_keys import (AUTO_STOP_IDLE, BY_KEY, CONFIG_KEYS, KNOWN_KEYS, PROJECT, is_unset,
                                       unknown_key_problem)
from cluster.stack.spec import ClusterSpec, ConfigError, unique_cidrs


def _project_keys() -> set[str]:
    """Names of every config key set in this project's namespace (explicitly or via the CLI)."""
    names = set(runtime_config.CONFIG.get()) | set(runtime_config.get_config_env())
    prefix = PROJECT + ":"
    return {name[len(prefix):] for name in names if name.startswith(prefix)}


def _decode(key: str, raw: Any) -> Any:
    if is_unset(key, raw):
        return None
    if BY_KEY[key].kind is list and isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw  # a bare string: the spec reads one CIDR, and reports a bad tag
    return raw


def read_config_values(config: pulumi.Config | None = None) -> dict[str, Any]:
    """The project's config as a plain dict of camelCase keys (unset keys left out)."""
    config = config or pulumi.Config(PROJECT)
    values = {}
    for entry in CONFIG_KEYS:
        value = _decode(entry.key, config.get(entry.key))
        if value is not None:
            values[entry.key] = value
    return values


def auto_stop_idle(config: pulumi.Config | None = None) -> int | None:
    """autoStopIdle in seconds (None: `off`): not part of the spec; `fab setup`, `fab up` and a job arm the
    master's auto-stop with it, and the setup step a new master's. AutostopError for a bad value."""
    return autostop.stack_idle_seconds((config or pulumi.Config(PROJECT)).get(AUTO_STOP_IDLE), AUTO_STOP_IDLE)


def auto_stop_problems(config: pulumi.Config | None = None) -> list[str]:
    """autoStopIdle checked here so that `pulumi up` refuses a bad value with the other settings, before
    anything is created."""
    try:
        auto_stop_idle(config)
    except autostop.AutostopError as exc:
        return [str(exc)]
    return []


def load_spec() -> ClusterSpec:
    """The validated spec of this stack; raises ConfigError naming every bad or unknown key."""
    problems = [unknown_key_problem(key) for key in sorted(_project_keys() - KNOWN_KEYS)]
    problems += auto_stop_problems()
    region = pulumi.Config("aws").get("region") or ""
    values = read_config_values()
    try:
        spec = ClusterSpec.from_config(values, stack=pulumi.get_stack(), region=region)
    except ConfigError as err:
        raise ConfigError(problems + err.problems) from None
    if problems:
        raise ConfigError(problems)
    admin = values.get("adminCidrs") or ()
    for note in unique_cidrs([admin] if isinstance(admin, str) else admin)[1]:
        pulumi.log.warn(note)  # the spec keeps the first of each network; say what was dropped
    return spec
