"""The image built apart by EC2 Image Builder (pure): what the build runs, on what, and what it reports.

No node that runs jobs is ever imaged. Image Builder launches a small build instance of its own from the base
image (BUILDER_INSTANCE_TYPE, in the stack's region and subnet), runs the image's one component on it (the
profile's install, the same script `fab setup` runs: cluster/node/setup_script.py's install_script, without this
project's wheel, which the setup step and `fab setup` add), snapshots it, terminates it and tags the image with
its bake identity (cluster/stack/image_reuse.py). The build instance never held a login key of a cluster, a job, a
home folder's content or a record of a cluster: there is nothing to scrub.

    component_document(script_uri)     -> str   the component's YAML (AWSTOE): download the script, run it, clean
    install_key(profile, bake_tag)     -> str   where in the stack's bucket the install script is put
    failure_line(name, error, logs)    -> str   a failed build in one line: Image Builder's reason, its logs
    image_users(tags)                  -> {cluster: stack}   the stacks that record their use of an image
    release(tags, cluster, keep=...)   -> (remove?, why)   what this stack's destroy does with its image
"""

from __future__ import annotations

import json
import re
from typing import Mapping

from cluster.stack.tags import USED_BY_PREFIX

# The build instance: a small, cheap current x86_64 type (2 vCPUs, 8 GiB: pip and apt need no more), billed on
# demand while Image Builder runs it. Its price: us-east-1's on-demand Linux rate (aws.amazon.com/ec2/pricing/
# on-demand), the figure `fab plan` prices the build with.
BUILDER_INSTANCE_TYPE = "m7i.large"
BUILDER_USD_PER_HOUR = 0.1008
# On the build instance: where the component puts the install script, removed before the snapshot.
BUILD_DIR = "/tmp/xeon-cluster-build"
# In the stack's bucket: the install scripts (one per bake tag) and Image Builder's build logs.
INSTALL_PREFIX = "image-builder/install"
LOG_PREFIX = "image-builder/logs"
# Image Builder's semantic versions: every recipe and component is named after the bake tag, so each is 1.0.0.
VERSION = "1.0.0"
# How long `pulumi up` waits for a build: the launch, the install, the snapshot of the build volume.
BUILD_TIMEOUT = "180m"


def install_key(profile: str, bake_tag: str) -> str:
    """The install script's key in the stack's bucket, e.g. `image-builder/install/stock-0a1b2c3d4e5f.sh`."""
    return f"{INSTALL_PREFIX}/{profile}-{bake_tag}.sh"


def component_document(script_uri: str) -> str:
    """The component's document: the build phase downloads the install script from the bucket (the build
    instance's role may read it), runs it as root and removes it and pip's cache. JSON is YAML: no quoting rule
    of YAML's to get wrong for a value."""
    if not re.fullmatch(r"s3://[a-z0-9][a-z0-9.-]{1,62}/[A-Za-z0-9/._-]+", script_uri or ""):
        raise ValueError(f"script_uri: {script_uri!r} is not allowed; allowed: s3://BUCKET/KEY of letters, digits, "
                         "'/', '.', '_' and '-'")
    script = f"{BUILD_DIR}/install.sh"
    steps = [
        {"name": "DownloadInstall", "action": "S3Download", "inputs": [{"source": script_uri, "destination": script}]},
        {"name": "Install", "action": "ExecuteBash", "inputs": {"commands": [f"bash {script}"]}},
        {"name": "Clean", "action": "ExecuteBash", "inputs": {"commands": [f"rm -rf {BUILD_DIR} /root/.cache/pip"]}},
    ]
    document = {"name": "xeon-cluster-install", "schemaVersion": 1.0,
                "description": "the profile's install (cluster/node/setup_script.py install_script)",
                "phases": [{"name": "build", "steps": steps}]}
    return json.dumps(document, indent=2) + "\n"


def failure_line(name: str, error: str, logs: str) -> str:
    """A failed build as `pulumi up` shows it: Image Builder's own reason (the provider's `last error`), where its
    logs are, and what to look at."""
    found = re.search(r"last error:\s*(.+)", error or "", re.S)
    reason = (found.group(1) if found else (error or "no reason given")).strip().splitlines()[0]
    return (f"{name}: the image build failed: {reason}; Image Builder's logs: {logs} (the install's output is in "
            f"its Install step); fix the cause and run `pulumi up` again, which builds it again")


def image_users(tags: Mapping[str, str]) -> dict[str, str]:
    """The clusters (and their stacks) whose use of the image its tags record (USED_BY_PREFIX + cluster: stack)."""
    return {key[len(USED_BY_PREFIX):]: value for key, value in tags.items() if key.startswith(USED_BY_PREFIX)}


def release(tags: Mapping[str, str], cluster: str, *, keep: bool) -> tuple[bool, str]:
    """What the destroy of `cluster`'s stack does with the image it built (its tags as they are then): remove it
    (True) only when the stack does not keep it and no other stack records its use; why, in words."""
    others = sorted(f"{c} (stack {s})" for c, s in image_users(tags).items() if c != cluster)
    if others:
        return False, f"kept: other stacks boot it ({', '.join(others)})"
    if keep:
        return False, "kept: keepImage is true"
    return True, "removed: keepImage is false and no other stack boots it"
