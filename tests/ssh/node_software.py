"""The local nodes' shared software, made before the suite: `python -m tests.ssh.node_software` (scripts/setup-dev.sh
runs it) runs `fab setup` on a one-node local cluster of its own, which fills the stock profile's wheelhouse
(/var/cache/xeon-cluster/wheels) and builds the shared venv in /opt/xeon-cluster that every local node of every
test uses. Without it, the suite's first clusters on a fresh machine build them while the other pytest workers
wait on the setup lock (about 40 s of the whole machine). Where a local cluster cannot run here it says why and
does nothing; a failed setup is shown and fails the set-up.
"""

from __future__ import annotations

import secrets
import sys
import tempfile
from pathlib import Path

from node_setup.local import cluster as lc
from node_setup.local import state as local_state
from tests.ssh.conftest import RunningLocalCluster, local_cluster_unavailable, run_fab


def main() -> int:
    reason = local_cluster_unavailable()
    if reason:
        print(f"skipped: {reason} (the ssh tests skip too)")
        return 0
    with tempfile.TemporaryDirectory(prefix="xc-node-software-") as tmp:
        config_home, data = Path(tmp) / "config", Path(tmp) / "data"
        name = f"setup-dev-{secrets.token_hex(3)}"
        paths = local_state.paths_for(name, config=config_home / "xeon-cluster", data=data)
        cluster = RunningLocalCluster(state=lc.create(1, name, paths=paths), paths=paths, config_home=config_home,
                                      data_root=data, known_hosts=Path(tmp) / "known_hosts")
        try:
            done = run_fab(cluster, "setup")
        finally:
            cluster.destroy()
    if done.returncode != 0:
        print(done.stdout + done.stderr, end="")
        print(f"fab setup on a one-node local cluster failed (exit {done.returncode})", file=sys.stderr)
        return done.returncode
    print(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "ready")
    return 0


if __name__ == "__main__":
    sys.exit(main())
