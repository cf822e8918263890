"""Every stack setting in one table: its key, the ClusterSpec attribute, its type, its "unset" value.

Read by `ClusterSpec.from_config` (what each key means), infra/config.py (which keys the Pulumi
program reads), node_setup/stack_config.py (a stack file read without the CLI) and the schema test
that compares this table with Pulumi.yaml. A new setting is one row here, one key in Pulumi.yaml
and one attribute of ClusterSpec.

Pulumi's project config types are string, integer, boolean and array only, so a decimal
(spotMaxPrice) is a string, a map (tags) a list of key=value strings, and an optional number has
a Pulumi.yaml default that means "not set" (`unset`).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

PROJECT = "xeon-cluster"

PULUMI_TYPES = {str: "string", float: "string", int: "integer", bool: "boolean", list: "array"}


@dataclass(frozen=True)
class ConfigKey:
    key: str  # camelCase, as in `pulumi config set <key>`
    attr: str  # the ClusterSpec attribute it sets
    kind: type  # str, float (a decimal string), int, bool or list (of strings)
    unset: Any = None  # the Pulumi.yaml default that means "not set" (besides "" and a missing key)

    @property
    def pulumi_type(self) -> str:
        return PULUMI_TYPES[self.kind]


CONFIG_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey("publicKey", "public_key", str),
    ConfigKey("adminCidrs", "admin_cidrs", list),
    ConfigKey("allowSshFromAnywhere", "allow_ssh_from_anywhere", bool),
    ConfigKey("clusterName", "cluster_name", str),
    ConfigKey("instanceType", "instance_type", str),
    ConfigKey("instanceTypes", "instance_types", list),
    ConfigKey("sockets", "sockets", int, unset="0"),
    ConfigKey("physicalCores", "physical_cores", int, unset="0"),
    ConfigKey("workerCount", "worker_count", int),
    ConfigKey("masterSpot", "master_spot", bool),
    ConfigKey("workerSpot", "worker_spot", bool),
    ConfigKey("spotMaxPrice", "spot_max_price", float),
    ConfigKey("onDemandFallback", "on_demand_fallback", str),
    ConfigKey("baseAmi", "base_ami", str),
    ConfigKey("sshUser", "ssh_user", str),
    ConfigKey("privateKeyPath", "private_key_path", str),
    ConfigKey("rootVolumeGib", "root_volume_gib", int),
    ConfigKey("rootVolumeType", "root_volume_type", str),
    ConfigKey("placementGroup", "placement_group", bool),
    ConfigKey("softwareProfile", "software_profile", str),
    ConfigKey("bake", "bake", bool),
    ConfigKey("keepImage", "keep_image", bool),
    ConfigKey("vpcId", "vpc_id", str),
    ConfigKey("subnetId", "subnet_id", str),
    ConfigKey("availabilityZone", "availability_zone", str),
    ConfigKey("zoneMove", "zone_move", bool),
    ConfigKey("destroyBucket", "destroy_bucket", bool),
    ConfigKey("tags", "tags", list),
)
BY_KEY = {k.key: k for k in CONFIG_KEYS}

# Settings of the nodes' own services: read from the same stack file, but not part of ClusterSpec
# (so not in Pulumi.yaml's schema, which declares the spec's keys). The Pulumi program checks them
# with the others (infra/config.py); `fab train` reads them from the stack file (node_setup/stack_config.py).
AUTO_STOP_IDLE = "autoStopIdle"  # idle time before the cluster powers off (cluster/node/autostop.py); "off"
NODE_KEYS: tuple[ConfigKey, ...] = (ConfigKey(AUTO_STOP_IDLE, "auto_stop_idle", str),)
KNOWN_KEYS = frozenset(BY_KEY) | {k.key for k in NODE_KEYS}


def is_unset(key: str, value: Any) -> bool:
    """Whether a raw value means "not set": missing, empty, or the key's Pulumi.yaml placeholder."""
    if value is None or value == "":
        return True
    known = BY_KEY.get(key)
    return known is not None and known.unset is not None and str(value) == known.unset


def unknown_key_problem(key: str, where: str = PROJECT) -> str:
    """`<where>:<key>: not a setting...`, with the closest known key as a suggestion."""
    close = difflib.get_close_matches(key, sorted(KNOWN_KEYS), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}? " if close else ""
    return (f"{where}:{key}: not a setting of this project; {hint}allowed: {', '.join(sorted(KNOWN_KEYS))} "
            f"(remove it with `pulumi config rm {key}`)")
