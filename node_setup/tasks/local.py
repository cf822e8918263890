"""`fab local-up` / `fab local-down`: the no-AWS cluster of network-namespace nodes on this machine."""

from __future__ import annotations

from node_setup.local import cluster as local_cluster
from node_setup.local import state as local_state
from node_setup.ssh import keys
from node_setup.tasks.common import duration_or_off, duration_or_zero, fail, task


def _progress(line: str) -> None:
    print(line, flush=True)


def _target(name: str) -> str:
    """What `--cluster` takes for this local cluster."""
    return "local" if name == local_state.DEFAULT_NAME else f"local:{name}"


def _name_flag(name: str) -> str:
    return "" if name == local_state.DEFAULT_NAME else f" --name {name}"


@task(help={
    "nodes": f"how many nodes to start (1 to {local_state.MAX_NODES})",
    "name": "local cluster name (default local; `--cluster local` finds the cluster named local)",
    "replace": "tear down a running cluster of that name first instead of refusing",
    "wheelhouse": "shared directory the nodes install packages from (they have no internet)",
    "link_mbit": f"limit what each node sends to M Mbit/s with tc ({local_state.LINK_MBIT_RANGE[0]:g} to "
                 f"{local_state.LINK_MBIT_RANGE[1]:g}; default 0: not limited), e.g. to make the cluster "
                 "communication-bound",
    "link_delay_ms": "with --link-mbit: also delay each node's packets by D ms (netem)",
    "keeper_delay": "start the group keeper: a node that goes down comes back as a new machine after this long, "
                    "e.g. 30s, as an Auto Scaling group replaces a worker (0, the default: no keeper)",
    "keeper_console_delay": "with --keeper-delay: each worker the keeper brings back lists its host keys on its "
                            "console only this long after, e.g. 10m, as a metal instance's long boot does "
                            "(0, the default: at once)",
}, kinds={"keeper-delay": duration_or_off, "keeper-console-delay": duration_or_off})
def local_up(c, nodes=3, name=local_state.DEFAULT_NAME, replace=False, wheelhouse=local_state.DEFAULT_WHEELHOUSE,
             link_mbit=0.0, link_delay_ms=0.0, keeper_delay=0.0, keeper_console_delay=0.0):
    """Start N local nodes (own network namespace, hostname, /root, sshd and metadata service each); Linux, root.

    Run again on a cluster with nodes down (`fab local-reclaim`) or missing, it brings them back as
    new machines and leaves the running ones alone.
    """
    from node_setup.local import keeper

    try:
        delay = keeper.validate_delay(keeper_delay)
        console_delay = keeper.validate_console_delay(keeper_console_delay)
        if console_delay and not delay:
            raise local_state.LocalClusterError(f"--keeper-console-delay: {console_delay:g} s given without "
                                                "--keeper-delay; allowed only with the keeper, e.g. --keeper-delay 30s")
        state = local_cluster.create(nodes, name, replace=replace, wheelhouse=wheelhouse or None, progress=_progress,
                                     link_mbit=link_mbit, link_delay_ms=link_delay_ms)
    except local_state.LocalClusterError as exc:
        raise fail(str(exc)) from None
    if delay:
        pid = keeper.start(local_state.paths_for(name), delay, console_delay=console_delay)
        _progress(f"group keeper (pid {pid}): a node that goes down comes back as a new machine after {delay:g} s"
                  + (f", its console's host keys {console_delay:g} s later" if console_delay else ""))
    target = _target(name)
    print("\nnodes: " + ", ".join(f"{n.name} {n.address}" for n in state.nodes))
    print(f"controller key: {state.key_path}")
    if state.link_mbit:
        link = local_state.describe_link(state.link_mbit, state.link_delay_ms)
        print(f"link: {link} (tc; fab local-down removes it)")
    print(f"next: fab setup --cluster {target}   then   fab train --nodes {len(state.nodes)} --cluster {target}")
    print(f"done: fab local-down{_name_flag(name)}")


