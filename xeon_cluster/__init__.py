"""What a user's own training program can import on the nodes (`fab train --script`).

Self-contained on purpose: a user's workdir may hold its own `training/` package or `cluster.py`,
which come first on the program's import path; nothing here imports the toolkit's packages of
those names, so neither can be picked up instead.

    from xeon_cluster.callbacks import SpotNoticeCallback   # a Trainer callback: checkpoint and stop
    from xeon_cluster import notice                          # the spot notice, or None

The toolkit's per-node watcher (xeon_cluster/notice_watch.py) writes the file named by
XEON_CLUSTER_NOTICE_FILE when the metadata service announces a spot interruption, and signals
every rank of the node with the signal in XEON_CLUSTER_NOTICE_SIGNAL (`fab train --notice-signal`,
SIGUSR1 unless it says otherwise, `none` for no signal). Every rank runs its program through
xeon_cluster/run.py, which ends the process cleanly.

The variables' names are defined here and the launch (cluster/job/launch.py) imports them.
"""

from __future__ import annotations

import json
import os

NOTICE_FILE_VARIABLE = "XEON_CLUSTER_NOTICE_FILE"
OUTPUT_DIR_VARIABLE = "XEON_CLUSTER_OUTPUT_DIR"
NOTICE_SIGNAL_VARIABLE = "XEON_CLUSTER_NOTICE_SIGNAL"
DEFAULT_NOTICE_SIGNAL = "SIGUSR1"
NO_SIGNAL = "none"  # XEON_CLUSTER_NOTICE_SIGNAL when a notice sends no signal
# Set by `fab train --managed`'s supervisor when it restarts the program after a recovery: the run's
# newest checkpoint folder (absolute), to continue from; unset on a first start.
RESUME_FROM_VARIABLE = "XEON_CLUSTER_RESUME_FROM"


def notice() -> dict | None:
    """The spot interruption notice this node received (`action`, `time`, `noticed_at`), or None."""
    path = os.environ.get(NOTICE_FILE_VARIABLE)
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def output_dir(default: str = "output") -> str:
    """Where the job should write (XEON_CLUSTER_OUTPUT_DIR, shared or rank 0's), or `default`."""
    return os.environ.get(OUTPUT_DIR_VARIABLE) or default


def resume_from() -> str | None:
    """The checkpoint folder a supervised restart continues from (XEON_CLUSTER_RESUME_FROM), or None."""
    return os.environ.get(RESUME_FROM_VARIABLE) or None


def notice_signal() -> str | None:
    """The signal the node's watcher sends this rank on a notice (XEON_CLUSTER_NOTICE_SIGNAL, e.g.
    "SIGUSR1"), None when it sends none; DEFAULT_NOTICE_SIGNAL when the variable is not set."""
    name = (os.environ.get(NOTICE_SIGNAL_VARIABLE) or DEFAULT_NOTICE_SIGNAL).strip()
    return None if name.lower() == NO_SIGNAL else name
