"""Tag keys written by the Pulumi program and read by discovery and the leak sweep."""

MANAGED_BY_KEY = "xeon-cluster:managed-by"
MANAGED_BY_VALUE = "xeon-cluster"
CLUSTER_KEY = "xeon-cluster:cluster"
ROLE_KEY = "xeon-cluster:role"
STACK_KEY = "xeon-cluster:stack"
RANK_KEY = "xeon-cluster:rank"
KEEP_KEY = "xeon-cluster:keep"
# On the cluster security group only (value: the stack): the stack exists. `pulumi up` writes it,
# `pulumi destroy` removes it with the group; `fab sweep` never deletes a cluster that has it.
STACK_MARKER_KEY = "xeon-cluster:stack-marker"
# Optional node tags discovery reads (defaults when absent: user "ubuntu", profile "stock").
SSH_USER_KEY = "xeon-cluster:ssh-user"
PROFILE_KEY = "xeon-cluster:profile"

ROLE_MASTER = "master"
ROLE_WORKER = "worker"


def cluster_tags(cluster_name: str, stack: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Tags every resource of a cluster carries (user tags first, ours win on conflict)."""
    tags = dict(extra or {})
    tags.update({MANAGED_BY_KEY: MANAGED_BY_VALUE, CLUSTER_KEY: cluster_name, STACK_KEY: stack})
    return tags


def node_tags(base: dict[str, str], role: str, rank: int, name: str, *, ssh_user: str | None = None,
              profile: str | None = None) -> dict[str, str]:
    """Tags of one node: the cluster's plus its role, its rank (master 0) and a Name, and the login
    user and software profile that discovery reads (when given)."""
    tags = {**base, ROLE_KEY: role, RANK_KEY: str(rank), "Name": name}
    tags.update({k: v for k, v in ((SSH_USER_KEY, ssh_user), (PROFILE_KEY, profile)) if v})
    return tags
