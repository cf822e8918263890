"""The bash that `fab setup`, `fab check` and the Pulumi setup step run on a node (pure text).

Three scripts, all deterministic for their inputs:

- `install_script(plan)`: tcmalloc and the profile's apt packages (only what is missing; apt waits
  for the dpkg lock with `-o DPkg::Lock::Timeout=` and retries a bounded number of times while
  unattended-upgrades holds it), a venv at `venv_dir(profile)` made from the OS Python, the
  profile's pip pins, then this project's wheel. Idempotent: the venv holds two markers, the
  profile's fingerprint digest and the project version; matching markers mean "nothing to do".
  The venv step runs under `flock`, because the nodes of a local cluster share `/opt`: the first
  node installs, the others wait and then find it done. A rerun after a failure picks up where
  it stopped (markers are written only after their step succeeded; pip skips what is there).
- `check_script(profile)`: prints facts (installed versions, markers, CPU flags, tcmalloc, free
  disk); `evaluate_check` compares them with the profile in Python.
- `prebake_script()`: what must not go into an image: SSH host keys, shell history, cloud-init
  per-instance state, private keys, the cluster key's authorized_keys lines.

Every script reports through lines that start with `::xc::` (`parse_events` reads them); the rest
of the output is the tools' own, kept for the failure report.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass, field
from typing import Iterable

from cluster.catalog import InstanceType
from cluster.profiles import NODE_ROOT, TCMALLOC_PACKAGES, TCMALLOC_PATH, Profile, venv_dir
from cluster.render import KEY_COMMENT_PREFIX

EVENT_PREFIX = "::xc::"
OS_PYTHON = "/usr/bin/python3"
PROFILE_MARKER = ".xeon-cluster-profile"
PROJECT_MARKER = ".xeon-cluster-project"
PROJECT_DISTRIBUTION = "xeon-cluster"
PREBAKE_KEY_STASH = "/run/xeon-cluster/hostkeys-before-bake"
DEFAULT_MIN_FREE_GIB = 10.0
CPU_FLAGS = ("amx_bf16", "amx_tile", "amx_int8", "avx512_bf16", "avx512f", "avx512_vnni")


def fingerprint_digest(profile: Profile) -> str:
    """A short digest of the profile's fingerprint: what the venv's profile marker holds."""
    return hashlib.sha256(profile.fingerprint().encode()).hexdigest()[:16]


def _q(value: object) -> str:
    return shlex.quote(str(value))


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
    venv: str | None = None  # default: cluster.profiles.venv_dir(profile)

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


_COMMON = r"""
xc() { echo "::xc:: $*"; }
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo -n"; fi
"""

_APT = r"""
apt_get() {  # apt-get that waits for the dpkg lock, then retries a bounded number of times
  local attempt out rc
  for attempt in $(seq 1 "$APT_ATTEMPTS"); do
    out=$($SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout="$APT_LOCK_TIMEOUT" "$@" 2>&1)
    rc=$?
    [ -n "$out" ] && printf '%s\n' "$out"
    [ "$rc" = 0 ] && return 0
    if printf '%s' "$out" | grep -qiE 'could not get lock|unable to acquire the dpkg|unable to lock'; then
      if [ "$attempt" -lt "$APT_ATTEMPTS" ]; then
        xc progress apt "the dpkg lock is held by another process (unattended-upgrades?); retry $attempt/$((APT_ATTEMPTS - 1)) in ${APT_RETRY_DELAY}s"
        sleep "$APT_RETRY_DELAY"
        continue
      fi
      xc step apt failed "the dpkg lock was still held after $APT_ATTEMPTS attempts"
      return "$rc"
    fi
    return "$rc"
  done
  return 1
}
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'ok installed'; }
known_to_apt() { apt-cache policy "$1" 2>/dev/null | grep -q 'Candidate: [^(]'; }
"""


def install_script(plan: InstallPlan) -> str:
    """The install script for one node (bash; run as the SSH user, sudo -n where root is needed)."""
    profile = plan.profile
    venv = plan.venv_path
    digest = fingerprint_digest(profile)
    if plan.wheelhouse:
        pip_source = f"--no-index --find-links {_q(plan.wheelhouse)}"
    else:
        pip_source = " ".join(f"--extra-index-url {_q(url)}" for url in profile.extra_index_urls)
    pins = " ".join(_q(p) for p in profile.pip_pins)
    head = "\n".join([
        "#!/bin/bash",
        f"# xeon-cluster install: profile {profile.name} ({digest})",
        "set -uo pipefail",
        f"APT_LOCK_TIMEOUT={plan.apt_lock_timeout_s}",
        f"APT_ATTEMPTS={max(plan.apt_attempts, 1)}",
        f"APT_RETRY_DELAY={plan.apt_retry_delay_s}",
        f"VENV_LOCK_TIMEOUT={plan.venv_lock_timeout_s}",
        f"NODE_ROOT={_q(plan.node_root)}",
        f"VENV={_q(venv)}",
        f"OS_PYTHON={_q(plan.python)}",
        f"PROFILE={_q(profile.name)}",
        f"DIGEST={_q(digest)}",
        f"APT_PACKAGES=({' '.join(_q(p) for p in profile.apt_packages)})",
        f"TCMALLOC_PACKAGES=({' '.join(_q(p) for p in TCMALLOC_PACKAGES)})",
        f"PROJECT_WHEEL={_q(plan.project_wheel or '')}",
        f"PROJECT_VERSION={_q(plan.project_version or '')}",
        "CHANGED=0",
    ])
    body = r"""
