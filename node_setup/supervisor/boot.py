"""A new master's boot step: `python -m node_setup.supervisor.boot KIND CLUSTER SIGNER STORE REGION`, run by the
master's boot script (cluster/node/boot_script.py's `master_boot_script`: the master's user data on AWS; on a
local cluster the group keeper runs it on the new master it brings back), as the SSH user in its home.

1. The cluster's private SSH key from the run store (the backend's `run_store`: SSM on AWS,
   node_setup/aws/run_secrets.py; its double locally, node_setup/local/run_store_double.py),
   written where `fab distribute` puts it on a master (cluster/node/render.py's MasterPaths), 0600.
2. Each run record in the store, newest first: the spec it points to (beside the checkpoints in S3, or in the
   output directory on the disk every node shares) read and verified with SIGNER, the controller's run-spec
   public key (cluster/run/runspec.py's `read`, bound to this cluster and that place); the run's state its
   supervisor mirrored beside the spec read back as data (cluster/run/supervision.py's `checked_state`). The
   newest run whose spec verifies and whose state is not final is the one continued; a record that does not
   verify is skipped with one line.
3. Its supervisor's directory on this master written from the signed hand-off (the run's request with
   --resume, its nodes and the backend's context), the record's values for the spec's withheld --env names only
   (0600), and the mirrored state as `takeover`; the supervisor started as `fab train --managed` starts it
   (a transient systemd unit on AWS, under its respawner locally). It takes the run over
   (node_setup/supervisor/loop.py's `_take_over`): each worker's host key verified from its console, the ssh
   files written, the job resumed from the newest checkpoint.

Nothing here runs a command a record names: the signed spec says what runs.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from cluster import records
from cluster.job.request import RunRequest
from cluster.node.profiles import get_profile, venv_dir
from cluster.node.render import MasterPaths
from cluster.run import runspec
from cluster.run import supervision as sv
from node_setup.backends import backend_for
from node_setup.spec_signing import SpecKey, checked_public_key

TAKEOVER_FIELDS = ("run", "status", "job", "updated", "replaced")  # what the new supervisor reads of the state


def _beside(spec_at: str) -> tuple[str, str]:
    """(the run's checkpoint URI or output directory, where its mirrored state is) for the spec at `spec_at`."""
    folder = spec_at[:-len(f"/{runspec.RUN_FOLDER}/{sv.SPEC_FILE}")]
    return folder, (runspec.state_uri(folder) if spec_at.startswith("s3://") else runspec.state_path(folder))


def unfinished_run(store, kind: str, cluster: str, key: SpecKey, say=print):
    """(the newest run whose spec verifies and whose mirrored state is not final: its spec Found, its record's
    secret values, its checked state), or None."""
    for name in reversed(store.names(runspec.RUNS_FOLDER)):
        where = store.where(name)
        try:
            run_id, spec_at, secrets = runspec.checked_run_record(store.get(name), where)
            folder, state_at = _beside(spec_at)
            binding = runspec.Binding(cluster, kind, checkpoint_uri=folder if spec_at.startswith("s3://") else None,
                                      output_dir=None if spec_at.startswith("s3://") else folder)
            found = runspec.read(store.read(spec_at), spec_at, key, binding)
        except runspec.RunSpecError as exc:
            say(f"xeon-cluster master boot: skipped: {exc}")
            continue
        if found.request.run_id != run_id:
            say(f"xeon-cluster master boot: skipped: {where} names run {run_id}, its spec another")
            continue
        try:
            state, problems = sv.checked_state(records.load(store.read(state_at), state_at), state_at)
        except records.RecordError as exc:
            state, problems = None, [str(exc)]
        for line in problems:
            say(f"xeon-cluster master boot: {line}")
        if state is None or state.get("run") != run_id:
            say(f"xeon-cluster master boot: run {run_id}: no state of it at {state_at}; not continued")
            continue
        if state.get("status") in sv.FINAL:
            continue
        return found, {n: v for n, v in secrets.items() if n in found.withheld}, state
    return None


def write_run(home: Path, found: runspec.Found, secrets: dict[str, str], state: dict) -> Path:
    """The run's supervisor directory on this master: its spec (the signed hand-off, the request with --resume,
    the lost master's state as `takeover`) and its secret values (0600)."""
    request: RunRequest = dataclasses.replace(found.request, resume=True)
    spec = {**(found.handoff or {}), "request": request.to_mapping(),
            "takeover": {k: state[k] for k in TAKEOVER_FIELDS if k in state}}
    run_dir = home / sv.RUN_ROOT / request.run_id
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    for name in (sv.STATE_FILE, sv.STOP_FILE):
        (run_dir / name).unlink(missing_ok=True)
    (run_dir / sv.SPEC_FILE).write_text(json.dumps(spec, indent=2) + "\n")
    secrets_path = run_dir / sv.SECRETS_FILE
    secrets_path.touch(mode=0o600)
    secrets_path.write_text(json.dumps(secrets) + "\n")
    return run_dir


def place_cluster_key(home: Path, cluster: str, text: str) -> Path:
    path = home / MasterPaths(cluster).private_key.removeprefix("~/")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.parent.chmod(0o700)
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(text if text.endswith("\n") else text + "\n")
    return path


def boot(kind: str, cluster: str, signer: str, *, data_dir: str = "", region: str | None = None,
         home: Path | None = None, store=None, start: bool = True, say=print) -> str | None:
    """The boot step (see the module's docstring): the run id it continued, or None."""
    home = home or Path.home()
    key = SpecKey(checked_public_key(signer))
    store = store or backend_for(kind).run_store(cluster, data_dir=data_dir, region=region)
    if store is None:
        say(f"xeon-cluster master boot: no run store for a cluster of kind {kind!r}; nothing to continue")
        return None
    cluster_key = store.get(runspec.CLUSTER_KEY_NAME)
    if cluster_key is None:
        say(f"xeon-cluster master boot: no cluster key at {store.where(runspec.CLUSTER_KEY_NAME)}; nothing to "
            "continue")
        return None
    chosen = unfinished_run(store, kind, cluster, key, say)
    if chosen is None:
        say("xeon-cluster master boot: no unfinished supervised run; nothing to continue")
        return None
    found, secrets, state = chosen
    place_cluster_key(home, cluster, cluster_key)
    write_run(home, found, secrets, state)
    run_id = found.request.run_id
    if start:
        profile = ((found.handoff or {}).get("inventory") or {}).get("profile") or "stock"
        python = f"{venv_dir(get_profile(profile))}/bin/python"
        command = sv.start_command(run_id, python, systemd=backend_for(kind).supervisor_as_service())
        subprocess.run(["bash", "-c", command], check=True, cwd=str(home), stdin=subprocess.DEVNULL, timeout=60)
    say(f"xeon-cluster master boot: run {run_id} ({state.get('status')}, job {state.get('job') or '-'}) continued "
        "by its supervisor here")
    return run_id


def main(argv: list[str]) -> int:
    if len(argv) != 5:
        print("usage: python -m node_setup.supervisor.boot KIND CLUSTER SIGNER STORE REGION", file=sys.stderr)
        return 2
    kind, cluster, signer, data_dir, region = argv
    try:
        boot(kind, cluster, signer, data_dir=data_dir, region=region or None)
    except (ValueError, runspec.StoreError, subprocess.SubprocessError) as exc:
        print(f"xeon-cluster master boot: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
