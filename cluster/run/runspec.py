"""A supervised run's spec beside its checkpoints (pure): what outlives a lost master, signed.

`fab train --managed` hands the run to a supervisor on the master; the master runs the job and the
supervisor. What a new master (node_setup/supervisor/boot.py) and the controller need to continue it is written at the
hand-off where the checkpoints are kept: `<checkpoint uri>/RUN_FOLDER/SPEC_FILE` with --checkpoint-uri
(S3), and `<output dir>/RUN_FOLDER/SPEC_FILE` on the master (on a local cluster that directory is on the
disk every node shares). `fab train --managed --resume` reads it back (`read`) and starts the run again
(`resumed`) with --resume: the job continues the newest checkpoint every rank can read.

The spec is the run's request (cluster/job/request.py), serialized, with the secret-looking --env
values (cluster/job/secrets.py) WITHHELD (their names listed in "withheld"), and signed: an Ed25519
signature over its canonical JSON (node_setup/spec_signing.py) with a key whose private half never leaves
the controller (node_setup/ssh/keys.py's `spec_key`) and whose public half a new master gets through its boot
script, so the master verifies the spec as the controller does. Every node's role may write the bucket (and
the disk every local node shares), so `read` checks the signature first and then
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
import json
from dataclasses import dataclass
from typing import Any, Protocol

from cluster import names, records
from cluster.job import request as rq
from cluster.job.secrets import secret_looking
from cluster.job.userjob import CopyPlan
from cluster.run import supervision as sv

RUN_FOLDER = "xeon-cluster-run"
FORMAT = 4  # 4: an Ed25519 signature, and the supervisor's hand-off (`handoff`) a new master starts from
WITHHELD = "(withheld)"
SIGNATURE = "signature"
HANDOFF = "handoff"
KINDS = ("aws", "local", "file")
_FIELDS = ("format", "kind", "cluster", "run", "checkpoint_uri", "request", "withheld", HANDOFF, SIGNATURE)


class Key(Protocol):
    """The run-spec key (node_setup/spec_signing.py's SpecKey): the controller signs, anyone with its public half
    verifies."""
    def sign(self, data: bytes) -> str: ...
    def verify(self, data: bytes, signature: str) -> bool: ...
CHANGES_SHOWN = 5  # names per kind in the refusal


class StoreError(RuntimeError):
    """The run's secret store cannot be used (node_setup/aws/run_secrets.py, its local double); one line."""


class RunSpecError(ValueError):
    """A run spec that cannot be resumed; the message is one line naming where it was read and why."""


@dataclass(frozen=True)
class Found:
    request: rq.RunRequest  # with WITHHELD in place of the withheld values
    kind: str  # the kind of cluster it ran on
    withheld: tuple[str, ...]
    cluster: str = ""  # the cluster's name it ran on
    handoff: dict | None = None  # the supervisor's spec less the request (a new master's boot step reads it)


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


def signed_bytes(data: dict) -> bytes:
    """What the signature covers: `data` less its signature field, canonical."""
    return canonical({k: v for k, v in data.items() if k != SIGNATURE})


def signature(data: dict, key: Key) -> str:
    """The key's signature over `data` less its signature field."""
    return key.sign(signed_bytes(data))


def withhold(request: rq.RunRequest) -> tuple[rq.RunRequest, dict[str, str]]:
    """(the request with WITHHELD in place of its secret-looking --env values, those values by name)."""
    env = request.env_map()
    secrets = {name: env[name] for name in secret_looking(env)}
    return request.with_env({name: WITHHELD for name in secrets}), secrets


def signed_text(request: rq.RunRequest, kind: str, key: Key, cluster: str = "",
                handoff: dict[str, Any] | None = None) -> str:
    """The spec's text for `request` (its secret values withheld) on the cluster `cluster` of `kind`, signed
    with `key`: the run id, cluster, kind and checkpoint URI are signed with it (`Binding`), and `handoff`, the
    supervisor's spec less the request (`handoff(...)`'s), which a new master starts the run's supervisor from."""
    kept, secrets = withhold(request)
    data: dict[str, Any] = {"format": FORMAT, "kind": kind, "cluster": cluster, "run": request.run_id,
                            "checkpoint_uri": _uri(request.checkpoint_uri), "request": kept.to_mapping(),
                            "withheld": sorted(secrets),
                            HANDOFF: {k: v for k, v in (handoff or {}).items() if k != "request"}}
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


def read(text: str | bytes | None, where: str, key: Key, binding: Binding | None = None) -> Found:
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
        matches = key.verify(signed_bytes(found), given)
    except ValueError:  # a value canonical JSON refuses (nan)
        matches = False
    if not matches:
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
    if not isinstance(found.get(HANDOFF), dict):
        raise bad(f"{HANDOFF}: allowed: a map (the supervisor's hand-off)")
    if found.get("run") != request.run_id or found.get("checkpoint_uri") != _uri(request.checkpoint_uri) \
            or not isinstance(found.get("cluster"), str):
        raise bad("its run id, cluster or checkpoint URI is not the run's it holds")
    if binding is not None:
        _check_binding(found, request, binding, where)
    return Found(request, found["kind"], tuple(withheld), found["cluster"], found[HANDOFF])


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


# ---------------------------------------------------------------- the run's secrets, where only the master reads

# What the controller puts in the run's secret store at the hand-off (node_setup/run_store.py: SSM Parameter
# Store SecureString on AWS, a double of it in the cluster's data directory locally), under STORE_ROOT/<cluster>/:
# CLUSTER_KEY_NAME, the cluster's private SSH key (a new master reaches the workers with it), and one run record
# per supervised run, RUNS_FOLDER/<run id>: where the run's signed spec is and its withheld --env values.
STORE_ROOT = "/xeon-cluster"
CLUSTER_KEY_NAME = "cluster-key"
RUNS_FOLDER = "runs"


def store_prefix(cluster: str) -> str:
    return f"{STORE_ROOT}/{names.cluster(cluster)}"


def run_record_name(run_id: str) -> str:
    return f"{RUNS_FOLDER}/{sv.check_run_id(run_id)}"


def run_record(run_id: str, spec_at: str, secrets: dict[str, str]) -> str:
    """A run record's text: the run, where its spec is (an s3:// URI or a path on the disk every node shares),
    its withheld values."""
    return json.dumps({"run": sv.check_run_id(run_id), "spec": spec_at, "secrets": dict(secrets)}, sort_keys=True)


def checked_run_record(text: str | None, where: str) -> tuple[str, str, dict[str, str]]:
    """(run id, where its spec is, its secret values) from a run record read back (RunSpecError: one line). It is
    data, not a command: the spec it points to must verify, and its values fill only the spec's withheld names."""
    try:
        found = records.load(text, where)
    except records.RecordError as exc:
        raise RunSpecError(f"{where}: {exc.why}") from None
    if not isinstance(found, dict) or set(found) != {"run", "spec", "secrets"}:
        raise RunSpecError(f"{where}: not a run record (run, spec, secrets)")
    run, spec, secrets = found["run"], found["spec"], found["secrets"]
    if not isinstance(run, str) or not sv.RUN_ID_RE.match(run):
        raise RunSpecError(f"{where}: run {run!r} is not a run id")
    if not isinstance(spec, str) or not (spec.startswith("s3://") or spec.startswith("/")) \
            or not spec.endswith(f"/{RUN_FOLDER}/{sv.SPEC_FILE}") or not records.is_printable(spec):
        raise RunSpecError(f"{where}: spec {str(spec)[:80]!r} is not allowed; allowed: an s3:// URI or an absolute "
                           f"path ending in /{RUN_FOLDER}/{sv.SPEC_FILE}")
    if not isinstance(secrets, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in secrets.items()):
        raise RunSpecError(f"{where}: secrets: allowed: a map of names to values")
    return run, spec, dict(secrets)


def state_path(output_dir: str) -> str:
    """The run's state, mirrored by its supervisor beside the spec in the output directory (STATE_FILE)."""
    return f"{output_dir.rstrip('/')}/{RUN_FOLDER}/{sv.STATE_FILE}"


def state_uri(checkpoint_uri: str) -> str:
    return f"{checkpoint_uri.rstrip('/')}/{RUN_FOLDER}/{sv.STATE_FILE}"
