"""Which nodes `--cluster` means: an AWS cluster found by its tags, `local`, or an inventory file.

    resolve_cluster(None)                  the only xeon-cluster cluster running in the region
    resolve_cluster("demo")                AWS cluster "demo" (tag xeon-cluster:cluster=demo)
    resolve_cluster("local")               the local cluster named local (`fab local-up`)
    resolve_cluster("local:bench8")        the local cluster named bench8
    resolve_cluster("lab.yaml")            an inventory file (cluster/inventory.py format)

Every task calls this once and then works on the returned Inventory (master first). Every
failure is a ClusterSelectionError whose message says what was looked for, what was found and
what to do.

`cluster_kind` (node_setup/backends/, the one place that reads it) says which kind of cluster
`--cluster` names; that kind's backend discovers it: an AWS cluster by node_setup/aws/discovery.py,
imported only when one is asked for (boto3).
The error and the key variable both kinds share are cluster/inventory.py's (so neither module imports
the other's caller).
"""

from __future__ import annotations

import difflib

from cluster.inventory import KEY_ENV, ClusterSelectionError, Inventory
from cluster.backend import LOCAL
from node_setup.backends import backend_for, cluster_kind, cluster_name
from node_setup.backends.files import load_inventory_file, process_started_at

__all__ = ["KEY_ENV", "ClusterSelectionError", "resolve_cluster", "cluster_kind", "cluster_name", "load_inventory_file",
           "process_started_at"]


def resolve_cluster(cluster: str | None, region: str | None = None) -> Inventory:
    """The Inventory that `--cluster` names (see the module docstring); master first. A name that names no
    cluster but is close to a local one's (`lokal`, `local:bench9` beside `local:bench8`) gets the suggestion
    with its error."""
    kind, target = cluster_kind(cluster)
    try:
        return backend_for(kind).discover(target, region)
    except ClusterSelectionError as exc:
        hint = local_suggestion(cluster.strip()) if cluster else ""
        if not hint:
            raise
        raise ClusterSelectionError(f"{exc}{hint}") from None


def local_suggestion(name: str) -> str:
    """'; did you mean `--cluster local:NAME`?' for a name that is, or is close to, a local cluster's (`local`,
    `local:NAME` or NAME of one this machine has), else ''."""
    from node_setup.local.state import DEFAULT_NAME, paths_for

    root = paths_for(DEFAULT_NAME).cluster_dir.parent
    names = sorted(p.name for p in root.iterdir() if (p / "state.json").is_file()) if root.is_dir() else []
    choices = {LOCAL: LOCAL, **{f"{LOCAL}:{n}": f"{LOCAL}:{n}" for n in names},
               **{n: f"{LOCAL}:{n}" for n in names if n != DEFAULT_NAME}}
    # the exact name a local cluster was given (`local-up --name t1`, then `--cluster t1`) is the closest match
    close = difflib.get_close_matches(name, [c for c in choices if choices[c] != name], n=1, cutoff=0.6)
    return f"; did you mean `--cluster {choices[close[0]]}`?" if close else ""
