"""Would a stack change replace nodes? The settings that replace nodes when changed, as the program
records them in its `nodeSettings` output, and their comparison with the stack file's settings
(`fab preflight` warns before `pulumi up`).

What each one replaces:
  publicKey       the key pair: the master and the workers' launch template, so every node
  placementGroup  the placement group every node is launched in: every node
  instanceType    every node
  masterSpot      the master (its market)
  workerSpot      every worker (the group is replaced, deleting first)

The public key is recorded as a short SHA-256 digest: enough to see a change, and an output stays
short. Pure: the caller reads the deployed output (the Pulumi CLI) and passes it in.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

from cluster.stack.config_keys import BY_KEY
from cluster.stack.spec import ClusterSpec

OUTPUT = "nodeSettings"  # the stack output that records them (infra/program.py)
REPLACES = {
    "publicKey": "every node (a new key pair)",
    "placementGroup": "every node",
    "instanceType": "every node",
    "masterSpot": "the master",
    "workerSpot": "every worker",
}
CANNOT_TELL = "cannot tell whether `pulumi up` would replace nodes"


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.strip().encode()).hexdigest()[:16]


def node_settings(spec: ClusterSpec) -> dict[str, Any]:
    """The settings that replace nodes, by config key, as the program exports them."""
    values = {key: getattr(spec, BY_KEY[key].attr) for key in REPLACES}
    values["publicKey"] = _digest(values["publicKey"])
    return values


def _shown(key: str, value: Any) -> str:
    if key == "publicKey":
        return "another key"
    return str(value).lower() if isinstance(value, bool) else str(value)


def replacements(wanted: Mapping[str, Any], deployed: Mapping[str, Any]) -> list[str]:
    """One line per changed setting: what it was, what it will be, what `pulumi up` replaces. A key the
    deployed output lacks (an older program) is not compared."""
    lines = []
    for key, what in REPLACES.items():
        if key in deployed and key in wanted and deployed[key] != wanted[key]:
            change = ("changed" if key == "publicKey"
                      else f"{_shown(key, deployed[key])} -> {_shown(key, wanted[key])}")
            lines.append(f"{key}: {change}; `pulumi up` replaces {what}")
    return lines


def deployed_settings(outputs: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The recorded settings from the stack's outputs; None when there are none to compare with."""
    if not outputs:
        return None
    found = outputs.get(OUTPUT)
    return found if isinstance(found, Mapping) and found else None
