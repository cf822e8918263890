"""The supervisor's loop: launch, watch, and on a lost worker await its replacement and resume.

The order (every decision is cluster/run/supervision.py's or cluster/run/recovery.py's):

1. launch the job on the run's nodes (`job.launch`), then watch it every `poll_s`: its end, a stop
   request (`fab stop`), the master's own spot notice, each worker's notice and SSH answer; a
   worker silent for SILENT_PROBES probes is lost once its instance's state says it is gone;
2. a lost worker: the job is let end (a notice: it checkpoints and exits 75), else stopped; the
   master's own notice is recorded as MASTER_LEAVING (not final) and this supervisor ends: a new master's
   boot step (node_setup/supervisor/boot.py) starts the run's supervisor there, which takes the run over
   (`LoopSpec.takeover`: each worker's host key verified from its console, the hosts written, a recovery
   recorded, the job resumed from the newest checkpoint);
3. replacements awaited up to --wait-for-capacity: a member of the group in the lost node's slot,
   another instance, whose presented host key its console lists (a wait while it presents none or
   the console lists none yet, for as long as its type boots and the recovery waits; a refusal for
   none by then or another key), then admitted (known_hosts, the software check, the job's
   preparation). A replacement refused or not admitted is handed back to the group (`hand_back`:
   terminated through it, so that it launches another, not left billing idle), one line saying why;
4. relaunched with --resume from the newest checkpoint every rank can read, on the full set, or on
   at least --min-nodes survivors with the global batch kept; a replacement that arrives later
   joins at the next checkpoint (the job is stopped after it and relaunched on the full set);
5. every recovery recorded (summary.json's "recoveries" at the end): cause, step, seconds lost,
   steps redone, seconds waiting, the host keys verified.

Every step is in the run's state file before it is taken (the nodes and the machines in their slots, the
job watched, a launch or a recovery under way), so a supervisor whose process ended (killed, or its
machine's OOM killer) and was started again (systemd's Restart= on AWS, node_setup/supervisor/respawn.py
on a local cluster) carries on from it (`LoopSpec.previous`): it adopts the job it watched while that job
runs, and finishes the launch or the recovery it was in the middle of, without a second record.

The collaborators are passed in, so the tests drive this loop in-process with a fake backend
(tests/unit/test_supervisor.py): `backend` (cluster/backend.py's MachineGroup, the kind's from
node_setup/backends/: members, instance state, console, hand back), `nodes` (probe, host key, admit), `job`
(launch, outcome, stop, checkpoint, summary, finish) and `store` (the run's files: log lines, state,
records, stop request).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

from cluster import exit_codes
from cluster.run import recovery as rc
from cluster.run import supervision as sv
from cluster.backend import MachineGroup
from cluster.run.runlog import started_line
from cluster.run.supervision import Member
from cluster.job.request import Managed

NOT_RECOVERED = (exit_codes.BAD_INPUT, exit_codes.CTRL_C)  # the user's ends, not the cluster's
JOB_END_GRACE_S = 180.0  # after a worker's notice: how long the job may take to checkpoint and end
ENDED_BY_SUPERVISOR = 137  # the record's exit code when the supervisor stopped a job that hung (SIGKILL's)
CONFIRM_S = 120.0  # after a job's end: how long a silent worker's loss may wait for its instance's state


@dataclass
class LoopSpec:
    run_id: str
    wanted: list[Member]  # the run's nodes at the start, master first: what recoveries restore
    managed: Managed  # --max-recoveries, --min-nodes, --wait-for-capacity
    poll_s: float = 5.0
    resume: bool = False  # the first launch continues a run (`fab train --managed --resume`)
    previous: dict | None = None  # the state file this run's supervisor left when its process ended (a restart)
    # on a new master: the run's state its lost master mirrored beside the spec (checked: data, not commands)
    takeover: dict | None = None


@dataclass
class Batch:
    plan: rc.BatchPlan
    describe_line: str


class Nodes(Protocol):
    """The run's nodes as the loop asks them (node_setup/supervisor/onmaster.py's Nodes)."""
    def probe(self, member: Member) -> tuple[bool, str | None]: ...
    def host_key(self, member: Member) -> str | None: ...
    def admit(self, member: Member, key: str) -> str | None: ...
    def take_over(self, master: Member, keys: dict[str, str]) -> None: ...


class Job(Protocol):
    """The run's jobs on the master (node_setup/supervisor/onmaster.py's Job)."""
    def new_id(self) -> str: ...
    def launch(self, members: list[Member], *, resume: bool, batch: rc.BatchPlan | None) -> str: ...
    def adopt(self, job_id: str, members: list[Member], *, resume: bool, launched_at: float) -> None: ...
    def outcome(self, job_id: str) -> int | str | None: ...
    def stop(self, job_id: str) -> None: ...
    def newest_checkpoint(self) -> tuple[int | None, float | None]: ...
    def summary(self) -> dict | None: ...
    def batch_for(self, node_count: int) -> Batch | None: ...
    def finish(self, records: list[dict]) -> None: ...
    def keep_for_controller(self) -> str: ...
    def restore_workdir(self, workers: list[str]) -> str | None: ...


class Store(Protocol):
    """The run's files (node_setup/supervisor/onmaster.py's RunFiles)."""
    def say(self, line: str) -> None: ...
    def state(self, *, status: str, job_id: str | None, nodes: list[str], recoveries: list[dict], line: str = "",
              pending: list[str], restart: dict | None, replaced: list[dict]) -> None: ...
    def stop_requested(self) -> bool: ...
    def records(self) -> list[dict]: ...
    def save_records(self, records: list[dict]) -> None: ...


@dataclass
class _Lost:
    name: str
    instance_id: str
    cause: str


@dataclass
class Supervisor:
    spec: LoopSpec
    backend: MachineGroup  # the cluster's kind's (node_setup/backends/): its members, instance states, consoles
    nodes: Nodes
    job: Job
    store: Store
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    members: dict[str, Member] = field(default_factory=dict)
    current: list[str] = field(default_factory=list)
    pending: dict[str, str] = field(default_factory=dict)  # slot -> the lost instance id
    refused: set[str] = field(default_factory=set)  # instance ids refused and handed back to the group
    first_seen: dict[str, float] = field(default_factory=dict)  # instance id -> when first seen
    awaited: set[str] = field(default_factory=set)  # instance ids said to be awaited (their boot)
    verified: dict[str, str] = field(default_factory=dict)  # slot -> the verified key line, this recovery
    admitted: dict[str, Member] = field(default_factory=dict)  # replacements ready to join
    records: list[dict] = field(default_factory=list)
    job_id: str | None = None
    resumed_step: int | None = None
    job_resume: bool = False  # whether the watched job was launched with --resume
    launched_at: float = 0.0  # when it was
    launching: dict | None = None  # a launch under way: {"job", "resume"}
    recovering: dict | None = None  # a recovery under way: {"lost", "code", "ended", "number"} (or "grow")
    replaced: list[dict] = field(default_factory=list)  # the run's master replacements (supervision.replaced_entry)

    @property
    def master(self) -> str:
        return self.spec.wanted[0].name

    @property
    def watched(self) -> str:
        """The job watched: every launch and adoption sets it before the loop watches."""
        assert self.job_id is not None
        return self.job_id

    def say(self, line: str) -> None:
        self.store.say(line)

    def _state(self, status: str, line: str = "") -> None:
        self.store.state(status=status, job_id=self.job_id, nodes=list(self.current), recoveries=self.records,
                         line=line, pending=sorted(self.pending), restart=self._restart_facts(),
                         replaced=self.replaced)

    def _restart_facts(self) -> dict:
        """What a restarted supervisor needs beyond the state's nodes and job (`_carry_on` reads it back)."""
        return {"members": {n: [m.address, m.instance_id, m.instance_type] for n, m in self.members.items()},
                "pending": dict(self.pending), "resumed_step": self.resumed_step, "job_resume": self.job_resume,
                "launched_at": self.launched_at, "reference": getattr(self.job, "reference", None),
                "launching": self.launching, "recovering": self.recovering}

    # ------------------------------------------------------------ the run

    def run(self) -> str:
        self.members = {m.name: m for m in self.spec.wanted}
        self.current = [m.name for m in self.spec.wanted]
        self.records = list(self.store.records())
        if self.spec.previous is not None:
            event = self._carry_on(self.spec.previous)
        elif self.spec.takeover is not None:
            outcome = self._take_over(self.spec.takeover)
            if outcome:
                return outcome
            event = None
        else:
            self.say("the master supervises the run and recovers " + self.spec.managed.describe(len(self.spec.wanted)))
            self._launch(resume=self.spec.resume, batch=None)
            event = None
        while True:
            (kind, *args), event, ended = (event or self._watch()), None, None
            if kind == "final":
                return args[0]
            if kind == "stop":
                return self._final(sv.STOPPED, f"job {self.job_id} was stopped (fab stop)")
            if kind == "master":
                return self._master_lost(args[0])
            if kind == "grow":
                self._grow()
                continue
            if kind == "ended":
                code = args[0]
                if code == 0:
                    return self._final(sv.COMPLETED, f"job {self.job_id} finished: exit code 0")
                if code in NOT_RECOVERED:
                    return self._final(sv.FAILED, f"job {self.job_id} ended with exit code {code}: not recovered")
                lost = self._losses_after_end()
                if lost is None:
                    return self._master_lost("the master's own notice")
                if not lost and code != exit_codes.INTERRUPTED:
                    return self._final(sv.FAILED, f"job {self.job_id} failed (exit code {code}) and every node "
                                                  "answers: not an interruption, no recovery")
            elif kind == "lost":  # while the job runs
                lost, code = args[0], self._end_job(args[0])
            else:  # "recover": the recovery a restarted supervisor found under way
                lost, code, ended = args
            outcome = self._recover(lost, code, ended)
            if outcome:
                return outcome

    def _launch(self, *, resume: bool, batch) -> None:
        job_id = self.job.new_id()  # in the state before the launch starts: a restart finds what it started
        self.launching = {"job": job_id, "resume": resume}
        self._state(sv.STARTING if self.job_id is None else sv.RECOVERING, f"starting job {job_id}")
        self._started(self.job.launch([self.members[n] for n in self.current], resume=resume, batch=batch), resume)

    def _started(self, job_id: str, resume: bool) -> None:
        self.job_id, self.job_resume, self.launched_at = job_id, resume, self.clock()
        self.launching = self.recovering = None
        self._state(sv.RUNNING)
        self.say(started_line(self.job_id, self.current))  # `fab logs` follows the run by this line

    # ------------------------------------------------------------ a restarted supervisor

    def _carry_on(self, previous: dict):
        """The first event of a supervisor started again after its process ended, from the state file it
        left: ("final", status) when the run had ended, a recovery under way, else None (watch the job)."""
        status, facts = previous.get("status"), previous.get("restart") or {}
        if status in sv.FINAL:
            return ("final", status)
        self._restore(previous, facts)
        self.say(f"the supervisor restarted after its process (pid {previous.get('pid')}) ended; carrying on from "
                 f"its state file: {status}, job {self.job_id or '-'}, {len(self.records)} recovery(ies)")
        launching, recovering = facts.get("launching"), facts.get("recovering")
        chosen = [self.members[n] for n in self.current]
        if launching:  # the launch was cut short, or done without its record: watch it if it runs, else again
            job_id, resume = str(launching["job"]), bool(launching["resume"])
            self.job.adopt(job_id, chosen, resume=resume, launched_at=self.clock())
            if self.job.outcome(job_id) is None:
                self._started(job_id, resume)
                return None
            self.job.stop(job_id)  # what a launch cut short left on the nodes
            self._launch(resume=resume, batch=self._batch())
            return None
        if self.job_id is not None:
            self.job.adopt(self.job_id, chosen, resume=self.job_resume, launched_at=self.launched_at)
        if recovering and recovering.get("takeover") and len(self.records) < int(recovering["number"]):
            outcome = self._take_over(recovering["takeover"])  # cut short before its record: taken over again
            return ("final", outcome) if outcome else None
        if recovering and len(self.records) < int(recovering["number"]) and not recovering.get("grow"):
            return ("recover", [_Lost(*x) for x in recovering["lost"]], recovering["code"], recovering["ended"])
        if recovering:  # recorded, or a grow cut short: the job is stopped (again) and launched on the nodes now
            if self.job_id is not None:
                self.job.stop(self.job_id)
            self._launch(resume=True, batch=self._batch())
            return None
        self._state(sv.RUNNING)
        return None

    def _restore(self, previous: dict, facts: dict) -> None:
        """The run's nodes, machines, awaited slots and watched job as the state file recorded them."""
        for name, (address, instance_id, instance_type) in (facts.get("members") or {}).items():
            if name in self.members:
                self.members[name] = Member(name, str(address), str(instance_id), instance_type=str(instance_type))
        self.current = [n for n in previous.get("nodes") or [] if n in self.members] or self.current
        self.pending = {str(k): str(v) for k, v in (facts.get("pending") or {}).items()}
        self.resumed_step = facts.get("resumed_step")
        self.job_resume, self.launched_at = bool(facts.get("job_resume")), float(facts.get("launched_at") or 0)
        self.job_id = previous.get("job")
        self.replaced = list(previous.get("replaced") or [])
        if facts.get("reference") and hasattr(self.job, "reference"):
            self.job.reference = facts["reference"]

    def _batch(self):
        batch = self.job.batch_for(len(self.current))
        return batch.plan if batch else None

    # ------------------------------------------------------------ watching

    def _watch(self):
        silent: dict[str, int] = {}
        notices: dict[str, str] = {}
        unanswered: set[str] = set()  # silent workers whose instance still runs: said once, watched
        while True:
            if self.store.stop_requested():
                self.job.stop(self.job_id)
                return ("stop",)
            outcome = self.job.outcome(self.job_id)
            if outcome == "stopped":
                return ("stop",)
            if outcome is not None:
                return ("ended", outcome)
            answered, notice = self.nodes.probe(self.members[self.master])
            if notice:
                return ("master", notice)
            lost = []
            for name in self.current[1:]:
                member = self.members[name]
                answered, notice = self.nodes.probe(member)
                silent[name] = 0 if answered else silent.get(name, 0) + 1
                if notice:
                    notices[name] = notice
                state = self.backend.instance_state(member) if silent[name] >= sv.SILENT_PROBES else None
                cause = sv.loss_cause(notice=notices.get(name), silent_probes=silent[name], instance_state=state)
                if cause:
                    lost.append(_Lost(name, member.instance_id, cause))
                elif state is not None and name not in unanswered:
                    unanswered.add(name)
                    self.say(f"{name}: no SSH answer for {silent[name]} probes, but its instance is {state}: not "
                             "lost (a network partition?); the job goes on")
                elif answered and name in unanswered:
                    unanswered.discard(name)
                    self.say(f"{name} answers again")
            if lost:
                return ("lost", lost)
            if self.pending and self._replacements_ready(block=False) and self._checkpoint_after_resume():
                return ("grow",)
            self.sleep(self.spec.poll_s)

    def _losses_after_end(self) -> list[_Lost] | None:
        """After the job's end: the lost workers (None: the master itself has a notice)."""
        answered, notice = self.nodes.probe(self.members[self.master])
        if notice:
            return None
        silent: dict[str, int] = {}
        deadline = self.clock() + CONFIRM_S
        while True:
            lost, unsure = [], []
            for name in self.current[1:]:
                member = self.members[name]
                answered, notice = self.nodes.probe(member)
                silent[name] = 0 if answered else silent.get(name, 0) + 1
                state = self.backend.instance_state(member) if silent[name] >= sv.SILENT_PROBES else None
                cause = sv.loss_cause(notice=notice, silent_probes=silent[name], instance_state=state)
                if cause:
                    lost.append(_Lost(name, member.instance_id, cause))
                elif silent[name]:
                    unsure.append(name)
            if not unsure:
                return lost
            if self.clock() >= deadline:
                self.say(f"{', '.join(unsure)}: no SSH answer for {CONFIRM_S:g} s while the instance still runs; "
                         "taken as lost")
                return lost + [_Lost(n, self.members[n].instance_id, sv.SILENT) for n in unsure]
            self.sleep(self.spec.poll_s)

    def _end_job(self, lost: list[_Lost]) -> int:
        """A worker was lost while the job runs: let it end (a notice: it checkpoints first), else stop it."""
        noticed = any(x.cause == sv.NOTICE for x in lost)
        deadline = self.clock() + (JOB_END_GRACE_S if noticed else 0)
        while True:
            outcome = self.job.outcome(self.watched)
            if isinstance(outcome, int):  # not None (running), not "stopped"
                return outcome
            if self.clock() >= deadline:
                self.job.stop(self.watched)
                return ENDED_BY_SUPERVISOR
            self.sleep(self.spec.poll_s)

    # ------------------------------------------------------------ recovering

    def _recover(self, lost: list[_Lost], code: int, ended: float | None = None) -> str | None:
        ended = self.clock() if ended is None else ended
        if len(self.records) >= self.spec.managed.max_recoveries:
            return self._final(sv.FAILED, f"--max-recoveries {self.spec.managed.max_recoveries} reached: not "
                                          "recovering again; `fab train --managed --resume` continues the run")
        names = [x.name for x in lost]
        # a job that ended 75 checkpointed at a notice: its lost nodes were reclaimed, even when they went
        # before a probe read their notice
        noticed = any(x.cause == sv.NOTICE for x in lost) or (code == exit_codes.INTERRUPTED and bool(lost))
        for x in lost:
            x.cause = sv.NOTICE if noticed else x.cause
        cause = sv.NOTICE if noticed else (sv.SILENT if lost else "interrupted")
        self.say(f"job {self.job_id} ended with exit code {code}; lost: "
                 + (", ".join(f"{x.name} ({x.cause})" for x in lost) or "none"))
        self.recovering = {"lost": [[x.name, x.instance_id, x.cause] for x in lost], "code": code, "ended": ended,
                           "number": len(self.records) + 1}
        self._state(sv.RECOVERING, f"lost {', '.join(names) or 'none'}")
        step, saved_at = self.job.newest_checkpoint()
        summary = self.job.summary()
        for x in lost:
            self.pending[x.name] = x.instance_id
            if x.name in self.current:  # a restart's recovery: already out
                self.current.remove(x.name)
        self.verified = {}
        if self.spec.managed.wait_s and self.pending and not self.backend.replaces_lost():
            self.say(f"no replacement can come for {', '.join(sorted(self.pending))} (nothing replaces a lost "
                     "machine of this cluster): going on with the survivors at once")
        elif self.spec.managed.wait_s and self.pending:
            self.say(f"awaiting replacement(s) for {', '.join(sorted(self.pending))} from the group (up to "
                     f"{self.spec.managed.wait_s:g} s)")
            self._replacements_ready(block=True, deadline=ended + self.spec.managed.wait_s)
        joined = self._join_admitted()
        decision = rc.next_step(len(self.spec.wanted), len(self.current), self.spec.managed.min_nodes)
        if decision == rc.TOO_FEW:
            return self._final(sv.FAILED, f"only {len(self.current)} node(s) left ({', '.join(self.current)}); "
                                          f"--min-nodes is {self.spec.managed.min_nodes}: stopping")
        batch = self.job.batch_for(len(self.current))
        stopped = ((summary or {}).get("interruption") or {}).get("step") or (summary or {}).get("steps")
        lost_s = rc.work_lost_seconds(stopped, step, ((summary or {}).get("step_time_seconds") or {}).get("mean"))
        if lost_s is None:
            lost_s = round(max(0.0, ended - (saved_at or ended)), 1)
        waited = self.clock() - ended
        record = rc.recovery_record(number=len(self.records) + 1, at=ended, cause=cause, step=step, exit_code=code,
                                    nodes_lost=names, nodes_after=list(self.current), seconds_lost=lost_s,
                                    seconds_waiting=waited, batch=batch.describe_line if batch else None)
        record["steps_redone"] = sv.steps_redone(stopped, step)
        record["host_keys"] = {n: self.verified[n] for n in joined if n in self.verified}
        self._state(sv.RECOVERING, f"resuming on {len(self.current)} node(s)")  # the nodes now, then the record
        self.records.append(record)
        self.store.save_records(self.records)
        self.say(f"recovery {record['number']}: lost {', '.join(names) or 'none'} at step {step}; resuming on "
                 f"{len(self.current)} node(s) ({', '.join(self.current)}) from checkpoint-{step}; {lost_s:g} s of "
                 f"work lost, {waited:.1f} s waiting"
                 + ("" if decision == rc.FULL else f"; survivors: {len(self.current)} of {len(self.spec.wanted)} "
                    f"node(s), awaiting {', '.join(sorted(self.pending))}"))
        if batch:
            self.say(batch.describe_line)
        self.resumed_step = step
        self._launch(resume=True, batch=batch.plan if batch else None)
        return None

    def _replacements_ready(self, *, block: bool, deadline: float = 0.0) -> bool:
        """Look for the pending slots' replacements, verify and admit them; True when every pending
        slot has one admitted. `block`: keep looking until then or `deadline`."""
        while True:
            members = self.backend.members() if self.pending else {}
            for name, old in sorted(self.pending.items()):
                if name in self.admitted:
                    continue
                found = sv.replacement(name, old, members)
                if found is None or found.instance_id in self.refused:
                    continue
                first = self.first_seen.setdefault(found.instance_id, self.clock())
                wait_s = sv.replacement_wait_s(found, recovery_left_s=deadline - first)
                verdict = sv.host_key_verdict(found, self.nodes.host_key(found), self.backend.console(found),
                                              waited_s=self.clock() - first, wait_s=wait_s)
                if verdict.outcome == "wait":
                    if found.instance_id not in self.awaited:
                        self.awaited.add(found.instance_id)
                        self.say(f"{verdict.line}: awaited up to {wait_s:g} s (its instance type's boot"
                                 + (", or the recovery's wait" if wait_s > sv.replacement_wait_s(found) else "")
                                 + ")")
                    continue
                if not verdict.verified:
                    self._hand_back(found, verdict.line)
                    continue
                self.say(verdict.line)
                problem = self.nodes.admit(found, verdict.key)
                if problem:
                    self._hand_back(found, f"{name} ({found.instance_id}): not ready ({problem})")
                    continue
                self.verified[name] = f"{verdict.key.split()[0]} {sv.fingerprint(verdict.key.split()[1])}"
                self.admitted[name] = found
                self.say(f"{name} ({found.instance_id}): software checked, keys and hosts distributed")
            done = all(n in self.admitted for n in self.pending)
            if done or not block or self.clock() >= deadline:
                return done
            self.sleep(self.spec.poll_s)

    def _hand_back(self, member: Member, why: str) -> None:
        """A replacement that cannot join: never considered again, and handed back to the group (which
        launches another in its slot) rather than left running idle, billed; one line says why and what."""
        self.refused.add(member.instance_id)
        self.say(f"{why}; {self.backend.hand_back(member)}")

    def _join_admitted(self) -> list[str]:
        joined = []
        for name, member in sorted(self.admitted.items()):
            self.members[name] = member
            self.pending.pop(name, None)
            joined.append(name)
        self.admitted = {}
        order = [m.name for m in self.spec.wanted]
        self.current = [n for n in order if n in self.current or n in joined]
        return joined

    def _checkpoint_after_resume(self) -> bool:
        step, _ = self.job.newest_checkpoint()
        return step is not None and (self.resumed_step is None or step > self.resumed_step)

    def _grow(self) -> None:
        """A replacement arrived while the run goes on with the survivors: at this checkpoint, back to full."""
        ended = self.clock()
        self.recovering = {"grow": True, "number": len(self.records) + 1}
        self._state(sv.RUNNING, "a replacement joins at this checkpoint")
        self.job.stop(self.watched)
        step, _ = self.job.newest_checkpoint()
        joined = self._join_admitted()
        batch = self.job.batch_for(len(self.current))
        record = rc.recovery_record(number=len(self.records) + 1, at=ended, cause="grown back", step=step,
                                    exit_code=None, nodes_lost=[], nodes_after=list(self.current), seconds_lost=0.0,
                                    seconds_waiting=self.clock() - ended, batch=batch.describe_line if batch else None)
        record["steps_redone"] = 0
        record["host_keys"] = {n: self.verified[n] for n in joined if n in self.verified}
        self._state(sv.RUNNING, f"{', '.join(joined)} joined")  # the nodes now, then the record
        self.records.append(record)
        self.store.save_records(self.records)
        self.say(f"{', '.join(joined)} joined at checkpoint-{step}: resuming on {len(self.current)} node(s)")
        self.resumed_step = step
        self._launch(resume=True, batch=batch.plan if batch else None)

    # ------------------------------------------------------------ a new master

    def _take_over(self, takeover: dict) -> str | None:
        """On a new master: the run its lost master supervised, continued. Each worker's host key verified from
        its console (a refused or silent one is lost, its replacement awaited as in any recovery), the master's
        ssh files written, one recovery recorded (cause MASTER_REPLACED), the job resumed from the newest
        checkpoint; None, or the run's final status when it cannot go on."""
        master = self.members[self.master]
        ended = float(takeover.get("updated") or self.clock())  # the lost master's last word
        self.replaced = list(takeover.get("replaced") or [])
        self.say(f"a new master {self.master} ({master.instance_id}, {master.address}) takes the run over from its "
                 f"lost master (last state {takeover.get('status')}, job {takeover.get('job') or '-'}, "
                 f"{len(self.records)} recovery(ies) so far)")
        if len(self.records) >= self.spec.managed.max_recoveries:
            return self._final(sv.FAILED, f"--max-recoveries {self.spec.managed.max_recoveries} reached: not "
                                          "recovering again; `fab train --managed --resume` continues the run")
        self.recovering = {"takeover": takeover, "number": len(self.records) + 1}
        self._state(sv.RECOVERING, "a new master takes the run over")
        step, saved_at = self.job.newest_checkpoint()
        keys, lost = self._verify_workers(deadline=self.clock() + max(self.spec.managed.wait_s, 60.0))
        self.nodes.take_over(master, keys)
        for name in [n for n in keys if n != self.master]:  # the master's files hold every verified key now
            problem = self.nodes.admit(self.members[name], keys[name])
            if problem:
                self._hand_back(self.members[name], f"{name} ({self.members[name].instance_id}): not ready ({problem})")
                lost.append(name)
        for name in lost:
            self.pending[name] = self.members[name].instance_id
            if name in self.current:
                self.current.remove(name)
        problem = self.job.restore_workdir(self.current[1:])
        if problem:
            return self._final(sv.FAILED, f"{problem}: `fab train --managed --resume` copies it again from the "
                                          "controller")
        if self.pending and self.spec.managed.wait_s and self.backend.replaces_lost():
            self.say(f"awaiting replacement(s) for {', '.join(sorted(self.pending))} from the group (up to "
                     f"{self.spec.managed.wait_s:g} s)")
            self._replacements_ready(block=True, deadline=self.clock() + self.spec.managed.wait_s)
        joined = self._join_admitted()
        if rc.next_step(len(self.spec.wanted), len(self.current), self.spec.managed.min_nodes) == rc.TOO_FEW:
            return self._final(sv.FAILED, f"only {len(self.current)} node(s) left ({', '.join(self.current)}); "
                                          f"--min-nodes is {self.spec.managed.min_nodes}: stopping")
        batch = self.job.batch_for(len(self.current))
        waited = self.clock() - ended
        lost_s = round(max(0.0, ended - (saved_at or ended)), 1)
        record = rc.recovery_record(number=len(self.records) + 1, at=ended, cause=sv.MASTER_REPLACED, step=step,
                                    exit_code=None, nodes_lost=[self.master, *lost], nodes_after=list(self.current),
                                    seconds_lost=lost_s, seconds_waiting=waited,
                                    batch=batch.describe_line if batch else None)
        record["steps_redone"] = None  # where the lost master's job stopped is not known
        record["host_keys"] = {n: f"{k.split()[0]} {sv.fingerprint(k.split()[1])}" for n, k in keys.items()
                               if n != self.master and n not in lost}
        record["host_keys"].update({n: self.verified[n] for n in joined if n in self.verified})
        self.records.append(record)
        self.store.save_records(self.records)
        self.say(f"recovery {record['number']}: the master was lost; resuming on {len(self.current)} node(s) "
                 f"({', '.join(self.current)}) from checkpoint-{step}; {waited:.1f} s since the lost master's last "
                 "state")
        self.resumed_step = step
        self._launch(resume=True, batch=batch.plan if batch else None)
        self.replaced.append(sv.replaced_entry(at=self.clock(), address=master.address, step=step,
                                               job_id=self.watched))
        self._state(sv.RUNNING)
        return None

    def _verify_workers(self, *, deadline: float) -> tuple[dict[str, str], list[str]]:
        """(slot -> the verified key line, for the master itself and each worker whose presented key its console
        lists; the workers refused or with no key by `deadline`, handed back to the group)."""
        master = self.members[self.master]
        keys: dict[str, str] = {}
        own = self.nodes.host_key(master)  # this machine's own sshd: nothing to verify it against but itself
        if own:
            keys[self.master] = own
        first, lost = self.clock(), []
        waiting = list(self.current[1:])
        while waiting:
            for name in list(waiting):
                member = self.members[name]
                verdict = sv.host_key_verdict(member, self.nodes.host_key(member), self.backend.console(member),
                                              waited_s=self.clock() - first, wait_s=max(0.0, deadline - first))
                if verdict.outcome == "wait":
                    continue
                waiting.remove(name)
                if verdict.verified:
                    self.say(verdict.line)
                    keys[name] = verdict.key
                else:
                    self._hand_back(member, verdict.line)
                    lost.append(name)
            if waiting:
                self.sleep(self.spec.poll_s)
        return keys, lost

    # ------------------------------------------------------------ ends

    def _master_lost(self, notice: str) -> str:
        """The master's own notice: not the run's end. Recorded (MASTER_LEAVING, mirrored beside the spec) for a new
        master's boot step, which continues the run; this supervisor ends here."""
        kept = self.job.keep_for_controller()
        line = (f"the master {self.master} has a spot notice ({notice}); it runs the job and the supervisor. {kept} "
                "A new master continues the run from its newest checkpoint when it boots")
        self.say(line)
        self._state(sv.MASTER_LEAVING, line)
        return sv.MASTER_LEAVING

    def _final(self, status: str, line: str) -> str:
        if self.records:
            self.job.finish(self.records)
        self.say(line)
        if self.records:
            self.say(f"{len(self.records)} recovery(ies) recorded in the run's summary.json")
        self._state(status, line)
        return status