@task(help={"name": "local cluster name (default local)",
            "force": "also remove a cluster another checkout made (a run on it ends)"})
def local_down(c, name=local_state.DEFAULT_NAME, force=False):
    """Stop a local cluster this checkout made: its sshd and node processes, namespaces, bridge and files.

    Safe to repeat. Another checkout's cluster is left alone unless --force.
    """
    try:
        local_cluster.destroy(local_state.paths_for(name), progress=_progress, force=force)
    except local_state.LocalClusterError as exc:
        raise fail(str(exc)) from None
    if keys.forget_cluster(name):
        _progress(f"  removed the SSH key pair and known_hosts `fab distribute` kept for {name!r}")


def _cluster_name(cluster: str) -> str:
    """`--cluster local` or `local:NAME` -> the local cluster's name; anything else is bad input."""
    from node_setup.backends import local_cluster_name

    name = local_cluster_name(cluster)
    if name is not None:
        try:
            local_state.validate_name(name)
        except local_state.LocalClusterError:
            raise fail(f"--cluster: {cluster!r} is not allowed; allowed: local or local:NAME "
                       "(NAME as given to `fab local-up --name`)") from None
        return name
    raise fail(f"--cluster: {cluster!r} is not allowed; allowed: local or local:NAME (a local cluster; "
               "on AWS, EC2 itself reclaims spot instances)")


@task(help={
    "node": "the node to reclaim, as local-up named it (node0 is the master)",
    "notice": f"time between the interruption notice and the node going down, e.g. 2m or 30s (0 to "
              f"{local_state.NOTICE_SECONDS_MAX}s; default {local_state.DEFAULT_NOTICE_SECONDS}s, as on EC2)",
    "rebalance": "post only a rebalance recommendation; the node stays up",
    "cluster": "local (default) or local:NAME",
    "silent": "no notice at all: the node goes down at once, as a machine that fails",
}, kinds={"notice": duration_or_zero})
def local_reclaim(c, node, notice=float(local_state.DEFAULT_NOTICE_SECONDS), rebalance=False, cluster="local",
                  silent=False):
    """Rehearse a spot reclaim: a notice on NODE's metadata service, then the node goes down as on EC2."""
    if node.startswith("-"):  # `fab local-reclaim --help` hands "--help" over as the node
        raise fail(f"node: {node!r} is an option, not a node; allowed: a node as local-up named it (node0 is the "
                   "master); this task's options: fab --help local-reclaim")
    from node_setup.backends import cluster_kind

    name = _cluster_name(cluster)
    try:
        local_state.validate_notice(notice)
        paths = local_state.paths_for(name)
        state = local_state.load_state(paths)
        if state is None:
            raise fail(f"--cluster: no local cluster named {name!r} is up; start one with "
                       f"`fab local-up{_name_flag(name)}`")
        problem = None if cluster_kind(cluster)[1] else local_state.implicit_use_problem(state)  # a bare `local`
        if problem:
            raise fail(problem)
        local_state.find_node(state, node)
    except local_state.LocalClusterError as exc:
        raise fail(str(exc)) from None
    try:
        local_cluster.reclaim(paths, node, notice_seconds=notice, rebalance=rebalance, silent=silent,
                              progress=_progress)
    except local_state.LocalClusterError as exc:
        raise fail(str(exc), code=1) from None
    if not rebalance:
        print(after_reclaim(node, len(state.nodes), name, keeper=local_cluster.keeper_pid(paths) is not None))


def after_reclaim(node: str, nodes: int, name: str, *, keeper: bool) -> str:
    """What brings a reclaimed node back: the cluster's group keeper when one runs, else `fab local-up`."""
    if keeper:
        return (f"the cluster's group keeper brings {node} back as a new machine after its delay (fab local-up "
                "--keeper-delay); nothing to do here (`fab status` shows it once it is up)")
    return f"bring it back as a new machine: fab local-up --nodes {nodes}{_name_flag(name)}"


TASKS = [local_up, local_down, local_reclaim]
