"""Replacing a lost MASTER with the Pulumi CLI without touching anything else (pure decisions).

The master is the stack's only EC2 instance resource (infra/master.py's component). The workers are
an Auto Scaling group (infra/workers.py): their instances are not in the stack, the group replaces a
lost one itself, and no URN names a worker, so this recovery is for the master only.

When fab runs Pulumi to replace a lost master, it must change the master only: a plain
`pulumi up --refresh --yes` applies every pending difference of the stack (a changed pin re-runs
setup and replaces the worker group in the middle of a run). So:

1. the lost master must be `terminated` first (the provider drops an instance from the state only
   then; a refresh while it is `shutting-down` changes nothing) - node_setup/aws/termination.py waits;
2. `refresh_argv`: refresh only the master's instance (`--target` its URN, found in the stack's
   exported state by its instance id and its parent, the master's component: `master_urn`);
3. `preview_argv` + `other_changes`: a full preview; any pending change on a resource that is neither
   the master nor depends on it stops the recovery, and `manual_command` is printed for the user;
4. `up_argv`: `pulumi up` of the master and, as the engine needs, its dependents (the setup step).

`stack_holds(state)` says what the stack holds afterwards (its instances, and operations an interrupted
run could not record). node_setup/pulumi_recovery.py runs the commands (never killing Pulumi).
"""

from __future__ import annotations

import json
import shlex
from typing import Iterable, Mapping

from cluster.stack.lifecycle import PULUMI, check_stack

INSTANCE_TYPE = "aws:ec2/instance:Instance"
MASTER_COMPONENT = "xeon-cluster:infra:Master"  # infra/master.py's component, the master instance's parent
STACK_TYPE = "pulumi:pulumi:Stack"
NO_CHANGE_OPS = ("same", "read", "refresh")  # preview steps that change nothing

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


def dependents(state: Mapping, urns: Iterable[str]) -> set[str]:
    """The URNs that depend, directly or through others, on `urns` (their inputs come from them)."""
    found = set(urns)
    resources = _resources(state)
    grew = True
    while grew:
        grew = False
        for r in resources:
            urn = r.get("urn")
            if urn is None or urn in found:
                continue
            needs = set(r.get("dependencies") or [])
            for deps in (r.get("propertyDependencies") or {}).values():
                needs.update(deps or [])
            if needs & found:
                found.add(urn)
                grew = True
    return found - set(urns)


def other_changes(preview: Mapping, allowed: Iterable[str]) -> list[tuple[str, str]]:
    """The (op, URN) steps of a `pulumi preview --json` that change a resource outside `allowed`."""
    allowed = set(allowed)
    out = []
    for step in (preview or {}).get("steps") or []:
        op, urn = step.get("op", ""), step.get("urn", "")
        if op in NO_CHANGE_OPS or urn in allowed or urn_type(urn) == STACK_TYPE:
            continue
        out.append((op, urn))
    return out


def urn_type(urn: str) -> str:
    """The resource type of a URN (`urn:pulumi:stack::project::parent$type::name` -> `type`)."""
    parts = urn.split("::")
    return parts[2].rsplit("$", 1)[-1] if len(parts) >= 4 else ""


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


def preview_argv(stack: str, cwd: str | None = None) -> tuple[str, ...]:
    return tuple(_base(("preview",), stack, cwd) + ["--json"])


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
