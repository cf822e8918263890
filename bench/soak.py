"""The soak: one long supervised run on a local cluster, many faults of several kinds, measured from outside.

    python bench/soak.py [--minutes 30] [--nodes 4] [--seed 1] [--kinds reclaim,silent,...] [--faults N]
                         [--steps S] [--checkpoint-steps 25] [--batch-size B] [--examples 3000]
                         [--hold SECONDS] [--settle SECONDS] [--baselines 3 | --no-baseline] [--json PATH]
                         [--name NAME | --cluster NAME]

Root and Linux (a local cluster of its own, `fab local-up --name NAME --keeper-delay 10s`, removed at the
end; `--cluster NAME`: a running local cluster, set up, that the soak uses and leaves running). What it
does, in order:

1. `fab local-up` with the group keeper, `fab setup`; moto's S3 behind a fault proxy (bench/soak_store.py)
   on the cluster bridge's address. The run's output folder is in each node's own home, as on AWS (a
   resumed worker reads checkpoints from S3; a replacement starts empty), the master's on a small tmpfs
   mounted in its own mount namespace: the master's disk, which the disk fault fills.
2. Without --steps, a short unsupervised run measures the step time, and the run gets the steps that take
   --minutes undisturbed.
3. `fab train --managed --detach` (the built-in demo, --seed, a checkpoint every --checkpoint-steps steps
   uploaded to the store), then no fab process is left: the soak walks away. From here it only reads
   `fab status --json` (every STATUS_EVERY_S) and the run's files (the supervisor's state and log, each
   job's log on the master, the bucket), and does the faults of a seeded schedule (bench/soak_plan.py),
   each once the run has passed its fraction of the steps, trains, and has uploaded a checkpoint since the
   fault before. Each fault is held, undone, and watched until the run trains again.
4. With the baselines (default 3), the same run again, undisturbed, each time: the run's fidelity is checked
   against them (bench/soak_plan.py's `fidelity`): every loss the first job logged (up to the first recovery)
   equals the first baseline's at that step, the first step after each recovery equals the baseline's at that
   step where the world size is the same, and the run's final loss is shown against the baselines' spread.
5. `fab local-down`, the store stopped, the tmpfs gone; then what is left: processes, namespaces, mounts,
   and checkpoint objects the run no longer needs.

It prints the table of faults and the run's figures, writes them as JSON (--json), and exits 1 when the
run did not complete, a fault never fired, a fault cost more than one checkpoint interval of steps, or
anything was left behind (`bench/soak_plan.py`'s verdict), else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import soak_plan as plan  # noqa: E402
from bench.soak_faults import FILL_FILE, Injector, LocalCluster, fab, supervisor_state  # noqa: E402
from bench.soak_leftovers import checkpoint_objects, controller_processes, left_behind  # noqa: E402
from bench.soak_store import Store  # noqa: E402
from cluster.run import supervision as sv  # noqa: E402
from node_setup.local import state as local_state  # noqa: E402

BUCKET = "soak"
KEEPER_DELAY = "10s"
TMPFS_SIZE = "64m"
EXAMPLES = 3000
POLL_S = 1.0
STATUS_EVERY_S = 15.0
SETTLE_S = 15.0  # after a fault that should not end the job: how long to watch whether it did
AGAIN_TIMEOUT_S = 900.0
HOLD_MORE_S = 180.0  # a store or disk fault is held until a checkpoint met it, at most this much longer
STOPPED_S = 5.0  # a time without a step at least this long is training stopped (shorter: slow steps)
_STARTED_RE = re.compile(r"\] job (\S+) started on ")


def _options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="the run's undisturbed length (default 30)")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1, help="the fault schedule's and the training's seed")
    parser.add_argument("--kinds", default=",".join(plan.KINDS), help="comma-separated fault kinds (default all)")
    parser.add_argument("--faults", type=int, default=0, help="how many (default: two of each kind per 30 min)")
    parser.add_argument("--steps", type=int, default=0, help="the run's steps (default: measured for --minutes)")
    parser.add_argument("--checkpoint-steps", type=int, default=25, help="checkpoint interval in steps")
    parser.add_argument("--batch-size", type=int, default=0, help="the batch per rank (default: the demo's)")
    parser.add_argument("--examples", type=int, default=EXAMPLES, help=f"the demo's examples (default {EXAMPLES})")
    parser.add_argument("--baselines", type=int, default=3,
                        help="undisturbed runs of the same settings to check the run against (default 3: the "
                             "first for step-by-step fidelity, all for the final loss's spread; 0 with --no-baseline)")
    parser.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True,
                        help="also run it undisturbed, for the final loss (default on)")
    parser.add_argument("--json", default="", help="write the report here (default soak-NAME.json)")
    parser.add_argument("--name", default="", help="the local cluster's name (default soak<seed>-<random>)")
    parser.add_argument("--cluster", default="", help="a running, set-up local cluster to use and leave running "
                                                      "(its keeper, if any, replaces lost nodes)")
    parser.add_argument("--hold", type=float, default=0.0, help="hold every held fault this long (default: "
                                                                "the schedule's, 20 to 45 s)")
    parser.add_argument("--settle", type=float, default=SETTLE_S, help="after a fault that should not end the "
                                                                       f"job, watch this long (default {SETTLE_S:g})")
    o = parser.parse_args()
    o.kinds = plan.parse_kinds(o.kinds)
    if o.cluster and o.name:
        raise plan.PlanError("--cluster: not with --name (the soak names only a cluster it makes)")
    o.own = not o.cluster
    o.name = o.cluster or o.name or f"soak{o.seed}-{secrets.token_hex(2)}"
    local_state.validate_name(o.name)
    o.faults = o.faults or plan.default_count(o.minutes, o.kinds)
    o.schedule = plan.schedule(o.kinds, o.faults, o.nodes, o.seed)
    for fault in o.schedule:
        fault.hold_s = o.hold if o.hold and fault.hold_s else fault.hold_s
    for what, value, low in (("--nodes", o.nodes, 1), ("--checkpoint-steps", o.checkpoint_steps, 1),
                             ("--steps", o.steps, 0), ("--batch-size", o.batch_size, 0),
                             ("--examples", o.examples, 1), ("--minutes", o.minutes, 0.5), ("--hold", o.hold, 0),
                             ("--settle", o.settle, 0), ("--baselines", o.baselines, 0)):
        if value < low:
            raise plan.PlanError(f"{what}: {value} is not allowed; allowed {low} or more")
    return o


def _now() -> str:
    return time.strftime("%H:%M:%S")


def say(line: str) -> None:
    print(f"soak [{_now()}] {line}", flush=True)


class Run:
    """One supervised run, watched through its files and `fab status --json`."""

    def __init__(self, cluster: LocalCluster, env: dict, o: argparse.Namespace, label: str, steps: int):
        self.cluster, self.env, self.o, self.label, self.steps = cluster, env, o, label, steps
        self.output = f"{output_root(o.name)}/{label}"
        self.uri = f"s3://{BUCKET}/{label}"
        self.jobs: dict[str, plan.JobSteps] = {}
        self.order: list[str] = []  # job ids in the order the supervisor started them
        self.started_at: dict[str, float] = {}
        self._offsets: dict[str, int] = {}
        self._sup_offset = 0
        self.sup_lines: list[tuple[float, str]] = []
        self.step_seen: list[tuple[float, int]] = []  # (when seen, the run's step) for every new step
        self.status_polls: list[dict] = []
        self.state: dict = {}
        self.run_id = ""
        self.handed_at = 0.0
        self._stop = threading.Event()

    # ------------------------------------------------------------ start

    def start(self, store: Store) -> None:
        extra = (f"--save_steps {self.o.checkpoint_steps} --logging_steps 1 --seed {self.o.seed} "
                 "--spot_poll_seconds 1")
        argv = ["train", "--managed", "--detach", "--cluster", f"local:{self.cluster.name}",
                *demo_args(self.o), "--max-steps", str(self.steps), "--max-recoveries", "100",
                "--wait-for-capacity", "5m", "--output-dir", self.output, "--checkpoint-uri", self.uri,
                "--env", store.node_env(), "--extra", extra]
        self.handed_at = time.time()
        done = fab(self.env, *argv, timeout=600)
        if done.returncode != 0:
            log = _read_from(self.cluster.master_home / sv.CURRENT_LINK / sv.LOG_FILE, 0)[-3000:]
            raise RuntimeError(f"fab train --managed failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr}"
                               f"\nthe supervisor's log:\n{log}")
        left = controller_processes(self.cluster.name)
        say(f"{self.label}: handed over in {time.time() - self.handed_at:.0f} s; fab processes left: {len(left)}")
        if left:
            raise RuntimeError(f"fab processes still running after --detach: {left}")
        self.state = supervisor_state(self.cluster)
        self.run_id = str(self.state.get("run") or "")
        threading.Thread(target=self._status_loop, daemon=True).start()

    def _status_loop(self) -> None:
        while not self._stop.wait(STATUS_EVERY_S):
            self._status_poll()

    def stop_watching(self) -> None:
        self._stop.set()

    # ------------------------------------------------------------ the run's files

    def poll(self) -> None:
        """Read what is new: the state file, the supervisor's log (new jobs), each job's log (its steps)."""
        now = time.time()
        self.state = supervisor_state(self.cluster) or self.state
        log = self.cluster.master_home / sv.RUN_ROOT / self.run_id / sv.LOG_FILE
        text = _read_from(log, self._sup_offset)
        if text:
            whole = text[:text.rfind("\n") + 1]
            self._sup_offset += len(whole.encode())
            for line in whole.splitlines():
                self.sup_lines.append((now, line))
                found = _STARTED_RE.search(line)
                if found and found.group(1) not in self.jobs:
                    self.order.append(found.group(1))
                    self.jobs[found.group(1)] = plan.JobSteps(found.group(1))
                    self.started_at[found.group(1)] = now
        before = self.step
        for job_id in self.order[-2:]:  # the newest job, and the one before it (its last lines)
            path = self.cluster.master_home / ".xeon-cluster" / "jobs" / job_id / "log"
            text = _read_from(path, self._offsets.get(job_id, 0))
            whole = text[:text.rfind("\n") + 1]
            self._offsets[job_id] = self._offsets.get(job_id, 0) + len(whole.encode())
            self.jobs[job_id].read(whole.splitlines())
        if self.step > before:
            self.step_seen.append((now, self.step))

    @property
    def job(self) -> plan.JobSteps | None:
        return self.jobs[self.order[-1]] if self.order else None

    @property
    def step(self) -> int:
        return self.job.last if self.job else 0

    @property
    def uploaded(self) -> int:
        return max((s for j in self.jobs.values() for s in j.uploaded), default=0)

    def status(self) -> str:
        return str(self.state.get("status") or "")

    def training(self, within_s: float = 10.0) -> bool:
        return bool(self.step_seen) and time.time() - self.step_seen[-1][0] <= within_s and self.job is not None \
            and self.job.logged > 0

    def wait(self, until, timeout: float, what: str) -> bool:
        deadline = time.time() + timeout
        while time.time() < deadline:
            self.poll()
            if until():
                return True
            if self.status() in sv.FINAL:
                return bool(until())
            time.sleep(POLL_S)
        say(f"{self.label}: gave up waiting for {what} after {timeout:.0f} s")
        return False

    def rate(self, start: float, end: float) -> float | None:
        """Steps per second seen between two moments (None: too few seen)."""
        seen = [s for t, s in self.step_seen if start <= t <= end]
        return round((seen[-1] - seen[0]) / (end - start), 2) if len(seen) > 1 and end > start else None

    def hold(self, seconds: float, exercised, keep) -> None:
        """Watch for `seconds` (a fault held, `keep()` at every poll), and on until `exercised()` (the fault met a
        checkpoint) for up to HOLD_MORE_S more, while the run goes on."""
        start = time.time()
        while time.time() - start < seconds or (not exercised() and time.time() - start < seconds + HOLD_MORE_S):
            keep()
            self.poll()
            if self.status() in sv.FINAL:
                return
            time.sleep(POLL_S)

    def _not_saved_since(self, before: set) -> bool:
        return any((j.job, step) not in before for j in self.jobs.values() for step in j.not_saved)

    # ------------------------------------------------------------ one fault

    def fault(self, fault: plan.Fault, injector: Injector, after_step: int) -> plan.Outcome:
        outcome = plan.Outcome(fault, interval_steps=self.o.checkpoint_steps)
        ready = self.wait(lambda: self.status() == sv.RUNNING and self.training()
                          and self.step >= fault.at_fraction * self.steps
                          and self.uploaded > max(after_step, self.job.start if self.job else 0),
                          AGAIN_TIMEOUT_S, f"fault {fault.number}'s moment")
        if not ready:
            outcome.notes.append(f"not fired: run {self.status() or 'not started'} at step {self.step}")
            return outcome
        t0, job0, pid0 = time.time(), self.order[-1], self.state.get("pid")
        outcome.fired_at_s, outcome.at_step = round(t0 - self.handed_at, 1), self.step
        seen_before = len(self.sup_lines)
        not_saved_before = {(j.job, step) for j in self.jobs.values() for step in j.not_saved}
        outcome.steps_per_s_before = self.rate(t0 - 30, t0)
        outcome.notes.append(injector.inject(fault))
        say(f"fault {fault.number}: {fault.kind} ({fault.node or '-'}) at step {self.step}: {outcome.notes[-1]}")
        if fault.hold_s:
            refused = injector.refused()
            exercised = {"store-errors": lambda: injector.refused() > refused,  # an upload was refused
                         "disk-full": lambda: self._not_saved_since(not_saved_before)}.get(fault.kind, lambda: True)
            self.hold(fault.hold_s, exercised, lambda: injector.keep(fault))
            outcome.notes.append(injector.heal(fault) + (f" ({injector.refused() - refused} requests refused)"
                                                         if fault.kind == "store-errors" else ""))
            outcome.steps_per_s_during = self.rate(t0, time.time())
        healed, outcome.undone_step = time.time(), self.step
        if fault.kind in plan.ENDS_A_NODE:  # the job must end: wait for the next one's first step
            self.wait(lambda: self.order[-1] != job0 and self.job.logged > 0, AGAIN_TIMEOUT_S, "a new job's step")
        else:  # it should not end the job: watch a while, and if it did, wait for the next job's first step
            self.wait(lambda: time.time() - healed >= self.o.settle and (self.order[-1] == job0 or self.job.logged > 0),
                      AGAIN_TIMEOUT_S, "the run to settle")
        if fault.kind == "supervisor-kill":
            self.wait(lambda: self.state.get("pid") not in (None, pid0), AGAIN_TIMEOUT_S, "the supervisor back")
        changed = self.order[-1] != job0
        outcome.job_changed = changed
        # the longest time without a step from the fault on (to the new job's first step, if it ended the job):
        # training again at its end
        until = self.started_at[self.order[-1]] if changed else time.time()
        marks = [t0] + [t for t, _ in self.step_seen if t0 < t <= time.time()]
        if changed:
            marks = [t for t in marks if t <= until] + [t for t in marks if t > until][:1]
        gaps = [(b - a, b) for a, b in zip(marks, marks[1:])]
        if gaps and (not changed or marks[-1] > until):
            stall, again = max(gaps, key=lambda g: (round(g[0]), -g[1]))  # the first of the longest
            if stall < STOPPED_S and not changed:  # it never stopped: its first step after the fault
                again = gaps[0][1]
            outcome.longest_stall_s, outcome.training_again_s = round(stall, 1), round(again - t0, 1)
        if changed:
            ended = [self.jobs[j] for j in self.order[self.order.index(job0):-1]]
            outcome.steps_redone = plan.steps_redone(ended, self.job)
        else:
            outcome.steps_redone = 0
        outcome.checkpoints_not_saved = sorted(step for j in self.jobs.values() for step in j.not_saved
                                               if (j.job, step) not in not_saved_before)
        if self.status() in sv.FINAL:
            outcome.notes.append(f"the run ended {self.status()} during this fault")
        outcome.supervisor_lines = [line for _, line in self.sup_lines[seen_before:]]
        outcome.supervisor = plan.what_the_supervisor_did(outcome.supervisor_lines, pid0, self.state.get("pid"),
                                                          changed)
        say(f"fault {fault.number}: training again after {outcome.training_again_s} s; "
            f"{outcome.steps_redone} step(s) redone; {outcome.supervisor}")
        return outcome

    def finish(self, timeout: float) -> None:
        self.wait(lambda: self.status() in sv.FINAL, timeout, "the run's end")
        for _ in range(3):  # the last lines of the last job
            self.poll()
        self.stop_watching()
        self._status_poll()  # what `fab status --json` says of the ended run

    def _status_poll(self) -> None:
        done = fab(self.env, "status", "--json", "--cluster", f"local:{self.cluster.name}", timeout=120)
        try:
            found = json.loads(done.stdout)
        except ValueError:
            found = {}
        supervised, job = found.get("supervised") or {}, found.get("job") or {}
        self.status_polls.append({"at_s": round(time.time() - self.handed_at, 1), "exit": done.returncode,
                                  "status": supervised.get("status"), "job": supervised.get("job"),
                                  "recoveries": supervised.get("recoveries"),
                                  "step": (job.get("progress") or {}).get("step")})


def _read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def output_root(name: str) -> str:
    """The soak's folder in each node's home (relative: each node its own, as on AWS)."""
    return f"xc-soak-{name}"


def on_master(path: str) -> str:
    """Where a folder relative to the home is on the master (the local cluster's user is root)."""
    return f"/root/{path}"


def demo_args(o: argparse.Namespace) -> list[str]:
    """fab train's options for the soak's demo: its examples and, when given, the batch per rank."""
    return ["--synthetic-examples", str(o.examples), *(["--batch-size", str(o.batch_size)] if o.batch_size else [])]


def calibrate(cluster: LocalCluster, env: dict, o: argparse.Namespace) -> int:
    """Steps that take --minutes undisturbed: a short run's mean step time (summary.json), same settings."""
    out = f"{output_root(o.name)}/calibration"
    extra = f"--save_steps {o.checkpoint_steps} --logging_steps 1 --seed {o.seed}"
    done = fab(env, "train", "--cluster", f"local:{cluster.name}", *demo_args(o), "--max-steps", "60",
               "--output-dir", out, "--extra", extra, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"the calibration run failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr}")
    summary = json.loads(cluster.in_master(on_master(f"{out}/summary.json")).read_text())
    step_s = float(summary["step_time_seconds"]["mean"])
    steps = max(4 * o.checkpoint_steps, int(o.minutes * 60 / step_s))
    say(f"calibration: {step_s:.3f} s a step on {o.nodes} node(s): {steps} steps for {o.minutes:g} minutes")
    shutil.rmtree(cluster.in_master(on_master(out)), ignore_errors=True)
    return steps


def soak_run(run: Run, store: Store, injector: Injector, faults: list[plan.Fault]) -> dict:
    run.start(store)
    outcomes, after = [], 0
    for fault in faults:
        outcome = run.fault(fault, injector, after)
        outcomes.append(outcome)
        after = outcome.undone_step or run.step
    run.finish(timeout=AGAIN_TIMEOUT_S + 4 * 60 * run.o.minutes)
    summary_path = run.cluster.in_master(on_master(f"{run.output}/summary.json"))
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, ValueError):
        summary = {}
    tail = []
    if run.status() != sv.COMPLETED and run.order:  # why: the end of its last job's log
        log = run.cluster.master_home / ".xeon-cluster" / "jobs" / run.order[-1] / "log"
        tail = _read_from(log, 0).splitlines()[-40:]
    return {"status": run.status(), "run": run.run_id, "wall_s": round(time.time() - run.handed_at, 1),
            **({"last_job_log_tail": tail} if tail else {}),
            "steps": summary.get("steps"), "recoveries": len(summary.get("recoveries") or []),
            "jobs": len(run.order), "final_loss": plan.final_loss(run.job.losses if run.job else []),
            "faults": [o.as_json() for o in outcomes], "outcomes": outcomes,
            "status_polls": len(run.status_polls),
            "status_seen": sorted({(p["status"] or "-") for p in run.status_polls}),
            "last_status_poll": run.status_polls[-1] if run.status_polls else None,
            "checkpoints": checkpoint_objects(store, run.label),
            "job_steps": [run.jobs[job_id] for job_id in run.order]}


