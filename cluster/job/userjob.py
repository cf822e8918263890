"""The user's own program on the cluster (`fab train --script/--module`), decided before anything moves.

Pure: this module turns the options into checked values and plans, and touches no file or node.

- `UserProgram`: what every rank runs (`python SCRIPT ARGS` or `python -m MODULE ARGS`, with the
  node venv's Python, from the job's copy of the workdir, through the runner xeon_cluster/run.py
  that ends each rank cleanly), and the signal a spot notice sends.
- `CopyPlan`: the workdir's files (path, size, SHA-256) after the skip rules, checked against the
  size limit, and what it withholds: dot-files and dot-folders (.aws, .ssh, .env, .config ...),
  files named like credentials (CREDENTIAL_NAMES), links that lead out of the workdir; the
  workdir's allow file (INCLUDE_FILE) lets the user ship a withheld path on purpose, never a link
  out. The home folder itself (or a folder above it) and a credentials folder (CREDENTIAL_FOLDERS:
  ~/.aws, ~/.ssh, ~/.config/gcloud, ~/.config itself ...) are refused as a workdir (`check_workdir`).
  Each node keeps a content-addressed store (FILE_STORE: one file per content, checked against its
  name before use) and the job's workdir is a copy out of it (copy-on-write where the filesystem
  can), so an unchanged file is never sent twice and what one job writes reaches no other job.
- `RequirementsPlan`: the packages of `--requirements`, parsed, refused when one would change a
  pinned package of the profile; installed once per content digest (REQUIREMENTS_MARKER_DIR).

The edges act on these: node_setup/ssh/workdir.py (scan and copy), node_setup/ssh/requirements.py
(install), node_setup/tasks/train.py (the options).
"""

from __future__ import annotations

import fnmatch
import hashlib
import posixpath
import re
import shlex
from dataclasses import dataclass, field

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from cluster.job.launch import job_dir
from cluster.node.profiles import Profile
from xeon_cluster import DEFAULT_NOTICE_SIGNAL, NO_SIGNAL
from xeon_cluster import run as runner

# Folders never copied, whatever .gitignore says (virtual environments are found by their
# pyvenv.cfg as well, whatever their name).
ALWAYS_SKIPPED = (".git", "__pycache__", ".venv", "venv", ".mypy_cache", ".pytest_cache", ".ipynb_checkpoints")
VENV_MARKER = "pyvenv.cfg"
DEFAULT_WORKDIR_LIMIT_MB = 200
LARGEST_SHOWN = 5
# Withheld unless the workdir's allow file lists them: every dot-file and dot-folder (the name starts
# with ".": .aws, .ssh, .env, .config, .kaggle, .netrc ...) and files named like credentials, wherever
# they are in the workdir: a pattern with "/" matches the path's last components (kube/config is a
# kube folder's config: a copy of ~/.kube without its dot). Below a tool's own folder the names are
# not dot-names, hence the tools' credential files by name: AWS's SSO and CLI caches, gcloud's
# (application default credentials, its two databases, legacy_credentials/), Azure's token caches,
# kube, docker and gh configs, Hugging Face's token, rclone's, Terraform's and git's credentials.
CREDENTIAL_NAMES = ("id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", "*.pem", "*.key", "*.p12", "*.pfx",
                    "*.jks", "*.keystore", "*.kdbx", "credentials", "credentials.json", "kaggle.json",
                    "client_secret*.json", "*service-account*.json", "*service_account*.json", "netrc", "_netrc",
                    "sso/cache/*.json", "cli/cache/*.json", "boto/cache/*.json", "aws/config",
                    "application_default_credentials.json", "credentials.db", "access_tokens.db",
                    "legacy_credentials", "accessTokens.json", "msal_token_cache.*", "service_principal_entries.*",
                    "kube/config", "kubeconfig", "kubeconfig.y*ml", "*.kubeconfig", "docker/config.json",
                    "gh/hosts.yml", "huggingface/token", "stored_tokens", "rclone.conf", "credentials.tfrc.json",
                    "git-credentials", "htpasswd", "*.ovpn", "*.ppk", "deploy_key*", "ssh_host_*_key",
                    "*.tfstate", "*.tfstate.backup")
