"""The run supervisor's decisions (pure): what a lost worker is, which replacement may join, what the
run's record on the master says.

The supervisor (node_setup/supervisor/) runs on the master, beside the job, and survives the
controller: `fab train --managed` hands it the run's spec and may go away. What it decides is here,
so that the same rules hold on a local cluster, on AWS and in the tests' fake backend:

- `loss_cause(...)`: a worker is lost when its watcher saw a spot notice (the node's metadata
  service announced the interruption), or when it stopped answering SSH for SILENT_PROBES probes in a
  row AND its instance's state says it is gone (the group's view: EC2's state, the local group
  keeper's record). A silent worker whose instance still runs is not replaced (nothing would come).
- `replacement(...)`: the member of the group that stands in for a lost node: the same name (slot),
  another instance id, running.
- `host_key_verdict(...)`: a replacement joins only with the host key its own console lists
  (cluster/node/console.py): no key or no fingerprints yet is a wait, for as long as its instance type
  may take to boot (`boot_wait_s`: cluster/stack/catalog.py's budget, 40 minutes for a metal type) and,
  while a recovery waits for it, until --wait-for-capacity runs out (`replacement_wait_s`); none by then,
  or another key, is a refusal, one line each. A refused replacement is handed back to the group (the
  loop: node_setup/supervisor/loop.py), which launches another.
- `steps_redone(...)`: the work a recovery repeats.
- The run's record on the master (RUN_ROOT/<run id>/): SPEC_FILE (what the controller handed over),
  STATE_FILE (what `fab status` reads), LOG_FILE (what `fab train --managed` and `fab logs` follow).
"""

from __future__ import annotations

import re
import shlex
import signal
import time
from dataclasses import dataclass

from cluster import records
from cluster.node.console import describe, fingerprint, parse_console
from cluster.stack.catalog import boot_wait_s
from xeon_cluster import RESUME_FROM_VARIABLE

RUN_ROOT = ".xeon-cluster/supervisor"  # in the SSH user's home on the master
CURRENT_LINK = f"{RUN_ROOT}/current"  # the newest supervised run
SPEC_FILE, STATE_FILE, LOG_FILE, STOP_FILE = "spec.json", "state.json", "log", "stop"
SECRETS_FILE = "secrets.json"  # the run's secret --env values (0600), apart from its spec; removed with the run
RUN_ID_RE = re.compile(r"^[0-9]{8}-[0-9]{6}-[0-9a-f]{4}\Z")  # a run is named after its first job's id
SUPERVISOR_MODULE = "node_setup.supervisor"  # `python -m` on the master, in the node venv
RESPAWN_MODULE = "node_setup.supervisor.respawn"  # its keeper where no systemd unit runs it
SYSTEMD_UNIT_PREFIX = "xeon-cluster-supervisor-"  # AWS: a transient unit per run (systemd-run)
# A supervisor killed (SIGKILL, the OOM killer, a crash) is started again after RESTART_DELAY_S and carries on
# from its state file: the unit's Restart=on-abnormal on AWS, node_setup/supervisor/respawn.py elsewhere.
RESTART_POLICY = "on-abnormal"
RESTART_DELAY_S = 5
CLEAN_STOP_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGPIPE, signal.SIGTERM)  # systemd's clean ends

NOTICE, SILENT = "spot notice", "unreachable"  # a recovery's cause
SILENT_PROBES = 3  # unanswered SSH probes in a row before the instance's state is asked
GONE_STATES = ("shutting-down", "terminated", "stopping", "stopped", "gone")

# What a run's state file says (`fab status --json`'s "supervised" object). MASTER_LEAVING is not final: the
# master's own spot notice, after which a new master's boot step continues the run (node_setup/supervisor/boot.py).
STARTING, RUNNING, RECOVERING, COMPLETED, FAILED, STOPPED, MASTER_LEAVING = (
    "starting", "running", "recovering", "completed", "failed", "stopped", "master-leaving")
FINAL = (COMPLETED, FAILED, STOPPED)
MASTER_REPLACED = "master replaced"  # a recovery's cause: a new master continued the run

# The user's own program (`fab train --managed --script/--module`): after a recovery it is restarted
# with the run's newest checkpoint in RESUME_FROM_VARIABLE and in the arguments of `--resume-arg`.
# The newest checkpoint: the folder named checkpoint-N or checkpoint_N with the highest N, directly in
# the output directory (Trainer's output_dir) or in its CHECKPOINTS_FOLDER (accelerate's
# save_state with automatic_checkpoint_naming), holding at least one file.
CHECKPOINT_PLACEHOLDER = "{checkpoint}"
CHECKPOINTS_FOLDER = "checkpoints"
CHECKPOINT_FOLDER_RE = re.compile(r"^checkpoint[-_]([0-9]{1,12})\Z")
_RESUME_WORD_RE = re.compile(r"^[A-Za-z0-9_.,:=/+@%{}-]{1,200}\Z")
_CHECKPOINT_PATH_RE = re.compile(r"^/[A-Za-z0-9_./+@-]{1,4000}\Z")


