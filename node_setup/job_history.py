"""The controller's job history of each cluster: a file in the controller's config directory
(node_setup/controller.py), `<config>/job-history/<cluster>.json`, merged and read by
cluster/job/jobhistory.py. `fab train` adds the job it starts (`started`); `fab jobs` and `fab status` merge
in what they read from the master (`record`), so that a master replaced or auto-stopped does not take the
cluster's job list with it; `fab get --job` reads it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

from cluster.job import jobhistory, joblist
from cluster.job.joblist import JobRow
from cluster.job.jobplan import JobPlan
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
    return _write(cluster, jobhistory.merged(read(cluster, say), master_rows), say)


def started(plan: JobPlan, say=print) -> None:
    """A job `fab train` just started, into its cluster's history (found there if its master goes before any
    `fab jobs` read it)."""
    row = joblist.row_of(plan.job_id, joblist.job_record(json.dumps(plan.metadata()), "job.json")[0],
                         plan.inventory.master.name)
    _write(plan.inventory.name, jobhistory.added(read(plan.inventory.name, say), row), say)


def _write(cluster: str, rows: list[JobRow], say) -> list[JobRow]:
    file = path(cluster)
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        partial = file.with_name(file.name + ".new")
        partial.write_text(jobhistory.dumps(rows))
        os.replace(partial, file)
    except OSError as exc:
        say(f"{file}: cannot be written ({exc.strerror or exc}); the job history is not kept")
    return rows
