"""The supervisor's work on the master and, over `ssh`, on the workers (node_setup/supervisor/loop.py's
collaborators), and its entry point.

- `RunFiles`: the run's directory on the master (cluster/run/supervision.py: spec, state, log, stop).
- `Shell`: a command on the master itself (bash) or on a worker (`ssh <alias>`: the ssh config,
  cluster key and known_hosts that `fab distribute` wrote on the master).
- `Nodes`: a node's SSH answer and spot notice (read on the node from its own metadata service), the
  host key a machine presents (`ssh-keyscan`), and admitting a verified replacement (its key into the
  master's known_hosts, its address into the ssh config, its software checked).
- `Job`: the job's plan (cluster/job/jobplan.py, as `fab train` makes it), its preparation on every node,
  its start detached on the master (the files and `setsid nohup` start of cluster/job/jobcommands.py, as fab's), its
  outcome, stop, checkpoints and summary.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from cluster.job import jobsummary
from cluster.run import recovery as rc
from cluster.run import supervision as sv
from cluster.inventory import Inventory, Node
from cluster.job.jobcommands import STATE_SH, STOP_MASTER_SH, STOP_NODE_SH, job_files, start_command
from cluster.job.jobcommands import sh_command as _sh
from cluster.job.joblog import first_failure
from cluster.job.jobplan import JobPlan, new_job_id, plan_job
from cluster.job.launch import job_dir
from cluster.node.profiles import get_profile, venv_dir
from cluster.node.render import MasterPaths, hostfile_text, known_hosts_text, replace_managed_block, ssh_config_block
from cluster.node.setup_script import PROJECT_MARKER
from cluster.run.supervision import Member
from cluster.job.userjob import UserProgram, check_module, notice_signal, workdir_on_node
from node_setup.backends import backend_for
from node_setup.supervisor.loop import LoopSpec, Supervisor

PROBE_TIMEOUT_S = 8
_NOTICE_PY = ("from training.imds import ImdsClient, endpoint\n"
              "c = ImdsClient(endpoint(), timeout=2)\n"
              "print('notice ' + (c.instance_action() or '-'))\n")


def _home_path(path: str) -> Path:
    return Path(path) if path.startswith("/") else Path.home() / path


def _write_atomically(path: Path, text: str, mode: int = 0o600) -> None:
    partial = path.with_name(path.name + ".xc-new")
    partial.write_text(text)
    partial.chmod(mode)
    os.replace(partial, path)


class RunFiles:
    """The run's directory on the master: its log, state, stop request; the recoveries in its output dir."""

    def __init__(self, run_dir: Path, output_dir: str, run_id: str, clock=time.time):
        self.dir, self.output_dir, self.run_id, self.clock = run_dir, output_dir, run_id, clock

    def say(self, line: str) -> None:
        stamp = time.strftime("%H:%M:%S", time.gmtime(self.clock()))
        with open(self.dir / sv.LOG_FILE, "a") as log:
            log.write(f"managed: [{stamp}] {line}\n")

    def state(self, *, status: str, job_id, nodes, recoveries, line: str = "", pending=()) -> None:
        record = sv.state_record(run_id=self.run_id, status=status, job_id=job_id, nodes=nodes,
                                 recoveries=recoveries, output_dir=self.output_dir, at=self.clock(), pid=os.getpid(),
                                 line=line, pending=list(pending))
        _write_atomically(self.dir / sv.STATE_FILE, json.dumps(record, indent=2) + "\n", 0o644)

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


class Shell:
    """Commands on the run's nodes from the master: the master itself locally, a worker over ssh."""

    def __init__(self, master: str):
        self.master = master

    def run(self, node: str, command: str, timeout: float = 120) -> subprocess.CompletedProcess:
        argv = (["bash", "-c", command] if node == self.master else
                ["ssh", "-o", f"ConnectTimeout={PROBE_TIMEOUT_S}", "-o", "BatchMode=yes", node, command])
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                                  cwd=str(Path.home()))
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 124, "", f"no answer in {timeout:g} s")


