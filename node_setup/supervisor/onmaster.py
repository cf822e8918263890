"""The supervisor's work on the master and, over `ssh`, on the workers (node_setup/supervisor/loop.py's
collaborators), and its entry point.

- `RunFiles`: the run's directory on the master (cluster/run/supervision.py: spec, state, log, stop, the
  secret values kept apart from the spec, removed when the run ends).
- `ShellTransport`: the job lifecycle's transport on the master (node_setup/job_lifecycle/): a command on
  the master itself (bash) or on a worker (`ssh <alias>`: the ssh config, cluster key and known_hosts that
  `fab distribute` wrote on the master); the nodes trusted by the host keys the master holds; your
  program's workdir copied from the run's (fab pushed it into the run's first job directory).
- `Nodes`: a node's SSH answer and spot notice (read on the node from its own metadata service), the
  host key a machine presents (`ssh-keyscan`), and admitting a verified replacement (its key and address
  into the master's known_hosts and ssh config, and into the idle auto-stop's node list, so that the
  auto-stop powers off the new machine; its software checked).
- `Job`: each job of the run, planned from the run's request as `fab train` plans it (cluster/job/jobplan.py's
  `plan`, with a Restart after a recovery: --resume, the batch that keeps the global batch, your program's
  newest checkpoint) and run by the same lifecycle as fab's: prepare (the busy-node check), hosts, start (the
  idle auto-stop armed as on every path), outcome (the one rule), stop; its checkpoints and summary.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from cluster.inventory import Inventory
from cluster.job import jobsummary
from cluster.job.jobplan import JobPlan, Restart, new_job_id, plan
from cluster.job.request import RequestError, RunRequest
from cluster.job.userjob import workdir_on_node
from cluster.node import autostop
from cluster.node.profiles import get_profile, venv_dir
from cluster.node.render import MasterPaths
from cluster.node.setup_script import PROJECT_MARKER
from cluster.run import recovery as rc
from cluster.run import runspec
from cluster.run import supervision as sv
from cluster.run.supervision import Member
from node_setup.backends import backend_for
from node_setup.job_lifecycle.steps import Lifecycle
from node_setup.job_lifecycle.transport import Answer
from node_setup.supervisor.loop import Batch, LoopSpec, Supervisor

PROBE_TIMEOUT_S = 8
_NOTICE_PY = ("from training.imds import ImdsClient, endpoint\n"
              "c = ImdsClient(endpoint(), timeout=2)\n"
              "print('notice ' + (c.instance_action() or '-'))\n")


def _home_path(path: str) -> Path:
    path = path[2:] if path.startswith("~/") else path
    return Path(path) if path.startswith("/") else Path.home() / path


def _write_atomically(path: Path, text: str | bytes, mode: int = 0o600) -> None:
    partial = path.with_name(path.name + ".xc-new")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(text.encode() if isinstance(text, str) else text)
    partial.chmod(mode)
    os.replace(partial, path)


def known_keys(path: Path) -> dict[str, str]:
    """alias -> "type base64" from a known_hosts file `fab distribute` (or the auto-stop's list) wrote."""
    found: dict[str, str] = {}
    try:
        text = path.read_text()
    except OSError:
        return found
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            found[parts[0].split(",")[0]] = f"{parts[1]} {parts[2]}"
    return found


class RunFiles:
    """The run's directory on the master: its log, state, stop request; the recoveries in its output dir."""

    def __init__(self, run_dir: Path, output_dir: str, run_id: str, clock=time.time, mirror=None, run_store=None):
        self.dir, self.output_dir, self.run_id, self.clock = run_dir, output_dir, run_id, clock
        self.mirror = mirror  # (where, text): the state beside the spec in S3 (--checkpoint-uri), or None
        self.mirror_problem: str | None = None
        self.run_store = run_store  # the cluster's run store (the backend's), where the run's record is

    def forget(self) -> None:
        """The run ended: its record (its secret values) removed from the run store, so no new master takes it."""
        if self.run_store is None:
            return
        try:
            self.run_store.delete(runspec.run_record_name(self.run_id))
        except runspec.StoreError as exc:
            self.say(f"the run's record stays in its store: {exc}")

    def say(self, line: str) -> None:
        with open(self.dir / sv.LOG_FILE, "a") as log:
            log.write(sv.log_line(self.clock(), line))

    def state(self, *, status: str, job_id, nodes, recoveries, line: str = "", pending=(), restart=None,
              replaced=()) -> None:
        """The run's state file, and its mirror beside the run's spec in the output directory (on the disk every
        node shares on a local cluster), where a new master's boot step reads it back."""
        record = sv.state_record(run_id=self.run_id, status=status, job_id=job_id, nodes=nodes,
                                 recoveries=recoveries, output_dir=self.output_dir, at=self.clock(), pid=os.getpid(),
                                 line=line, pending=list(pending), restart=restart, keeper=os.getppid(),
                                 replaced=list(replaced))
        text = json.dumps(record, indent=2) + "\n"
        _write_atomically(self.dir / sv.STATE_FILE, text, 0o644)
        beside = _home_path(runspec.state_path(self.output_dir))
        if beside.parent.is_dir():  # `fab train --managed` wrote the spec there
            _write_atomically(beside, text, 0o644)
        if self.mirror is not None:
            where, write = self.mirror
            try:
                write(where, text)
                problem = None
            except runspec.StoreError as exc:
                problem = str(exc)
            if problem != self.mirror_problem:  # said once, and once when it works again
                self.say(f"the run's state could not be mirrored: {problem}; a new master would find it as it was "
                         "last mirrored" if problem else f"the run's state is mirrored to {where} again")
                self.mirror_problem = problem

    def previous(self) -> dict | None:
        """The state this run's supervisor left when its process ended (None: none, this is its first start)."""
        try:
            found = json.loads((self.dir / sv.STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        return found if isinstance(found, dict) and found.get("run") == self.run_id else None

    def stop_requested(self) -> bool:
        return (self.dir / sv.STOP_FILE).exists()

    def _records_path(self) -> Path:
        return _home_path(self.output_dir) / rc.RECOVERIES_FILE

    def records(self) -> list[dict]:
        try:
            found = json.loads(self._records_path().read_text())
        except (OSError, ValueError):
            return []
        return [r for r in found if isinstance(r, dict)] if isinstance(found, list) else []

    def save_records(self, records: list[dict]) -> None:
        path = self._records_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(path, json.dumps(records, indent=2) + "\n", 0o644)


class ShellTransport:
    """The job lifecycle's transport on the master: the master itself locally, a worker over ssh."""

    def __init__(self, master: str, run_id: str):
        self.master, self.run_id = master, run_id

    def run_one(self, node: str, command: str, timeout: float | None = 120, data: bytes | None = None) -> Answer:
        argv = (["bash", "-c", command] if node == self.master else
                ["ssh", "-o", f"ConnectTimeout={PROBE_TIMEOUT_S}", "-o", "BatchMode=yes", node, command])
        try:
            done = subprocess.run(argv, capture_output=True, input=data, timeout=timeout, cwd=str(Path.home()),
                                  stdin=subprocess.DEVNULL if data is None else None)
        except subprocess.TimeoutExpired:
            return Answer(node, 124, f"no answer in {timeout:g} s")
        return Answer(node, done.returncode, (done.stdout + done.stderr).decode(errors="replace"))

    def run(self, nodes: Sequence[str], command: str, *, timeout: float | None = 120) -> list[Answer]:
        with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
            return list(pool.map(lambda node: self.run_one(node, command, timeout), nodes))

    def put(self, node: str, path: str, data: bytes, *, mode: int = 0o644) -> None:
        if node == self.master:
            _write_atomically(_home_path(path), data, mode)
            return
        partial = shlex.quote(f"{path}.xc-new")
        answer = self.run_one(node, f"cd && umask 077 && cat > {partial} && chmod {mode:o} {partial} && "
                                    f"mv -f {partial} {shlex.quote(path)}", data=data)
        if not answer.ok:
            raise RuntimeError(f"{node}: writing {path} failed: {answer.out.strip()[-200:]}")

    def trust(self, inventory: Inventory) -> dict[str, str]:
        """The host keys the master holds for these nodes (`fab distribute`'s, and each admitted replacement's)."""
        return known_keys(_home_path(MasterPaths(inventory.name).known_hosts))

    def copy_workdir(self, plan: JobPlan) -> list[Answer]:
        """The run's workdir (pushed by `fab train` into the run's first job directory) copied into this job's,
        on the master itself or through `ssh` on a worker (a replacement too)."""
        src, dst = shlex.quote(workdir_on_node(self.run_id)), shlex.quote(workdir_on_node(plan.job_id))
        remote = shlex.quote(f"cd && mkdir -p {dst} && tar -xf - -C {dst}")

        def one(node: str) -> Answer:
            command = (f"cd && mkdir -p {dst} && cp -a {src}/. {dst}/" if node == self.master else
                       f"cd && tar -C {src} -cf - . | ssh -o BatchMode=yes {shlex.quote(node)} {remote}")
            return replace(self.run_one(self.master, command, timeout=900), node=node)

        with ThreadPoolExecutor(max_workers=max(1, len(plan.inventory.nodes))) as pool:
            return list(pool.map(one, [n.name for n in plan.inventory.nodes]))

    def install_requirements(self, plan: JobPlan) -> list[Answer]:
        return [Answer(n.name, 1, "--requirements: not with --managed") for n in plan.inventory.nodes]


class Nodes:
    def __init__(self, transport: ShellTransport, inventory: Inventory, cluster: Inventory | None, python: str):
        self.transport, self.inventory, self.cluster, self.python = transport, inventory, cluster, python
        self.paths = MasterPaths(inventory.name)
        self.life = Lifecycle(transport, lambda line: None)

    def probe(self, member: Member) -> tuple[bool, str | None]:
        answer = self.transport.run_one(member.name, f"{shlex.quote(self.python)} -I -c {shlex.quote(_NOTICE_PY)}",
                                        timeout=PROBE_TIMEOUT_S + 10)
        if not answer.ok:
            return False, None
        line = next((ln for ln in answer.out.splitlines() if ln.startswith("notice ")), "notice -")
        body = line[len("notice "):].strip()
        return True, None if body == "-" else body

    def host_key(self, member: Member) -> str | None:
        try:
            result = subprocess.run(["ssh-keyscan", "-T", "5", "-t", "ed25519", member.address], capture_output=True,
                                    text=True, timeout=20, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return None
        for line in result.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 3 and not line.startswith("#"):
                return f"{parts[1]} {parts[2]}"
        return None

    def admit(self, member: Member, key: str) -> str | None:
        """A verified replacement: its key and address in the master's ssh files and in the idle auto-stop's
        node list (else at idle the auto-stop would look for the old machine and keep the master up), then its
        software checked."""
        keys = {**self.transport.trust(self.inventory), member.name: key}
        self.inventory = _moved(self.inventory, member)
        self.life.write_hosts(self.inventory, keys)
        self.record_for_autostop(member, key)
        marker = shlex.quote(f"{venv_dir(get_profile(self.inventory.profile))}/{PROJECT_MARKER}")
        mine = self.transport.run_one(self.transport.master, f"cat {marker}").out.strip()
        theirs = self.transport.run_one(member.name, f"cat {marker}", timeout=60)
        if not theirs.ok:
            return f"no xeon-cluster in its venv ({theirs.out.strip()[-200:]})"
        if theirs.out.strip() != mine:
            return f"its venv holds xeon-cluster {theirs.out.strip()!r}, the master {mine!r}"
        return None

    def take_over(self, master: Member, keys: dict[str, str]) -> None:
        """A new master: its own address in the inventory, and the master's ssh files (known_hosts, ssh config,
        hostfile) for the run's nodes with `keys`, each verified from its node's console (the loop's
        `_verify_workers`); the cluster key is the one the boot step put in place."""
        self.inventory = _moved(self.inventory, master)
        known = [n for n in self.inventory.nodes if n.name in keys]
        self.life.write_hosts(replace(self.inventory, nodes=tuple(known)), keys)

    def record_for_autostop(self, member: Member, key: str) -> None:
        """The auto-stop's node list (cluster/node/autostop.py's node_list_files) with the replacement in its
        slot, when one was recorded (`fab setup`, `fab distribute`, `fab autostop` record the whole cluster)."""
        listed = _home_path(f"{autostop.STATE_DIR}/{autostop.KNOWN_HOSTS_FILE}")
        if self.cluster is None or not listed.exists():
            return
        self.cluster = _moved(self.cluster, member)
        keys = {**known_keys(listed), member.name: key}
        for path, text in autostop.node_list_files(self.cluster.name, self.cluster.nodes, self.cluster.user,
                                                   keys).items():
            _write_atomically(_home_path(path), text)


def _moved(inventory: Inventory, member: Member) -> Inventory:
    """`inventory` with `member` (a replacement) in its slot: its address and instance id."""
    nodes = [replace(n, address=member.address, private_address=member.address, instance_id=member.instance_id)
             if n.name == member.name else n for n in inventory.nodes]
    return replace(inventory, nodes=tuple(nodes))


class Job:
    """The run's jobs on the master: each planned from the run's request, as `fab train` plans it."""

    def __init__(self, request: RunRequest, transport: ShellTransport, nodes: Nodes, say=lambda line: None):
        self.request, self.transport, self.nodes = request, transport, nodes
        self.life = Lifecycle(transport, say)
        self.plans: dict[str, JobPlan] = {}
        self.reference: dict | None = None
        self.started = 0.0  # when the newest job was launched
        self._next_id: str | None = None
        self.version = transport.run_one(transport.master, "cat " + shlex.quote(
            f"{venv_dir(get_profile(nodes.inventory.profile))}/{PROJECT_MARKER}")).out.strip()

    @property
    def output_dir(self) -> str:
        return str(self.request.output_dir)

    def new_id(self) -> str:
        """The next job's id, which the next launch takes (the loop records it in the run's state first)."""
        self._next_id = new_job_id()
        return self._next_id

    def _plan(self, job_id: str, members: list[Member], *, resume: bool, batch: rc.BatchPlan | None) -> JobPlan:
        by_name = {n.name: n for n in self.nodes.inventory.nodes}
        chosen = [replace(by_name[m.name], rank=i, address=m.address, private_address=m.address,
                          instance_id=m.instance_id) for i, m in enumerate(members)]
        inventory = replace(self.nodes.inventory, nodes=tuple(chosen))
        restart = None
        if resume:
            checkpoint = self.newest_checkpoint_path() if self.request.own is not None else None
            restart = Restart(resume=True, batch=batch, checkpoint=checkpoint)
        return plan(self.request, inventory, job_id=job_id, nodes=len(chosen), restart=restart)

    def launch(self, members: list[Member], *, resume: bool, batch: rc.BatchPlan | None) -> str:
        job_id, self._next_id = self._next_id or new_job_id(), None
        job = self._plan(job_id, members, resume=resume, batch=batch)
        self.plans[job_id] = job  # a launch cut short can still be stopped
        try:
            self.life.launch(job, self.request, expected_version=self.version, supervised_run=self.request.run_id)
        except Exception as exc:  # noqa: BLE001 - LifecycleError, or the transport's: the run's state says why
            raise RuntimeError(f"preparing the nodes failed: {exc}") from None
        self.started = time.time()
        return job_id

    def adopt(self, job_id: str, members: list[Member], *, resume: bool, launched_at: float) -> None:
        """A job this run's supervisor launched before its process ended: planned again (its id, its nodes), so
        that its outcome and its stop are read as for a job launched here."""
        self.plans[job_id] = self._plan(job_id, members, resume=resume, batch=None)
        self.started = launched_at

    def outcome(self, job_id: str) -> int | str | None:
        """None while the job runs, "stopped" after `fab stop`, else its exit code (the one rule: a rank's own
        where the launcher returned another)."""
        job = self.plans[job_id]
        ended = self.life.outcome(job)
        if ended is None:
            return None
        return "stopped" if ended.code is None else ended.code

    def stop(self, job_id: str) -> None:
        job = self.plans.get(job_id)
        if job is not None:
            self.life.stop(job, grace=5)
    def _checkpoint_folders(self) -> dict[str, int]:
        """The output directory's candidate checkpoint folders (relative path -> files in it)."""
        root, found = _home_path(self.output_dir), {}
        for parent in ("", sv.CHECKPOINTS_FOLDER):
            try:
                entries = [e for e in os.scandir(root / parent) if e.is_dir(follow_symlinks=False)]
            except OSError:
                continue
            for entry in entries:
                if sv.CHECKPOINT_FOLDER_RE.match(entry.name):
                    found[f"{parent}/{entry.name}".lstrip("/")] = sum(1 for _ in os.scandir(entry.path))
        return found

    def newest_checkpoint_path(self) -> str | None:
        """The user's program: the newest checkpoint folder (absolute), by cluster/run/supervision.py's rule."""
        newest = sv.newest_checkpoint_folder(self._checkpoint_folders())
        return str(_home_path(self.output_dir) / newest[0]) if newest else None

    def newest_checkpoint(self) -> tuple[int | None, float | None]:
        best: tuple[int | None, float | None] = (None, None)
        if self.request.own is not None:
            newest = sv.newest_checkpoint_folder(self._checkpoint_folders())
            if newest:
                best = (newest[1], (_home_path(self.output_dir) / newest[0]).stat().st_mtime)
            return best
        for manifest in _home_path(self.output_dir).glob("checkpoint-*/xeon-checkpoint.json"):
            text = manifest.parent.name.rsplit("-", 1)[-1]
            if text.isdigit() and (best[0] is None or int(text) > best[0]):
                best = (int(text), manifest.stat().st_mtime)
        return best

    def summary(self) -> dict | None:
        """The newest job's summary.json (None when that job wrote none: an older job's is not its)."""
        path = _home_path(self.output_dir) / "summary.json"
        if not path.exists() or path.stat().st_mtime < self.started:
            return None
        found, _ = jobsummary.parse(path.read_text(), str(path))
        if found and self.reference is None and found.get("world_size"):
            self.reference = found
        return found

    def batch_for(self, node_count: int) -> Batch | None:
        """The batch that keeps the first summary's global batch on `node_count` nodes (None: unchanged)."""
        ref = self.reference
        if not ref:
            return None
        ranks = node_count * max(1, int(ref["world_size"]) // self.request.nodes)
        if ranks == int(ref["world_size"]):
            return None
        plan = rc.batch_for(per_rank=int(ref["per_rank_batch_size"]),
                            accumulation=int(ref["gradient_accumulation_steps"]),
                            ranks_before=int(ref["world_size"]), ranks=ranks)
        return Batch(plan, plan.describe(int(ref["per_rank_batch_size"]), int(ref["gradient_accumulation_steps"])))

    def finish(self, records: list[dict]) -> None:
        path = _home_path(self.output_dir) / "summary.json"
        found, _ = jobsummary.parse(path.read_text() if path.exists() else None, str(path))
        if found is not None:
            _write_atomically(path, json.dumps(rc.merge_recoveries(found, records), indent=2) + "\n", 0o644)

    def restore_workdir(self, workers: list[str]) -> str | None:
        """A new master, for your own program: the run's workdir (which `fab train` pushed into the run's first job
        directory on every node, and which the lost master took along) taken back from a worker that has it and
        checked against the digest the signed spec records before it is used; None when it is in place, else
        why not (one line)."""
        own = self.request.own
        target = _home_path(workdir_on_node(self.request.run_id))
        if own is None or target.is_dir():
            return None
        assert own.workdir_files is not None  # runspec.read refuses a spec of your program without it
        problems = []
        for name in workers:
            partial = target.with_name(target.name + ".xc-new")
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            remote = shlex.quote(f"cd && tar -C {shlex.quote(workdir_on_node(self.request.run_id))} -cf - .")
            command = f"ssh -o BatchMode=yes {shlex.quote(name)} {remote} | tar -xf - -C {shlex.quote(str(partial))}"
            answer = self.transport.run_one(self.transport.master, command, timeout=900)
            found = _digest(partial) if answer.ok else None
            if found == tuple(own.workdir_files):
                os.replace(partial, target)
                return None
            shutil.rmtree(partial, ignore_errors=True)
            problems.append(f"{name}: " + (f"not copied ({answer.out.strip()[-200:]})" if found is None else
                                           "its copy is not as the run recorded it"))
        return f"your program's workdir could not be taken back from a worker ({'; '.join(problems) or 'none'})"

    def keep_for_controller(self) -> str:
        """What survives the master, said when its notice ends the run (`fab train --managed` wrote the run's
        spec at the hand-off: cluster/run/runspec.py)."""
        from cluster.run import runspec

        uri = self.request.checkpoint_uri
        if uri:
            return f"The run's spec is in {runspec.spec_uri(uri)} and its checkpoints under {uri}."
        if self.nodes.inventory.on_shared_disk(self.output_dir):  # the local cluster's output root
            return (f"The output directory {self.output_dir} is on the disk every node shares, with the run's spec "
                    f"in {runspec.spec_path(self.output_dir)}.")
        return (f"The checkpoints were only on the master's disk ({self.output_dir}, no --checkpoint-uri): "
                "they go with it.")


def _digest(folder: Path) -> tuple[tuple[str, str], ...]:
    """A folder's files as a workdir's digest (cluster/job/request.py's `workdir_digest`): (path, SHA-256), by path."""
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        found.append((str(path.relative_to(folder)), hashlib.sha256(path.read_bytes()).hexdigest()))
    return tuple(sorted(found))


# ---------------------------------------------------------------- entry point


def read_request(run_dir: Path, spec: dict) -> RunRequest:
    """The run's request from its spec, every field checked, with its secret values from their own file."""
    request = RunRequest.from_mapping(spec.get("request"))
    path = run_dir / sv.SECRETS_FILE
    secrets = json.loads(path.read_text()) if path.exists() else {}
    withheld = {name for name, value in request.env if value == "(withheld)"}
    if not isinstance(secrets, dict) or set(secrets) - withheld:
        raise RequestError(f"{path}: allowed: the values of the run's withheld --env names ({sorted(withheld)})")
    return request.with_env(secrets)


def build(run_dir: Path) -> Supervisor:
    """The supervisor of the run whose spec is in `run_dir` (every value checked as it enters)."""
    spec = json.loads((run_dir / sv.SPEC_FILE).read_text())
    request = read_request(run_dir, spec)
    managed = request.managed
    if managed is None:
        raise RequestError(f"{run_dir / sv.SPEC_FILE}: the run has no --managed settings")
    kind = spec.get("kind", "file")
    inventory = Inventory.from_mapping(spec["inventory"], default_name=spec["inventory"]["name"], kind=kind)
    cluster = (Inventory.from_mapping(spec["cluster"], default_name=spec["cluster"]["name"], kind=kind)
               if spec.get("cluster") else None)
    ids = dict(spec.get("instance_ids") or {})
    members = [Member(n.name, n.private_address, str(ids.get(n.name) or f"i-{'0' * 8}{i:08x}"))
               for i, n in enumerate(inventory.nodes)]
    # the cluster's group (local: its keeper's record, which has the instance ids a local inventory lacks)
    group, members = backend_for(inventory.kind).machine_group(spec, members)
    takeover = spec.get("takeover")
    if takeover is not None:  # a new master: the machines in the slots now, as the group records them
        now = group.members()
        members = [now.get(m.name, m) for m in members]
        for member in members:
            inventory = _moved(inventory, member)
            cluster = _moved(cluster, member) if cluster is not None else None
    python = f"{venv_dir(get_profile(inventory.profile))}/bin/python"
    transport = ShellTransport(inventory.master.name, request.run_id)
    nodes = Nodes(transport, inventory, cluster, python)
    store = backend_for(kind).run_store(inventory.name, data_dir=spec.get("local_data_dir") or "",
                                        region=spec.get("region"))
    mirror = None
    if store is not None and request.checkpoint_uri and not inventory.on_shared_disk(str(request.output_dir)):
        mirror = (runspec.state_uri(request.checkpoint_uri), store.write)  # beside the spec in S3
    files = RunFiles(run_dir, str(request.output_dir), request.run_id, mirror=mirror, run_store=store)
    loop_spec = LoopSpec(request.run_id, members, managed, float(spec.get("poll_seconds", 5)), request.resume,
                         previous=files.previous(), takeover=takeover)
    return Supervisor(loop_spec, group, nodes, Job(request, transport, nodes, files.say), files)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "run":
        print("usage: python -m node_setup.supervisor run RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(argv[1]).expanduser()
    try:
        supervisor = build(run_dir)
        try:
            status = supervisor.run()
        except Exception as exc:  # noqa: BLE001 - the state file says why the run ended, for fab status
            supervisor.store.say(f"the supervisor failed: {type(exc).__name__}: {exc}")
            supervisor._state(sv.FAILED, f"the supervisor failed: {exc}")
            status = sv.FAILED
        if status in sv.FINAL and isinstance(supervisor.store, RunFiles):
            supervisor.store.forget()
    finally:  # the run's secret values go with it
        (run_dir / sv.SECRETS_FILE).unlink(missing_ok=True)
    return 0 if status == sv.COMPLETED else 1
