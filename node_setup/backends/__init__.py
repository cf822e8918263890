"""One backend per kind of cluster: what differs between local, AWS and an inventory file.

`backend_for(kind)` is the one place that picks by an inventory's kind; every caller asks the
backend it returns (cluster/backend.py's `ClusterBackend`). Each kind's module imports what it
acts with only inside its methods: `fab --list` loads no boto3, and the run supervisor (on the
master, in the node venv: no Fabric, no paramiko) loads only the group of its own kind.

- `local`: network namespaces on this machine (node_setup/local/);
- `aws`: EC2 instances found by their tags (node_setup/aws/); boto3 inside its methods only;
- `inventory`: an inventory file's machines, any SSH hosts: nothing comes back, nothing is priced;
- `members`: a machine's name, address, instance id and state, and the worker group's name and
  region, as they come from outside, each checked whole.
"""

from __future__ import annotations

from cluster.backend import AWS, LOCAL, ClusterBackend


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
