"""The run supervisor on the master, seen from the controller (`fab train --managed`, `fab status`,
`fab stop`): its start (a transient systemd unit on AWS, a detached process on a local node), its
state file, a stop asked for. Following the run is node_setup/ssh/supervised_log.py's; the recoveries
themselves are the supervisor's (node_setup/supervisor/), which runs on the master without Fabric.
"""

from __future__ import annotations

import shlex
from typing import Callable

from cluster import records
from cluster.run import supervision as sv
from cluster.node.profiles import get_profile, venv_dir


def _run_dir(run_id: str) -> str:
    return f"{sv.RUN_ROOT}/{sv.check_run_id(run_id)}"


def start_supervisor(master, spec: dict, secrets: dict[str, str], *, systemd: bool) -> str:
    """Put the run's spec on the master, its secret values in a file of their own beside it (0600 from its
    first byte; the supervisor removes it when the run ends), and start its supervisor there, detached from
    this SSH session: a transient systemd unit (`systemd`: a machine of its own), else `setsid nohup` (a local
    cluster's node: a process inside its namespace). Returns the run directory (relative to the home)."""
    from node_setup.ssh.job import write_remote_json

    run_id = sv.check_run_id(spec["request"]["run_id"])
    d = _run_dir(run_id)
    qd = shlex.quote(d)
    master.run(f"cd && mkdir -p {qd} && chmod 700 {shlex.quote(sv.RUN_ROOT)} {qd} && rm -f {qd}/{sv.STOP_FILE} "
               f"{qd}/{sv.SECRETS_FILE} {qd}/{sv.STATE_FILE}", hide=True, in_stream=False)  # a state file: a restart
    write_remote_json(master, f"{d}/{sv.SPEC_FILE}", spec)
    if secrets:
        write_remote_json(master, f"{d}/{sv.SECRETS_FILE}", secrets, mode=0o600)
    python = f"{venv_dir(get_profile(spec['inventory'].get('profile') or 'stock'))}/bin/python"
    master.run(sv.start_command(run_id, python, systemd=systemd), hide=True, in_stream=False)
    return d


def supervised_state(master, run_id: str | None = None, say: Callable[[str], None] = print) -> dict | None:
    """The state file of the given (or newest) supervised run on the master; None when there is none or it
    cannot be read (one line to `say` naming the master and the file; a malformed field: one line, left out)."""
    from node_setup.ssh.job import read_remote_record

    d = _run_dir(run_id) if run_id else sv.CURRENT_LINK
    where = f"{getattr(master, 'host', 'the master')}: ~/{d}/{sv.STATE_FILE}"
    try:  # one reader for every record from a node (cluster/records.py), its fields typed (supervision.py)
        state, problems = sv.checked_state(records.load(read_remote_record(master, f"{d}/{sv.STATE_FILE}"), where),
                                           where)
    except records.RecordError as exc:
        state, problems = None, [str(exc)]
    for line in problems:
        say(f"warning: {line}")
    return state


def request_stop(master) -> str | None:
    """Ask the newest supervised run's supervisor to stop (before `fab stop` ends the job): its run id, or None."""
    state = supervised_state(master)
    if not state or state.get("status") in sv.FINAL:
        return None
    master.run(f"cd && touch {shlex.quote(sv.CURRENT_LINK)}/{sv.STOP_FILE}", hide=True, warn=True, in_stream=False)
    return str(state.get("run"))
