"""How a job ended and what `fab train` says about it: the one rule for its outcome (`outcome`: fab and
the run supervisor both read a job's end with it), from its summary.json the figures of a finished run
and exactly what is saved where after a spot reclaim, and the warnings at launch (spot nodes without a
checkpoint URI, nodes with another xeon-cluster than this checkout)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cluster import exit_codes
from cluster.inventory import Inventory
from cluster.job.joblog import RankFailure, first_failure
from cluster.job.jobsummary import PRINTED as SUMMARY_KEYS


def interruption_record(summary: dict) -> tuple[int | None, dict | None, str | None]:
    """From an interrupted run's summary: (the notice's step, the checkpoint record saved at that step
    or None, the run's --checkpoint_uri or None). The job's own last log line reads the same."""
    step = (summary.get("interruption") or {}).get("step")
    record = next((r for r in reversed(summary.get("checkpoints") or []) if r.get("step") == step), None)
    return step, record, (summary.get("settings") or {}).get("checkpoint_uri")


def summary_lines(summary: dict, path: str, master: str) -> list[str]:
    """The run's figures (SUMMARY_KEYS, then its metrics) and its failed checkpoint uploads.
    `summary` as cluster/job/jobsummary.py's `parse` gives it (so are the reports below)."""
    lines = [f"summary ({path} on {master}):"]
    lines += [f"  {key}: {summary[key]}" for key in SUMMARY_KEYS if key in summary]
    lines += [f"  {key}: {value}" for key, value in sorted((summary.get("metrics") or {}).items())
              if not isinstance(value, (dict, list))]
    errors = summary.get("checkpoint_upload_errors") or []
    if errors:
        listed = "; ".join(f"checkpoint-{e['step']}: {e['error']}" for e in errors[:3])
        lines.append(f"  checkpoint upload errors: {len(errors)} of {len(summary.get('checkpoints') or [])} "
                     f"({listed}{'; ...' if len(errors) > 3 else ''}): those exist only on {master}")
    return lines


def reclaim_report(summary: dict | None, master: str, *, managed: bool = False) -> list[str]:
    """After exit 75, from the job's summary: exactly what is saved where, and what is not."""
    resume = ("`fab train --managed` resumes it (below)" if managed else
              "rerun with `fab train --resume` (it continues from the newest checkpoint every node can read)")
    if summary is None:
        return [f"spot capacity was reclaimed, and {master} has no readable summary.json: whether a checkpoint was "
                f"saved is unknown; look for checkpoint-* folders in the output directory on {master}, then {resume}"]
    step, record, uri = interruption_record(summary)
    uploaded = [r for r in summary.get("checkpoints") or [] if r.get("uri")]
    on_s3 = (f"the newest checkpoint on S3 is checkpoint-{uploaded[-1]['step']} ({uploaded[-1]['uri']})" if uploaded
             else "this run uploaded no checkpoint to S3")
    if record is None or record.get("save_error"):
        why = f" ({record['save_error']})" if record else ""
        return [f"spot capacity was reclaimed at step {step}, and no checkpoint was saved at step {step}{why}"
                + (f"; {on_s3}" if uri else "") + f"; {resume}"]
    if uri and record.get("uri"):
        return [f"spot capacity was reclaimed: checkpoint-{step} is saved in {record['path']} on {master} and "
                f"uploaded to {record['uri']}; {resume}"]
    if uri:
        return [f"spot capacity was reclaimed: checkpoint-{step} is saved only in {record['path']} on {master}: its "
                f"upload to {uri} failed ({record.get('upload_error')}), so it is lost if {master} goes",
                f"{on_s3}; {resume}"]
    return [f"spot capacity was reclaimed: checkpoint-{step} is saved only on {master}'s local disk "
            f"({record['path']}), not uploaded (no --checkpoint-uri): it is lost if {master} was reclaimed; {resume}"]


def software_warning(installed: Mapping[str, str], expected: str) -> str | None:
    """One line at launch when a node's installed xeon-cluster is not this checkout's, or None.

    `installed`: node -> the version in its venv's project marker ("" when there is none). The job
    runs the nodes' copy of the toolkit, so a change made here since `fab setup` would not be in it.
    """
    other = {node: version for node, version in installed.items() if version != expected}
    if not other:
        return None
    shown = ", ".join(f"{node} {version or 'none'}" for node, version in other.items())
    return (f"warning: the nodes' xeon-cluster is not this checkout's ({expected}): {shown}; the job runs the "
            "nodes' copy; `fab setup` with the same --cluster installs this one")


def spot_warning(inventory: Inventory, checkpoint_uri: str | None) -> str | None:
    """One line at launch when spot nodes train without --checkpoint-uri, or None."""
    spot = [n.name for n in inventory.nodes if n.spot]  # spot instances: an AWS cluster's (its backend's market)
    if not spot or checkpoint_uri:
        return None
    which = f"{spot[0]} is a spot instance" if len(spot) == 1 else f"{', '.join(spot)} are spot instances"
    return (f"warning: {which} and no --checkpoint-uri is given: a reclaim loses the run's progress (checkpoints "
            "stay on the instance's local disk, which goes with it); add --checkpoint-uri "
            "s3://$(pulumi stack output bucketName)/<run name>")


# ------------------------------------------------------------------------------ how a job ended: one rule

RUNNING, STOPPED, EXITED = "running", "stopped", "exited"
NO_EXIT_CODE = exit_codes.FAILED  # a job that ended without writing its exit code


@dataclass(frozen=True)
class Outcome:
    """How a job ended (`outcome`): its state, its exit code (None when stopped) and what the launcher said."""

    state: str  # STOPPED, EXITED, or what job-state.sh said of a job that left no code (lost, missing)
    code: int | None  # the job's code: the failing rank's program's own where the launcher returned another
    launcher_code: int | None = None  # what the launcher returned (None: nothing written)
    detail: str = ""  # when it was stopped, or job-state.sh's words
    first: RankFailure | None = None  # the rank that failed first on its own


def outcome(state_line: str, log: str | None, rank_hosts: Sequence[str]) -> Outcome | None:
    """The one rule for how a job ended, from the master's job-state.sh line (cluster/job/jobcommands.py's
    STATE_SH) and, when it failed, its log: None while it runs; stopped (`fab stop`); else its exit code, the
    first failing rank's own when the launcher returned another (Intel MPI's 255, torchrun's 1), and
    NO_EXIT_CODE when the job left none."""
    state, _, detail = state_line.strip().partition(" ")
    if state == RUNNING:
        return None
    if state == STOPPED:
        return Outcome(STOPPED, None, detail=detail)
    given = int(detail) if state == EXITED and detail.strip().lstrip("-").isdigit() else None
    code = NO_EXIT_CODE if given is None else given
    first = first_failure(log or "", rank_hosts) if code else None
    if first is not None and first.code is not None:
        code = first.code
    return Outcome(state or "lost", code, given, detail, first)
