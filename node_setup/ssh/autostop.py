"""Idle auto-stop on a cluster's nodes: install the service, arm, cancel, read its status.

The text (service, power-off command, install section) and the status line come from
cluster/node/autostop.py; this module only runs them over SSH.
"""

from __future__ import annotations

import io
import shlex
import sys
from typing import Mapping

from cluster.node import autostop
from node_setup.backends import backend_for
from node_setup.ssh.fanout import NodeOutcome, on_nodes

INSTALL_TIMEOUT_S = 60


def _bash(script: str) -> str:
    return "bash -c " + shlex.quote(script)


def install(conns: Mapping[str, object]) -> list[NodeOutcome]:
    """Put the service and the power-off command on every node (what `fab setup` installs)."""
    return on_nodes(conns, _bash(autostop.install_script()), timeout=INSTALL_TIMEOUT_S)


def _run(master, command: str) -> autostop.Status:
    guarded = (f"if [ -x {shlex.quote(autostop.SERVICE_PATH)} ]; then {command}; "
               "else echo installed=no; fi")
    result = master.run(guarded, hide=True, warn=True, in_stream=False, timeout=60)
    if not result.ok:
        raise RuntimeError(f"{command.split()[-1]} failed on the master (exit {result.exited}): "
                           f"{(result.stdout + result.stderr).strip()}")
    return autostop.parse_status(result.stdout)


def record_nodes(master, inventory, host_keys: Mapping[str, str]) -> None:
    """Write the cluster's full node list on the master (what the service powers off): called with the
    whole cluster by `fab setup`, `fab distribute` and `fab autostop`, never by `fab train --nodes N`.
    `host_keys`: alias -> the host key the controller verified (distribution's result)."""
    files = autostop.node_list_files(inventory.name, inventory.nodes, inventory.user, host_keys)
    files.update(backend_for(inventory.kind).idle_stop_files(inventory))  # AWS: the group it sets to 0 first
    master.run(f"mkdir -p {shlex.quote(autostop.STATE_DIR)} && chmod 700 {shlex.quote(autostop.STATE_DIR)}",
               hide=True, in_stream=False)
    for path, text in files.items():
        master.put(io.StringIO(text), remote=f"{path}.xc-new")
        master.run(f"chmod 600 {shlex.quote(path)}.xc-new && mv -f {shlex.quote(path)}.xc-new {shlex.quote(path)}",
                   hide=True, in_stream=False)


def record_distribution(inventory, conns: Mapping[str, object], result) -> None:
    """record_nodes from a whole-cluster DistributionResult (its nodes' verified host keys)."""
    record_nodes(conns[inventory.master.name], inventory, {n.node: n.host_key for n in result.nodes})


def arm_at_setup(inventory, conns: Mapping[str, object], idle_s: int, *, force: bool) -> autostop.Status:
    """`fab setup`'s arming: the cluster key and the full node list (a whole-cluster distribution),
    then arm: `force` (an explicit --auto-stop) re-arms, else the stack's default arms unless it is
    armed or was cancelled on this master. Raises DistributionError or RuntimeError."""
    from node_setup.ssh.distribute import distribute

    result = distribute(inventory, conns=dict(conns))
    record_distribution(inventory, conns, result)
    master = conns[inventory.master.name]
    command = (autostop.arm_command if force else autostop.arm_default_command)(idle_s, autostop.poll_for(idle_s))
    return _run(master, command)


def arm(master, idle_s: int, poll_s: int) -> autostop.Status:
    return _run(master, autostop.arm_command(idle_s, poll_s))


def arm_default(master, inventory) -> autostop.Status | None:
    """Arm the cluster's default idle auto-stop (its backend's `default_idle_stop`: on AWS the stack's
    autoStopIdle; none elsewhere) unless it is armed or was cancelled on this master; a problem is one
    warning line. What a job's start arms."""
    try:
        idle_s = backend_for(inventory.kind).default_idle_stop(inventory)
        if idle_s is None:
            return None
        return _run(master, autostop.arm_default_command(idle_s))
    except Exception as exc:  # noqa: BLE001 - never in the way of the job that was just started
        print(f"warning: idle auto-stop not armed: {exc}", file=sys.stderr)
        return None


def cancel(master) -> autostop.Status:
    return _run(master, autostop.cancel_command())


def status(master) -> autostop.Status:
    return _run(master, autostop.status_command())


def status_line(master) -> str:
    """`fab status`'s auto-stop line; never raises (an unreachable master is said so)."""
    return status_report(master)[0]


def status_report(master) -> tuple[str, str | None]:
    """(`fab status`'s auto-stop line, the problem to list when workers were left running, else None)."""
    try:
        state = status(master)
    except Exception as exc:  # noqa: BLE001 - a status line, not a failure
        return f"auto-stop: unknown ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})", None
    return autostop.status_line(state), autostop.problem(state)
