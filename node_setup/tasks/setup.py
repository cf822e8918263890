"""`fab setup`, `fab check`, `fab distribute`, `fab forget`, `fab version`: software and SSH trust.

Exit codes (node_setup/tasks/common.py): 0 every node ok; 1 a node failed (install error, check
mismatch); 2 bad input (the cluster cannot be resolved, unknown profile, controller-side
preparation failed); 3 a node could not be reached by SSH. Failed nodes never stop the others;
rerun to pick up.
"""

from __future__ import annotations

import time
from dataclasses import replace

from invoke import Exit

from cluster.inventory import Inventory
from cluster.node.profiles import PROFILES, get_profile
from cluster.node.render import table
from cluster.node.setup_script import DEFAULT_MIN_FREE_GIB, fingerprint_digest
from node_setup.controller import PROJECT_ROOT, project_version
from node_setup.ssh import connections
from node_setup.tasks import common
from node_setup.tasks.common import (CLUSTER_HELP, FAILED, REGION_HELP, UNREACHABLE, Unset, duration, duration_or_off,
                                     fail, given, task)

TIMEOUT_HELP = f"SSH connect timeout per node, e.g. 30s (default {connections.CONNECT_TIMEOUT}s)"
# Not --connect-timeout: that is Fabric's own core option (whole seconds), which a task option must not shadow.
TIMEOUT_KIND = {"ssh-timeout": duration}


def _inventory(cluster: str | None, region: str | None, profile: str | None = None) -> Inventory:
    inventory = common.inventory(cluster, region)
    if not profile:
        return inventory
    try:
        return replace(inventory, profile=get_profile(profile).name)
    except ValueError as exc:
        raise fail(str(exc)) from None


def _exit_code(oks: list[bool], unreachable: list[bool]) -> int:
    if all(oks):
        return 0
    return UNREACHABLE if any(unreachable) else FAILED


def _setup_idle(inventory: Inventory, option: str) -> int | None:
    """The idle time `fab setup` arms (cluster/node/autostop.py setup_idle); bad input exits 2 first."""
    from cluster.node import autostop
    from node_setup.backends import backend_for

    try:
        return autostop.setup_idle(option, lambda: backend_for(inventory.kind).default_idle_stop(inventory))
    except autostop.AutostopError as exc:
        raise fail(str(exc)) from None


def _arm_autostop(inventory: Inventory, idle_s: int, forced: bool) -> None:
    """Arm the master's idle auto-stop after a setup of every node; a problem is one warning line."""
    from cluster.node import autostop
    from node_setup.ssh import autostop as remote

    conns = common.connect(inventory)
    try:
        print(autostop.status_line(remote.arm_at_setup(inventory, conns, idle_s, force=forced)), flush=True)
    except Exception as exc:  # noqa: BLE001 - the software is installed; say why nothing was armed
        print(f"warning: idle auto-stop not armed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__} "
              "(`fab autostop` arms it)", flush=True)
    finally:
        connections.close_all(conns)


