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

from cluster.spec import ClusterSpec, ConfigError

PROJECT = "xeon-cluster"

# Every key `ClusterSpec.from_config` reads; Pulumi.yaml declares each with a type and default.
STRING_KEYS = ("clusterName", "instanceType", "spotMaxPrice", "baseAmi", "sshUser",
               "privateKeyPath", "rootVolumeType", "softwareProfile", "vpcId", "subnetId",
               "publicKey")
INTEGER_KEYS = ("workerCount", "rootVolumeGib", "sockets", "physicalCores")
BOOLEAN_KEYS = ("masterSpot", "workerSpot", "allowSshFromAnywhere", "placementGroup", "bake",
                "destroyBucket")
ARRAY_KEYS = ("adminCidrs", "tags")
CONFIG_KEYS = STRING_KEYS + INTEGER_KEYS + BOOLEAN_KEYS + ARRAY_KEYS

# Pulumi.yaml needs a default for every optional key (a typed key without one is required by the
# CLI). These defaults mean "not set": the spec then derives or looks the value up.
UNSET_SENTINELS: dict[str, Any] = {"sockets": "0", "physicalCores": "0"}


def _project_keys() -> set[str]:
    """Names of every config key set in this project's namespace (explicitly or via the CLI)."""
    names = set(runtime_config.CONFIG.get()) | set(runtime_config.get_config_env())
    prefix = PROJECT + ":"
    return {name[len(prefix):] for name in names if name.startswith(prefix)}


def _decode(key: str, raw: Any) -> Any:
    if raw is None or raw == "":
        return None
    if UNSET_SENTINELS.get(key) == str(raw):
        return None
    if key in ARRAY_KEYS and isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw  # a bare string: the spec reads one CIDR, and reports a bad tag
    return raw


def read_config_values(config: pulumi.Config | None = None) -> dict[str, Any]:
    """The project's config as a plain dict of camelCase keys (unset keys left out)."""
    config = config or pulumi.Config(PROJECT)
    values = {}
    for key in CONFIG_KEYS:
        value = _decode(key, config.get(key))
        if value is not None:
            values[key] = value
    return values


def load_spec() -> ClusterSpec:
    """The validated spec of this stack; raises ConfigError naming every bad or unknown key."""
    unknown = sorted(_project_keys() - set(CONFIG_KEYS))
    problems = [f"{PROJECT}:{key}: not a setting of this project; allowed: {', '.join(sorted(CONFIG_KEYS))} "
                f"(remove it with `pulumi config rm {key}`)" for key in unknown]
    region = pulumi.Config("aws").get("region") or ""
    try:
        spec = ClusterSpec.from_config(read_config_values(), stack=pulumi.get_stack(), region=region)
    except ConfigError as err:
        raise ConfigError(problems + err.problems) from None
    if problems:
        raise ConfigError(problems)
    return spec