def main() -> int:
    try:
        o = _options()
    except (plan.PlanError, local_state.LocalClusterError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        print("error: the soak needs root on Linux (a local cluster of its own)", file=sys.stderr)
        return 2
    command = "python bench/soak.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    env = {**os.environ, "AWS_EC2_METADATA_DISABLED": "true"}
    cluster = LocalCluster(o.name)
    root = on_master(output_root(o.name))  # the master's; each node has its own
    store = None
    report: dict = {"command": command, "name": o.name, "nodes": o.nodes, "seed": o.seed, "minutes": o.minutes,
                    "checkpoint_steps": o.checkpoint_steps, "cpus": os.cpu_count()}
    say(f"cluster {o.name}: {o.nodes} node(s), keeper {KEEPER_DELAY}; {len(o.schedule)} fault(s) of "
        f"{len(o.kinds)} kind(s), seed {o.seed}")
    started = time.time()
    runs: dict = {}
    try:
        for args in (("local-up", "--nodes", str(o.nodes), "--name", o.name, "--keeper-delay", KEEPER_DELAY),
                     ("setup", "--cluster", f"local:{o.name}")) if o.own else ():
            done = fab(env, *args, timeout=1800)
            if done.returncode != 0:
                raise RuntimeError(f"fab {args[0]} failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr}")
        store = Store(cluster.state().bridge_address, BUCKET)
        env.update(store.controller_env())  # fab train --managed writes the run's spec beside its checkpoints
        os.makedirs(cluster.master_home / output_root(o.name), mode=0o700, exist_ok=True)
        cluster.master_mount("mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700", f"xc-soak-{o.name}", root)
        steps = o.steps or calibrate(cluster, env, o)
        report["steps"] = steps
        injector = Injector(cluster, env, store, root)
        runs["soak"] = soak_run(Run(cluster, env, o, "soak", steps), store, injector, o.schedule)
        for number in range(1, (o.baselines if o.baseline else 0) + 1):
            label = "baseline" if number == 1 else f"baseline-{number}"
            runs[label] = soak_run(Run(cluster, env, o, label, steps), store, injector, [])
    except RuntimeError as exc:
        report["error"] = str(exc)
        say(f"stopped: {exc}")
    finally:
        report["fill_left"] = cluster.in_master(f"{root}/{FILL_FILE}").exists() if cluster.paths.state_path.exists() \
            else False
        if not o.own and supervisor_state(cluster).get("status") not in (*sv.FINAL, None):  # a run cut short
            fab(env, "stop", "--cluster", f"local:{o.name}", timeout=300)
        try:
            if cluster.paths.state_path.exists():
                cluster.master_mount("umount", root)
        except (subprocess.SubprocessError, OSError) as exc:
            report["umount"] = str(exc)
        state = local_state.load_state(cluster.paths)
        for node in state.nodes if state else []:  # each node's folder (its own home, as the master's under it)
            shutil.rmtree(Path(node.dir) / "root" / output_root(o.name), ignore_errors=True)
        if o.own:
            down = fab(env, "local-down", "--name", o.name, timeout=300)
            report["local_down"] = (down.stdout.strip().splitlines() or [""])[-1]
        if store is not None:
            store.close()
    soak = runs.get("soak", {})
    outcomes = soak.pop("outcomes", [])
    job_steps = {label: run.pop("job_steps", []) for label, run in runs.items()}
    for run in runs.values():
        run.pop("outcomes", None)
    baselines = [steps_of[0] for label, steps_of in job_steps.items() if label.startswith("baseline") and steps_of]
    report.update({k: soak.get(k) for k in ("status", "run", "wall_s", "steps", "recoveries", "jobs", "final_loss",
                                            "status_polls", "status_seen", "last_status_poll", "last_job_log_tail")})
    report["faults"] = soak.get("faults", [])
    report["kinds_fired"] = sorted({f["kind"] for f in report["faults"] if f["fired_at_s"] is not None})
    report["baseline"] = {k: v for k, v in runs.get("baseline", {}).items() if k != "faults"} or None
    if report["baseline"] and report["final_loss"] is not None and report["baseline"]["final_loss"] is not None:
        report["final_loss_difference"] = round(report["final_loss"] - report["baseline"]["final_loss"], 4)
    report["fidelity"] = plan.fidelity(job_steps.get("soak", []), [b.losses for b in baselines],
                                       baselines[0].world if baselines else None, report.get("final_loss"))
    report["checkpoint_objects"] = soak.get("checkpoints")
    report["checkpoint_objects_not_needed"] = len((soak.get("checkpoints") or {}).get("not_needed", []))
    report.update(left_behind(cluster, output_root(cluster.name), [r.get("run", "") for r in runs.values()], o.own))
    report["total_s"] = round(time.time() - started, 1)
    report["problems"] = ([report["error"]] if report.get("error") else []) + plan.verdict(report)
    path = Path(o.json or f"soak-{o.name}.json")
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\n$ {command}\n")
    print(plan.table(outcomes))
    print(f"\nrun {report.get('run')}: {report.get('status')} in {report.get('wall_s')} s, "
          f"{report.get('steps')} steps, {report.get('recoveries')} recoveries, {report.get('jobs')} jobs; "
          f"final loss {report.get('final_loss')}"
          + (f" (undisturbed: {report['baseline']['final_loss']} in {report['baseline']['wall_s']} s)"
             if report["baseline"] else "")
          + f"; faults fired: {sum(f['fired_at_s'] is not None for f in report['faults'])} of "
          f"{len(report['faults'])}, of {len(report['kinds_fired'])} kind(s); checkpoint objects not needed: "
          f"{report['checkpoint_objects_not_needed']}; processes left: {len(report['processes_left'])}, "
          f"namespaces left: {len(report['namespaces_left'])}, mounts left: {len(report['mounts_left'])}, "
          f"files left: {len(report['files_left'])}")
    print(f"fidelity: {json.dumps(report['fidelity'])}")
    print(f"report: {path}")
    for line in report["problems"]:
        print(f"PROBLEM: {line}")
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
