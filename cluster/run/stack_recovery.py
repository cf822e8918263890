"""Replacing a lost MASTER with the Pulumi CLI without touching anything else (pure decisions).

The master is the stack's only EC2 instance resource (infra/master.py's component). The workers are
an Auto Scaling group (infra/workers.py): their instances are not in the stack, the group replaces a
lost one itself, and no URN names a worker, so this recovery is for the master only.

When fab runs Pulumi to replace a lost master, it must change the master only: a plain
`pulumi up --refresh --yes` applies every pending difference of the stack (a changed pin re-runs
setup and replaces the worker group in the middle of a run). And a targeted `pulumi up --target
<master> --target-dependents` applies every pending difference of the master's dependents, which on
the program's graph are most of the cluster: the setup step, the image, its snapshot tags, the
workers' launch template and group, the group's policy. A preview cannot tell which of its steps are
real: the setup step's outputs are unknown in a preview, so the image and the group always show as
replaced. So the decision is made from facts, before any Pulumi command changes anything:

1. `pending_settings`: the settings the last `pulumi up` recorded (its `nodeSettings` output, in the
   stack's exported state: `deployed_settings_of`; every setting, the bake tag and the workers'
   template shape, cluster/stack/node_replacement.py) are compared with the stack file as it is now;
   any difference, or nothing recorded, stops the recovery and `manual_command` is printed for the user;
2. the lost master must be `terminated` (the provider drops an instance from the state only then; a
   refresh while it is `shutting-down` changes nothing) - node_setup/aws/termination.py waits;
3. `refresh_argv`: refresh only the master's instance (`--target` its URN, found in the stack's
   exported state by its instance id and its parent, the master's component: `master_urn`);
4. `up_argv`: `pulumi up` of the master and its dependents: with nothing pending, the master is created
   and the setup step updated (the new master set up again); the image and the workers stay.

`stack_holds(state)` says what the stack holds afterwards (its instances, and operations an interrupted
run could not record). node_setup/pulumi_recovery.py runs the commands (never killing Pulumi).
"""

from __future__ import annotations

import json
import shlex
from typing import Iterable, Mapping

from cluster.stack import node_replacement
from cluster.stack.lifecycle import PULUMI, check_stack

INSTANCE_TYPE = "aws:ec2/instance:Instance"
MASTER_COMPONENT = "xeon-cluster:infra:Master"  # infra/master.py's component, the master instance's parent
STACK_TYPE = "pulumi:pulumi:Stack"

# How long fab waits for EC2 to report a lost instance `terminated` before refreshing: a metal
# instance can take about as long to shut down as to start (over 20 minutes); polled every 15 s.
TERMINATED_WAIT_S = 30 * 60
TERMINATED_POLL_S = 15


def _resources(state: Mapping) -> list[Mapping]:
    """The resources of a `pulumi stack export` (version 3) document."""
    return list(((state or {}).get("deployment") or {}).get("resources") or [])


def master_urn(state: Mapping, instance_id: str) -> str | None:
    """The URN of the master's instance `instance_id` in the stack; None when the stack holds no such
    master (an id it does not hold, or an instance outside the master's component)."""
    return next((r["urn"] for r in _resources(state)
                 if r.get("type") == INSTANCE_TYPE and r.get("id") == instance_id and r.get("urn")
                 and MASTER_COMPONENT in urn_parents(r["urn"])), None)


def deployed_settings_of(state: Mapping) -> Mapping | None:
    """The `nodeSettings` output the last `pulumi up` recorded, from the stack's exported state (its stack
    resource's outputs); None when it recorded none (not deployed, or by an older version)."""
    stack = next((r for r in _resources(state) if r.get("type") == STACK_TYPE), None)
    return node_replacement.deployed_settings((stack or {}).get("outputs"))


def pending_settings(wanted: Mapping, deployed: Mapping | None) -> list[str]:
    """What differs between the stack file (`wanted`: node_replacement.node_settings of its spec) and what
    the last `pulumi up` recorded, one short item each; ["..."] saying why when nothing was recorded."""
    if deployed is None:
        return [f"no {node_replacement.OUTPUT} output (the stack was deployed by an older version, or not at all)"]
    found = []
    for key in node_replacement.differences(wanted, deployed):
        what = node_replacement.replaced_by(key, wanted)
        found.append(f"{key}{' (missing from the recorded output)' if key not in deployed else ''}"
                     + (f": replaces {what}" if what else ""))
    return found


def urn_parents(urn: str) -> list[str]:
    """The parent types of a URN (`urn:pulumi:stack::project::a$b$type::name` -> [a, b])."""
    parts = urn.split("::")
    return parts[2].split("$")[:-1] if len(parts) >= 4 else []


def urn_name(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


def _base(verb: Iterable[str], stack: str, cwd: str | None) -> list[str]:
    argv = [PULUMI, *verb, "--stack", check_stack(stack), "--non-interactive"]
    return argv + (["--cwd", cwd] if cwd else [])


def export_argv(stack: str, cwd: str | None = None) -> tuple[str, ...]:
    return tuple(_base(("stack", "export"), stack, cwd))


def refresh_argv(stack: str, urns: Iterable[str], cwd: str | None = None) -> tuple[str, ...]:
    targets = [a for urn in urns for a in ("--target", urn)]
    return tuple(_base(("refresh",), stack, cwd) + ["--yes", *targets])


def up_argv(stack: str, urns: Iterable[str], cwd: str | None = None) -> tuple[str, ...]:
    targets = [a for urn in urns for a in ("--target", urn)]
    return tuple(_base(("up",), stack, cwd) + ["--yes", *targets, "--target-dependents"])


def manual_command(stack: str) -> str:
    """What the user runs (and reviews) when the stack has changes besides the lost nodes."""
    return shlex.join([PULUMI, "up", "--refresh", "--stack", check_stack(stack)])


def parse_json_output(text: str) -> dict:
    """The JSON document in a Pulumi command's output (stderr lines around it are skipped); {} if none."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("{")]
    ends = [i for i, line in enumerate(lines) if line.startswith("}")]
    if starts and ends and ends[-1] >= starts[0]:
        try:
            return json.loads("\n".join(lines[starts[0]:ends[-1] + 1]))
        except ValueError:
            return {}
    return {}


def stack_holds(state: Mapping) -> list[str]:
    """Lines saying what the stack holds: each instance (the master: name and id), operations not recorded."""
    lines = [f"{urn_name(r['urn'])}: {r.get('id') or '(no id)'}" for r in _resources(state)
             if r.get("type") == INSTANCE_TYPE and r.get("urn")]
    pending = ((state or {}).get("deployment") or {}).get("pending_operations") or []
    for op in pending:
        res = op.get("resource") or {}
        lines.append(f"pending {op.get('type', '?')} of {urn_name(res.get('urn', '?'))} (not recorded: "
                     "`pulumi refresh` resolves it; an instance AWS made for it may still run)")
    return lines or ["no instances"]