# What a private key's file holds, whatever its name (a workdir file holding one is withheld by content):
# OpenSSH's, PEM's (PKCS#1 RSA, SEC1 EC, DSA, PKCS#8 and its encrypted form), PuTTY's and OpenPGP's
# private key block. A service account's JSON holds the PKCS#8 header in its "private_key" string.
PRIVATE_KEY_MARKERS = (b"-----BEGIN OPENSSH PRIVATE KEY-----", b"-----BEGIN RSA PRIVATE KEY-----",
                       b"-----BEGIN EC PRIVATE KEY-----", b"-----BEGIN DSA PRIVATE KEY-----",
                       b"-----BEGIN PRIVATE KEY-----", b"-----BEGIN ENCRYPTED PRIVATE KEY-----",
                       b"PuTTY-User-Key-File-", b"-----BEGIN PGP PRIVATE KEY BLOCK-----")
CONTENT_SCAN_BYTES = 1 << 20  # how much of each file is looked at for PRIVATE_KEY_MARKERS
# Well-known folders that hold credentials ("/"-separated, as under a home). A workdir that is one, lies
# inside one or holds one below a dot-folder (~/.config holds gcloud/, which is no dot-name) is refused
# by name (`check_workdir`), wherever it is: a copy of a home's .aws elsewhere is as secret.
CREDENTIAL_FOLDERS = (".aws", ".ssh", ".gnupg", ".kube", ".docker", ".azure", ".config/gcloud", ".config/gh",
                      ".config/rclone", ".config/op", ".kaggle", ".huggingface", ".cache/huggingface", ".pulumi",
                      ".terraform.d", ".oci", ".password-store", ".local/share/keyrings")
INCLUDE_FILE = ".xeon-cluster-include"  # in the workdir: paths (one a line) to ship although withheld
WITHHELD_DOT, WITHHELD_CREDENTIAL, WITHHELD_LINK = "dot-files and dot-folders", "named like credentials", \
    "links that lead out of the workdir"
WITHHELD_KEY = "holding a private key"
WITHHELD_SHOWN = 20  # per kind in the launch's summary (the dry run lists all)
# On every node, relative to the SSH user's home: one file per content, named by its SHA-256
# (".x" appended for an executable file).
FILE_STORE = ".xeon-cluster/files"
WORKDIR = "workdir"  # the job's copy of the workdir, inside its job directory
REQUIREMENTS_MARKER_DIR = ".xeon-cluster-requirements"  # inside the node's venv: one marker per digest
# The signals a spot notice may send to every rank (`--notice-signal`; the default and the way to
# send none, NO_SIGNAL, are xeon_cluster's, which the rank's program reads).
NOTICE_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
_DIGEST = re.compile(r"[0-9a-f]{64}\Z")


class UserJobError(ValueError):
    """A bad --script/--module/--args/--workdir/--requirements/--notice-signal; one line, what is allowed."""


# ----------------------------------------------------------------------------- the program


def split_args(text: str) -> list[str]:
    """`--args` split like a shell would (no expansion)."""
    try:
        return shlex.split(text or "")
    except ValueError as exc:
        raise UserJobError(f"--args: cannot split {text!r} like a shell would ({exc}); "
                           "close every quote, e.g. --args '--epochs 2 --name \"my run\"'") from None


def check_module(name: str) -> str:
    if not _MODULE.match(name or ""):
        raise UserJobError(f"--module: {name!r} is not a module name; allowed: dotted Python names, e.g. my_pkg.train")
    return name


def notice_signal(name: str) -> str | None:
    """`--notice-signal`: SIGUSR1 (default), another of NOTICE_SIGNALS (with or without SIG), or none."""
    text = (name or DEFAULT_NOTICE_SIGNAL).strip().upper()
    if text == NO_SIGNAL.upper():
        return None
    full = text if text.startswith("SIG") else f"SIG{text}"
    if full not in NOTICE_SIGNALS:
        raise UserJobError(f"--notice-signal: {name!r} is not allowed; choose one of "
                           f"{', '.join(NOTICE_SIGNALS)} or {NO_SIGNAL}")
    return full


