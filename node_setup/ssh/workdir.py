"""The user's workdir on every node (`fab train --script`): scanned here, copied by content.

    scan(workdir, limit_bytes) -> CopyPlan         on the controller: the files to copy (skip rules:
                                                   cluster/job/userjob.py ALWAYS_SKIPPED, virtual
                                                   environments, the workdir's .gitignore), hashed;
                                                   withheld: dot-names, credential names, links out
                                                   of the workdir (unless the allow file lists them)
    push(conns, plan, job_id) -> [NodeOutcome]     every node in parallel (fanout.each_node): the
                                                   link manifest, the contents its store lacks (or
                                                   holds changed), then a copy into the job's workdir

Each node keeps one file per content under ~/.xeon-cluster/files (cluster/job/userjob.py FILE_STORE),
read-only, so a file that did not change since any earlier job is copied there, not sent. The job's
workdir is a copy (`cp --reflink=auto`: copy-on-write where the filesystem can), never a hard link:
a hard link shares the file itself, so what one job wrote (root ignores the read-only mode) would
be in every later job's workdir, and all empty files share one digest. The shell side is
cluster/shell/workdir.sh.
"""

from __future__ import annotations

import hashlib
import io
import os
import shlex
from pathlib import Path

from cluster import shell
from cluster.job.launch import job_dir
from cluster.job.userjob import (ALWAYS_SKIPPED, CONTENT_SCAN_BYTES, DEFAULT_WORKDIR_LIMIT_MB, FILE_STORE,
                             INCLUDE_FILE, VENV_MARKER, WITHHELD_KEY, WITHHELD_LINK, WITHHELD_SHOWN, CopyPlan,
                             FileEntry, UserJobError, check_entry_path, check_workdir, holds_private_key, human_bytes,
                             is_included, leads_to_include, link_inside, parse_includes, withheld_reason,
                             workdir_on_node)
from node_setup.ssh import connections
from node_setup.ssh.fanout import NodeOutcome, each_node

WORKDIR_SH = shell.render("workdir.sh", {"STORE": FILE_STORE})
MANIFEST = "workdir.manifest"  # in the job directory (cluster/shell/workdir.sh reads it)
CHUNK = 1024 * 1024


def _ignore_spec(workdir: Path):
    """The workdir's own .gitignore as a matcher (pathspec), or None."""
    path = workdir / ".gitignore"
    if not path.is_file():
        return None
    import pathspec

    return pathspec.GitIgnoreSpec.from_lines(path.read_text(errors="replace").splitlines())


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _includes(root: Path) -> tuple[str, ...]:
    """The workdir's allow file (cluster/job/userjob.py INCLUDE_FILE), parsed, or ()."""
    path = root / INCLUDE_FILE
    return parse_includes(path.read_text(errors="replace")) if path.is_file() and not path.is_symlink() else ()


def scan(workdir: str | Path, limit_bytes: int = DEFAULT_WORKDIR_LIMIT_MB * 1024 * 1024) -> CopyPlan:
    """The workdir's files after the skip rules, hashed; UserJobError when it is the home folder or a
    credentials folder such as ~/.aws (before anything is read) or over the limit. Dot-names, credential
    names, files holding a private key (by their content, whatever their name) and links out of the workdir
    are withheld (CopyPlan.withheld) unless the allow file lists them (never a link out)."""
    root = Path(check_workdir(str(Path(workdir).resolve()), str(Path.home().resolve())))
    spec = _ignore_spec(root)
    includes = _includes(root)
    files, skipped, withheld = [], [], []
    for here, dirs, names in os.walk(root, followlinks=False):
        rel_here = Path(here).relative_to(root).as_posix()
        rel = (lambda n: n) if rel_here == "." else (lambda n, rel_here=rel_here: f"{rel_here}/{n}")
        keep = []
        for d in sorted(dirs):
            full, path = Path(here) / d, rel(d)
            if full.is_symlink() and link_inside(str(root), os.path.realpath(full)) is None:
                withheld.append((path + "/", WITHHELD_LINK))
            elif (d in ALWAYS_SKIPPED or (full / VENV_MARKER).is_file() or full.is_symlink()
                    or (spec is not None and spec.match_file(path + "/"))):
                skipped.append(path + "/")
            elif (reason := withheld_reason(path, includes)) and not leads_to_include(path, includes):
                withheld.append((path + "/", reason))
            else:
                keep.append(d)
        dirs[:] = keep
        for name in sorted(names):
            full, path = Path(here) / name, rel(name)
            if spec is not None and spec.match_file(path):
                skipped.append(path)
                continue
            target = link_inside(str(root), os.path.realpath(full)) if full.is_symlink() else path
            if target is None:
                withheld.append((path, WITHHELD_LINK))
                continue
            if not full.is_file():
                skipped.append(path)
                continue
            reason = withheld_reason(path, includes) or withheld_reason(target, includes)
            if not reason and not is_included(path, includes):
                with open(full, "rb") as head:
                    reason = WITHHELD_KEY if holds_private_key(head.read(CONTENT_SCAN_BYTES)) else None
            if reason:
                withheld.append((path, reason))
                continue
            stat = full.stat()
            files.append(FileEntry(check_entry_path(path), stat.st_size, _digest(full),
                                   executable=bool(stat.st_mode & 0o111)))
    return CopyPlan(str(root), tuple(files), tuple(skipped), limit_bytes, tuple(withheld)).check()


def _sh(*args: str) -> str:
    return "sh -c " + shlex.quote(WORKDIR_SH) + " xeon-cluster " + " ".join(shlex.quote(a) for a in args)


def push_one(conn, plan: CopyPlan, job_id: str) -> tuple[int, int, str]:
    """Copy the plan to one node; returns (files sent, bytes sent, the link step's last line)."""
    jd, wd = job_dir(job_id), workdir_on_node(job_id)
    conn.run(f"mkdir -p {shlex.quote(jd)} {shlex.quote(FILE_STORE)}", hide=True, in_stream=False)
    conn.put(io.StringIO(plan.manifest()), remote=f"{jd}/{MANIFEST}")
    missing = conn.run(_sh("missing", jd, wd), hide=True, in_stream=False).stdout.split()
    contents = plan.contents
    sent_bytes = 0
    for name in missing:
        entry = contents.get(name)
        if entry is None:
            raise UserJobError(f"the node asked for {name!r}, which is not in the copy plan")
        conn.put(str(Path(plan.workdir) / entry.path), remote=f"{FILE_STORE}/{name}.part")
        sent_bytes += entry.size
    linked = conn.run(_sh("link", jd, wd), hide=True, in_stream=False).stdout.strip().splitlines()
    return len(missing), sent_bytes, linked[-1] if linked else ""


def push(conns: dict, plan: CopyPlan, job_id: str) -> list[NodeOutcome]:
    """The workdir on every node at once; a node's failure is its outcome, the others go on."""
    for line in plan.withheld_lines(WITHHELD_SHOWN):
        print(line, flush=True)

    def one(name: str, conn) -> NodeOutcome:
        try:
            sent, size, linked = push_one(conn, plan, job_id)
        except Exception as exc:  # noqa: BLE001 - reported per node
            return NodeOutcome(name, False, f"workdir: {connections.explain(exc, conn)}")
        return NodeOutcome(name, True, f"workdir: sent {sent} new file(s) ({human_bytes(size)}), {linked}")

    return each_node(conns, one)
