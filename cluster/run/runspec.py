"""A supervised run's spec beside its checkpoints (pure): what outlives a lost master, signed.

`fab train --managed` hands the run to a supervisor on the master; the master runs the job and the
supervisor, so a lost master ends the run. What the controller needs to continue it is written at the
hand-off where the checkpoints are kept: `<checkpoint uri>/RUN_FOLDER/SPEC_FILE` with --checkpoint-uri
(S3), and `<output dir>/RUN_FOLDER/SPEC_FILE` on the master (on a local cluster that directory is on the
disk every node shares). `fab train --managed --resume` reads it back (`read`) and starts the run again
(`resumed`) with --resume: the job continues the newest checkpoint every rank can read.

The spec is the run's request (cluster/job/request.py), serialized, with the secret-looking --env
values (cluster/job/secrets.py) WITHHELD (their names listed in "withheld"), and signed: HMAC-SHA256
over its canonical JSON with a key that never leaves the controller (node_setup/ssh/keys.py's
`spec_key`). Every node's role may write the bucket, so `read` checks the signature first and then
every field (RunSpecError, one line naming where it was read): a spec anyone else wrote or changed
(an environment variable added, a training argument added, an interpreter named, the signature
removed) is refused before anything starts. Nothing in it names an interpreter: the node's is the
profile's (cluster/node/profiles.py), and the offline demo is stored as its task and size.

- `signed_text(request, kind, key)`: the spec's text; `withhold(request)`: the request less its secret
  values (the supervisor's spec on the master holds none either: they go to a file of their own).
- `handoff(...)`: the supervisor's spec on the master (the request less its secret values, which go to
  a file of their own, SECRETS_FILE, 0600, removed with the run) and the machines.
- `read(text, where, key, binding)` -> Found: `binding` (a Binding) is what --resume resumes: the
  cluster (name and kind) and where the spec was read; the spec must have been signed for it, so one
  copied over another run's (in the bucket every node may write) or from another cluster is refused.
  The key can be rotated (`fab forget --spec-key`): every spec signed before is refused after.
- `resumed(found, env, run_id, workdir=...)`: the request again, --resume
  set, a new run id, the withheld values given again with --env (RunSpecError naming --env when one is
  missing); for your own program (--script/--module) with its workdir's copy plan made again on this
  controller, checked against the digest the spec recorded (`workdir_changes`): a workdir that changed
  is refused in one line naming the files changed, added and removed (`WorkdirChanges.refusal`) unless
  --workdir-changed-ok says to go on with it, which the new run's request records with the new digest.
  The supervisor then starts the program with the run's newest checkpoint, as after a worker's recovery
  (cluster/run/supervision.py's rule: XEON_CLUSTER_RESUME_FROM and --resume-arg's words).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

from cluster import records
from cluster.job import request as rq
from cluster.job.secrets import secret_looking
from cluster.job.userjob import CopyPlan
from cluster.run import supervision as sv

RUN_FOLDER = "xeon-cluster-run"
FORMAT = 3  # 3: the run id, cluster, kind and checkpoint URI signed beside the request (`Binding`)
WITHHELD = "(withheld)"
SIGNATURE = "signature"
SCHEME = "hmac-sha256"
KINDS = ("aws", "local", "file")
_FIELDS = ("format", "kind", "cluster", "run", "checkpoint_uri", "request", "withheld", SIGNATURE)
CHANGES_SHOWN = 5  # names per kind in the refusal


class RunSpecError(ValueError):
    """A run spec that cannot be resumed; the message is one line naming where it was read and why."""


@dataclass(frozen=True)
class Found:
    request: rq.RunRequest  # with WITHHELD in place of the withheld values
    kind: str  # the kind of cluster it ran on
    withheld: tuple[str, ...]
    cluster: str = ""  # the cluster's name it ran on


@dataclass(frozen=True)
class Binding:
    """What `--resume` resumes, which a spec must have been signed for (`read`): the cluster (its name and
    kind) and where the spec was read: beside the checkpoints of `checkpoint_uri`, or in `output_dir` on
    the master. A spec copied from another run's place, or from another cluster, is refused."""

    cluster: str
    kind: str
    checkpoint_uri: str | None = None
    output_dir: str | None = None


def spec_uri(checkpoint_uri: str) -> str:
    """Where the spec goes beside the checkpoints of --checkpoint-uri (an s3:// URI)."""
    return f"{checkpoint_uri.rstrip('/')}/{RUN_FOLDER}/{sv.SPEC_FILE}"


def spec_path(output_dir: str) -> str:
    """Where the spec goes in the run's output directory on the master."""
    return f"{output_dir.rstrip('/')}/{RUN_FOLDER}/{sv.SPEC_FILE}"


