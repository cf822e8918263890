"""The controller's job history of each cluster: a file in the controller's config directory
(node_setup/controller.py), `<config>/job-history/<cluster>[.<identity>].json`, merged and read by
cluster/job/jobhistory.py. `fab train` adds the job it starts (`started`) and, once it ended, what the master
then records (`observed`); `fab train --managed` observes the master once the supervisor started the run's
first job and again once the run ended (node_setup/tasks/managed.py), so a run's jobs are there with their
ends though the supervisor, not fab, started them; `fab jobs` and `fab status` (which reads the supervisor's
report) merge in what they read from the master (`record`), so that a master replaced or auto-stopped does
not take the cluster's job list with it; `fab get --job` reads it.

A history is the cluster's, not only its name's (`identity`): a local cluster's carries the time `fab
local-up` made it, so a new local cluster of an old one's name starts a history of its own.
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
from cluster.inventory import Inventory
from node_setup.controller import config_root


def identity(inventory: Inventory) -> str:
    """What tells this cluster from an earlier one of its name (its backend's history identity; "": the name)."""
    from node_setup.backends import backend_for

    return backend_for(inventory.kind).history_identity(inventory)


def path(cluster: str, identity: str = "") -> Path:
    if identity and not identity.isdigit():
        raise ValueError(f"job history identity {identity!r} is not allowed; allowed: digits")
    name = names.cluster(cluster) + (f".{identity}" if identity else "")  # checked: no path in a name
    return config_root() / "job-history" / f"{name}.json"


def read(cluster: str, say=print, identity: str = "") -> list[JobRow]:
    """The cluster's history (empty when there is none); a malformed file or entry is one line to `say`."""
    file = path(cluster, identity)
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


def record(cluster: str, master_rows: Sequence[JobRow], say=print, identity: str = "") -> list[JobRow]:
    """Merge what the master listed into the cluster's history and keep it; returns the merged rows."""
    return _write(cluster, jobhistory.merged(read(cluster, say, identity), master_rows), say, identity)


def started(plan: JobPlan, say=print) -> None:
    """A job `fab train` just started, into its cluster's history (found there if its master goes before any
    `fab jobs` read it)."""
    _add(plan, joblist.row_of(plan.job_id, _metadata(plan), plan.inventory.master.name), say)


def observed(inventory: Inventory, master, say=print) -> list[JobRow]:
    """The master's job records read now (one SSH round) and merged into the history: what `fab train` does once
    its job has ended, so that the end is kept even if no `fab jobs` reads the master again. [] when the master
    cannot be read (the history waits for the next read)."""
    from node_setup.ssh import job as jobs

    try:
        rows, _ = joblist.parse(jobs.list_jobs(master), inventory.master.name)
    except Exception:  # noqa: BLE001 - the job's own outcome is fab's to report; the history is not in its way
        return []
    return record(inventory.name, rows, say, identity(inventory))


def _metadata(plan: JobPlan) -> dict:
    return joblist.job_record(json.dumps(plan.metadata()), "job.json")[0]


def _add(plan: JobPlan, row: JobRow, say) -> None:
    ident = identity(plan.inventory)
    _write(plan.inventory.name, jobhistory.added(read(plan.inventory.name, say, ident), row), say, ident)


def _write(cluster: str, rows: list[JobRow], say, identity: str = "") -> list[JobRow]:
    file = path(cluster, identity)
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        partial = file.with_name(file.name + ".new")
        partial.write_text(jobhistory.dumps(rows))
        os.replace(partial, file)
    except OSError as exc:
        say(f"{file}: cannot be written ({exc.strerror or exc}); the job history is not kept")
    return rows
