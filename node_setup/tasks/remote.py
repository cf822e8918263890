"""`fab exec` and `fab get`: a shell command on every node, and a job's output back to this machine.

    fab exec 'COMMAND' [--nodes N]        every (or the first N) node in parallel (fanout.each_node);
                                          each node's output labelled `[node]`, then a table of
                                          per-node results; exit 1 if a command failed, 3 if a node
                                          could not be reached
    fab get [--job ID] [--path P] [--to DIR]
                                          the job's output folder (or P under it) from the master
                                          into DIR/<job id> (default ./xeon-cluster-runs/<job id>),
                                          resumable (a partial file continues where it stopped, when
                                          the master's sha256 of that prefix is its own), each file
                                          checked against the master's sha256 once copied,
                                          with progress for large files; default job: the newest.
                                          Walked over SFTP (node_setup/ssh/fetch.py): names that could
                                          leave --to refused (cluster/job/fetch_paths.py), links never
                                          followed on either side; exit 1 if an entry was refused
                                          or could not be read
"""

from __future__ import annotations

from pathlib import Path

from invoke import Exit

from cluster.node import autostop
from cluster.job import fetch_paths
from cluster.job.jobplan import shown
from cluster.job.userjob import human_bytes
from node_setup.ssh.fanout import NodeOutcome, each_node, outcome_table
from node_setup.tasks import common
from node_setup.tasks.common import CLUSTER_HELP, FAILED, JOB_HELP, REGION_HELP, UNREACHABLE, Unset, fail, task

DEFAULT_GET_ROOT = "xeon-cluster-runs"  # `fab get` default --to: ./xeon-cluster-runs/<job id>


def _first_nodes(inventory, nodes: int):
    if nodes and not 1 <= nodes <= len(inventory.nodes):
        raise fail(f"--nodes: {nodes} is not possible on cluster {inventory.name!r}; allowed 1 to "
                   f"{len(inventory.nodes)}")
    return inventory.first(nodes or len(inventory.nodes))


@task(help={
    "command": "the shell command every node runs (quote it: fab exec 'nproc && free -g')",
    "nodes": "run on the first N nodes only, master first (left out: all)",
    "cluster": CLUSTER_HELP,
    "region": REGION_HELP,
})
def exec_(c, command, nodes=Unset(int, "all nodes"), cluster="", region=""):
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
        # on the master, recorded as activity for the idle auto-stop (cluster/node/autostop.py)
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
    """`--path`: a relative path under the output folder (cluster/job/fetch_paths.py's rule)."""
    try:
        return fetch_paths.check_subpath(path)
    except ValueError as exc:
        raise fail(f"--path: {path!r} is not allowed ({exc}); give a path relative to the job's output folder, "
                   "without `..` or control characters") from None


@task(help={
    "job": JOB_HELP,
    "path": "a file or folder under the job's output folder (default: all of it)",
    "to": f"local folder to copy into: the job's files go to DIR/<job id> (default ./{DEFAULT_GET_ROOT})",
    "cluster": CLUSTER_HELP,
    "region": REGION_HELP,
})
def get(c, job="", path="", to="", cluster="", region=""):
    """Copy a job's output folder (or a path under it) from the master to this machine, resumably."""
    from cluster.job import jobhistory
    from cluster.names import printable
    from node_setup import job_history
    from node_setup.ssh import fetch
    from node_setup.ssh import job as jobs

    rel = check_remote_path(path)
    dest = Path(to).expanduser() if to else None
    if dest is not None and dest.is_symlink():
        raise fail(f"--to: {to!r} is a symbolic link; allowed: a real folder (fab get never writes through a link)")
    inventory = common.inventory(cluster, region)
    master = common.connect(inventory)[inventory.master.name]
    past = None  # the job as the controller's job history knows it, when its master is gone
    try:
        job_id = jobs.resolve_job_id(master, job or None)
        output_dir = jobs.read_metadata(master, job_id).get("output_dir")
    except jobs.JobError as exc:
        past = (jobhistory.find(job_history.read(inventory.name, identity=job_history.identity(inventory)), job)
                if job else None)
        if past is None:
            raise fail(str(exc)) from None
        job_id, output_dir = past.id, past.output_dir  # still there if the nodes share the disk it was on
    if not isinstance(output_dir, str) or not output_dir:
        raise fail(f"--job: job {job_id} records no output folder on {inventory.master.name}", FAILED)
    root = output_dir if rel == "." else f"{output_dir.rstrip('/')}/{rel}"
    sftp = master.sftp()
    try:
        sftp.lstat(root)
        link = fetch.first_link(sftp, output_dir, rel)
    except OSError as exc:
        if past is not None:
            raise fail("; ".join(jobhistory.whereabouts(past)) + f"; {shown(root)!r} is not on "
                       f"{inventory.master.name}, the master now", FAILED) from None
        raise fail(f"--path: {shown(root)!r} is not on {inventory.master.name} ({exc.strerror or exc})",
                   FAILED) from None
    if past is not None:
        print(f"job {job_id}: its master {printable(past.master or '?')} no longer has it; its output folder "
              f"{shown(printable(output_dir))} is on {inventory.master.name} (a disk the nodes share)", flush=True)
    if link:
        raise fail(f"--path: {shown(link)!r} on {inventory.master.name} is a symbolic link; fab get never follows one",
                   FAILED)
    left_out: list[str] = []

    def say(line: str) -> None:
        left_out.append(line.split(" ", 1)[0])
        print(line, flush=True)

    files = list(fetch.walk(sftp, root, say))
    base = dest or Path(DEFAULT_GET_ROOT)
    dest = base / job_id  # each job in its own folder: one job's files never meet another's
    print(f"job {job_id}: {len(files)} file(s), {human_bytes(sum(f.size for f in files))} in "
          f"{shown(root)!r} on {inventory.master.name} -> {dest}", flush=True)
    try:
        tree = fetch.LocalTree(base)
    except fetch.UnsafeLocalPath as exc:
        raise fail(f"--to: {exc}", FAILED) from None
    counts: dict[str, int] = {}
    digest = fetch.remote_digest(master)
    with tree:
        for file in files:
            try:
                what = fetch.copy(sftp, file.remote, tree, (job_id, *file.parts), file.size, file.mode, digest=digest)
            except (fetch.UnsafeLocalPath, ValueError) as exc:  # ValueError: the name rule, checked again here
                what = "refused"
                print(f"refused {'/'.join(file.parts)!r} in {dest}: {exc}; not written", flush=True)
            except fetch.ChangedWhileCopied as exc:
                what = "changed"
                print(f"changed {'/'.join(file.parts)!r}: {exc}", flush=True)
            except OSError as exc:  # unreadable on the master, or not writable here
                what = "failed"
                print(f"failed {'/'.join(file.parts)!r}: {exc}", flush=True)
            counts[what.split(" ")[0]] = counts.get(what.split(" ")[0], 0) + 1
    verified = sum(counts.get(k, 0) for k in fetch.VERIFIED)
    for what in left_out:
        counts[what] = counts.get(what, 0) + 1
    print("done: " + (", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "nothing to copy")
          + (f"; {verified} verified ({fetch_paths.DIGEST} on the master)" if verified else "") + f"; in {dest}")
    if counts.get("refused") or counts.get("failed") or counts.get("changed"):
        raise Exit(code=FAILED)


TASKS = [exec_, get]
TASK_NAMES = {"exec_": "exec"}  # `exec` is a Python builtin, so the function carries an underscore
