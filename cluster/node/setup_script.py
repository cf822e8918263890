"""The bash that `fab setup`, `fab check`, the Pulumi setup step and the image's build run on a node (pure text).

Two scripts, both deterministic for their inputs; their text is in cluster/shell/ (`install.sh`,
`check.sh`) and this module fills in the values (cluster.shell.render):

- `install_script(plan)`: tcmalloc and the profile's apt packages (only what is missing; apt waits
  for the dpkg lock with `-o DPkg::Lock::Timeout=` and retries a bounded number of times while
  unattended-upgrades holds it), a venv at `venv_dir(profile)` made from the OS Python, the
  profile's index-only packages each from its own index alone, then its pip pins from PyPI alone
  (cluster/node/profiles.py says why), then this project's wheel. Idempotent: the venv holds two markers, the
  profile's fingerprint digest and the project version; matching markers mean "nothing to do".
  The venv step runs under the setup lock (`setup-lock.sh`, `with_setup_lock`), because the nodes
  of a local cluster share `/opt`: the first node installs, the others wait, saying who holds it
  (`lock_holder`: its cluster and checkout, then its node), and then find it done; a lock whose
  holder is gone (its process, or its node's namespace) is broken instead of waited out. A rerun
  after a failure picks up where it stopped (markers are written only after their step succeeded;
  pip skips what is there).
  Last, the idle auto-stop service (cluster/node/autostop.py install_section), so it is in the image.
- `check_script(profile)`: prints facts (installed versions, markers, CPU flags, tcmalloc, free
  disk); `evaluate_check` compares them with the profile in Python.

Every script reports through lines that start with `::xc::` (`parse_events` reads them); the rest
of the output is the tools' own, kept for the failure report.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Iterable, Mapping

from cluster.node import autostop
from cluster import names, shell
from cluster.stack.catalog import InstanceType
from cluster.node.profiles import NODE_ROOT, TCMALLOC_PACKAGES, TCMALLOC_PATH, IndexPin, Profile, venv_dir

EVENT_PREFIX = "::xc::"
OS_PYTHON = "/usr/bin/python3"
PROFILE_MARKER = ".xeon-cluster-profile"
PROJECT_MARKER = ".xeon-cluster-project"
PROJECT_DISTRIBUTION = "xeon-cluster"
# install.sh's last line; the auto-stop section (cluster/node/autostop.py) goes right before it
INSTALL_DONE_LINE = 'xc "done" "$CHANGED"\n'
DEFAULT_MIN_FREE_GIB = 10.0
SETUP_LOCK_FILE = "setup-lock.sh"  # the setup lock's functions, put into the scripts that take it
LOCK_HOLDER_MAX = 300
CPU_FLAGS = ("amx_bf16", "amx_tile", "amx_int8", "avx512_bf16", "avx512f", "avx512_vnni")


def fingerprint_digest(profile: Profile) -> str:
    """A short digest of the profile's fingerprint: what the venv's profile marker holds."""
    return hashlib.sha256(profile.fingerprint().encode()).hexdigest()[:16]


@dataclass(frozen=True)
class InstallPlan:
    """Everything `install_script` needs; paths are on the node."""

    profile: Profile
    project_wheel: str | None = None  # an uploaded wheel of this project, or None to skip it
    project_version: str | None = None  # what the project marker records (controller's exact version)
    wheelhouse: str | None = None  # install with --no-index --find-links from here (offline nodes)
    python: str = OS_PYTHON
    apt_lock_timeout_s: int = 600  # apt's own wait for the dpkg lock, per attempt
    apt_attempts: int = 5  # attempts while the lock is still held after that wait
    apt_retry_delay_s: int = 30
    venv_lock_timeout_s: int = 3600  # how long a node waits for another node installing the shared venv
    node_root: str = NODE_ROOT  # where the venv and its lock live (tests point it elsewhere)
    lock_holder: str = ""  # who takes the setup lock, for a node waiting on it: "cluster C, checkout P"
    venv: str | None = None  # default: cluster.node.profiles.venv_dir(profile)
    compile_bytecode: bool = True  # False: pip's --no-compile (the backend's compiles_bytecode)

    @property
    def venv_path(self) -> str:
        return self.venv or venv_dir(self.profile)

    def __post_init__(self) -> None:
        if self.project_wheel and not self.project_version:
            raise ValueError("project_version: required with project_wheel (it goes into the project marker)")
        if not self.python.startswith("/") or self.python.startswith("/root/"):
            raise ValueError(f"python: {self.python!r} is not allowed; give an absolute path to the OS Python "
                             "outside /root (e.g. /usr/bin/python3): the nodes must be able to run it")
        for name in ("apt_lock_timeout_s", "apt_attempts", "apt_retry_delay_s", "venv_lock_timeout_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: {getattr(self, name)!r} must not be negative")
        check_lock_holder(self.lock_holder)


def install_script(plan: InstallPlan) -> str:
    """The install script for one node (bash; run as the SSH user, sudo -n where root is needed)."""
    profile = plan.profile
    # Online, the index-only packages come first, each from its own index alone (no PyPI, no
    # dependencies); then every pin from PyPI alone, which finds those already installed.
    # Offline, everything comes from the wheelhouse the controller filled the same way.
    index_pins: tuple[IndexPin, ...]
    if plan.wheelhouse:
        pip_source, index_pins = ["--no-index", "--find-links", plan.wheelhouse], ()
    else:
        pip_source, index_pins = [], profile.index_pins
    text = shell.render("install.sh", {
        "APT_LOCK_TIMEOUT": str(plan.apt_lock_timeout_s),
        "APT_ATTEMPTS": str(max(plan.apt_attempts, 1)),
        "APT_RETRY_DELAY": str(plan.apt_retry_delay_s),
        "VENV_LOCK_TIMEOUT": str(plan.venv_lock_timeout_s),
        "NODE_ROOT": plan.node_root,
        "VENV": plan.venv_path,
        "OS_PYTHON": plan.python,
        "PROFILE": profile.name,
        "DIGEST": fingerprint_digest(profile),
        "PROFILE_MARKER": PROFILE_MARKER,
        "PROJECT_MARKER": PROJECT_MARKER,
        "PROJECT_WHEEL": plan.project_wheel or "",
        "PROJECT_VERSION": plan.project_version or "",
        "APT_PACKAGES": profile.apt_packages,
        "TCMALLOC_PACKAGES": TCMALLOC_PACKAGES,
        "PIP_SOURCE": pip_source,
        "PIP_COMPILE": [] if plan.compile_bytecode else ["--no-compile"],
        "INDEX_URLS": [p.index_url for p in index_pins],
        "INDEX_REQUIREMENTS": [p.requirement() for p in index_pins],
        "PINS": profile.pip_pins,
    })
    # 4. the idle auto-stop service (and its power-off command), so that it is in the baked image
    head, done, tail = text.rpartition(INSTALL_DONE_LINE)
    if not done:
        raise ValueError(f"install.sh no longer ends with {INSTALL_DONE_LINE.strip()!r}")
    return with_setup_lock(head + autostop.install_section(f"{plan.node_root}/bin") + done + tail, plan.lock_holder)


def check_lock_holder(holder: str) -> str:
    """`lock_holder` is one line of the lock's record: printable text, no line break."""
    if not isinstance(holder, str) or names.printable(holder) != holder or len(holder) > LOCK_HOLDER_MAX:
        raise ValueError(f"lock_holder: {holder!r} is not allowed; allowed: one line of printable text, up to "
                         f"{LOCK_HOLDER_MAX} characters")
    return holder