# ---- 1. OS packages: tcmalloc (first name apt knows) and the profile's packages, only if missing
need=()
for p in "${APT_PACKAGES[@]}"; do installed "$p" || need+=("$p"); done
tcmalloc=""
for p in "${TCMALLOC_PACKAGES[@]}"; do if installed "$p"; then tcmalloc="$p"; break; fi; done
if [ -n "$tcmalloc" ] && [ "${#need[@]}" = 0 ]; then
  xc step apt unchanged "tcmalloc ($tcmalloc) and ${APT_PACKAGES[*]} already installed"
else
  wanted="${need[*]}"; [ -n "$tcmalloc" ] || wanted="$wanted tcmalloc"
  xc progress apt "installing:$wanted"
  apt_get update -qq || { xc step apt failed "apt-get update failed"; exit 10; }
  if [ -z "$tcmalloc" ]; then
    for p in "${TCMALLOC_PACKAGES[@]}"; do if known_to_apt "$p"; then tcmalloc="$p"; break; fi; done
    [ -n "$tcmalloc" ] || { xc step apt failed "apt knows none of ${TCMALLOC_PACKAGES[*]} (tcmalloc)"; exit 11; }
    need+=("$tcmalloc")
  fi
  apt_get install -y -qq --no-install-recommends "${need[@]}" || { xc step apt failed "apt-get install ${need[*]} failed"; exit 12; }
  xc step apt changed "installed ${need[*]}"
  CHANGED=1
fi