class Nodes:
    def __init__(self, shell_: Shell, inventory: Inventory, python: str):
        self.shell, self.inventory, self.python = shell_, inventory, python
        self.paths = MasterPaths(inventory.name)

    def probe(self, member: Member) -> tuple[bool, str | None]:
        result = self.shell.run(member.name, f"{shlex.quote(self.python)} -I -c {shlex.quote(_NOTICE_PY)}",
                                timeout=PROBE_TIMEOUT_S + 10)
        if result.returncode != 0:
            return False, None
        line = next((ln for ln in result.stdout.splitlines() if ln.startswith("notice ")), "notice -")
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

    def known_keys(self) -> dict[str, str]:
        """alias -> "type base64" from the cluster's known_hosts on the master."""
        found = {}
        try:
            text = _home_path(self.paths.known_hosts[2:]).read_text()
        except OSError:
            return found
        for line in text.splitlines():
            parts = line.split()
            if len(parts) >= 3:
                found[parts[0].split(",")[0]] = f"{parts[1]} {parts[2]}"
        return found

    def write_hosts(self, nodes: list[Node], keys: dict[str, str]) -> None:
        """The master's known_hosts, ssh config block and hostfile for `nodes` (as distribution writes them)."""
        ssh = Path.home() / ".ssh"
        _write_atomically(_home_path(self.paths.known_hosts[2:]), known_hosts_text(nodes, keys))
        config = ssh / "config"
        existing = config.read_text() if config.exists() else ""
        block = ssh_config_block(self.inventory.name, nodes, self.inventory.user, self.paths)
        _write_atomically(config, replace_managed_block(existing, block, self.inventory.name))
        _write_atomically(_home_path(self.paths.hostfile[2:]), hostfile_text(nodes), 0o644)

    def admit(self, member: Member, key: str) -> str | None:
        """A verified replacement: its key and address on the master, then its software checked."""
        keys = self.known_keys()
        keys[member.name] = key
        nodes = [replace(n, address=member.address, private_address=member.address, instance_id=member.instance_id)
                 if n.name == member.name else n for n in self.inventory.nodes]
        self.inventory = replace(self.inventory, nodes=tuple(nodes))
        self.write_hosts(nodes, keys)
        marker = f"{venv_dir(get_profile(self.inventory.profile))}/{PROJECT_MARKER}"
        mine = self.shell.run(self.shell.master, f"cat {shlex.quote(marker)}").stdout.strip()
        theirs = self.shell.run(member.name, f"cat {shlex.quote(marker)}", timeout=60)
        if theirs.returncode != 0:
            return f"no xeon-cluster in its venv ({(theirs.stderr or theirs.stdout).strip()[-200:]})"
        if theirs.stdout.strip() != mine:
            return f"its venv holds xeon-cluster {theirs.stdout.strip()!r}, the master {mine!r}"
        return None


@dataclass
class Batch:
    plan: rc.BatchPlan
    describe_line: str


