"""`fab exec` and `fab get`: a shell command on every node, and a job's output back to this machine.

    fab exec 'COMMAND' [--nodes N]        every (or the first N) node in parallel (fanout.each_node);
                                          each node's output labelled `[node]`, then a table of
                                          per-node results; exit 1 if a command failed, 3 if a node
                                          could not be reached
    fab get [--job ID] [--path P] [--to DIR]
                                          the job's output folder (or P under it) from the master,
                                          resumable (a partial file continues where it stopped),
                                          with progress for large files; default job: the newest
"""

from __future__ import annotations

import os
import posixpath
import shlex
import stat as stat_mode
import time
from pathlib import Path

from invoke import Exit

from cluster import autostop
from cluster.jobplan import shown
from cluster.userjob import human_bytes
from node_setup.ssh.fanout import NodeOutcome, each_node, outcome_table
from node_setup.tasks import common
from node_setup.tasks.common import CLUSTER_HELP, FAILED, JOB_HELP, REGION_HELP, UNREACHABLE, fail, task

PROGRESS_FROM_BYTES = 8 * 1024 * 1024  # files at least this large report progress
CHUNK = 1024 * 1024
DEFAULT_GET_ROOT = "xeon-cluster-runs"  # `fab get` default: ./xeon-cluster-runs/<job id>


def _first_nodes(inventory, nodes: int):
    if nodes and not 1 <= nodes <= len(inventory.nodes):
        raise fail(f"--nodes: {nodes} is not possible on cluster {inventory.name!r}; allowed 1 to {len(inventory.nodes)}")
    return inventory.first(nodes or len(inventory.nodes))


@task(help={
    "command": "the shell command every node runs (quote it: fab exec 'nproc && free -g')",
    "nodes": "run on the first N nodes only, master first (default all)",
    "cluster": CLUSTER_HELP,
    "region": REGION_HELP,
})
def exec_(c, command, nodes=0, cluster="", region=""):
    """Run a shell command on every node in parallel; output labelled by node, a table of results."""
    from node_setup.ssh.connections import explain, is_unreachable

    if not command.strip() or "\0" in command:
        raise fail(f"command: {command!r} is not allowed; give a non-empty shell command")
    if command.startswith("-"):  # `fab exec --help` hands "--help" over as the command
        raise fail(f"command: {command!r} is an option, not a shell command; allowed: a shell command, quoted "
                   "(fab exec 'nproc'); this task's options: fab --help exec")
    inventory = _first_nodes(common.inventory(cluster, region), nodes)
    conns = common.connect(inventory)

    def one(name: str, conn) -> tuple[NodeOutcome, str, bool]:
        # on the master, recorded as activity for the idle auto-stop (cluster/autostop.py)
        run = autostop.recorded_command(command) if name == inventory.master.name else command
        try:
            result = conn.run(run, hide=True, warn=True, in_stream=False)
        except Exception as exc:  # noqa: BLE001 - reported per node
            return NodeOutcome(name, False, f"unreachable: {explain(exc, conn)}"), "", is_unreachable(exc)
        text = result.stdout + result.stderr
        return NodeOutcome(name, result.ok, "exit 0" if result.ok else f"exit {result.exited}"), text, False

    results = each_node(conns, one)
    for outcome, text, _ in results:
        for line in text.splitlines():
            print(f"[{outcome.node}] {line}")
    print(f"\nexec on {len(results)} node(s):")
    print(outcome_table(o for o, _, _ in results))
    if any(unreachable for _, _, unreachable in results):
        raise Exit(code=UNREACHABLE)
    if any(not o.ok for o, _, _ in results):
        raise Exit(code=FAILED)




def check_remote_path(path: str) -> str:
    """`--path`: a relative path under the output folder, without `..`."""
    norm = posixpath.normpath(path or ".")
    if path.startswith("/") or norm == ".." or norm.startswith("../") or "\0" in path:
        raise fail(f"--path: {path!r} is not allowed; give a path relative to the job's output folder, without `..`")
    return norm


def _copy(sftp, remote: str, local: Path, size: int) -> str:
    """One file, resumed when `local` is a shorter copy; returns what happened."""
    have = local.stat().st_size if local.exists() else 0
    if have == size:
        return "unchanged"
    if have > size:
        have = 0
    local.parent.mkdir(parents=True, exist_ok=True)
    shown_at, start = -1, time.monotonic()
    with sftp.open(remote, "rb") as src, open(local, "ab" if have else "wb") as dst:
        src.seek(have)
        done = have
        while done < size:
            block = src.read(min(CHUNK, size - done))
            if not block:
                break
            dst.write(block)
            done += len(block)
            if size >= PROGRESS_FROM_BYTES and done * 10 // size != shown_at:
                shown_at = done * 10 // size
                print(f"  {local.name}: {human_bytes(done)} of {human_bytes(size)} ({100 * done // size}%)", flush=True)
    return (f"resumed at {human_bytes(have)}" if have else "copied") + f" in {time.monotonic() - start:.1f} s"


@task(help={
    "job": JOB_HELP,
    "path": "a file or folder under the job's output folder (default: all of it)",
    "to": f"local folder to copy into (default ./{DEFAULT_GET_ROOT}/<job id>)",
    "cluster": CLUSTER_HELP,
    "region": REGION_HELP,
})
def get(c, job="", path="", to="", cluster="", region=""):
    """Copy a job's output folder (or a path under it) from the master to this machine, resumably."""
    from node_setup.ssh import job as jobs

    rel = check_remote_path(path)
    inventory = common.inventory(cluster, region)
    master = common.connect(inventory)[inventory.master.name]
    try:
        job_id = jobs.resolve_job_id(master, job or None)
        output_dir = jobs.read_metadata(master, job_id).get("output_dir")
    except jobs.JobError as exc:
        raise fail(str(exc)) from None
    if not output_dir:
        raise fail(f"--job: job {job_id} records no output folder on {inventory.master.name}", FAILED)
    root = output_dir if rel == "." else f"{output_dir}/{rel}"
    listing = master.run(f"cd && if [ -f {shlex.quote(root)} ]; then stat -c '\t%s' {shlex.quote(root)}; "
                         f"else find {shlex.quote(root)} -type f -printf '%P\\t%s\\n'; fi",
                         hide=True, warn=True, in_stream=False)
    if not listing.ok:
        raise fail(f"--path: {shown(root)} is not on {inventory.master.name} "
                   f"({(listing.stderr or '').strip() or 'not found'})", FAILED)
    files = [line.rsplit("\t", 1) for line in listing.stdout.splitlines() if "\t" in line]
    dest = Path(to or os.path.join(DEFAULT_GET_ROOT, job_id)).expanduser()
    single = len(files) == 1 and files[0][0] == ""
    print(f"job {job_id}: {len(files)} file(s), {human_bytes(sum(int(s) for _, s in files))} in "
          f"{shown(root)} on {inventory.master.name} -> {dest}", flush=True)
    sftp = master.sftp()
    counts: dict[str, int] = {}
    for name, size in files:
        remote = root if single else f"{root}/{name}"
        local = dest / (posixpath.basename(root) if single else name)
        if not sftp.stat(remote).st_mode or stat_mode.S_ISDIR(sftp.stat(remote).st_mode):
            continue
        what = _copy(sftp, remote, local, int(size))
        counts[what.split(" ")[0]] = counts.get(what.split(" ")[0], 0) + 1
    print("done: " + (", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "nothing to copy") + f"; in {dest}")


TASKS = [exec_, get]
TASK_NAMES = {"exec_": "exec"}  # `exec` is a Python builtin, so the function carries an underscore
