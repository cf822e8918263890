"""A supervised run's spec beside its checkpoints (pure): what outlives a lost master.

`fab train --managed` hands the run to a supervisor on the master; the master runs the job and the
supervisor, so a lost master ends the run. What the controller needs to continue it is written at the
hand-off where the checkpoints are kept: `<checkpoint uri>/RUN_FOLDER/SPEC_FILE` with --checkpoint-uri
(S3), and `<output dir>/RUN_FOLDER/SPEC_FILE` on the master (on a local cluster that directory is on the
disk every node shares). `fab train --managed --resume` reads it back (`read`) and starts the run again
(`resumed`) with the same arguments and --resume: the job continues the newest checkpoint every rank can
read.

- `portable(spec)`: from the supervisor's spec (node_setup/tasks/managed.py's run_spec), the fields that
  do not depend on the machines (no addresses, instance ids, host keys): the job's arguments, the demo
  data's preparation, the layout, the node count, the program and its --resume-arg, the output
  directory, the --managed settings, the run id. An --env value whose name or value looks like a
  secret (cluster/job/k8s.py's `secret_looking`) is WITHHELD, its name listed in "withheld".
- `read(text, where)`: the file checked whole, every value as it enters (it comes from a bucket):
  RunSpecError, one line naming `where`, otherwise.
- `resumed(found, env)`: the training arguments with --resume and the layout with the withheld values
  given again with --env (RunSpecError naming --env when one is missing).
"""

from __future__ import annotations

import json
import re
from typing import Any

from cluster.run import supervision as sv
from cluster.job.job_args import SYNTHETIC_ROOT, TASKS, synthetic_data
from cluster.job.k8s import secret_looking

RUN_FOLDER = "xeon-cluster-run"
FORMAT = 1
WITHHELD = "(withheld)"
RESUME = "--resume"
KINDS = ("aws", "local", "file")
_ARG_RE = re.compile(r"^[^\x00-\x1f\x7f]{0,4000}\Z")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
_OUTPUT_DIR_RE = re.compile(r"^[A-Za-z0-9_./+@-]{1,4000}\Z")
_SYNTHETIC_RE = re.compile(r"^\[ -f (?:')?" + re.escape(SYNTHETIC_ROOT)
                           + r"/synthetic-(?P<task>[a-z]+)(?:-(?P<n>[0-9]{1,9}))?"
                           r"/train\.json(?:')? \] \|\| (?P<python>/[A-Za-z0-9_./+-]{1,400}/bin/python) -m ")
_LAYOUT_COUNTS = ("ranks_per_node", "threads_per_rank", "ccl_workers")
_LAYOUT_KEYS = (*_LAYOUT_COUNTS, "pin", "extra_env", "launcher", "min_nodes", "max_restarts")


class RunSpecError(ValueError):
    """A run spec that cannot be resumed; the message is one line naming where it was read and why."""


def spec_uri(checkpoint_uri: str) -> str:
    """Where the spec goes beside the checkpoints of --checkpoint-uri (an s3:// URI)."""
    return f"{checkpoint_uri.rstrip('/')}/{RUN_FOLDER}/{sv.SPEC_FILE}"


def spec_path(output_dir: str) -> str:
    """Where the spec goes in the run's output directory on the master."""
    return f"{output_dir.rstrip('/')}/{RUN_FOLDER}/{sv.SPEC_FILE}"


def portable(spec: dict) -> dict:
    """The supervisor's spec less what belongs to the machines, secret-looking --env values withheld."""
    layout = dict(spec.get("layout") or {})
    env = {str(k): str(v) for k, v in (layout.get("extra_env") or {}).items()}
    withheld = sorted(secret_looking(env))
    layout["extra_env"] = {k: (WITHHELD if k in withheld else v) for k, v in env.items()}
    return {"format": FORMAT, "run_id": sv.check_run_id(spec["run_id"]), "kind": spec["kind"],
            "nodes": len(spec["inventory"]["hosts"]), "training_args": list(spec["training_args"]),
            "prepare": list(spec.get("prepare") or ()), "layout": layout, "withheld": withheld,
            "output_dir": spec["output_dir"], "program": spec.get("program"), "resume_arg": spec.get("resume_arg", ""),
            "max_recoveries": spec["max_recoveries"], "min_nodes": spec["min_nodes"],
            "wait_seconds": spec["wait_seconds"]}


def text(spec: dict) -> str:
    return json.dumps(portable(spec), indent=2) + "\n"