def with_setup_lock(script: str, holder: str) -> str:
    """A rendered bash script with the setup lock's functions (`setup_lock FILE TIMEOUT`, cluster/shell/
    setup-lock.sh) and LOCK_HOLDER after its header."""
    head, end, body = script.partition(shell.HEADER_END + "\n")
    if not end:
        raise ValueError("with_setup_lock: the script has no rendered header")
    source = shell.source(SETUP_LOCK_FILE).splitlines(keepends=True)
    start = next(i for i, line in enumerate(source) if not line.startswith("#"))  # after its comment
    values = shell.header({"LOCK_HOLDER": check_lock_holder(holder) or "a setup"}, bash=True)
    return head + end + "".join(line + "\n" for line in values) + "".join(source[start:]) + body


def check_script(profile: Profile, project_distribution: str = PROJECT_DISTRIBUTION, venv: str | None = None) -> str:
    """Print the facts `evaluate_check` needs, as `::xc:: fact <name> <value...>` lines."""
    return shell.render("check.sh", {
        "VENV": venv or venv_dir(profile),
        "PROFILE_MARKER": PROFILE_MARKER,
        "PROJECT_MARKER": PROJECT_MARKER,
        "TCMALLOC_PATH": TCMALLOC_PATH,
        "NODE_ROOT": NODE_ROOT,
        "PACKAGES": [*(pin_name(p) for p in profile.pip_pins), project_distribution],
        "CPU_FLAGS": CPU_FLAGS,
    })