class SupervisionError(ValueError):
    """A run spec the supervisor cannot use; the message names the field and what is allowed."""


@dataclass(frozen=True)
class Member:
    """One machine of the cluster's group as the backend sees it now."""

    name: str  # the node's alias (its slot: node1, or the worker index on AWS)
    address: str
    instance_id: str
    state: str = "running"
    instance_type: str = ""  # its EC2 type, when the group says ("": not known, waited for as long as metal)


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not RUN_ID_RE.match(run_id):
        raise SupervisionError(f"run id: {run_id!r} is not allowed; allowed: a job id such as 20261123-101500-ab12")
    return run_id


def loss_cause(*, notice: str | None, silent_probes: int, instance_state: str | None) -> str | None:
    """NOTICE, SILENT or None (not lost, or not yet confirmed)."""
    if notice:
        return NOTICE
    if silent_probes >= SILENT_PROBES and (instance_state or "gone") in GONE_STATES:
        return SILENT
    return None


def replacement(name: str, old_instance_id: str, members: dict[str, Member]) -> Member | None:
    """The running member in `name`'s slot that is another machine than the lost one, or None."""
    found = members.get(name)
    if found is None or found.state != "running" or found.instance_id == old_instance_id:
        return None
    return found


@dataclass(frozen=True)
class KeyVerdict:
    outcome: str  # "verified", "wait" or "refused"
    line: str  # what the supervisor says
    key: str = ""  # "type base64" of the verified key

    @property
    def verified(self) -> bool:
        return self.outcome == "verified"


def replacement_wait_s(member: Member, *, recovery_left_s: float = 0.0) -> float:
    """How long a replacement may take to present a host key its console lists: its instance type's boot
    (a type not known: a metal type's), or what is left of a recovery's --wait-for-capacity when longer
    (cloud-init prints the fingerprints at the end of boot, after sshd answers)."""
    return max(float(boot_wait_s(member.instance_type)), recovery_left_s)


def host_key_verdict(member: Member, presented: str | None, console_text: str, *, waited_s: float,
                     wait_s: float | None = None) -> KeyVerdict:
    """Whether the replacement's presented host key ("type base64", from ssh-keyscan) is one its
    console lists; a wait while it presents none or the console lists none yet and `wait_s` (default: its
    type's boot, replacement_wait_s) is not over."""
    wait_s = replacement_wait_s(member) if wait_s is None else wait_s
    console = parse_console(console_text)
    who = f"{member.name} ({member.instance_id})"
    if not presented:
        if waited_s < wait_s:
            return KeyVerdict("wait", f"{who}: no host key presented yet")
        return KeyVerdict("refused", f"{who}: refused: it presented no host key in {wait_s:g} s")
    kind, _, b64 = presented.strip().partition(" ")
    b64 = b64.split()[0] if b64 else ""
    if not console.fingerprints:
        if waited_s < wait_s:
            return KeyVerdict("wait", f"{who}: its console lists no host key fingerprints yet")
        return KeyVerdict("refused", f"{who}: refused: its console listed no host key fingerprints in {wait_s:g} s, "
                                     "so its key cannot be verified")
    match = console.match(kind, b64)
    if match is None:
        return KeyVerdict("refused", f"{who}: refused: it presented {kind} {fingerprint(b64) or '(not base64)'}, "
                                     f"but its console lists {describe(console)} (another machine answers at "
                                     f"{member.address}, or its key changed)")
    return KeyVerdict("verified", f"{who}: host key {match} verified from its console", f"{kind} {b64}")


def steps_redone(stopped_step: int | None, checkpoint_step: int | None) -> int | None:
    """Optimizer steps between the checkpoint resumed from and where the job stopped."""
    if stopped_step is None:
        return None
    return max(0, int(stopped_step) - int(checkpoint_step or 0))