# ---- 2. the venv, from the OS Python, shared by every node that sees the same /opt
[ -x "$OS_PYTHON" ] || { xc step venv failed "$OS_PYTHON not found: install python3 and python3-venv"; exit 20; }
case "$(readlink -f "$OS_PYTHON")" in
  /root/*) xc step venv failed "$OS_PYTHON resolves under /root; the nodes need an OS Python"; exit 21 ;;
esac
if [ ! -d "$NODE_ROOT" ] || [ ! -w "$NODE_ROOT" ]; then
  $SUDO mkdir -p "$NODE_ROOT" && $SUDO chown "$(id -u):$(id -g)" "$NODE_ROOT" \
    || { xc step venv failed "cannot create $NODE_ROOT (needs root or passwordless sudo)"; exit 22; }
fi
exec 9>"$NODE_ROOT/.setup-$PROFILE.lock"
if ! flock -n 9; then
  xc progress venv "another setup holds $NODE_ROOT/.setup-$PROFILE.lock (a node sharing /opt); waiting up to ${VENV_LOCK_TIMEOUT}s"
  flock -w "$VENV_LOCK_TIMEOUT" 9 || { xc step venv failed "timed out waiting for the venv lock"; exit 23; }
fi
if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/__PROFILE_MARKER__" 2>/dev/null)" = "$DIGEST" ]; then
  xc step venv unchanged "$VENV already has profile $PROFILE ($DIGEST)"
else
  if [ ! -x "$VENV/bin/python" ]; then
    xc progress venv "creating $VENV from $OS_PYTHON"
    "$OS_PYTHON" -m venv "$VENV" || { xc step venv failed "$OS_PYTHON -m venv $VENV failed (is python3-venv installed?)"; exit 24; }
  fi
  rm -f "$VENV/__PROFILE_MARKER__" "$VENV/__PROJECT_MARKER__"
  xc progress venv "pip install (profile $PROFILE): __PINS__"
  "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input -q __PIP_SOURCE__ __PINS__ \
    || { xc step venv failed "pip install of the profile's pins failed"; exit 25; }
  echo "$DIGEST" > "$VENV/__PROFILE_MARKER__.tmp" && mv "$VENV/__PROFILE_MARKER__.tmp" "$VENV/__PROFILE_MARKER__"
  xc step venv changed "$VENV has profile $PROFILE ($DIGEST)"
  CHANGED=1
fi

# ---- 3. this project, at the controller's exact version
if [ -z "$PROJECT_WHEEL" ]; then
  xc step project skipped "no project wheel given"
elif [ "$(cat "$VENV/__PROJECT_MARKER__" 2>/dev/null)" = "$PROJECT_VERSION" ]; then
  xc step project unchanged "xeon-cluster $PROJECT_VERSION already installed"
else
  "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input -q --no-deps --force-reinstall "$PROJECT_WHEEL" \
    || { xc step project failed "pip install $PROJECT_WHEEL failed"; exit 30; }
  echo "$PROJECT_VERSION" > "$VENV/__PROJECT_MARKER__.tmp" && mv "$VENV/__PROJECT_MARKER__.tmp" "$VENV/__PROJECT_MARKER__"
  xc step project changed "xeon-cluster $PROJECT_VERSION installed"
  CHANGED=1
fi
flock -u 9
xc done "$CHANGED"
"""
    body = (body.replace("__PINS__", pins).replace("__PIP_SOURCE__", pip_source)
            .replace("__PROFILE_MARKER__", PROFILE_MARKER).replace("__PROJECT_MARKER__", PROJECT_MARKER))
    return head + "\n" + _COMMON + _APT + body


def check_script(profile: Profile, project_distribution: str = PROJECT_DISTRIBUTION, venv: str | None = None) -> str:
    """Print the facts `evaluate_check` needs, as `::xc:: fact <name> <value...>` lines."""
    venv = venv or venv_dir(profile)
    names = [pin_name(p) for p in profile.pip_pins]
    names.append(project_distribution)
    probe = ("import importlib.metadata as m, sys\n"
             "for n in sys.argv[1:]:\n"
             "    try: print('::xc:: fact pkg', n, m.version(n))\n"
             "    except m.PackageNotFoundError: print('::xc:: fact pkg', n, 'MISSING')\n")
    return "\n".join([
        "#!/bin/bash",
        "set -u",
        f"VENV={_q(venv)}",
        'xc() { echo "::xc:: $*"; }',
        'if [ -x "$VENV/bin/python" ]; then',
        '  xc fact python "$VENV/bin/python" "$("$VENV/bin/python" -c \'import platform; print(platform.python_version())\')"',
        f'  "$VENV/bin/python" -c {_q(probe)} {" ".join(_q(n) for n in names)}',
        "else",
        '  xc fact python MISSING',
        "fi",
        f'xc fact profile_marker "$(cat "$VENV/{PROFILE_MARKER}" 2>/dev/null || echo MISSING)"',
        f'xc fact project_marker "$(cat "$VENV/{PROJECT_MARKER}" 2>/dev/null || echo MISSING)"',
        f"flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\\n' | grep -xE '{'|'.join(CPU_FLAGS)}' | sort | tr '\\n' ' ')",
        'xc fact cpu_flags ${flags:-none}',
        f"if [ -e {_q(TCMALLOC_PATH)} ]; then xc fact tcmalloc {_q(TCMALLOC_PATH)}; else xc fact tcmalloc MISSING; fi",
        f'target="$VENV"; [ -e "$target" ] || target={_q(NODE_ROOT)}; [ -e "$target" ] || target=/',
        "xc fact disk_free_kib \"$(df -Pk \"$target\" | awk 'NR==2 {print $4}')\" \"$target\"",
        "xc fact cpu_model \"$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')\"",
        "",
    ])


def prebake_script(root: str = "", restore_host_keys_after_s: int | None = 300) -> str:
    """Remove what must not be baked into an image. `root` prefixes every path (tests).

    SSH host keys are moved to /run (tmpfs, never part of a snapshot) rather than deleted, because
    the master keeps running and serving SSH after the no-reboot snapshot; they are moved back
    `restore_host_keys_after_s` seconds later by a detached process (None: not restored). Instances
    made from the image get new host keys from cloud-init (ssh_deletekeys) on first boot.
    """
    r = _q(root) if root else '""'
    if restore_host_keys_after_s is not None:
        restore = (
            f'  nohup setsid sh -c "sleep {int(restore_host_keys_after_s)}; '
            f'mv -n \\"$STASH\\"/ssh_host_* \\"$R/etc/ssh/\\"" >/dev/null 2>&1 < /dev/null &\n'
            f'  xc step prebake hostkeys "moved to $STASH; restored in {int(restore_host_keys_after_s)}s"\n')
    else:
        restore = '  xc step prebake hostkeys "moved to $STASH (not restored)"\n'
    return (
        "#!/bin/bash\n"
        "set -uo pipefail\n"
        f"R={r}\n"
        f'STASH="$R"{_q(PREBAKE_KEY_STASH)}\n'
        + _COMMON +
        "shopt -s nullglob\n"
        "# ---- SSH host keys: a clone must never share them\n"
        'keys=("$R"/etc/ssh/ssh_host_*)\n'
        'if [ "${#keys[@]}" -gt 0 ]; then\n'
        '  $SUDO mkdir -p "$STASH" && $SUDO chmod 700 "$STASH" && $SUDO mv "${keys[@]}" "$STASH/" '
        '|| { xc step prebake failed "cannot move host keys"; exit 40; }\n'
        + restore +
        "else\n"
        '  xc step prebake hostkeys "none present"\n'
        "fi\n"
        "# ---- shell history\n"
        'hist=("$R"/root/.bash_history "$R"/root/.python_history "$R"/home/*/.bash_history "$R"/home/*/.python_history)\n'
        'for f in "${hist[@]}"; do [ -e "$f" ] && $SUDO rm -f "$f"; done\n'
        'xc step prebake history "removed"\n'
        "# ---- cloud-init per-instance state (clones run cloud-init again as new instances)\n"
        'if [ -z "$R" ] && command -v cloud-init >/dev/null 2>&1; then $SUDO cloud-init clean --logs >/dev/null 2>&1; fi\n'
        '$SUDO rm -rf "$R"/var/lib/cloud/instances "$R"/var/lib/cloud/instance "$R"/var/lib/cloud/sem '
        '"$R"/var/lib/cloud/data "$R"/var/log/cloud-init.log "$R"/var/log/cloud-init-output.log\n'
        'xc step prebake cloud-init "per-instance state removed"\n'
        "# ---- private keys in any ~/.ssh, and the cluster key's authorized_keys lines\n"
        'removed=0\n'
        'for f in "$R"/root/.ssh/* "$R"/home/*/.ssh/*; do\n'
        '  [ -f "$f" ] || continue\n'
        "  if $SUDO grep -qE -- '-----BEGIN ([A-Z]+ )?PRIVATE KEY-----' \"$f\" 2>/dev/null; then $SUDO rm -f \"$f\"; removed=$((removed+1)); fi\n"
        "done\n"
        'for f in "$R"/root/.ssh/authorized_keys "$R"/home/*/.ssh/authorized_keys; do\n'
        f'  [ -f "$f" ] && $SUDO sed -i "/ {KEY_COMMENT_PREFIX}/d" "$f"\n'
        "done\n"
        'xc step prebake private-keys "removed $removed"\n'
        "sync\n"
        'xc done 1\n'
    )


def append_line_once_command(path: str, line: str, mode: str = "600") -> str:
    """Shell that appends `line` to `path` unless present (creates the file and its dir)."""
    return (f"umask 077; mkdir -p \"$(dirname {path})\" && touch {path} && chmod {mode} {path} && "
            f"(grep -qxF {_q(line)} {path} && echo unchanged || (echo {_q(line)} >> {path} && echo appended))")


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


def pip_download_args(profile: Profile, dest: str, index_urls: Iterable[str] = ()) -> list[str]:
    """`pip download` arguments that fill a wheelhouse with the profile's pins (controller side)."""
    args = ["download", "--disable-pip-version-check", "--no-input", "-q", "-d", dest]
    for url in index_urls:
        args += ["--extra-index-url", url]
    return args + list(profile.pip_pins)


def wheelhouse_marker_name(profile: Profile) -> str:
    """The file that says a wheelhouse holds everything the profile needs."""
    return f".xeon-cluster-filled-{profile.name}-{fingerprint_digest(profile)}"

