"""`fab local-up` / `fab local-down`: the no-AWS cluster of network-namespace nodes on this machine."""

from __future__ import annotations

import sys

from invoke import Exit, task

from node_setup import keys, local_cluster


def _progress(line: str) -> None:
    print(line, flush=True)


@task(help={
    "nodes": f"how many nodes to start (1 to {local_cluster.MAX_NODES})",
    "name": "local cluster name (default local; `--cluster local` finds the cluster named local)",
    "replace": "tear down a running cluster of that name first instead of refusing",
    "wheelhouse": "shared directory the nodes install packages from (they have no internet)",
})
def local_up(c, nodes=3, name=local_cluster.DEFAULT_NAME, replace=False,
             wheelhouse=local_cluster.DEFAULT_WHEELHOUSE):
    """Start N local nodes (own network namespace, hostname, /root and sshd each); Linux, root."""
    try:
        state = local_cluster.create(int(nodes), name, replace=replace, wheelhouse=wheelhouse or None,
                                     progress=_progress)
    except local_cluster.LocalClusterError as exc:
        raise Exit(f"local-up: {exc}", code=2) from None
    target = "local" if name == local_cluster.DEFAULT_NAME else f"local:{name}"
    print("\nnodes: " + ", ".join(f"{n.name} {n.address}" for n in state.nodes))
    print(f"controller key: {state.key_path}")
    print(f"next: fab setup --cluster {target}   then   fab train --nodes {len(state.nodes)} --cluster {target}")
    print("done: fab local-down" + ("" if name == local_cluster.DEFAULT_NAME else f" --name {name}"))


@task(help={"name": "local cluster name (default local)"})
def local_down(c, name=local_cluster.DEFAULT_NAME):
    """Stop a local cluster: its sshd and node processes, namespaces, bridge, files (safe to repeat)."""
    try:
        local_cluster.destroy(local_cluster.paths_for(name), progress=_progress)
    except local_cluster.LocalClusterError as exc:
        print(f"local-down: {exc}", file=sys.stderr)
        raise Exit(code=2) from None
    if keys.forget_cluster(name):
        _progress(f"  removed the SSH key pair and known_hosts `fab distribute` kept for {name!r}")


TASKS = [local_up, local_down]