# ------------------------------------------------------------------------------- reading the output


@dataclass(frozen=True)
class Event:
    kind: str  # "step", "progress", "fact", "done"
    name: str
    status: str
    detail: str


def parse_events(text: str) -> list[Event]:
    """The `::xc::` lines of a script's output, in order.

    step <name> <status> <detail>    progress <name> <detail>    fact <name> <value...>    done <changed>
    """
    events = []
    for line in text.splitlines():
        if not line.startswith(EVENT_PREFIX):
            continue
        parts = line[len(EVENT_PREFIX):].strip().split(" ", 3)
        kind = parts[0] if parts else ""
        if kind == "step" and len(parts) >= 3:
            events.append(Event("step", parts[1], parts[2], parts[3] if len(parts) > 3 else ""))
        elif kind == "progress" and len(parts) >= 2:
            events.append(Event("progress", parts[1], "", " ".join(parts[2:])))
        elif kind == "fact" and len(parts) >= 2:
            events.append(Event("fact", parts[1], "", " ".join(parts[2:])))
        elif kind == "done":
            events.append(Event("done", "", parts[1] if len(parts) > 1 else "", ""))
    return events


def changed(events: Iterable[Event]) -> bool | None:
    """Whether the install changed anything (None when the script did not finish)."""
    done = [e for e in events if e.kind == "done"]
    return None if not done else done[-1].status == "1"