def state_record(*, run_id: str, status: str, job_id: str | None, nodes: list[str], recoveries: list[dict],
                 output_dir: str, at: float, pid: int | None = None, line: str = "",
                 pending: list[str] | None = None, restart: dict | None = None, keeper: int | None = None,
                 replaced: list[dict] | None = None) -> dict:
    """The run's state file: what `fab status` shows of a supervised run, and in `restart` what a supervisor
    started again after its process ended carries on from (node_setup/supervisor/loop.py); `keeper`: the pid
    of the process that starts it again (its parent: node_setup/supervisor/respawn.py, or systemd's);
    `replaced`: each master replacement the run went through (`replaced_entry`)."""
    return {"run": run_id, "status": status, "job": job_id, "nodes": list(nodes), "recoveries": len(recoveries),
            "output_dir": output_dir, "updated": round(at, 1), "pid": pid, "keeper": keeper, "line": line,
            "awaiting": list(pending or []), "restart": dict(restart or {}), "replaced": list(replaced or [])}


def replaced_entry(*, at: float, address: str, step: int | None, job_id: str) -> dict:
    """One master replacement in the state: when the new master took the run over, its address, the
    checkpoint the run continued from and the job it continued as."""
    return {"at": round(at, 1), "address": address, "step": step, "job": job_id}


def replaced_line(entry: dict) -> str:
    """What `fab status` says of a master replacement no one watched."""
    step = entry.get("step")
    return (f"master replaced at {time.strftime('%H:%M:%S', time.gmtime(float(entry.get('at') or 0)))} (new address "
            f"{entry.get('address')}); run continued from "
            + (f"checkpoint-{step}" if step is not None else "its start (no checkpoint)")
            + f" as job {entry.get('job')}")


def start_command(run_id: str, python: str, *, systemd: bool) -> str:
    """The shell command (run in the SSH user's home) that starts the supervisor of the run whose directory is
    RUN_ROOT/<run id>, detached: a transient systemd unit (`systemd`: a machine of its own), else `setsid nohup`
    under its keeper (node_setup/supervisor/respawn.py). Killed, either starts it again, and it carries on from its
    state file (node_setup/supervisor/loop.py). Used by `fab train --managed` and a new master's boot step."""
    d = f"{RUN_ROOT}/{check_run_id(run_id)}"
    qd, py = shlex.quote(d), shlex.quote(python)
    command = f"{py} -m {SUPERVISOR_MODULE} run \"$HOME\"/{qd}"
    if systemd:
        unit = shlex.quote(f"{SYSTEMD_UNIT_PREFIX}{run_id}")
        start = (f"sudo systemd-run --quiet --unit {unit} --uid \"$(id -u)\" --gid \"$(id -g)\" "
                 f"--property Restart={RESTART_POLICY} --property RestartSec={RESTART_DELAY_S} "
                 f"--setenv HOME=\"$HOME\" --working-directory \"$HOME\" "
                 f"/bin/sh -c {shlex.quote(f'exec {command} >> {d}/{LOG_FILE} 2>&1')}")
    else:
        start = (f"(setsid nohup {py} -m {RESPAWN_MODULE} \"$HOME\"/{qd} -- {command} </dev/null "
                 f">> {qd}/{LOG_FILE} 2>&1 &)")
    return f"cd && ln -sfn {shlex.quote(run_id)} {shlex.quote(CURRENT_LINK)} && {start}"


def log_line(at: float, line: str) -> str:
    """One line of the run's log (LOG_FILE), as `fab logs` shows the supervisor's lines."""
    return f"managed: [{time.strftime('%H:%M:%S', time.gmtime(at))}] {line}\n"


def restarted(returncode: int, status: str | None) -> bool:
    """Whether the supervisor's process is started again after it ended with `returncode` (a negative one:
    the signal that ended it) while its run's state said `status`: killed by a signal other than a clean
    stop's (systemd's Restart=on-abnormal, the unit's on AWS; the local respawner's rule too), before its
    run ended."""
    return returncode < 0 and -returncode not in CLEAN_STOP_SIGNALS and status not in FINAL


def _texts(value: object) -> bool:
    return isinstance(value, list) and all(records.is_printable(v) for v in value)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# The state file's fields as `state_record` writes them: what each must be to be kept.
_STATE_FIELDS = {
    "run": (lambda v: isinstance(v, str) and bool(RUN_ID_RE.fullmatch(v)), "a run id"),
    "job": (lambda v: v is None or (isinstance(v, str) and bool(RUN_ID_RE.fullmatch(v))), "null or a job id"),
    "nodes": (_texts, "a list of node names"), "awaiting": (_texts, "a list of node names"),
    "recoveries": (_count, "a whole number"), "output_dir": (records.is_printable, "a path"),
    "updated": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "epoch seconds"),
    "pid": (lambda v: v is None or _count(v), "null or a pid"), "keeper": (lambda v: v is None or _count(v), "a pid"),
    "line": (records.is_printable, "one line of printable text"),
    "restart": (lambda v: isinstance(v, dict), "a map"),
    "replaced": (lambda v: isinstance(v, list) and all(_replaced(e) for e in v), "a list of master replacements"),
}
STATUSES = (STARTING, RUNNING, RECOVERING, MASTER_LEAVING, *FINAL)


