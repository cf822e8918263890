"""The soak's decisions, apart from its actions (bench/soak.py): the seeded fault schedule, what a job's
log says about its steps, what the supervisor's lines during a fault amount to, and the report (JSON and
the Markdown table docs/benchmarks.md shows).

Faults are placed on the run's progress (a fraction of its steps), not on the clock, so a soak paced by
a slow, shared machine still spreads its faults over the whole run.
"""

from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass, field

# Every kind of fault, with how long the seeded schedule holds it (seconds; 0: a single act).
KINDS = {
    "reclaim": (0, 0),  # fab local-reclaim NODE --notice: a spot notice, then the node gone
    "silent": (0, 0),  # fab local-reclaim NODE --silent: the node gone without a notice
    "partition": (40, 60),  # the worker's sshd stopped (SIGSTOP), then back (SIGCONT): the machine still runs
    "slow-link": (20, 40),  # the worker's link limited hard with tc, then unlimited
    "store-errors": (20, 45),  # the checkpoint store answers 503 SlowDown and 500 InternalError to every request
    "supervisor-kill": (0, 0),  # the supervisor's process on the master killed (SIGKILL)
    "disk-full": (20, 40),  # the master's output filesystem filled to a few hundred KiB free, then freed
}
ENDS_A_NODE = ("reclaim", "silent")  # the keeper brings the node back as a new machine
ON_A_WORKER = ("reclaim", "silent", "partition", "slow-link")
FIRST_AT, LAST_AT = 0.12, 0.85  # the faults' span, as fractions of the run's steps
SLOW_LINK_MBIT = 5.0

_LOSS_RE = re.compile(r"^\[0\] \{'loss': '?([0-9.eE+-]+|nan|inf)'?")
_RESUMED_RE = re.compile(r"^\[0\] .* resuming from \S+ \(step ([0-9]+) ")
_UPLOADED_RE = re.compile(r"^\[0\] .* checkpoint ([0-9]+) uploaded to ")
_NOT_SAVED_RE = re.compile(r"^\[0\] .* checkpoint ([0-9]+) (?:not saved|upload to \S+ failed)")
_WORLD_RE = re.compile(r"^\[0\] .* world size ([0-9]+) \(")


class PlanError(ValueError):
    """A soak setting that cannot make a schedule; the message names it and what is allowed."""


@dataclass
class Fault:
    number: int
    kind: str
    at_fraction: float  # fired once the run passed this fraction of its steps (and the gates in soak.py)
    node: str | None  # the worker it acts on (None: the store, the supervisor, the master's disk)
    hold_s: float  # how long it lasts before it is undone (0: a single act)


def parse_kinds(text: str) -> list[str]:
    kinds = [k for k in (w.strip() for w in text.split(",")) if k]
    unknown = [k for k in kinds if k not in KINDS]
    if not kinds or unknown or len(set(kinds)) != len(kinds):
        raise PlanError(f"--kinds: {text!r} is not allowed; allowed: a comma-separated list of distinct kinds of "
                        f"{', '.join(KINDS)}")
    return kinds


def schedule(kinds: list[str], count: int, nodes: int, seed: int) -> list[Fault]:
    """`count` faults of `kinds` in a seeded order, each kind as often as the others (or once more), each
    worker fault on a seeded worker (never node0, the master), spread over FIRST_AT..LAST_AT of the run."""
    if count < len(kinds):
        raise PlanError(f"--faults: {count} is not allowed; allowed: at least one of each of the {len(kinds)} "
                        "kinds asked for")
    if nodes < 2 and any(k in ON_A_WORKER for k in kinds):
        raise PlanError(f"--nodes: {nodes} is not allowed with a worker's fault; allowed: 2 or more")
    rng = random.Random(seed)
    order = [kinds[i % len(kinds)] for i in range(count)]
    rng.shuffle(order)
    step = (LAST_AT - FIRST_AT) / max(1, count - 1) if count > 1 else 0.0
    faults = []
    for i, kind in enumerate(order):
        low, high = KINDS[kind]
        faults.append(Fault(number=i + 1, kind=kind, at_fraction=round(FIRST_AT + i * step, 3),
                            node=f"node{rng.randint(1, nodes - 1)}" if kind in ON_A_WORKER else None,
                            hold_s=float(rng.randint(low, high)) if high else 0.0))
    return faults


def default_count(minutes: float, kinds: list[str]) -> int:
    """Two of each kind in 30 minutes (the soak's default), fewer in a shorter soak but one of each."""
    return max(len(kinds), round(2 * len(kinds) * minutes / 30))