class Job:
    """The run's jobs on the master: each plan as `fab train` makes it, with --resume after a recovery."""

    def __init__(self, spec: dict, shell_: Shell, nodes: Nodes, run_dir: Path):
        self.spec, self.shell, self.nodes, self.run_dir = spec, shell_, nodes, run_dir
        self.plans: dict[str, JobPlan] = {}
        self.reference: dict | None = None
        self.started = 0.0  # when the newest job was launched
        self.program, self.resume_words = user_program(spec)

    def _user_plan(self, inventory: Inventory, *, resume: bool) -> JobPlan:
        """The user's program (--script/--module); after a recovery with the newest checkpoint in its
        arguments (--resume-arg) and environment (cluster/run/supervision.py's restart_arguments)."""
        checkpoint = self.newest_checkpoint_path() if resume else None
        args, env = sv.restart_arguments(self.program.args, self.resume_words, checkpoint)
        layout = dict(self.spec.get("layout", {}))
        layout["extra_env"] = {**(layout.get("extra_env") or {}), **env}
        return plan_job(inventory, nodes=len(inventory.nodes), training_args=(), job_id=new_job_id(),
                        output_dir=self.output_dir, prepare=[f"mkdir -p {shlex.quote(self.output_dir)}"],
                        user=replace(self.program, args=args), **layout)

    def _copy_workdir(self, node: str, plan: JobPlan) -> str:
        """On the master: the run's workdir (pushed by `fab train` into the run's first job directory)
        copied into this job's, on the master itself or through `ssh` on a worker."""
        src, dst = shlex.quote(workdir_on_node(self.spec["run_id"])), shlex.quote(workdir_on_node(plan.job_id))
        if node == self.shell.master:
            return f"cd && mkdir -p {dst} && cp -a {src}/. {dst}/"
        remote = shlex.quote(f"cd && mkdir -p {dst} && tar -xf - -C {dst}")
        return f"cd && tar -C {src} -cf - . | ssh -o BatchMode=yes {shlex.quote(node)} {remote}"

    @property
    def output_dir(self) -> str:
        return self.spec["output_dir"]

    def launch(self, members: list[Member], *, resume: bool, batch: rc.BatchPlan | None) -> str:
        by_name = {n.name: n for n in self.nodes.inventory.nodes}
        chosen = [replace(by_name[m.name], rank=i, address=m.address, private_address=m.address,
                          instance_id=m.instance_id) for i, m in enumerate(members)]
        inventory = replace(self.nodes.inventory, nodes=tuple(chosen))
        if self.program is not None:
            plan = self._user_plan(inventory, resume=resume)
        else:
            args = list(self.spec["training_args"])
            if resume and "--resume" not in args:
                args.append("--resume")
            plan = plan_job(inventory, nodes=len(chosen), training_args=rc.with_batch(args, batch),
                            job_id=new_job_id(), output_dir=self.output_dir, prepare=self.spec.get("prepare") or (),
                            **self.spec.get("layout", {}))
        self.nodes.write_hosts(chosen, self.nodes.known_keys())
        d = job_dir(plan.job_id)
        steps = " && ".join(f"( {s} )" for s in [f"mkdir -p {shlex.quote(d)}/ranks", *plan.prepare])
        with ThreadPoolExecutor(max_workers=max(1, len(chosen))) as pool:
            results = list(pool.map(lambda n: self.shell.run(n.name, steps, timeout=900), chosen))
            if self.program is not None:  # the run's workdir, from the master, into this job's (a replacement too)
                copies = list(pool.map(lambda n: self.shell.run(self.shell.master, self._copy_workdir(n.name, plan),
                                                                timeout=900), chosen))
                results = [r if r.returncode else c for r, c in zip(results, copies)]
        failed = [f"{n.name}: {(r.stderr or r.stdout).strip()[-300:]}" for n, r in zip(chosen, results)
                  if r.returncode != 0]
        if failed:
            raise RuntimeError(f"preparing the nodes failed: {'; '.join(failed)}")
        for name, text in job_files(plan, supervised_run=self.spec["run_id"]).items():  # as fab's start writes them
            (Path.home() / d / name).write_text(text)
        started = self.shell.run(self.shell.master, start_command(plan))
        if started.returncode != 0 or not started.stdout.strip().isdigit():
            raise RuntimeError(f"the job script did not start: {(started.stdout + started.stderr).strip()}")
        self.plans[plan.job_id] = plan
        self.started = time.time()
        return plan.job_id

    def outcome(self, job_id: str):
        """None while the job runs, "stopped" after `fab stop`, else its exit code (a rank's own where the
        launcher returned another)."""
        state, _, detail = self.shell.run(self.shell.master, _sh(STATE_SH, job_id)).stdout.strip().partition(" ")
        if state == "running":
            return None
        if state == "stopped":
            return "stopped"
        code = int(detail) if state == "exited" and detail.strip().lstrip("-").isdigit() else 1
        plan = self.plans.get(job_id)
        if code and plan is not None:
            log = (Path.home() / job_dir(job_id) / "log")
            first = first_failure(log.read_text(errors="replace") if log.exists() else "", list(plan.launch.rank_hosts))
            if first is not None and first.code is not None:
                code = first.code
        return code

    def stop(self, job_id: str) -> None:
        self.shell.run(self.shell.master, _sh(STOP_MASTER_SH, job_id), timeout=60)
        plan = self.plans.get(job_id)
        for node in (plan.inventory.nodes if plan else ()):
            self.shell.run(node.name, _sh(STOP_NODE_SH, job_id, 5), timeout=40)

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
        if self.program is not None:
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
        ranks = node_count * max(1, int(ref["world_size"]) // max(1, len(self.spec["inventory"]["hosts"])))
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

    def keep_for_controller(self) -> str:
        """What survives the master, said when its notice ends the run (`fab train --managed` wrote the run's
        spec at the hand-off: cluster/run/runspec.py)."""
        from cluster.run import runspec
        from cluster.job.job_args import job_setting

        uri = job_setting(self.spec["training_args"], "--checkpoint_uri") or ""
        if uri.startswith("s3://"):
            return f"The run's spec is in {runspec.spec_uri(uri)} and its checkpoints under {uri}."
        if self.nodes.inventory.on_shared_disk(self.output_dir):  # the local cluster's output root
            return (f"The output directory {self.output_dir} is on the disk every node shares, with the run's spec "
                    f"in {runspec.spec_path(self.output_dir)}.")
        return (f"The checkpoints were only on the master's disk ({self.output_dir}, no --checkpoint-uri): "
                "they go with it.")


def user_program(spec: dict) -> tuple[UserProgram | None, tuple[str, ...]]:
    """The spec's own program (`fab train --managed --script/--module`) and its --resume-arg words, checked."""
    found = spec.get("program")
    if not found:
        return None, ()
    script, module = found.get("script"), found.get("module")
    if script is not None and (not isinstance(script, str) or script.startswith("/") or ".." in script.split("/")
                               or any(c in script for c in "\t\n\r")):
        raise sv.SupervisionError(f"program script: {script!r} is not allowed; allowed: a path inside the workdir")
    if script is None:
        check_module(str(module))
    args = tuple(str(a) for a in found.get("args") or ())
    words = sv.resume_words(spec["resume_arg"]) if spec.get("resume_arg") else ()
    return UserProgram(script, module, args, notice_signal(found.get("signal") or "none")), words


# ---------------------------------------------------------------- entry point


def build(run_dir: Path) -> Supervisor:
    """The supervisor of the run whose spec is in `run_dir` (every value checked as it enters)."""
    spec = json.loads((run_dir / sv.SPEC_FILE).read_text())
    run_id = sv.check_run_id(spec.get("run_id"))
    inventory = Inventory.from_mapping(spec["inventory"], default_name=spec["inventory"]["name"],
                                       kind=spec.get("kind", "file"))
    ids = dict(spec.get("instance_ids") or {})
    members = [Member(n.name, n.private_address, str(ids.get(n.name) or f"i-{'0' * 8}{i:08x}"))
               for i, n in enumerate(inventory.nodes)]
    # the cluster's group (local: its keeper's record, which has the instance ids a local inventory lacks)
    group, members = backend_for(inventory.kind).machine_group(spec, members)
    opts = rc.ManagedOptions(int(spec["max_recoveries"]), int(spec["min_nodes"]), float(spec["wait_seconds"]),
                             len(members))
    python = f"{venv_dir(get_profile(inventory.profile))}/bin/python"
    shell_ = Shell(inventory.master.name)
    nodes = Nodes(shell_, inventory, python)
    files = RunFiles(run_dir, spec["output_dir"], run_id)
    loop_spec = LoopSpec(run_id, members, opts, float(spec.get("poll_seconds", 5)), bool(spec.get("resume")))
    return Supervisor(loop_spec, group, nodes, Job(spec, shell_, nodes, run_dir), files)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "run":
        print("usage: python -m node_setup.supervisor run RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(argv[1]).expanduser()
    supervisor = build(run_dir)
    try:
        status = supervisor.run()
    except Exception as exc:  # noqa: BLE001 - the state file says why the run ended, for fab status
        supervisor.store.say(f"the supervisor failed: {type(exc).__name__}: {exc}")
        supervisor._state(sv.FAILED, f"the supervisor failed: {exc}")
        return 1
    return 0 if status == sv.COMPLETED else 1