def script_in_workdir(script: str, workdir: str) -> str:
    """The script's path relative to the workdir (both absolute and resolved), or UserJobError."""
    rel = posixpath.relpath(script, workdir)
    if rel == "." or rel.startswith("../") or rel == ".." or posixpath.isabs(rel):
        raise UserJobError(f"--script: {script} is outside the workdir {workdir}; allowed: a file inside "
                           "--workdir (the workdir defaults to the script's folder)")
    return rel


@dataclass(frozen=True)
class UserProgram:
    """What every rank runs: the node venv's Python with a script (relative to the workdir) or a module."""

    script: str | None
    module: str | None
    args: tuple[str, ...]
    signal: str | None = DEFAULT_NOTICE_SIGNAL

    def argv(self, python: str) -> list[str]:
        """`python -m xeon_cluster.run --script SCRIPT -- ARGS` (or `--module MODULE`): the runner runs
        the program as `python SCRIPT ARGS` would, then ends the rank cleanly (xeon_cluster/run.py)."""
        target = [runner.SCRIPT_OPTION, self.script] if self.script else [runner.MODULE_OPTION, self.module or ""]
        return [python, "-m", runner.__name__, *target, runner.ARGS_SEPARATOR, *self.args]

    def describe(self) -> str:
        """The program as the user would run it by hand: `python SCRIPT ARGS` or `python -m MODULE ARGS`."""
        target = [self.script] if self.script else ["-m", self.module or ""]
        return " ".join(shlex.quote(a) for a in ["python", *target, *self.args])


def workdir_on_node(job_id: str) -> str:
    """The job's copy of the workdir, relative to the home directory (the same on every node)."""
    return f"{job_dir(job_id)}/{WORKDIR}"


# ----------------------------------------------------------------------------- the copy plan


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the workdir, "/"-separated
    size: int
    digest: str  # SHA-256 hex of the content
    executable: bool = False

    @property
    def stored_as(self) -> str:
        """The file's name in the node's store (FILE_STORE)."""
        return self.digest + (".x" if self.executable else "")


def check_entry_path(path: str) -> str:
    """A workdir path that can travel in the link manifest (tab-separated lines)."""
    if any(c in path for c in "\t\n\r") or path.startswith("/") or ".." in path.split("/"):
        raise UserJobError(f"--workdir: the file name {path!r} holds a tab, a line break or `..`; "
                           "rename it or list it in the workdir's .gitignore")
    return path


def credentials_folder(workdir: str) -> str | None:
    """How the workdir (absolute) meets a CREDENTIAL_FOLDERS entry: "is .aws", "lies inside .aws",
    "holds .config/gcloud" (the workdir is .config), or None."""
    parts = tuple(p for p in workdir.split("/") if p)
    for folder in CREDENTIAL_FOLDERS:
        named = tuple(folder.split("/"))
        for i in range(len(parts) - len(named) + 1):
            if parts[i:i + len(named)] == named:
                return f"{'is' if i + len(named) == len(parts) else 'lies inside'} {folder}"
        if any(parts[-k:] == named[:k] for k in range(1, len(named))):
            return f"holds {folder}"
    return None


def check_workdir(workdir: str, home: str) -> str:
    """The workdir (absolute, resolved), refused when it is the home folder or a folder above it (it
    would ship keys, credentials and caches to every node), or a credentials folder (`credentials_folder`)."""
    allowed = ("allowed: a folder of the project, e.g. move the script into a folder of its own or pass "
               "--workdir PROJECT_FOLDER")
    if workdir == home or workdir == "/" or home.startswith(workdir.rstrip("/") + "/"):
        raise UserJobError(f"--workdir: {workdir} is your home folder or holds it, and would copy all of it to "
                           f"every node; {allowed}")
    found = credentials_folder(workdir)
    if found:
        raise UserJobError(f"--workdir: {workdir} {found}, a folder of credentials, and would copy them to every "
                           f"node; {allowed}")
    return workdir


