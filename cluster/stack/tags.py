"""Tag keys written by the Pulumi program and read by discovery and the leak sweep."""

MANAGED_BY_KEY = "xeon-cluster:managed-by"
MANAGED_BY_VALUE = "xeon-cluster"
CLUSTER_KEY = "xeon-cluster:cluster"
ROLE_KEY = "xeon-cluster:role"
STACK_KEY = "xeon-cluster:stack"
RANK_KEY = "xeon-cluster:rank"
# On a baked image and its root snapshot: what the bake put in it, read by the rule that reuses a kept image
# (cluster/stack/image_reuse.py), `fab images` and `fab sweep`. KEEP_KEY ("true") marks one `pulumi destroy` leaves
# (the stack's keepImage); the others say what it holds: the profile's bake tag (a hash of its fingerprint), the
# region, the base it was baked on (baseAmi's id, or the looked-up Ubuntu release) and that base's image id, the
# architecture, this project's version, and when the setup step ran (UTC, the image name's stamp).
KEEP_KEY = "xeon-cluster:keep"
FINGERPRINT_KEY = "xeon-cluster:fingerprint"
REGION_KEY = "xeon-cluster:region"
BASE_KEY = "xeon-cluster:base"
BASE_IMAGE_KEY = "xeon-cluster:base-image"
ARCHITECTURE_KEY = "xeon-cluster:architecture"
PROJECT_VERSION_KEY = "xeon-cluster:project-version"
CREATED_KEY = "xeon-cluster:created"
# On a built image, one per stack that boots it (key: this prefix and the stack's cluster; value: the stack), put
# by that stack and removed by its `pulumi destroy`: an image another stack uses is neither removed nor untagged by
# the stack that built it (cluster/stack/image_build.py's release).
USED_BY_PREFIX = "xeon-cluster:used-by:"
# On the cluster security group only (value: the stack): the stack exists. `pulumi up` writes it,
# `pulumi destroy` removes it with the group; `fab sweep` never deletes a cluster that has it.
STACK_MARKER_KEY = "xeon-cluster:stack-marker"
# Beside it, the image the stack's nodes boot: "bake" (its own) or the id of the kept image it reuses, so that a
# later `pulumi up` of the same stack keeps that choice (cluster/stack/image_reuse.py).
IMAGE_SOURCE_KEY = "xeon-cluster:image-source"
# Optional node tags discovery reads (defaults when absent: user "ubuntu", profile "stock").
SSH_USER_KEY = "xeon-cluster:ssh-user"
PROFILE_KEY = "xeon-cluster:profile"

ROLE_MASTER = "master"
ROLE_WORKER = "worker"
# AWS's own tag on every instance an Auto Scaling group launches: its group's name (the program finds the
# master's instance by it; the sweep tells a master its group launched by it).
GROUP_NAME_TAG = "aws:autoscaling:groupName"


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
