"""Which stack settings replace what, as the program's own triggers define them, and what `pulumi up` would
do after a change of the stack file (pure).

One list, read by the Pulumi program and by the toolkit:
- WORKER_TEMPLATE: every field of a launch template but its user data, with the settings it is made from (the
  master's template has the same fields: infra/node_group.py). Each group's replacement trigger is exactly
  these fields, with its market, type, image and subnet, so a change of any of WORKER_SETTINGS replaces every
  worker and one of MASTER_SETTINGS the master (each group is replaced, deleting first).
- BAKE_SETTINGS: the image's identity, its bake tag (`bake_tag`, a hash of the profile's fingerprint: the
  profile and its pins): a change builds a new image (EC2 Image Builder, infra/image.py), and every node, the
  master too, moves to it; so does a new `baseAmi` with a bake (the image's base).
- MASTER_SETTINGS: what replaces the master (its group of one): the same template fields, made from the
  master's market (`masterSpot`) and its one type, and the image and subnet every node shares.

The program exports `node_settings(spec)` as its `nodeSettings` output: every setting of the stack (the
public key as a short SHA-256 digest, enough to see a change; not `privateKeyPath`, a path on the
controller), the bake tag and the shape of the workers' template. Two readers compare it with the stack
file as it is now:
- `fab preflight` (`replacements`): one warning per changed setting that replaces nodes, naming what.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

from cluster.stack.config_keys import CONFIG_KEYS
from cluster.stack.spec import FALLBACK_OFF, ClusterSpec

OUTPUT = "nodeSettings"  # the stack output that records them (infra/program.py)
BAKE_TAG = "bakeTag"  # the image's identity, in that output
TEMPLATE_SHAPE = "workerTemplate"  # the fields of the workers' template, in that output

# The workers' launch template, field by field (the Pulumi argument names; its user data and its image are
# not listed: a new user data makes a new version and replaces no worker; the image is the group's trigger
# on its own) -> the stack settings each is made from. A field made of constants lists none.
WORKER_TEMPLATE: dict[str, tuple[str, ...]] = {
    "instance_type": ("instanceType", "instanceTypes"),  # the first of instanceTypes; the rest are overrides
    "key_name": ("publicKey",),
    "network_interfaces": ("vpcId", "subnetId"),  # with a public address (the default VPC): the groups go here
    "vpc_security_group_ids": ("vpcId", "subnetId"),
    "placement": ("placementGroup",),
    # none with a mixed instances policy (several types, or onDemandFallback)
    "instance_market_options": ("workerSpot", "spotMaxPrice", "instanceTypes", "onDemandFallback"),
    "instance_initiated_shutdown_behavior": (),
    "iam_instance_profile": (),
    "metadata_options": (),
    "block_device_mappings": ("rootVolumeGib", "rootVolumeType"),
    "tag_specifications": ("tags", "sshUser", "softwareProfile", "clusterName"),
}
# The image the workers boot: the baked one (its bake tag), or without a bake the base image.
BAKE_SETTINGS = ("softwareProfile",)
IMAGE_SETTINGS = ("bake", "baseAmi")  # baseAmi: the base image without a bake, the built image's base with one
WORKER_SETTINGS = tuple(sorted({s for made_of in WORKER_TEMPLATE.values() for s in made_of}
                               | {"workerSpot", "instanceType"} | set(BAKE_SETTINGS) | set(IMAGE_SETTINGS)))
# The master's template: the workers' fields, its own market and one type (the first of instanceTypes: the
# master has no mixed instances policy, so the list's other types and onDemandFallback are the workers' alone).
MASTER_SETTINGS = tuple(sorted(({s for made_of in WORKER_TEMPLATE.values() for s in made_of}
                                - {"workerSpot", "instanceTypes", "onDemandFallback"})
                               | {"masterSpot", "instanceType"} | set(BAKE_SETTINGS) | set(IMAGE_SETTINGS)))
# With zoneMove, availabilityZone decides the kept subnet again (infra/placement.py): both groups move when the
# zone's subnet is another (`replaced_by`); without it, the subnet the stack kept stays.
NOT_RECORDED = ("privateKeyPath",)  # a path on the controller that runs pulumi: nothing in AWS depends on it

CANNOT_TELL = "cannot tell whether `pulumi up` would replace nodes"


def bake_tag(fingerprint: str) -> str:
    """A short stable id of the software (the profile's fingerprint): names the image and replaces it when
    the software changes, never when only the master instance does."""
    return hashlib.sha256(f"bake|{fingerprint}".encode()).hexdigest()[:12]


def template_shape() -> str:
    """The fields of the workers' template this program makes, as a short digest (a program that makes
    another template replaces every worker)."""
    return "sha256:" + hashlib.sha256("|".join(sorted(WORKER_TEMPLATE)).encode()).hexdigest()[:16]


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.strip().encode()).hexdigest()[:16]


def node_settings(spec: ClusterSpec) -> dict[str, Any]:
    """Every setting of the stack by config key (lists as lists), the bake tag and the template's shape, as
    the program exports them."""
    values: dict[str, Any] = {}
    for entry in CONFIG_KEYS:
        if entry.key in NOT_RECORDED:
            continue
        value = getattr(spec, entry.attr)
        values[entry.key] = sorted(value.items()) if isinstance(value, Mapping) else (
            list(value) if isinstance(value, (tuple, list)) else value)
    values["publicKey"] = _digest(spec.public_key)
    values[BAKE_TAG] = bake_tag(spec.profile.fingerprint())
    values[TEMPLATE_SHAPE] = template_shape()
    return values


def _normal(value: Any) -> Any:
    """A value as it comes back from a stack output (JSON): tuples are lists, pairs are lists."""
    if isinstance(value, (tuple, list)):
        return [_normal(v) for v in value]
    return value


def replaced_by(key: str, wanted: Mapping[str, Any]) -> str | None:
    """What `pulumi up` replaces when `key` changes to the value in `wanted`; None: no node."""
    if key == BAKE_TAG or key in BAKE_SETTINGS or (key == "baseAmi" and wanted.get("bake")):
        return "the image (Image Builder builds it again) and every node"
    if key == TEMPLATE_SHAPE:
        return "every worker (this checkout's program makes another launch template)"
    if key in ("zoneMove", "availabilityZone"):  # the kept subnet's trigger names the zone with zoneMove only
        return ("every node when availabilityZone's subnet is not the kept one (the zone move: the master's and "
                "the workers' groups, deleting first)") if wanted.get("zoneMove") else None
    master = key in MASTER_SETTINGS and (key != "spotMaxPrice" or bool(wanted.get("masterSpot")))
    workers = key in WORKER_SETTINGS and (key != "spotMaxPrice" or bool(wanted.get("workerSpot")))
    if master and workers:
        return "every node"
    if master:
        return "the master"
    if workers:
        return "every worker (the group is replaced, deleting first)"
    return None


def _shown(key: str, value: Any) -> str:
    if value is None or value == "" or value == []:
        return "(not set)"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join("=".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v) for v in value)
    return str(value)


def _change(key: str, before: Any, after: Any) -> str:
    if key in ("publicKey", BAKE_TAG, TEMPLATE_SHAPE):
        return "changed"
    return f"{_shown(key, before)} -> {_shown(key, after)}"


def differences(wanted: Mapping[str, Any], deployed: Mapping[str, Any]) -> list[str]:
    """Every key whose value differs between the stack file (`wanted`) and the deployed output, in
    `wanted`'s order; a key the deployed output lacks counts as a difference (nothing to compare with)."""
    return [k for k in wanted if k not in deployed or _normal(deployed[k]) != _normal(wanted[k])]


def replacements(wanted: Mapping[str, Any], deployed: Mapping[str, Any]) -> list[str]:
    """One line per changed setting that replaces nodes: what it was, what it will be, what `pulumi up`
    replaces. A key the deployed output lacks (an older program) is not compared."""
    lines = []
    for key in wanted:
        if key not in deployed or _normal(deployed[key]) == _normal(wanted[key]):
            continue
        if key == "onDemandFallback" and (deployed[key] == FALLBACK_OFF) == (wanted[key] == FALLBACK_OFF):
            continue  # another wait: the group's policy is the same
        what = replaced_by(key, wanted)
        if what:
            name = {BAKE_TAG: "software (the profile's pins)", TEMPLATE_SHAPE: "workers' launch template"}.get(key, key)
            lines.append(f"{name}: {_change(key, deployed[key], wanted[key])}; `pulumi up` replaces {what}")
    return lines


def deployed_settings(outputs: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The recorded settings from the stack's outputs; None when there are none to compare with."""
    if not outputs:
        return None
    found = outputs.get(OUTPUT)
    return found if isinstance(found, Mapping) and found else None
