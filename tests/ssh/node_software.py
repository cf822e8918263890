"""The local nodes' shared software, made before the suite: `python -m tests.ssh.node_software` (scripts/setup-dev.sh
runs it) runs `fab setup` on a one-node local cluster of its own, which fills the stock profile's wheelhouse
(/var/cache/xeon-cluster/wheels) and builds the shared venv in /opt/xeon-cluster that every local node of every
test uses. Without it, the suite's first clusters on a fresh machine build them while the other pytest workers
wait on the setup lock (about 40 s of the whole machine). Where a local cluster cannot run here it says why and
does nothing; a failed setup is shown and fails the set-up.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

from node_setup.local import cluster as lc
from node_setup.local import state as local_state
from tests.ssh.conftest import REPO_ROOT, local_cluster_unavailable


def main() -> int:
    reason = local_cluster_unavailable()
    if reason:
        print(f"skipped: {reason} (the ssh tests skip too)")
        return 0
    with tempfile.TemporaryDirectory(prefix="xc-node-software-") as tmp:
        config_home, data = Path(tmp) / "config", Path(tmp) / "data"
        name = f"setup-dev-{secrets.token_hex(3)}"
        paths = local_state.paths_for(name, config=config_home / "xeon-cluster", data=data)
        lc.create(1, name, paths=paths)
        try:
            env = {**os.environ, "XDG_CONFIG_HOME": str(config_home), local_state.DATA_ROOT_ENV: str(data)}
            done = subprocess.run([sys.executable, "-m", "fabric", "setup", "--cluster", str(paths.inventory_path)],
                                  cwd=REPO_ROOT, env=env, capture_output=True, text=True)
        finally:
            lc.destroy(paths)
    if done.returncode != 0:
        print(done.stdout + done.stderr, end="")
        print(f"fab setup on a one-node local cluster failed (exit {done.returncode})", file=sys.stderr)
        return done.returncode
    print(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "ready")
    return 0


if __name__ == "__main__":
    sys.exit(main())
