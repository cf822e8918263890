"""`fab autostop`: power the cluster off once no job or `fab exec` has run for the idle time.

    fab autostop [--idle 30m] [--poll 30s] [--cancel] [--cluster ...]

Arming refreshes the service on every node (what `fab setup` installs), distributes the cluster's
SSH key (the master powers the workers off over SSH, as `fab train` reaches them), records the
cluster's full node list on the master (what it powers off; `fab train --nodes N` never narrows
it), then arms the
service on the master and prints its status line; `--cancel` disarms it. The rule and the
power-off are in cluster/node/autostop.py.
"""

from __future__ import annotations

from cluster.node import autostop
from node_setup.ssh.fanout import outcome_table
from node_setup.tasks import common
from node_setup.tasks.common import CLUSTER_HELP, FAILED, REGION_HELP, UNREACHABLE, duration, fail, task


@task(help={
    "idle": f"power off after this long without a job or fab exec: 30m, 2h, 90s, 1h30m (default "
            f"{autostop.DEFAULT_IDLE}, as the stack's autoStopIdle)",
    "poll": f"time between the service's checks, e.g. 30s (default {autostop.DEFAULT_POLL_S}s)",
    "cancel": "disarm it: the cluster stays up",
    "cluster": CLUSTER_HELP,
    "region": REGION_HELP,
}, kinds={"idle": duration, "poll": duration})
def autostop_(c, idle=autostop.idle_seconds(autostop.DEFAULT_IDLE), poll=float(autostop.DEFAULT_POLL_S), cancel=False,
              cluster="", region=""):
    """Arm (or --cancel) the master's idle auto-stop: every node powers off after --idle without activity."""
    from node_setup.ssh import autostop as remote
    from node_setup.ssh.distribute import DistributionError, distribute
    from node_setup.ssh.keys import KeyStoreError

    try:
        idle_s = autostop.idle_seconds(f"{idle:g}s", "--idle")
        poll_s = autostop.poll_seconds(f"{poll:g}", "--poll")
    except autostop.AutostopError as exc:
        raise fail(str(exc)) from None
    inventory = common.inventory(cluster, region)
    conns = common.connect(inventory)
    master = conns[inventory.master.name]
    if cancel:
        try:
            print(autostop.status_line(remote.cancel(master)))
        except Exception as exc:  # noqa: BLE001 - one line, the reason
            raise fail(f"could not cancel auto-stop on {inventory.master.name}: {exc}", UNREACHABLE) from None
        return
    installed = remote.install(conns)
    if not all(o.ok for o in installed):
        print(outcome_table(installed))
        raise fail("could not install the auto-stop service on every node (above); nothing was armed",
                   UNREACHABLE if any(o.detail.startswith(("unreachable", "no result")) for o in installed)
                   else FAILED)
    try:
        remote.record_distribution(inventory, conns, distribute(inventory, conns=conns))
    except DistributionError as exc:
        raise fail(f"the master cannot reach every worker, so it could not power them off: {exc}; "
                   "nothing was armed", UNREACHABLE) from None
    except KeyStoreError:
        raise  # the controller's key store: one line and exit 2 (node_setup/tasks/executor.py)
    except Exception as exc:  # noqa: BLE001 - one line, the reason
        raise fail(f"could not record the cluster's nodes on {inventory.master.name}: {exc}; nothing was armed",
                   UNREACHABLE) from None
    try:
        state = remote.arm(master, idle_s, poll_s)
    except Exception as exc:  # noqa: BLE001 - one line, the reason
        raise fail(f"could not arm auto-stop on {inventory.master.name}: {exc}", FAILED) from None
    print(autostop.status_line(state))
    print(f"  {len(inventory.nodes)} node(s) power off together ({state.mode} power-off); "
          "`fab autostop --cancel` disarms it")


TASKS = [autostop_]
TASK_NAMES = {"autostop_": "autostop"}
