"""One backend per kind of cluster: what differs between local, AWS and an inventory file.

`backend_for(kind)` is the one place that picks by an inventory's kind, and `cluster_kind` the one
that reads which kind `--cluster` names (`local_cluster_name`, `cluster_name`: the name it gives,
without reaching it); every caller asks the backend `backend_for` returns (cluster/backend.py's
`ClusterBackend`). Each kind's module imports what it acts with only inside its methods: `fab --list`
loads no boto3, and the run supervisor (on the master, in the node venv: no Fabric, no paramiko)
loads only the group of its own kind.

- `local`: network namespaces on this machine (node_setup/local/);
- `aws`: EC2 instances found by their tags (node_setup/aws/); boto3 inside its methods only;
- `inventory`: an inventory file's machines, any SSH hosts: nothing comes back, nothing is priced;
- `members`: a machine's name, address, instance id and state, and the worker group's name and
  region, as they come from outside, each checked whole.
"""

from __future__ import annotations

import os
from pathlib import Path

from cluster.backend import AWS, FILE, LOCAL, ClusterBackend

INVENTORY_SUFFIXES = (".yaml", ".yml")


def backend_for(kind: str | None) -> ClusterBackend:
    """The backend of a cluster of this kind (an inventory's `kind`: "local", "aws", else an inventory file)."""
    if kind == LOCAL:
        from node_setup.backends.local import LocalBackend

        return LocalBackend()
    if kind == AWS:
        from node_setup.backends.aws import AwsBackend

        return AwsBackend()
    from node_setup.backends.inventory import InventoryFileBackend

    return InventoryFileBackend()


def cluster_kind(cluster: str | None) -> tuple[str, str | None]:
    """Which kind of cluster `--cluster` names, and what names it there: (kind, name or path)."""
    cluster = (cluster or "").strip() or None
    if cluster is None:
        return AWS, None  # the only xeon-cluster cluster running in the region
    if cluster == LOCAL or cluster.startswith(LOCAL + ":"):
        return LOCAL, cluster.partition(":")[2] or None  # None: a bare `local` (this checkout's cluster named local)
    if looks_like_path(cluster):
        return FILE, cluster
    return AWS, cluster


def looks_like_path(value: str) -> bool:
    return os.sep in value or value.endswith(INVENTORY_SUFFIXES) or Path(value).is_file()


def local_cluster_name(cluster: str | None) -> str | None:
    """The NAME of the local cluster `--cluster` names (`local`, `local:NAME`); None when it names another kind."""
    from node_setup.local.state import DEFAULT_NAME

    kind, target = cluster_kind(cluster)
    return (target or DEFAULT_NAME) if kind == LOCAL else None


def cluster_name(cluster: str | None) -> str | None:
    """The name the controller keeps a cluster's files under (its keys, its calibration), found without
    reaching the cluster (an AWS cluster may be gone): a local cluster's NAME, an inventory file's name
    (ClusterSelectionError when it cannot be read), an AWS cluster's name (None: not named)."""
    kind, target = cluster_kind(cluster)
    if kind == FILE:
        from node_setup.backends.files import load_inventory_file

        return load_inventory_file(str(target)).name
    return local_cluster_name(cluster) or target
