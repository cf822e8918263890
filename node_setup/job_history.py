"""The controller's job history of each cluster: a file in the controller's config directory
(node_setup/controller.py), `<config>/job-history/<cluster>.json`, merged and read by
cluster/job/jobhistory.py. `fab jobs`, `fab status` and `fab get` record what they read from the master,
so that a master replaced or auto-stopped does not take the cluster's job list with it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from cluster.job import jobhistory
from cluster.job.joblist import JobRow
from cluster import names
from node_setup.controller import config_root


def path(cluster: str) -> Path:
    return config_root() / "job-history" / f"{names.cluster(cluster)}.json"  # checked: no path in a name


def read(cluster: str, say=print) -> list[JobRow]:
    """The cluster's history (empty when there is none); a malformed file or entry is one line to `say`."""
    file = path(cluster)
    try:
        text = file.read_text()
    except FileNotFoundError:
        return []
    except OSError as exc:
        say(f"{file}: cannot be read ({exc.strerror or exc}); the job list shows the master's jobs only")
        return []
    rows, problem = jobhistory.loads(text, str(file))
    if problem:
        say(problem)
    return rows


def record(cluster: str, master_rows: Sequence[JobRow], say=print) -> list[JobRow]:
    """Merge what the master listed into the cluster's history and keep it; returns the merged rows."""
    rows = jobhistory.merged(read(cluster, say), master_rows)
    file = path(cluster)
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        partial = file.with_name(file.name + ".new")
        partial.write_text(jobhistory.dumps(rows))
        os.replace(partial, file)
    except OSError as exc:
        say(f"{file}: cannot be written ({exc.strerror or exc}); the job history is not kept")
    return rows