@dataclass(frozen=True)
class CheckItem:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class CheckReport:
    items: tuple[CheckItem, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return all(i.ok for i in self.items)

    def failures(self) -> list[CheckItem]:
        return [i for i in self.items if not i.ok]


_VERSION_PART = re.compile(r"\d+")


def pin_name(pin: str) -> str:
    """`torch==2.13.0` -> `torch`; `boto3>=1.35` -> `boto3`."""
    return re.split(r"[=<>~!\[;\s]", pin.strip(), maxsplit=1)[0]


def _version_key(version: str) -> tuple[int, ...]:
    base = version.split("+", 1)[0]
    return tuple(int(p) for p in _VERSION_PART.findall(base)[:4])


def pin_satisfied(pin: str, installed: str | None) -> bool:
    """Whether `installed` meets `pin` (==, >=, <=, >, <; local versions like +cpu match ==)."""
    if installed is None:
        return False
    match = re.match(r"^\s*[A-Za-z0-9_.\-\[\]]+\s*(==|>=|<=|>|<)\s*([^,;\s]+)\s*$", pin)
    if not match:
        return True  # a bare name: presence is all that is asked
    op, wanted = match.groups()
    if op == "==":
        return installed == wanted or installed.split("+", 1)[0] == wanted
    have, want = _version_key(installed), _version_key(wanted)
    return {">=": have >= want, "<=": have <= want, ">": have > want, "<": have < want}[op]


def _facts(events: Iterable[Event]) -> tuple[dict[str, str], dict[str, str]]:
    facts, packages = {}, {}
    for e in events:
        if e.kind != "fact":
            continue
        if e.name == "pkg":
            name, _, version = e.detail.partition(" ")
            packages[name.lower()] = version.strip()
        else:
            facts[e.name] = e.detail
    return facts, packages


def evaluate_check(profile: Profile, events: Iterable[Event], *, project_version: str | None = None,
                   instance: InstanceType | None = None, min_free_gib: float = DEFAULT_MIN_FREE_GIB) -> CheckReport:
    """Compare a node's facts with the profile (and the machine, when its instance type is known)."""
    facts, packages = _facts(events)
    items: list[CheckItem] = []
    python = facts.get("python", "MISSING")
    if python.startswith("MISSING"):
        items.append(CheckItem("venv", False, f"{venv_dir(profile)} missing: run `fab setup`"))
    else:
        items.append(CheckItem("venv", True, python))
    marker = facts.get("profile_marker", "MISSING")
    digest = fingerprint_digest(profile)
    items.append(CheckItem("profile", marker == digest,
                           f"{profile.name} ({digest})" if marker == digest else
                           f"marker {marker}, expected {digest}: run `fab setup`"))
    for pin in profile.pip_pins:
        name = pin_name(pin)
        have = packages.get(name.lower())
        have = None if have in (None, "MISSING") else have
        items.append(CheckItem(name, pin_satisfied(pin, have),
                               f"{have} ({pin})" if have else f"missing ({pin}): run `fab setup`"))
    if project_version is not None:
        recorded = facts.get("project_marker", "MISSING")
        items.append(CheckItem(PROJECT_DISTRIBUTION, recorded == project_version,
                               recorded if recorded == project_version else
                               f"{recorded} on the node, {project_version} here: run `fab setup`"))
    tcmalloc = facts.get("tcmalloc", "MISSING")
    items.append(CheckItem("tcmalloc", tcmalloc != "MISSING",
                           tcmalloc if tcmalloc != "MISSING" else f"{TCMALLOC_PATH} missing: run `fab setup`"))
    flags = set(facts.get("cpu_flags", "").split()) - {"none"}
    bf16 = sorted(flags & {"amx_bf16", "avx512_bf16"})
    if instance is not None and instance.bf16:
        wanted = {"amx_bf16"} if instance.amx else {"avx512_bf16"}
        missing = sorted(wanted - flags)
        items.append(CheckItem("bf16", not missing,
                               ", ".join(bf16) if not missing else
                               f"{instance.name} should show {', '.join(missing)} in /proc/cpuinfo; it does not"))
    else:
        items.append(CheckItem("bf16", True, ", ".join(bf16) or "no AMX/AVX512-BF16 (bf16 off by default)"))
    free = facts.get("disk_free_kib", "").split(" ", 1)
    try:
        free_gib = int(free[0]) / 2**20
    except (ValueError, IndexError):
        items.append(CheckItem("disk", False, f"free space unknown ({facts.get('disk_free_kib')!r})"))
    else:
        where = free[1] if len(free) > 1 else "?"
        items.append(CheckItem("disk", free_gib >= min_free_gib,
                               f"{free_gib:.1f} GiB free on {where}" + (
                                   "" if free_gib >= min_free_gib else f" (< {min_free_gib:g} GiB: free some space)")))
    return CheckReport(tuple(items))


def index_download_args(pin: IndexPin, dest: str, requirement_file: str, *, index_reachable: bool = True) -> list[str]:
    """`pip download` arguments for one index-only package (controller side): from its own index
    alone, or, where the controller cannot reach that index, from the controller's own find-links
    alone (`--no-index`); never from PyPI, never its dependencies. `requirement_file` holds
    `pin.requirement()` (a requirements file is where pip takes hashes)."""
    source = ["--index-url", pin.index_url] if index_reachable else ["--no-index"]
    return ["download", "--disable-pip-version-check", "--no-input", "-q", "-d", dest, *source, "--no-deps",
            "-r", requirement_file]


def pip_download_args(profile: Profile, dest: str, index_files: Mapping[str, str]) -> list[str]:
    """`pip download` arguments for the rest of the profile and every dependency, from PyPI alone
    (controller side). Each index-only pin is given as the file already taken from its index
    (`name @ file:///...`, `index_files` maps its name to that path), so PyPI cannot supply it."""
    missing = [p.pin for p in profile.index_pins if p.name not in index_files]
    if missing:
        raise ValueError(f"pip_download_args: no downloaded file for {', '.join(missing)}")
    files = {p.pin: index_files[p.name] for p in profile.index_pins}
    pins = [f"{pin_name(pin)} @ {PurePosixPath(files[pin]).as_uri()}" if pin in files else pin
            for pin in profile.pip_pins]
    return ["download", "--disable-pip-version-check", "--no-input", "-q", "-d", dest, *pins]


def wheelhouse_marker_name(profile: Profile) -> str:
    """The file that says a wheelhouse holds everything the profile needs."""
    return f".xeon-cluster-filled-{profile.name}-{fingerprint_digest(profile)}"