# ---------------------------------------------------------------- what a job's log says


@dataclass
class JobSteps:
    """One job of the run, from its log on the master (rank 0's lines, `--logging_steps 1`)."""

    job: str
    start: int = 0  # the step it resumed from (0: a fresh start)
    logged: int = 0  # steps it logged (one loss line each)
    losses: list[float] = field(default_factory=list)
    world: int | None = None  # its ranks, as rank 0 logged them
    uploaded: list[int] = field(default_factory=list)  # checkpoints it uploaded
    not_saved: list[int] = field(default_factory=list)  # checkpoints it could not save or upload

    @property
    def last(self) -> int:
        return self.start + self.logged

    def read(self, lines: list[str]) -> None:
        """Take more lines of the job's log (whole lines, in order)."""
        for line in lines:
            found = _LOSS_RE.match(line)
            if found:
                self.logged += 1
                try:
                    self.losses.append(float(found.group(1)))
                except ValueError:
                    pass
                continue
            for pattern, into in ((_UPLOADED_RE, self.uploaded), (_NOT_SAVED_RE, self.not_saved)):
                found = pattern.match(line)
                if found:
                    into.append(int(found.group(1)))
            found = _RESUMED_RE.match(line)
            if found:
                self.start = int(found.group(1))
            found = _WORLD_RE.match(line)
            if found:
                self.world = int(found.group(1))


def steps_redone(ended: list[JobSteps], resumed: JobSteps | None) -> int:
    """Steps trained again after a fault: the furthest the jobs it ended got, less where the next one resumed."""
    if not ended or resumed is None:
        return 0
    return max(0, max(j.last for j in ended) - resumed.start)


def final_loss(losses: list[float], window: int = 20) -> float | None:
    """The mean of the last `window` logged losses (less noisy than the last one), to 4 significant digits."""
    tail = losses[-window:]
    return float(f"{sum(tail) / len(tail):.4g}") if tail else None


def fidelity(jobs: list[JobSteps], baselines: list[list[float]], baseline_world: int | None,
             final: float | None) -> dict:
    """The run against undisturbed runs of the same settings (each a list of losses, step 1 first), as logged:

    - `first_job`: every step the first job logged (up to the first recovery) against the first baseline's;
    - `after_recoveries`: the first step each later job logged against the baseline's at that step, where the
      job's world size is the baseline's (`equal` None where it is not: a world of another size sums another
      batch, so no step of it has an undisturbed counterpart);
    - `final_loss_spread`: the lowest and highest of the baselines' final losses, and whether the run's lies in it.
    """
    report: dict = {"baselines": len(baselines)}
    if not baselines or not jobs:
        return report
    reference = baselines[0]
    first = jobs[0]
    compared = [(first.start + i + 1, loss) for i, loss in enumerate(first.losses)
                if first.start + i < len(reference)]
    differing = [step for step, loss in compared if loss != reference[step - 1]]
    report["first_job"] = {"steps": len(compared), "equal": len(compared) - len(differing),
                           "first_difference": differing[0] if differing else None}
    after = []
    for job in jobs[1:]:
        step = job.start + 1
        if not job.losses or step > len(reference):
            continue
        same_world = job.world is not None and job.world == baseline_world
        after.append({"job": job.job, "step": step, "world": job.world, "loss": job.losses[0],
                      "baseline": reference[step - 1], "equal": (job.losses[0] == reference[step - 1])
                      if same_world else None})
    report["after_recoveries"] = after
    finals = [f for f in (final_loss(losses) for losses in baselines) if f is not None]
    if finals:
        low, high = min(finals), max(finals)
        report["final_loss_spread"] = [low, high]
        report["final_within_spread"] = final is not None and low <= final <= high
    return report


def fidelity_problems(report: dict) -> list[str]:
    """What the fidelity checks show otherwise, one line each."""
    problems = []
    first = report.get("first_job")
    if first and first["first_difference"] is not None:
        problems.append(f"the first job's loss differs from the undisturbed run's from step "
                        f"{first['first_difference']} ({first['equal']} of {first['steps']} steps equal)")
    for entry in report.get("after_recoveries", []):
        if entry["equal"] is False:
            problems.append(f"job {entry['job']}'s first step {entry['step']} logged loss {entry['loss']}, the "
                            f"undisturbed run {entry['baseline']}")
    return problems


# ---------------------------------------------------------------- the report


