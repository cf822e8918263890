"""Node work for `fab train --managed` (node_setup/tasks/managed.py): which nodes are alive, which
have a spot notice, waiting for a node to go, the new node's host key and software, the run's
recoveries on the master.

Spot notices are read on each node from its own metadata service (over SSH, with the node venv's
training/imds.py client), never from this machine.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import replace
from typing import Callable

from cluster import supervision as sv
from cluster.inventory import Inventory
from cluster.profiles import get_profile, venv_dir
from cluster.recovery import RECOVERIES_FILE, merge_recoveries
from node_setup.ssh import connections, keys
from node_setup.ssh.fanout import each_node

PROBE_TIMEOUT = 5  # seconds: a node that does not answer SSH within this is taken as gone

_NOTICE_PY = ("from training.imds import ImdsClient, endpoint\n"
              "c = ImdsClient(endpoint(), timeout=2)\n"
              "print('notice ' + (c.instance_action() or '-'))\n")


def _probe(inventory: Inventory, command: str, timeout: float = PROBE_TIMEOUT) -> dict[str, tuple[bool, str]]:
    """Run `command` on every node of `inventory` with fresh connections: name -> (answered, stdout)."""
    conns = connections.connections_for(inventory, connect_timeout=timeout)

    def one(name: str, conn) -> tuple[bool, str]:
        try:
            result = conn.run(command, hide=True, warn=True, in_stream=False, timeout=timeout + 10)
            return True, result.stdout
        except Exception:  # noqa: BLE001 - any failure to get a session counts as "does not answer"
            return False, ""

    try:
        return dict(zip(conns, each_node(conns, one)))
    finally:
        connections.close_all(conns)


def alive(inventory: Inventory) -> list[str]:
    """The nodes that answer SSH (host keys checked), rank order."""
    return [name for name, (ok, _) in _probe(inventory, "true").items() if ok]


def notices(inventory: Inventory) -> dict[str, str | None]:
    """name -> the node's spot interruption notice (JSON text) or None, for the nodes that answer."""
    python = f"{venv_dir(get_profile(inventory.profile))}/bin/python"
    found = {}
    for name, (ok, out) in _probe(inventory, f"{shlex.quote(python)} -I -c {shlex.quote(_NOTICE_PY)}").items():
        if ok:
            line = next((ln for ln in out.splitlines() if ln.startswith("notice ")), "notice -")
            body = line[len("notice "):].strip()
            found[name] = None if body == "-" else body
    return found


def wait_until_gone(inventory: Inventory, names: list[str], deadline: float,
                    progress: Callable[[str], None], poll: float = 2.0) -> list[str]:
    """Poll until the nodes `names` stop answering or `deadline` (time.time()); those still up."""
    sub = replace(inventory, nodes=tuple(n for n in inventory.nodes if n.name in names))
    up = list(names)
    said = False
    while up:
        up = alive(sub) if sub.nodes else []
        if not up or time.time() >= deadline:
            break
        if not said:
            progress(f"waiting for {', '.join(up)} to go (its notice is due)")
            said = True
        time.sleep(poll)
    return up


def forget_old_host_keys(inventory: Inventory, lost: list[str]) -> dict[str, int]:
    """Drop the controller's recorded host keys of the lost nodes' addresses (a replacement may reuse
    them with a new key); name -> lines removed."""
    by_name = {n.name: n for n in inventory.nodes}
    return {name: keys.forget_host(inventory.name, connections.host_key_name(by_name[name].address))
            for name in lost if name in by_name}


def host_key_fingerprints(inventory: Inventory, names: list[str]) -> dict[str, str]:
    """name -> "ssh-ed25519 SHA256:..." of the key each node proved (now pinned), for the nodes given."""
    import base64
    import hashlib

    chosen = [n for n in inventory.nodes if n.name in names]
    conns = connections.connections_for(inventory, chosen, connect_timeout=PROBE_TIMEOUT)

    def one(name: str, conn) -> str:
        try:
            kind, b64 = connections.seen_host_key(conn).split()[:2]
        except Exception as exc:  # noqa: BLE001 - reported per node
            return f"not verified: {connections.explain(exc, conn)}"
        digest = base64.b64encode(hashlib.sha256(base64.b64decode(b64)).digest()).decode().rstrip("=")
        return f"{kind} SHA256:{digest}"

    try:
        return dict(zip(conns, each_node(conns, one)))
    finally:
        connections.close_all(conns)