def canonical(data: Any) -> bytes:
    """The one byte string of `data` that is signed: sorted keys, no spaces, ASCII."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def signature(data: dict, key: bytes) -> str:
    """`hmac-sha256:<hex>` over `data` less its signature field."""
    unsigned = {k: v for k, v in data.items() if k != SIGNATURE}
    return f"{SCHEME}:{hmac.new(key, canonical(unsigned), hashlib.sha256).hexdigest()}"


def withhold(request: rq.RunRequest) -> tuple[rq.RunRequest, dict[str, str]]:
    """(the request with WITHHELD in place of its secret-looking --env values, those values by name)."""
    env = request.env_map()
    secrets = {name: env[name] for name in secret_looking(env)}
    return request.with_env({name: WITHHELD for name in secrets}), secrets


def signed_text(request: rq.RunRequest, kind: str, key: bytes, cluster: str = "") -> str:
    """The spec's text for `request` (its secret values withheld) on the cluster `cluster` of `kind`, signed
    with `key`: the run id, cluster, kind and checkpoint URI are signed with it (`Binding`)."""
    kept, secrets = withhold(request)
    data: dict[str, Any] = {"format": FORMAT, "kind": kind, "cluster": cluster, "run": request.run_id,
                            "checkpoint_uri": _uri(request.checkpoint_uri), "request": kept.to_mapping(),
                            "withheld": sorted(secrets)}
    data[SIGNATURE] = signature(data, key)
    return json.dumps(data, indent=2) + "\n"


def handoff(request: rq.RunRequest, *, kind: str, run_nodes: dict, cluster: dict, instance_ids: dict[str, str],
            context: dict[str, Any], poll_s: float = 5.0) -> tuple[dict[str, Any], dict[str, str]]:
    """(the supervisor's spec on the master, the secret values kept apart from it): the request with its
    secret values withheld, the run's nodes and the whole cluster (inventory mappings: the idle auto-stop's
    node list names a replacement too), their instance ids, the backend's `run_context` entries."""
    kept, secrets = withhold(request)
    spec = {"request": kept.to_mapping(), "kind": kind, "inventory": run_nodes, "cluster": cluster,
            "instance_ids": dict(instance_ids), "poll_seconds": poll_s, **context}
    return spec, secrets


def _uri(uri: str | None) -> str | None:
    return uri.rstrip("/") if uri else None


def read(text: str | bytes | None, where: str, key: bytes, binding: Binding | None = None) -> Found:
    """The spec read back: its signature checked against `key` first, then every field, then that it was
    signed for `binding` (what --resume resumes; RunSpecError: one line naming `where`)."""
    def bad(what: str) -> RunSpecError:
        return RunSpecError(f"{where}: {what}; it is not a run spec `fab train --managed` wrote on this controller, "
                            "so the run cannot be resumed from it")

    try:  # the one reader of a record from elsewhere (cluster/records.py): size, nesting, numbers bounded
        found = records.load(text, where)
    except records.RecordError as exc:
        raise bad(exc.why) from None
    if not isinstance(found, dict):
        raise bad("not a JSON object")
    given = found.get(SIGNATURE)
    if not isinstance(given, str) or not given:
        raise bad("it is not signed")
    try:
        expected = signature(found, key)
    except ValueError:  # a value canonical JSON refuses (nan)
        raise bad("its signature does not match its content (written or changed by someone else)") from None
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise bad("its signature does not match its content (written or changed by someone else)")
    if found.get("format") != FORMAT:
        raise bad(f"format {found.get('format')!r}, allowed {FORMAT}")
    unknown = sorted(set(found) - set(_FIELDS))
    if unknown:
        raise bad(f"unknown field {unknown[0]!r}")
    if found.get("kind") not in KINDS:
        raise bad(f"kind {found.get('kind')!r}, allowed {', '.join(KINDS)}")
    try:
        request = rq.RunRequest.from_mapping(found.get("request"))
    except rq.RequestError as exc:
        raise bad(str(exc)) from None
    withheld = found.get("withheld")
    marked = sorted(name for name, value in request.env if value == WITHHELD)
    if not isinstance(withheld, list) or sorted(withheld) != marked:
        raise bad(f"withheld: allowed the names of the --env values written as {WITHHELD}")
    if request.own is not None and request.own.workdir_files is None:
        raise bad("it ran your own program (--script/--module) and records no digest of its workdir to check the "
                  "workdir against; start it again with `fab train --managed --script ...`")
    if request.managed is None:
        raise bad("it has no --managed settings")
    if found.get("run") != request.run_id or found.get("checkpoint_uri") != _uri(request.checkpoint_uri) \
            or not isinstance(found.get("cluster"), str):
        raise bad("its run id, cluster or checkpoint URI is not the run's it holds")
    if binding is not None:
        _check_binding(found, request, binding, where)
    return Found(request, found["kind"], tuple(withheld), found["cluster"])