@task(help={
    "cluster": CLUSTER_HELP,
    "region": REGION_HELP,
    "profile": "software profile to install instead of the cluster's (stock or intel)",
    "ssh-timeout": TIMEOUT_HELP,
    "auto-stop": "arm the idle auto-stop for this long without a job or fab exec (30m, 2h, 90s) or `off`; "
                 "default: on an AWS cluster the stack's autoStopIdle (30m), elsewhere off",
}, kinds={**TIMEOUT_KIND, "auto-stop": duration_or_off})
def setup(c, cluster="", region="", profile="", ssh_timeout=float(connections.CONNECT_TIMEOUT),
          auto_stop=Unset(duration_or_off)):
    """Install the software profile and this project on every node, in parallel (idempotent).

    Then arms the idle auto-stop (on AWS by default), so a cluster that never runs a job still powers off."""
    from node_setup.ssh import install, wheels

    inventory = _inventory(cluster, region, profile)
    idle_s = _setup_idle(inventory, "" if not given(auto_stop) else f"{auto_stop:g}s" if auto_stop else "off")
    prof = get_profile(inventory.profile)
    start = time.monotonic()
    try:
        wheel = wheels.build_project_wheel()
    except wheels.InstallError as exc:
        raise fail(str(exc)) from None
    print(f"setup: cluster {inventory.name} ({len(inventory.nodes)} node(s)), profile {prof.name} "
          f"({fingerprint_digest(prof)}), xeon-cluster {wheel.version}", flush=True)
    try:
        results = install.setup_nodes(inventory, profile=prof, project_wheel=wheel, progress=install.print_progress,
                                      connect_timeout=float(ssh_timeout))
    except wheels.InstallError as exc:
        raise fail(str(exc)) from None
    rows = [(r.node, "ok" if r.ok else "failed", "-" if r.changed is None else ("yes" if r.changed else "no"),
             f"{r.seconds:.1f}s", r.summary) for r in results]
    print("\n" + table(rows, ("node", "result", "changed", "time", "detail")), end="")
    for r in results:
        if not r.ok and r.tail:
            print(f"\n{r.node}: last lines of output:\n" + "\n".join(f"  | {line}" for line in r.tail))
    failed = [r.node for r in results if not r.ok]
    print(f"\nsetup: {len(results) - len(failed)}/{len(results)} node(s) ok in {time.monotonic() - start:.1f} s"
          + (f"; failed: {', '.join(failed)} (rerun `fab setup` to pick up)" if failed else ""), flush=True)
    code = _exit_code([r.ok for r in results], [r.unreachable for r in results])
    if code:
        raise Exit(code=code)
    if idle_s is not None:
        _arm_autostop(inventory, idle_s, forced=given(auto_stop))


@task(help={
    "cluster": CLUSTER_HELP,
    "region": REGION_HELP,
    "profile": "software profile to check against instead of the cluster's",
    "min-free-gib": f"least free disk (GiB) where the venv lives (default {DEFAULT_MIN_FREE_GIB:g})",
    "ssh-timeout": TIMEOUT_HELP,
}, kinds=TIMEOUT_KIND)
def check(c, cluster="", region="", profile="", min_free_gib=DEFAULT_MIN_FREE_GIB,
          ssh_timeout=float(connections.CONNECT_TIMEOUT)):
    """Verify every node: package versions match the profile, bf16 CPU flags, tcmalloc, free disk."""
    from node_setup.ssh import install

    inventory = _inventory(cluster, region, profile)
    prof = get_profile(inventory.profile)
    version = project_version() if (PROJECT_ROOT / "pyproject.toml").exists() else None
    results = install.check_nodes(inventory, profile=prof, project_version=version,
                                  min_free_gib=float(min_free_gib), connect_timeout=float(ssh_timeout))
    names = None
    rows = []
    for r in results:
        if r.report is None:
            rows.append((r.node, "failed", r.error))
            continue
        names = names or [i.name for i in r.report.items]
        bad = r.report.failures()
        detail = "; ".join(f"{i.name}: {i.detail}" for i in bad) if bad else \
            ", ".join(i.detail for i in r.report.items if i.name in ("torch", "bf16", "disk"))
        rows.append((r.node, "ok" if not bad else "failed", detail))
    print(f"check: cluster {inventory.name}, profile {prof.name}" + (f", xeon-cluster {version}" if version else "")
          + (f"; checked: {', '.join(names)}" if names else ""))
    print(table(rows, ("node", "result", "detail")), end="", flush=True)
    code = _exit_code([r.ok for r in results], [r.report is None for r in results])
    if code:
        raise Exit(code=code)