def _replaced(entry: object) -> bool:
    return (isinstance(entry, dict) and set(entry) == {"at", "address", "step", "job"}
            and isinstance(entry["at"], (int, float)) and not isinstance(entry["at"], bool)
            and isinstance(entry["address"], str) and records.is_printable(entry["address"])
            and (entry["step"] is None or _count(entry["step"]))
            and isinstance(entry["job"], str) and bool(RUN_ID_RE.fullmatch(entry["job"])))


def checked_state(value: object, where: str) -> tuple[dict | None, list[str]]:
    """A state file read back from the master (cluster/records.py load's value), its fields typed: (the
    state with a malformed field left out, one line for each), or (None, [why]) when it has no known status
    and run id or is not an object; (None, []) for no state file."""
    if value is None:
        return None, []
    known_run = _STATE_FIELDS["run"][0]
    if not isinstance(value, dict) or value.get("status") not in STATUSES or not known_run(value.get("run")):
        return None, [f"{where}: not a supervised run's state (no known status and run id); not read"]
    state, problems = dict(value), []
    for key, (check, allowed) in _STATE_FIELDS.items():
        if key in state and not check(state[key]):
            problems.append(f"{where}: {key} left out; allowed: {allowed}")
            del state[key]
    return state, problems


def status_line(state: dict) -> str:
    """`fab status`'s line for a supervised run."""
    waiting = f"; awaiting {', '.join(state['awaiting'])}" if state.get("awaiting") else ""
    return (f"supervised run {state.get('run')}: {state.get('status')} (job {state.get('job') or '-'}, "
            f"{len(state.get('nodes') or [])} node(s), {state.get('recoveries', 0)} recovery(ies){waiting})"
            + (f": {state['line']}" if state.get("line") else "")
            + "".join(f"; {replaced_line(e)}" for e in state.get("replaced") or []))


def resume_words(template: str) -> tuple[str, ...]:
    """`--resume-arg`: the words the restarted program gets, one of them holding CHECKPOINT_PLACEHOLDER
    (e.g. "--resume_from_checkpoint {checkpoint}"); SupervisionError naming the setting otherwise."""
    words = tuple(template.split())
    allowed = (f"allowed: the program's own words with {CHECKPOINT_PLACEHOLDER} where the checkpoint folder goes, "
               f"e.g. '--resume_from_checkpoint {CHECKPOINT_PLACEHOLDER}' (letters, digits and _.,:=/+@%- only)")
    if not words or not any(CHECKPOINT_PLACEHOLDER in w for w in words):
        raise SupervisionError(f"--resume-arg: {template!r} has no {CHECKPOINT_PLACEHOLDER}; {allowed}")
    bad = next((w for w in words if not _RESUME_WORD_RE.match(w)
                or set("{}") & set(w.replace(CHECKPOINT_PLACEHOLDER, ""))), None)
    if bad is not None:
        raise SupervisionError(f"--resume-arg: the word {bad!r} is not allowed; {allowed}")
    return words


def newest_checkpoint_folder(folders: dict[str, int]) -> tuple[str, int] | None:
    """Of the candidate folders (path relative to the output directory -> the number of files in it),
    the newest checkpoint by the rule above: (its relative path, N), or None."""
    best: tuple[str, int] | None = None
    for path, files in sorted(folders.items()):
        parent, _, name = path.rpartition("/")
        found = CHECKPOINT_FOLDER_RE.match(name)
        if not found or parent not in ("", CHECKPOINTS_FOLDER) or files < 1:
            continue
        if best is None or int(found.group(1)) > best[1]:
            best = (path, int(found.group(1)))
    return best


def restart_arguments(args: tuple[str, ...], words: tuple[str, ...], checkpoint: str | None
                      ) -> tuple[tuple[str, ...], dict[str, str]]:
    """The restarted program's arguments and environment: its own `args`, then `words` with the
    checkpoint's absolute path filled in, and RESUME_FROM_VARIABLE; unchanged without a checkpoint."""
    if checkpoint is None:
        return tuple(args), {}
    if not _CHECKPOINT_PATH_RE.match(checkpoint) or "/../" in checkpoint + "/":
        raise SupervisionError(f"checkpoint folder: {checkpoint!r} is not allowed; allowed: an absolute path of "
                               "letters, digits and _./+@-")
    filled = tuple(w.replace(CHECKPOINT_PLACEHOLDER, checkpoint) for w in words)
    return tuple(args) + filled, {RESUME_FROM_VARIABLE: checkpoint}