def check_software(inventory: Inventory, names: list[str],
                   progress: Callable[[str, str], None]) -> dict[str, str | None]:
    """`fab setup`'s check on the new nodes, then its install where the check fails (idempotent);
    name -> None when the node is ready, else why not."""
    from node_setup.controller import PROJECT_ROOT, project_version
    from node_setup.ssh import install
    from node_setup.ssh.wheels import InstallError

    sub = replace(inventory, nodes=tuple(n for n in inventory.nodes if n.name in names))
    version = project_version() if (PROJECT_ROOT / "pyproject.toml").exists() else None
    checks = {c.node: c for c in install.check_nodes(sub, project_version=version, connect_timeout=PROBE_TIMEOUT)}
    missing = [name for name, c in checks.items() if not c.ok]
    result = {name: None for name in checks}
    if not missing:
        return result
    for name in missing:
        progress(name, "not what the profile wants (fab check); installing as fab setup does")
    again = replace(sub, nodes=tuple(n for n in sub.nodes if n.name in missing))
    try:
        installed = install.setup_nodes(again, progress=progress)
    except InstallError as exc:
        return {**result, **{name: str(exc) for name in missing}}
    result.update({r.node: (None if r.ok else (r.error or "install failed")) for r in installed})
    return result


# ---------------------------------------------------------------- the run's recoveries on the master


def _path(output_dir: str, name: str) -> str:
    return f"{output_dir.rstrip('/')}/{name}"


def read_records(master, output_dir: str) -> list[dict]:
    """The recoveries recorded for the run in `output_dir` on the master (none: [])."""
    from node_setup.ssh.job import read_remote_file

    text = read_remote_file(master, _path(output_dir, RECOVERIES_FILE))
    try:
        records = json.loads(text) if text else []
    except ValueError:
        return []
    return [r for r in records if isinstance(r, dict)] if isinstance(records, list) else []


def write_records(master, output_dir: str, records: list[dict]) -> None:
    from node_setup.ssh.job import write_remote_json

    master.run(f"mkdir -p {shlex.quote(output_dir)}", hide=True, in_stream=False)
    write_remote_json(master, _path(output_dir, RECOVERIES_FILE), records)


def merge_into_summary(master, output_dir: str, records: list[dict]) -> bool:
    """Put the run's recoveries into summary.json on the master (the resumed job wrote it without
    them); False when there is no readable summary."""
    from node_setup.ssh.job import read_remote_summary, write_remote_json

    path = _path(output_dir, "summary.json")
    summary = read_remote_summary(master, path)
    if summary is None:
        return False
    write_remote_json(master, path, merge_recoveries(summary, records))
    return True


def newest_checkpoint(master, output_dir: str) -> tuple[int | None, float | None]:
    """(step, Unix time of its manifest) of the newest complete checkpoint in `output_dir` on the master."""
    quoted = shlex.quote(output_dir.rstrip("/"))
    result = master.run(f"cd && for m in {quoted}/checkpoint-*/xeon-checkpoint.json; do [ -f \"$m\" ] && "
                        f"echo \"$(stat -c %Y \"$m\") $m\"; done; true", hide=True, warn=True, in_stream=False)
    best: tuple[int | None, float | None] = (None, None)
    for line in result.stdout.splitlines():
        when, _, path = line.partition(" ")
        step_text = path.rsplit("/checkpoint-", 1)[-1].split("/", 1)[0]
        if step_text.isdigit() and when.isdigit() and (best[0] is None or int(step_text) > best[0]):
            best = (int(step_text), float(when))
    return best


# ---------------------------------------------------------------- the run supervisor on the master