def parse_includes(text: str) -> tuple[str, ...]:
    """The workdir's allow file (INCLUDE_FILE): one path a line, relative to the workdir ("#" starts a
    comment line); a folder ships whole. UserJobError naming the line of a path that is absolute or climbs out."""
    paths = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        path = line.rstrip("/")
        if line.startswith("/") or not path or ".." in path.split("/") or any(c in path for c in "*?[\t"):
            raise UserJobError(f"--workdir: {INCLUDE_FILE} line {number}: {line!r} is not allowed; list "
                               "paths relative to the workdir, without `..` or wildcards, e.g. .config/app.yaml")
        paths.append(posixpath.normpath(path))
    return tuple(paths)


def is_included(path: str, includes: tuple[str, ...]) -> bool:
    """Whether the allow file lists `path` or a folder above it."""
    return any(path == p or path.startswith(p + "/") for p in includes)


def leads_to_include(folder: str, includes: tuple[str, ...]) -> bool:
    """Whether a listed path lies inside `folder` (so the scan must look inside a withheld folder)."""
    return any(p.startswith(folder + "/") for p in includes)


def _tail_matches(parts: list[str], pattern: str) -> bool:
    """Whether the path's last components match the pattern's, one by one (fnmatch, case counts)."""
    wanted = pattern.split("/")
    return len(parts) >= len(wanted) and all(fnmatch.fnmatchcase(p, w) for p, w in zip(parts[-len(wanted):], wanted))


def withheld_reason(path: str, includes: tuple[str, ...] = ()) -> str | None:
    """Why a workdir path ("/"-separated, relative) is withheld by default (WITHHELD_DOT or
    WITHHELD_CREDENTIAL), or None when it ships (or the allow file lists it)."""
    if is_included(path, includes):
        return None
    parts = path.split("/")
    if any(part.startswith(".") and part not in (".", "..") for part in parts):
        return WITHHELD_DOT
    if any(_tail_matches(parts, pattern) for pattern in CREDENTIAL_NAMES):
        return WITHHELD_CREDENTIAL
    return None


def holds_private_key(head: bytes) -> bool:
    """Whether a file's first CONTENT_SCAN_BYTES (`head`) hold one of PRIVATE_KEY_MARKERS."""
    return any(marker in head for marker in PRIVATE_KEY_MARKERS)


def link_inside(workdir: str, target: str) -> str | None:
    """A link's resolved target relative to the workdir (both absolute, resolved), or None when the
    link leads out of the workdir."""
    rel = posixpath.relpath(target, workdir)
    return None if rel == ".." or rel.startswith("../") or posixpath.isabs(rel) else rel


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