def _check_binding(found: dict, request: rq.RunRequest, binding: Binding, where: str) -> None:
    """RunSpecError unless the spec was signed for the run `binding` names (see Binding)."""
    def elsewhere(what: str) -> RunSpecError:
        return RunSpecError(f"{where}: it was signed for {what} (a spec copied from another run's place or "
                            "cluster); this run cannot be resumed from it")

    for what, signed, here in (("cluster", found["cluster"], binding.cluster), ("kind", found["kind"], binding.kind)):
        if signed != here:
            raise elsewhere(f"{what} {signed!r}, not this {what} {here!r}")
    if binding.checkpoint_uri is not None and found["checkpoint_uri"] != _uri(binding.checkpoint_uri):
        raise elsewhere(f"the run of checkpoint URI {found['checkpoint_uri']!r}, not {_uri(binding.checkpoint_uri)!r}")
    directory = (request.output_dir or "").rstrip("/")
    if binding.output_dir is not None and directory != binding.output_dir.rstrip("/"):
        raise elsewhere(f"the run of output directory {request.output_dir!r}, not {binding.output_dir!r}")


@dataclass(frozen=True)
class WorkdirChanges:
    """How the workdir on this controller differs from the digest a run recorded: paths, each sorted."""

    changed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.changed or self.added or self.removed)

    def refusal(self, workdir: str, run_id: str) -> str:
        """The one line that refuses the resume: which files changed, were added or removed, and how to go on."""
        parts = []
        for kind, paths in (("changed", self.changed), ("added", self.added), ("removed", self.removed)):
            if paths:
                more = f" and {len(paths) - CHANGES_SHOWN} more" if len(paths) > CHANGES_SHOWN else ""
                parts.append(f"{kind}: {', '.join(paths[:CHANGES_SHOWN])}{more}")
        return (f"--resume: the workdir {workdir} is not as run {run_id} recorded it ({'; '.join(parts)}); the run "
                f"copies it again from here: restore those files to continue the run as it was, or give "
                f"{rq.CHANGED_OK_OPTION} to continue with the workdir as it is now (recorded with the run)")


def workdir_changes(recorded: tuple[tuple[str, str], ...], now: tuple[tuple[str, str], ...]) -> WorkdirChanges:
    """The difference between two workdir digests (cluster/job/request.py's `workdir_digest`)."""
    before, after = dict(recorded), dict(now)
    return WorkdirChanges(changed=tuple(sorted(p for p in before.keys() & after.keys() if before[p] != after[p])),
                          added=tuple(sorted(after.keys() - before.keys())),
                          removed=tuple(sorted(before.keys() - after.keys())))


def resumed(found: Found, env: dict[str, str], run_id: str, *, workdir: CopyPlan | None = None,
            workdir_changed_ok: bool = False) -> rq.RunRequest:
    """The run of `found` again: a new run id, --resume, the withheld --env values from `env`; its output
    directory, node count, layout, program and --managed settings as they were. Your own program's: with
    `workdir`, its workdir's copy plan made again on this controller, refused when it is not as recorded
    unless `workdir_changed_ok` (RunSpecError: one line)."""
    missing = [name for name in found.withheld if not env.get(name)]
    if missing:
        raise RunSpecError(f"--env: {', '.join(missing)} withheld from the run's spec (it looks like a secret); give "
                           f"it again with the resume, e.g. --env '{missing[0]}=...'")
    request = found.request.with_env({name: env[name] for name in found.withheld})
    own = request.own
    if own is None:
        if workdir_changed_ok:
            raise RunSpecError(f"{rq.CHANGED_OK_OPTION}: run {request.run_id} ran the built-in job, which copies no "
                               "workdir; leave it out")
    else:
        assert workdir is not None and own.workdir_files is not None  # the caller scanned it; `read` checked
        now = rq.workdir_digest(workdir)
        changes = workdir_changes(own.workdir_files, now)
        if changes and not workdir_changed_ok:
            raise RunSpecError(changes.refusal(own.workdir, request.run_id))
        program = dataclasses.replace(own, workdir_files=now, workdir_changed_ok=workdir_changed_ok, copy=workdir)
        request = dataclasses.replace(request, program=program)
    return dataclasses.replace(request, run_id=sv.check_run_id(run_id), resume=True)