@dataclass
class Outcome:
    """What one fault did, as the soak measured it."""

    fault: Fault
    fired_at_s: float | None = None  # seconds since the run was handed over (None: never fired)
    at_step: int | None = None
    undone_step: int | None = None  # the run's step when the fault was undone (or done, if a single act)
    supervisor: str = ""  # what the supervisor did, in a few words
    supervisor_lines: list[str] = field(default_factory=list)
    job_changed: bool = False
    training_again_s: float | None = None  # fault to the first step after it (a new job's, if it ended one)
    longest_stall_s: float | None = None  # the longest time without a step from the fault to training again
    steps_redone: int | None = None
    interval_steps: int = 0
    steps_per_s_before: float | None = None  # over the 30 s before the fault
    steps_per_s_during: float | None = None  # while it was held
    checkpoints_not_saved: list[int] = field(default_factory=list)  # not saved or not uploaded, from the fault on
    notes: list[str] = field(default_factory=list)

    @property
    def within_interval(self) -> bool | None:
        return None if self.steps_redone is None else self.steps_redone <= self.interval_steps

    def as_json(self) -> dict:
        return {**asdict(self.fault), **{k: v for k, v in asdict(self).items() if k != "fault"},
                "within_interval": self.within_interval}


def what_the_supervisor_did(lines: list[str], pid0, pid1, changed: bool) -> str:
    """A few words from the supervisor's lines during a fault."""
    said = [line.split("] ", 1)[-1] for line in lines]
    restarted = next((s for s in said if s.startswith("the supervisor restarted")), None)
    recovery = next((s for s in said if s.startswith("recovery ")), None)
    parts = []
    if restarted:
        parts.append(f"restarted (pid {pid0} -> {pid1}), carried on from its state file")
    if recovery:
        parts.append(recovery.split(";")[0])
        waited = re.search(r"([0-9.]+) s waiting", recovery)
        if waited:
            parts.append(f"{waited.group(1)} s waiting")
    for line in said:
        found = re.match(r"^(\S+): no SSH answer for .* its instance is (\S+): not lost", line)
        if found:
            parts.append(f"{found.group(1)} silent, its instance {found.group(2)}: not lost, the job went on")
    if not parts:
        parts.append("a new job" if changed else "nothing: the job trained on")
    return "; ".join(parts)


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def table(outcomes: list[Outcome]) -> str:
    """The faults as a Markdown table."""
    rows = ["| # | fault | target | held s | at s (step) | what the supervisor did | fault to training again s "
            "| longest stall s | steps/s before, held | checkpoints not saved | steps redone (interval) |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        f = o.fault
        at = "not fired" if o.fired_at_s is None else f"{o.fired_at_s:.0f} ({o.at_step})"
        redone = "-" if o.steps_redone is None else f"{o.steps_redone} ({o.interval_steps})"
        rates = f"{_s(o.steps_per_s_before)}, {_s(o.steps_per_s_during)}" if f.hold_s else _s(o.steps_per_s_before)
        missed = ", ".join(map(str, o.checkpoints_not_saved)) or "-"
        rows.append(f"| {f.number} | {f.kind} | {f.node or '-'} | {f.hold_s:g} | {at} | {o.supervisor or '-'} | "
                    f"{_s(o.training_again_s)} | {_s(o.longest_stall_s)} | {rates} | {missed} | {redone} |")
    return "\n".join(rows)


def verdict(report: dict) -> list[str]:
    """What the soak's Done-when asks and the report shows otherwise, one line each (none: it passed)."""
    problems = []
    fired = [o for o in report["faults"] if o["fired_at_s"] is not None]
    if report.get("status") != "completed":
        problems.append(f"the run ended {report.get('status')!r}, not completed")
    if len(fired) < len(report["faults"]):
        problems.append(f"{len(report['faults']) - len(fired)} fault(s) never fired (the run ended first)")
    for o in fired:
        if o["within_interval"] is False:
            problems.append(f"fault {o['number']} ({o['kind']}): {o['steps_redone']} steps redone, more than one "
                            f"checkpoint interval ({o['interval_steps']})")
        if o["training_again_s"] is None:
            problems.append(f"fault {o['number']} ({o['kind']}): training never seen again")
    for what in ("processes_left", "namespaces_left", "mounts_left", "files_left"):
        if report.get(what):
            problems.append(f"{what.replace('_', ' ')}: {report[what]}")
    if report.get("checkpoint_objects_not_needed"):
        problems.append(f"checkpoint objects the run no longer needs: {report['checkpoint_objects_not_needed']}")
    return problems + fidelity_problems(report.get("fidelity") or {})