@task(help={
    "cluster": CLUSTER_HELP,
    "region": REGION_HELP,
    "ssh-timeout": TIMEOUT_HELP,
}, kinds=TIMEOUT_KIND)
def distribute(c, cluster="", region="", ssh_timeout=float(connections.CONNECT_TIMEOUT)):
    """Cluster SSH key to every node; ssh config, known_hosts and hostfile on the master."""
    from node_setup.ssh import install
    from node_setup.ssh.distribute import distribute as run_distribution

    from node_setup.ssh import autostop as remote_autostop

    inventory = _inventory(cluster, region)
    conns = connections.connections_for(inventory, connect_timeout=float(ssh_timeout))
    try:
        result = run_distribution(inventory, conns=conns, progress=install.print_progress, raise_on_failure=False)
        if result.ok:  # the whole cluster: the idle auto-stop's node list follows it (a replaced node, too)
            try:
                remote_autostop.record_distribution(inventory, conns, result)
            except Exception as exc:  # noqa: BLE001 - one warning line; the distribution itself is done
                print(f"warning: the idle auto-stop's node list was not written on {inventory.master.name}: {exc}")
    finally:
        connections.close_all(conns)
    print("\n" + result.table(), end="")
    if result.ok:
        print(f"distribute: {len(result.nodes)} node(s) in {result.seconds:.1f} s; hostfile on "
              f"{inventory.master.name}: {result.hostfile}", flush=True)
        return
    print(f"distribute: failed on {', '.join(n.node for n in result.failed)}; the master's files were "
          "not written. Rerun when the nodes are back.", flush=True)
    raise Exit(code=_exit_code([n.ok for n in result.nodes], [n.unreachable for n in result.nodes]))


def _cluster_name(cluster: str) -> str:
    """The name the controller's files are kept under, without asking AWS (the cluster may be gone)."""
    from node_setup.discovery import cluster_name

    try:
        return cluster_name(cluster) or cluster
    except ValueError as exc:
        raise fail(str(exc)) from None


@task(help={
    "cluster": "the cluster whose keys to forget: an AWS cluster name, `local` (or local:NAME) or an inventory file",
    "host": "forget only this node's recorded host key (its address), e.g. after it was replaced",
    "spec-key": "replace the key that signs supervised runs' specs: every spec signed before is refused after",
})
def forget(c, cluster="", host="", spec_key=False):
    """Forget what the controller keeps for a cluster: its SSH key pair and recorded host keys.

    Run it after `pulumi destroy` (a later cluster may reuse the addresses), or with --host after a
    node was replaced (it comes back with a new host key). With --spec-key (no --cluster needed) the key
    that signs supervised runs' specs is replaced by a new one: every spec signed before is refused by
    `fab train --managed --resume` from then on.
    """
    from node_setup.ssh import keys

    if spec_key:
        try:
            path = keys.rotate_spec_key()
        except keys.KeyStoreError as exc:
            raise fail(str(exc)) from None
        print(f"the run-spec key {path} is new: specs signed before can no longer be resumed")
        if not cluster:
            return
    if not cluster:
        raise fail("--cluster: not given; name the cluster whose keys to forget (e.g. --cluster demo)")
    name = _cluster_name(cluster)
    try:
        if host:
            removed = keys.forget_host(name, host)
            print(f"forgot {removed} recorded host key line(s) of {host} for cluster {name!r}"
                  + ("" if removed else " (none were recorded)"))
        elif keys.forget_cluster(name):
            print(f"forgot cluster {name!r}: its SSH key pair and recorded host keys are removed")
        else:
            print(f"nothing to forget: no keys are kept for cluster {name!r}")
    except keys.KeyStoreError as exc:
        raise fail(str(exc)) from None


@task(help={})
def version(c):
    """Print this project's version (with the digest of its sources) and the profiles' pins."""
    print(f"xeon-cluster {project_version()}")
    for profile in PROFILES.values():
        print(f"  profile {profile.name} ({fingerprint_digest(profile)}): {', '.join(profile.pip_pins)}")


TASKS = [setup, check, distribute, forget, version]