def _whole(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def read(text_: str | bytes | None, where: str) -> dict:
    """The spec read back, every field checked (RunSpecError: one line naming `where` and the field)."""
    def bad(what: str) -> RunSpecError:
        return RunSpecError(f"{where}: {what}; it is not a run spec `fab train --managed` wrote, so the run cannot "
                            "be resumed from it")

    try:
        found = json.loads(text_) if text_ is not None else None
    except ValueError as exc:
        raise bad(f"not JSON ({exc})") from None
    if not isinstance(found, dict):
        raise bad("not a JSON object")
    if found.get("format") != FORMAT:
        raise bad(f"format {found.get('format')!r}, allowed {FORMAT}")
    try:
        sv.check_run_id(found.get("run_id"))  # type: ignore[arg-type]
    except sv.SupervisionError as exc:
        raise bad(str(exc)) from None
    if found.get("kind") not in KINDS:
        raise bad(f"kind {found.get('kind')!r}, allowed {', '.join(KINDS)}")
    if not _whole(found.get("nodes"), 1, 10000):
        raise bad(f"nodes {found.get('nodes')!r}, allowed a whole number of 1 or more")
    args = found.get("training_args")
    if not isinstance(args, list) or not all(isinstance(a, str) and _ARG_RE.match(a) for a in args):
        raise bad("training_args: allowed a list of one-line texts")
    if found.get("program"):
        raise bad("it ran your own program (--script/--module), whose workdir was on the master; start it again "
                  "with `fab train --managed --script ...`")
    if not isinstance(found.get("output_dir"), str) or not _OUTPUT_DIR_RE.match(found["output_dir"]) \
            or ".." in found["output_dir"].split("/"):
        raise bad(f"output_dir {found.get('output_dir')!r}, allowed a path of letters, digits and _./+@-")
    if not _whole(found.get("max_recoveries"), 0, 1000) or not _whole(found.get("min_nodes"), 1, found["nodes"]):
        raise bad(f"max_recoveries {found.get('max_recoveries')!r} or min_nodes {found.get('min_nodes')!r} out of "
                  f"range (0 or more; 1 to {found['nodes']})")
    wait = found.get("wait_seconds")
    if not isinstance(wait, (int, float)) or isinstance(wait, bool) or not 0 <= wait <= 7 * 86400:
        raise bad(f"wait_seconds {wait!r}, allowed 0 to a week")
    _check_layout(found.get("layout"), found.get("withheld"), bad)
    _check_prepare(found.get("prepare"), bad)
    return found


def _check_layout(layout: Any, withheld: Any, bad) -> None:
    if not isinstance(layout, dict) or set(layout) - set(_LAYOUT_KEYS):
        raise bad(f"layout: allowed an object of {', '.join(_LAYOUT_KEYS)}")
    for key in _LAYOUT_COUNTS:
        if layout.get(key) is not None and not _whole(layout[key], 0, 4096):
            raise bad(f"layout {key} {layout[key]!r}, allowed a whole number")
    if layout.get("pin") not in (None, True, False) or layout.get("launcher", "mpirun") != "mpirun" \
            or layout.get("min_nodes") is not None or layout.get("max_restarts") is not None:
        raise bad("layout: pin true, false or null; launcher mpirun; no torchrun settings")
    env = layout.get("extra_env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and _ENV_NAME_RE.match(k) and isinstance(v, str)
                                            and _ARG_RE.match(v) for k, v in env.items()):
        raise bad("layout extra_env: allowed NAME: one-line value")
    if not isinstance(withheld, list) or sorted(withheld) != sorted(k for k, v in env.items() if v == WITHHELD):
        raise bad("withheld: allowed the names of the --env values written as " + WITHHELD)


def _check_prepare(prepare: Any, bad) -> None:
    """The preparation may only be the offline demo's data (cluster/job/job_args.py's synthetic_data), rebuilt
    here from its task and size and compared whole: nothing else from the file runs on a node."""
    if not isinstance(prepare, list):
        raise bad("prepare: allowed a list")
    for command in prepare:
        found = _SYNTHETIC_RE.match(command) if isinstance(command, str) else None
        if found is None or found.group("task") not in TASKS or \
                command != synthetic_data(found.group("task"), int(found.group("n")) if found.group("n") else None,
                                          found.group("python")).prepare:
            raise bad(f"prepare: {str(command)[:80]!r} is not the offline demo's data step")


def resumed(found: dict, env: dict[str, str]) -> tuple[list[str], dict]:
    """(the training arguments with --resume, the layout with the withheld --env values from `env`)."""
    missing = [name for name in found["withheld"] if not env.get(name)]
    if missing:
        raise RunSpecError(f"--env: {', '.join(missing)} withheld from the run's spec (it looks like a secret); give "
                           f"it again with the resume, e.g. --env '{missing[0]}=...'")
    layout = dict(found["layout"])
    layout["extra_env"] = {k: (env[k] if v == WITHHELD else v) for k, v in (layout.get("extra_env") or {}).items()}
    args = list(found["training_args"])
    return (args if RESUME in args else [*args, RESUME]), layout
