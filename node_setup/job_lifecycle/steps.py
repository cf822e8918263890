"""The steps of one job, in order, the same wherever they run from (node_setup/job_lifecycle/__init__.py).

`Lifecycle(transport, say)`:

    launch(plan, request, expected_version=...)   prepare, upload, hosts, start; the job script's pid
    prepare(plan, refuse_busy=..., expected_version=...)   every node: the version its venv holds (a
                        warning line when it is not `expected_version`), with `refuse_busy` first the
                        launch claimed on the master (`claim`: of two launches at once one goes on, the
                        start or `release` gives it up), then another job still running there (the
                        launch stops, this job's directory removed), the job's directory, the offline
                        demo's data
    upload(plan, data_files)   data files of this machine, your workdir, your requirements
    hosts(plan)         ssh config, known_hosts and hostfile on the master for the plan's nodes
    start(plan, request, **metadata)   the job's files on the master, its script started detached, and
                        the request's idle auto-stop armed (unless armed or cancelled there)
    outcome(plan)       None while it runs, else cluster/job/jobreport.py's Outcome (the one rule)
    stop(plan, grace)   the job script on the master, then every node's ranks

A step that cannot go on raises LifecycleError with `reason` UNREACHABLE (a node could not be reached or
prepared), BUSY (another job runs on a chosen node) or FAILED (something on a node failed), and the
answers of every node.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Callable, Generic, Mapping, Sequence, TypeVar

from cluster.inventory import Inventory
from cluster.job import jobcommands as jc
from cluster.job import jobreport
from cluster.job.jobplan import JobPlan
from cluster.job.launch import job_dir
from cluster.job.request import DataFile, RunRequest
from cluster.node import autostop
from cluster.node.render import MasterPaths, hostfile_text, known_hosts_text, replace_managed_block, ssh_config_block
from node_setup.job_lifecycle.transport import Answer, Transport

UNREACHABLE, BUSY, FAILED = "unreachable", "busy", "failed"
PREPARE_TIMEOUT_S = 900  # the offline demo's data is written on every node in this step
STOP_GRACE_S = 10


class LifecycleError(RuntimeError):
    """A step that could not go on; the message says what and what to do."""

    def __init__(self, message: str, reason: str, answers: Sequence[Answer] = ()):
        super().__init__(message)
        self.reason = reason
        self.answers = list(answers)


def table(answers: Sequence[Answer]) -> str:
    """Per-node results as indented lines: name, ok/FAILED, the last lines of the output."""
    width = max([len(a.node) for a in answers] + [4])
    lines = []
    for a in answers:
        detail = a.out.strip().splitlines() or ["done" if a.ok else f"exit {a.code}"]
        lines.append(f"  {a.node:<{width}}  {'ok    ' if a.ok else 'FAILED'}  {detail[-1]}")
        if not a.ok and len(detail) > 1:
            lines += [f"  {'':<{width}}          {d}" for d in detail[-4:-1]]
    return "\n".join(lines)


def _failed(answers: Sequence[Answer], what: str, reason: str) -> None:
    failed = [a.node for a in answers if not a.ok]
    if failed:
        names = ", ".join(failed)
        raise LifecycleError(f"cannot launch: {what} failed on {names} (reason above); the other nodes are fine. "
                             f"Fix or replace {names}, or use fewer nodes (--nodes), then rerun", reason, answers)


T = TypeVar("T", bound=Transport)


@dataclass
class Lifecycle(Generic[T]):
    transport: T  # fab's FabricTransport, the supervisor's ShellTransport (each side reads its own further)
    say: Callable[[str], None] = print

    def nodes(self, plan: JobPlan) -> list[str]:
        return [n.name for n in plan.inventory.nodes]

    # ------------------------------------------------------------------ before the start

    def launch(self, plan: JobPlan, request: RunRequest, *, expected_version: str | None,
               **metadata: object) -> int:
        self.prepare(plan, refuse_busy=not request.allow_busy, expected_version=expected_version)
        try:
            self.upload(plan, request.data_files)
            self.hosts(plan)
            return self.start(plan, request, **metadata)
        except BaseException:
            self.release(plan)
            raise

    def claim(self, plan: JobPlan) -> None:
        """The cluster's next launch claimed for this job on the master (cluster/shell/job-claim.sh), so that
        of two launches at once exactly one passes the busy check and starts; the start releases it.
        LifecycleError BUSY when another launch holds it."""
        answers = self.transport.run([self.transport.master], jc.claim_command(plan.job_id), timeout=90)
        busy = jc.busy_jobs((a.node, a.out) for a in answers)
        if busy:
            raise LifecycleError(jc.busy_line(busy), BUSY, answers)
        _failed(answers, "claiming the launch on the master", UNREACHABLE)

    def release(self, plan: JobPlan) -> None:
        """This job's launch claim given up (a launch that stops before its start); never raises."""
        try:
            self.transport.run([self.transport.master], jc.release_command(plan.job_id), timeout=30)
        except Exception:  # noqa: BLE001 - an unreleased claim expires (CLAIM_TTL_S) or goes with the start
            pass

    def prepare(self, plan: JobPlan, *, refuse_busy: bool, expected_version: str | None) -> list[Answer]:
        """Every node prepared; with `refuse_busy` the launch claimed first (`claim`), and given up again when
        this step stops."""
        self.say(f"preparing {len(plan.inventory.nodes)} node(s): job directory"
                 + (", synthetic model and data" if plan.prepare and plan.user is None else "") + " ...")
        if refuse_busy:
            self.claim(plan)
        try:
            answers = self.transport.run(self.nodes(plan), jc.prepare_command(plan, refuse_busy=refuse_busy),
                                         timeout=PREPARE_TIMEOUT_S)
            busy = jc.busy_jobs((a.node, a.out) for a in answers)
            if busy:
                self.transport.run(self.nodes(plan), f"cd && rm -rf {shlex.quote(job_dir(plan.job_id))}", timeout=30)
                raise LifecycleError(jc.busy_line(busy), BUSY, answers)
            if expected_version is not None:
                warning = jobreport.software_warning({a.node: jc.installed_version(a.out) for a in answers if a.ok},
                                                     expected_version)
                if warning:
                    self.say(warning)
            _failed(answers, "preparing the node", UNREACHABLE)
        except BaseException:
            if refuse_busy:
                self.release(plan)
            raise
        return answers

    def upload(self, plan: JobPlan, data_files: Sequence[DataFile] = ()) -> None:
        if data_files:
            self.say(f"copying {len(data_files)} data file(s) to {len(plan.inventory.nodes)} node(s) ...")
            folders = sorted({os.path.dirname(f.node) for f in data_files})
            answers = self.transport.run(self.nodes(plan), "cd && mkdir -p " + " ".join(map(shlex.quote, folders)))
            _failed(answers, "copying the data files", UNREACHABLE)
            for data in data_files:
                with open(data.local, "rb") as local:
                    body = local.read()
                for node in self.nodes(plan):
                    self.transport.put(node, data.node, body)
        if plan.user is not None:
            files = f" ({len(plan.copy.files)} file(s))" if plan.copy is not None else ""
            self.say(f"copying the workdir to {len(plan.inventory.nodes)} node(s){files} ...")
            answers = self.transport.copy_workdir(plan)
            self.say(table(answers))
            _failed(answers, "the workdir's copy", UNREACHABLE)
        if plan.install is not None:
            self.say(f"installing {len(plan.install.requirements)} requirement(s) on {len(plan.inventory.nodes)} "
                     "node(s) ...")
            answers = self.transport.install_requirements(plan)
            self.say(table(answers))
            _failed(answers, "installing the requirements", FAILED)

    def hosts(self, plan: JobPlan) -> None:
        """The master's ssh files for the plan's nodes (the transport's trusted host keys), as `fab distribute`
        writes them; nothing to write when trusting wrote them (fab's distribution)."""
        keys = self.transport.trust(plan.inventory)
        if keys is not None:
            self.write_hosts(plan.inventory, keys)

    def write_hosts(self, inv: Inventory, keys: Mapping[str, str]) -> None:
        """known_hosts, the ssh config's managed block and the hostfile on the master for `inv`'s nodes."""
        paths, master = MasterPaths(inv.name), self.transport.master
        found = self.transport.run([master], f"cat {paths.ssh_config.replace('~/', '')} 2>/dev/null; true")[0]
        config = replace_managed_block(found.out if found.ok else "", ssh_config_block(inv.name, inv.nodes, inv.user),
                                       inv.name)
        self.transport.run([master], "cd && mkdir -p .ssh && chmod 700 .ssh")
        for path, text, mode in ((paths.known_hosts, known_hosts_text(inv.nodes, keys), 0o600),
                                 (paths.ssh_config, config, 0o600), (paths.hostfile, hostfile_text(inv.nodes), 0o644)):
            self.transport.put(master, path.replace("~/", ""), text.encode(), mode=mode)

    # ------------------------------------------------------------------ the start, the end

    def start(self, plan: JobPlan, request: RunRequest, **metadata: object) -> int:
        master, d = self.transport.master, job_dir(plan.job_id)
        for name, text in jc.job_files(plan, **metadata).items():
            self.transport.put(master, f"{d}/{name}", text.encode(), mode=jc.file_mode(name))
        started = self.transport.run([master], jc.start_command(plan))[0]
        pid = started.out.strip()
        if not started.ok or not pid.isdigit():
            raise LifecycleError(f"the job script did not start on the master {plan.inventory.master.name}: "
                                 f"{pid or 'no pid written'}; look at ~/{d}/log there", FAILED, [started])
        if request.idle_stop_s:
            self.arm_idle_stop(request.idle_stop_s)
        return int(pid)

    def arm_idle_stop(self, idle_s: int) -> None:
        """The idle auto-stop armed on the master unless it is armed or was cancelled there; never in the
        way of the job that just started (a problem is one warning line)."""
        guarded = (f"if [ -x {shlex.quote(autostop.SERVICE_PATH)} ]; then {autostop.arm_default_command(idle_s)}; "
                   "else echo installed=no; fi")
        answer = self.transport.run([self.transport.master], guarded, timeout=60)[0]
        if not answer.ok:
            self.say(f"warning: idle auto-stop not armed: {answer.out.strip()[-200:] or f'exit {answer.code}'}")

    def outcome(self, plan: JobPlan) -> jobreport.Outcome | None:
        master, d = self.transport.master, job_dir(plan.job_id)
        state = self.transport.run([master], jc.sh_command(jc.STATE_SH, plan.job_id), timeout=60)[0]
        if not state.ok:
            return None  # the master did not answer: not an end
        line = state.out.strip() or "lost"
        if line.startswith(jobreport.EXITED) and line != f"{jobreport.EXITED} 0":
            log = self.transport.run([master], f"cat {shlex.quote(d)}/log 2>/dev/null; true", timeout=120)[0].out
        else:
            log = ""
        return jobreport.outcome(line, log, list(plan.launch.rank_hosts))

    def stop(self, plan: JobPlan, grace: int = STOP_GRACE_S) -> list[Answer]:
        """End the job everywhere: the job script's session on the master, then every node's ranks; an answer
        per node (the master's job script first) that is ok when nothing of the job is left there."""
        script = self.transport.run([self.transport.master], jc.sh_command(jc.STOP_MASTER_SH, plan.job_id),
                                    timeout=60)[0]
        first = Answer("job script", 0 if script.code in (0, 3) else script.code, script.out)
        return [first, *self.transport.run(self.nodes(plan), jc.sh_command(jc.STOP_NODE_SH, plan.job_id, grace),
                                           timeout=grace + 30)]