@dataclass(frozen=True)
class CopyPlan:
    workdir: str  # on the controller
    files: tuple[FileEntry, ...]
    skipped: tuple[str, ...] = ()  # what the skip rules left out (folders end with "/")
    limit_bytes: int = DEFAULT_WORKDIR_LIMIT_MB * 1024 * 1024
    withheld: tuple[tuple[str, str], ...] = ()  # (path, WITHHELD_*): what may hold credentials, left here

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def contents(self) -> dict[str, FileEntry]:
        """One entry per distinct stored file (what a node may need to receive)."""
        return {f.stored_as: f for f in self.files}

    def check(self) -> "CopyPlan":
        for entry in self.files:
            check_entry_path(entry.path)
            if not _DIGEST.match(entry.digest):
                raise UserJobError(f"--workdir: {entry.path}: {entry.digest!r} is not a SHA-256 digest")
        if self.total_bytes > self.limit_bytes:
            largest = sorted(self.files, key=lambda f: -f.size)[:LARGEST_SHOWN]
            listed = ", ".join(f"{f.path} ({human_bytes(f.size)})" for f in largest)
            raise UserJobError(f"--workdir: {self.workdir} holds {human_bytes(self.total_bytes)} to copy, over the "
                               f"limit of {human_bytes(self.limit_bytes)}; largest: {listed}; list what the job "
                               "does not need in the workdir's .gitignore, or raise --workdir-limit-mb")
        return self

    def manifest(self) -> str:
        """The link manifest every node reads: `<stored name>\\t<path>` per file."""
        return "".join(f"{f.stored_as}\t{f.path}\n" for f in self.files)

    def describe(self) -> list[str]:
        lines = [f"copy plan: {len(self.files)} file(s), {human_bytes(self.total_bytes)} from {self.workdir} "
                 f"(limit {human_bytes(self.limit_bytes)}); files a node already has are not sent again"]
        lines += [f"  {f.path}  {human_bytes(f.size)}" for f in sorted(self.files, key=lambda f: f.path)]
        if self.skipped:
            lines.append(f"  skipped: {', '.join(self.skipped)}")
        return lines + self.withheld_lines()

    def withheld_lines(self, shown: int | None = None) -> list[str]:
        """What was withheld, by kind (at most `shown` paths each), and how to ship one on purpose."""
        lines = []
        for kind in (WITHHELD_DOT, WITHHELD_CREDENTIAL, WITHHELD_KEY, WITHHELD_LINK):
            paths = sorted(p for p, k in self.withheld if k == kind)
            if paths:
                more = f" and {len(paths) - shown} more (--dry-run lists all)" if shown and len(paths) > shown else ""
                lines.append(f"  not copied, {kind}: {', '.join(paths[:shown] if shown else paths)}{more}")
        if lines:
            lines.append(f"  to copy a path that is not copied on purpose, list it (one a line) in {INCLUDE_FILE} "
                         "in the workdir; a link out of the workdir is never copied")
        return lines


# ----------------------------------------------------------------------------- the install plan


@dataclass(frozen=True)
class RequirementsPlan:
    source: str  # the file, as the user named it
    requirements: tuple[str, ...]  # normalised requirement lines
    constraints: tuple[str, ...]  # the profile's exact pins: no requirement may move them
    digest: str = field(default="")  # what "installed once" is keyed on

    def describe(self) -> list[str]:
        return [f"install plan: {len(self.requirements)} requirement(s) from {self.source} into the node venv "
                f"(once per content, key {self.digest[:12]}), every node in parallel, the profile's pins held:",
                *[f"  {r}" for r in self.requirements]]


def parse_requirements(text: str, source: str, profile: Profile) -> RequirementsPlan:
    """The requirement lines of `text`; UserJobError for a line that does not parse or that would
    change a pinned package of the profile (naming the package and its pin)."""
    requirements = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            raise UserJobError(f"--requirements: {source} line {number}: {line!r}: pip options are not allowed; "
                               "list one package per line (e.g. peft==0.13.2)")
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            reason = str(exc).splitlines()[0] if str(exc) else "invalid"
            raise UserJobError(f"--requirements: {source} line {number}: {line!r} does not parse ({reason}); "
                               "allowed: one requirement per line, e.g. peft>=0.13") from None
        if req.url:
            raise UserJobError(f"--requirements: {source} line {number}: {line!r}: a URL requirement is not "
                               "allowed; name the package and version")
        pinned = profile.pin_of(req.name) or next(
            (v for p in profile.pip_pins for n, _, v in [p.partition("==")]
             if canonicalize_name(n) == canonicalize_name(req.name) and v), None)
        if pinned and req.specifier and not req.specifier.contains(pinned, prereleases=True):
            raise UserJobError(f"--requirements: {source} line {number}: {line!r} would change {req.name}, "
                               f"pinned to {pinned} by profile {profile.name}; allowed: a version range that "
                               f"admits {pinned}, or leave {req.name} out")
        requirements.append(str(req))
    if not requirements:
        raise UserJobError(f"--requirements: {source} names no package; allowed: one requirement per line")
    constraints = tuple(p for p in profile.pip_pins if "==" in p)
    digest = hashlib.sha256("\n".join([profile.fingerprint(), *requirements]).encode()).hexdigest()
    return RequirementsPlan(source, tuple(requirements), constraints, digest)
