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

from cluster.inventory import KEY_ENV, ClusterSelectionError, Inventory
from node_setup.backends import backend_for, cluster_kind, cluster_name
from node_setup.backends.files import load_inventory_file, process_started_at

__all__ = ["KEY_ENV", "ClusterSelectionError", "resolve_cluster", "cluster_kind", "cluster_name", "load_inventory_file",
           "process_started_at"]


def resolve_cluster(cluster: str | None, region: str | None = None) -> Inventory:
    """The Inventory that `--cluster` names (see the module docstring); master first."""
    kind, target = cluster_kind(cluster)
    return backend_for(kind).discover(target, region)
