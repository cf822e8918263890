"""`fab train --requirements FILE`: the file's packages in the node venv, once per content digest.

    install(inventory, conns, plan) -> [NodeOutcome]   every node in parallel (fanout.each_node)

The plan is cluster/job/userjob.py's RequirementsPlan (parsed, checked against the profile's pins).
It installs the way `fab setup` does (node_setup/ssh/install.py, wheels.py): nodes with a
wheelhouse (the local cluster) install from it with no index, after the controller has put the
requirements into it (`pip download`, with the controller's own pip configuration, constrained by
the profile's pins) and, for a wheelhouse on other machines, copied it (wheels.sync_wheelhouse);
other nodes install from PyPI alone (never from the profile's own indexes: a requirement that
names a package of one of them would let PyPI's package of that name win). The node side is
cluster/shell/install-requirements.sh: under setup's lock, skipped when the digest's marker is there.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from cluster import shell
from cluster.inventory import Inventory
from cluster.node.profiles import NODE_ROOT, get_profile, venv_dir
from cluster.node.setup_script import InstallPlan, with_setup_lock
from cluster.job.userjob import REQUIREMENTS_MARKER_DIR, RequirementsPlan
from node_setup.backends import backend_for
from node_setup.ssh import connections
from node_setup.ssh.fanout import NodeOutcome, each_node
from node_setup.ssh.install import lock_holder
from node_setup.ssh.wheels import InstallError, sync_wheelhouse, tail

WHEELHOUSE_MARKER = ".xeon-cluster-requirements-{digest}"


def fill_wheelhouse(plan: RequirementsPlan, wheelhouse: str | Path) -> bool:
    """Put the requirements (and what they need) into the wheelhouse, once per digest."""
    wheelhouse = Path(wheelhouse)
    marker = wheelhouse / WHEELHOUSE_MARKER.format(digest=plan.digest)
    if marker.exists():
        return False
    wheelhouse.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as constraints:
        constraints.write("\n".join(plan.constraints) + "\n")
        constraints.flush()
        cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-input", "-q",
               "-d", str(wheelhouse), "--find-links", str(wheelhouse), "-c", constraints.name, *plan.requirements]
        result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise InstallError(f"--requirements: putting {', '.join(plan.requirements)} into the wheelhouse {wheelhouse} "
                           f"failed (exit {result.returncode}): {tail(result.stdout + result.stderr, 3)}")
    marker.write_text("\n".join(plan.requirements) + "\n")
    return True


def node_script(inventory: Inventory, plan: RequirementsPlan) -> str:
    profile = get_profile(inventory.profile)
    # PyPI alone, never the profile's own indexes (cluster/node/profiles.py says why); the profile's
    # pins are installed already and held by the constraints.
    source = ["--no-index", "--find-links", inventory.wheelhouse] if inventory.wheelhouse else []
    return with_setup_lock(shell.render("install-requirements.sh", {
        "VENV": venv_dir(profile), "LOCK": f"{NODE_ROOT}/.setup-{profile.name}.lock",
        "LOCK_TIMEOUT": str(InstallPlan(profile).venv_lock_timeout_s), "MARKER_DIR": REQUIREMENTS_MARKER_DIR,
        "DIGEST": plan.digest, "REQUIREMENTS": list(plan.requirements), "CONSTRAINTS": list(plan.constraints),
        "PIP_SOURCE": source}), lock_holder(inventory))


def install(inventory: Inventory, conns: dict, plan: RequirementsPlan) -> list[NodeOutcome]:
    """The requirements on every node at once; one outcome per node ("installed"/"unchanged")."""
    if inventory.wheelhouse:
        fill_wheelhouse(plan, inventory.wheelhouse)
    command = f"bash -c {shlex.quote(node_script(inventory, plan))}"
    copies_wheelhouse = backend_for(inventory.kind).copies_wheelhouse()  # a local cluster's nodes read it here

    def one(name: str, conn) -> NodeOutcome:
        try:
            if inventory.wheelhouse and copies_wheelhouse:
                sync_wheelhouse(conn, inventory.wheelhouse)
            result = conn.run(command, hide=True, warn=True, in_stream=False)
        except Exception as exc:  # noqa: BLE001 - reported per node
            return NodeOutcome(name, False, f"requirements: {connections.explain(exc, conn)}")
        lines = [line.split(" ", 2)[2] for line in result.stdout.splitlines() if line.startswith("::xc:: ")]
        detail = lines[-1] if lines else tail(result.stdout + result.stderr, 3)
        return NodeOutcome(name, result.ok, f"requirements {detail}" if result.ok
                           else f"requirements: {detail}\n{tail(result.stdout + result.stderr, 3)}")

    return each_node(conns, one)