def _run_dir(run_id: str) -> str:
    return f"{sv.RUN_ROOT}/{sv.check_run_id(run_id)}"


def start_supervisor(master, spec: dict, *, systemd: bool) -> str:
    """Put the run's spec on the master and start its supervisor there, detached from this SSH session:
    a transient systemd unit (`systemd`: a machine of its own), else `setsid nohup` (a local cluster's
    node: a process inside its namespace). Returns the run directory (relative to the home)."""
    from node_setup.ssh.job import write_remote_json

    d = _run_dir(spec["run_id"])
    qd = shlex.quote(d)
    master.run(f"cd && mkdir -p {qd} && chmod 700 {shlex.quote(sv.RUN_ROOT)} {qd} && rm -f {qd}/{sv.STOP_FILE}",
               hide=True, in_stream=False)
    write_remote_json(master, f"{d}/{sv.SPEC_FILE}", spec)
    python = shlex.quote(f"{venv_dir(get_profile(spec['inventory'].get('profile') or 'stock'))}/bin/python")
    command = f"{python} -m {sv.SUPERVISOR_MODULE} run \"$HOME\"/{qd}"
    if systemd:
        unit = shlex.quote(f"{sv.SYSTEMD_UNIT_PREFIX}{spec['run_id']}")
        start = (f"sudo systemd-run --quiet --unit {unit} --uid \"$(id -u)\" --gid \"$(id -g)\" "
                 f"--setenv HOME=\"$HOME\" --working-directory \"$HOME\" "
                 f"/bin/sh -c {shlex.quote(f'exec {command} >> {d}/{sv.LOG_FILE} 2>&1')}")
    else:
        start = f"(setsid nohup {command} </dev/null >> {qd}/{sv.LOG_FILE} 2>&1 &)"
    master.run(f"cd && ln -sfn {shlex.quote(spec['run_id'])} {shlex.quote(sv.CURRENT_LINK)} && {start}",
               hide=True, in_stream=False)
    return d


def supervised_state(master, run_id: str | None = None) -> dict | None:
    """The state file of the given (or newest) supervised run on the master; None when there is none."""
    from node_setup.ssh.job import read_remote_file

    d = _run_dir(run_id) if run_id else sv.CURRENT_LINK
    text = read_remote_file(master, f"{d}/{sv.STATE_FILE}")
    try:
        state = json.loads(text) if text else None
    except ValueError:
        return None
    return state if isinstance(state, dict) else None


def supervisor_running(master, state: dict) -> bool:
    pid = state.get("pid")
    if not isinstance(pid, int):
        return False
    result = master.run(f"tr '\\0' ' ' < /proc/{pid}/cmdline 2>/dev/null", hide=True, warn=True, in_stream=False)
    return sv.SUPERVISOR_MODULE in result.stdout and str(state.get("run")) in result.stdout


def follow_supervisor(master, run_id: str, pid: int, out=sys.stdout) -> None:
    """Stream the supervisor's log until it ends (KeyboardInterrupt propagates: the caller detaches)."""
    d = shlex.quote(f"{_run_dir(run_id)}/{sv.LOG_FILE}")
    promise = master.run(f"cd && exec tail -c +1 -F --pid={int(pid)} {d} 2>/dev/null", out_stream=out,
                         err_stream=out, hide=False, warn=True, pty=False, in_stream=False, asynchronous=True)
    runner = promise.runner
    try:
        while not (runner.process_is_finished or runner.has_dead_threads):
            time.sleep(0.2)
        promise.join()
    except KeyboardInterrupt:
        master.close()
        raise


def request_stop(master) -> str | None:
    """Ask the newest supervised run's supervisor to stop (before `fab stop` ends the job): its run id, or None."""
    state = supervised_state(master)
    if not state or state.get("status") in sv.FINAL:
        return None
    master.run(f"cd && touch {shlex.quote(sv.CURRENT_LINK)}/{sv.STOP_FILE}", hide=True, warn=True, in_stream=False)
    return str(state.get("run"))
