"""Install and check a software profile on nodes over SSH (the scripts come from cluster.setup_script).

For the Pulumi setup step (infra/setup_step.py), on one open Fabric Connection:

    install_profile(conn, profile, *, wheelhouse=None, project_wheel=None, progress=None) -> InstallResult
        raises invoke.UnexpectedExit (with the remote output) when the install fails
    prepare_for_bake(conn, *, restore_host_keys_after_s=300) -> None
        raises invoke.UnexpectedExit when the cleanup fails

For `fab setup` / `fab check`, on a whole inventory, every node in parallel, never raising for a
node: `setup_nodes(...)` -> [InstallResult], `check_nodes(...)` -> [NodeCheck], rank order.

This project goes to the nodes as a wheel built from the controller's checkout (`pip wheel
--no-deps` of a clean copy of the sources, so the checkout gets no build/ or egg-info litter),
versioned `<pyproject version>+src.<digest of the sources>`: any change of the controller's code
reinstalls it on the next setup, and nothing else.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from invoke.exceptions import CommandTimedOut, UnexpectedExit

from cluster.catalog import InstanceType
from cluster.inventory import Inventory
from cluster.profiles import Profile, get_profile
from cluster.setup_script import (DEFAULT_MIN_FREE_GIB, CheckReport, Event, InstallPlan, changed, check_script,
                                  evaluate_check, install_script, parse_events, pip_download_args, prebake_script,
                                  wheelhouse_marker_name)
from node_setup import connections

PROJECT_ROOT = Path(__file__).resolve().parents[1]
PROJECT_PACKAGES = ("cluster", "infra", "node_setup", "training")
REMOTE_DIR = ".cache/xeon-cluster"  # relative to the SSH user's home (where ssh commands start)
OUTPUT_TAIL_LINES = 15
INSTALL_TIMEOUT_S = 3600
INDEX_PROBE_TIMEOUT_S = 5

Progress = Callable[[str], None]


class InstallError(RuntimeError):
    """Something on the controller side of setup failed (wheel build, wheelhouse); says what to do."""


# ------------------------------------------------------------------------------ the project wheel


def _source_files(root: Path) -> list[Path]:
    files = [root / "pyproject.toml"]
    for package in PROJECT_PACKAGES:
        files += sorted(p for p in (root / package).rglob("*.py") if "__pycache__" not in p.parts)
    return files


def project_version(root: Path | None = None) -> str:
    """`<version>+src.<12 hex>`: the pyproject version and a digest of the package sources."""
    root = root or PROJECT_ROOT
    pyproject = root / "pyproject.toml"
    if not pyproject.exists():
        from importlib.metadata import version

        return version("xeon-cluster")
    base = tomllib.loads(pyproject.read_text())["project"]["version"]
    digest = hashlib.sha256()
    for path in _source_files(root):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{base}+src.{digest.hexdigest()[:12]}"


@dataclass(frozen=True)
class ProjectWheel:
    path: Path
    version: str  # what the node's project marker records


def build_project_wheel(root: Path | None = None, cache_dir: Path | None = None) -> ProjectWheel:
    """A wheel of the controller's checkout, built once per source version and cached."""
    root = root or PROJECT_ROOT
    if not (root / "pyproject.toml").exists():
        raise InstallError(f"no project checkout at {root} (pyproject.toml missing) to build the xeon-cluster wheel "
                           "from; run fab from the repository, or pass project_wheel")
    version = project_version(root)
    cache = cache_dir or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "xeon-cluster" / "wheels"
    out = cache / version
    found = sorted(out.glob("xeon_cluster-*.whl")) if out.exists() else []
    if found:
        return ProjectWheel(found[0], version)
    with tempfile.TemporaryDirectory(prefix="xc-wheel-") as tmp:
        src = Path(tmp) / "src"
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        for package in PROJECT_PACKAGES:
            if (root / package).is_dir():
                shutil.copytree(root / package, src / package, ignore=ignore)
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            if (root / name).exists():
                shutil.copy2(root / name, src / name)
        if not (src / "README.md").exists():
            (src / "README.md").write_text("xeon-cluster\n")
        built = Path(tmp) / "dist"
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(built),
               str(src)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(built.glob("xeon_cluster-*.whl"))
        if result.returncode != 0 or not wheels:
            raise InstallError(f"building the xeon-cluster wheel failed (`{' '.join(cmd)}`, exit {result.returncode}):\n"
                               + _tail(result.stdout + result.stderr) +
                               "\ninstall setuptools and wheel into the controller's Python (pip install -e .[dev])")
        out.mkdir(parents=True, exist_ok=True)
        target = out / wheels[0].name
        shutil.copy2(wheels[0], target)
    return ProjectWheel(target, version)


def _given_wheel(path: str | Path) -> ProjectWheel:
    path = Path(path).expanduser()
    if not path.is_file() or path.suffix != ".whl":
        raise InstallError(f"project_wheel: {str(path)!r} is not a wheel file; give the path of a .whl")
    version = path.name.split("-")[1]
    return ProjectWheel(path, f"{version}+whl.{hashlib.sha256(path.read_bytes()).hexdigest()[:12]}")


# --------------------------------------------------------------------------------- the wheelhouse


def reachable_indexes(urls: Iterable[str], timeout: float = INDEX_PROBE_TIMEOUT_S) -> tuple[list[str], list[str]]:
    """Split index URLs into (reachable, unreachable with reason) from the controller.

    pip retries an unreachable index five times per package (minutes per fill), so the fill uses
    only the indexes that answer; PyPI and the controller's own pip configuration always apply.
    """
    good, bad = [], []
    for url in urls:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
                good.append(url)
        except urllib.error.HTTPError:
            good.append(url)  # it answered (some indexes refuse HEAD on the root)
        except (urllib.error.URLError, OSError) as exc:
            bad.append(f"{url} ({getattr(exc, 'reason', exc)})")
    return good, bad


def fill_wheelhouse(profile: Profile, wheelhouse: str | Path, progress: Progress = lambda _: None) -> bool:
    """Download the profile's pins (and their dependencies) into `wheelhouse` on the controller.

    Runs once per profile fingerprint (a marker file in the wheelhouse); returns True if it filled.
    """
    import fcntl

    wheelhouse = Path(wheelhouse)
    marker = wheelhouse / wheelhouse_marker_name(profile)
    if marker.exists():
        progress(f"wheelhouse {wheelhouse}: already has profile {profile.name}")
        return False
    wheelhouse.mkdir(parents=True, exist_ok=True)
    with open(wheelhouse / ".fill.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another fab filling the same wheelhouse: wait for it
        if marker.exists():
            progress(f"wheelhouse {wheelhouse}: filled by another run meanwhile")
            return False
        return _fill(profile, wheelhouse, marker, progress)


def _fill(profile: Profile, wheelhouse: Path, marker: Path, progress: Progress) -> bool:
    indexes, unreachable = reachable_indexes(profile.extra_index_urls)
    for entry in unreachable:
        progress(f"wheelhouse: index {entry} is unreachable from here; using the others")
    progress(f"wheelhouse {wheelhouse}: pip download of profile {profile.name} ({len(profile.pip_pins)} pins)")
    start = time.monotonic()
    cmd = [sys.executable, "-m", "pip", *pip_download_args(profile, str(wheelhouse), indexes)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise InstallError(f"filling the wheelhouse {wheelhouse} failed (exit {result.returncode}):\n"
                           + _tail(result.stdout + result.stderr) +
                           "\nthe controller needs the profile's packages from PyPI or its pip find-links")
    marker.write_text(f"{profile.fingerprint()}\n")
    progress(f"wheelhouse {wheelhouse}: filled in {time.monotonic() - start:.0f} s")
    return True


def sync_wheelhouse(conn, wheelhouse: str | Path) -> int:
    """Copy the wheelhouse's files the node lacks (same path on the node); returns how many."""
    wheelhouse = Path(wheelhouse)
    listing = conn.run(f"mkdir -p {wheelhouse} && cd {wheelhouse} && find . -maxdepth 1 -type f -printf '%f %s\\n'",
                       hide=True, in_stream=False)
    remote = dict(line.rsplit(" ", 1) for line in listing.stdout.splitlines() if " " in line)
    copied = 0
    for path in sorted(wheelhouse.iterdir()):
        if path.is_file() and remote.get(path.name) != str(path.stat().st_size):
            conn.put(str(path), remote=str(wheelhouse / path.name))
            copied += 1
    return copied


# ------------------------------------------------------------------------------ one node


def _tail(text: str, lines: int = OUTPUT_TAIL_LINES) -> str:
    return "\n".join((text or "").rstrip().splitlines()[-lines:])


class _LineSink(io.TextIOBase):
    """Where the remote output goes: `::xc::` progress/step lines to `progress`; the rest is dropped
    here (invoke still captures all of it in result.stdout/stderr, which the failure report reads)."""

    def __init__(self, progress: Progress | None):
        self.progress = progress
        self._partial = ""

    def write(self, text: str) -> int:
        self._partial += text
        *lines, self._partial = self._partial.split("\n")
        for line in lines:
            self._line(line)
        return len(text)

    def _line(self, line: str) -> None:
        events = parse_events(line)
        if not events:
            return
        event = events[0]
        if self.progress and event.kind in ("progress", "step"):
            status = f" {event.status}" if event.status else ""
            self.progress(f"{event.name}{status}: {event.detail}".rstrip(": "))

    def flush(self) -> None:
        pass


@dataclass
class InstallResult:
    node: str
    ok: bool
    changed: bool | None  # None: did not finish
    steps: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (status, detail)
    tail: tuple[str, ...] = ()
    seconds: float = 0.0
    error: str | None = None
    unreachable: bool = False

    @property
    def summary(self) -> str:
        if not self.ok:
            return self.error or "failed"
        if not self.changed:
            return "already installed, nothing changed"
        return "; ".join(f"{name} {status}" for name, (status, _) in self.steps.items() if status == "changed")


def _result_from(node: str, text: str, seconds: float, ok: bool, error: str | None = None) -> InstallResult:
    events: list[Event] = parse_events(text)
    steps = {e.name: (e.status, e.detail) for e in events if e.kind == "step"}
    if not ok and error is None:
        failed = [f"{name}: {detail}" for name, (status, detail) in steps.items() if status == "failed"]
        error = failed[-1] if failed else "the install script failed"
    tail = tuple(line for line in text.splitlines() if line.strip())[-OUTPUT_TAIL_LINES:]
    return InstallResult(node, ok, changed(events) if ok else None, steps, tail, seconds, error)


def _ensure_remote_dir(conn) -> None:
    conn.run(f"mkdir -p {REMOTE_DIR} && chmod 700 {REMOTE_DIR}", hide=True, in_stream=False)


def install_profile(conn, profile: Profile, *, wheelhouse: str | None = None,
                    project_wheel: str | Path | ProjectWheel | bool | None = None, progress: Progress | None = None,
                    timeout: float | None = INSTALL_TIMEOUT_S, **plan_options) -> InstallResult:
    """Install `profile` (and this project) on the node behind `conn`; idempotent.

    `project_wheel`: None builds it from the controller's checkout, False skips the project, a path
    or ProjectWheel installs that wheel. `wheelhouse`: a directory on the node holding every wheel
    (nodes without internet). Raises invoke.UnexpectedExit / CommandTimedOut when the remote
    install fails; the exception's result carries the full output.
    """
    start = time.monotonic()
    wheel: ProjectWheel | None
    if project_wheel is None or project_wheel is True:
        wheel = build_project_wheel()
    elif project_wheel is False:
        wheel = None
    elif isinstance(project_wheel, ProjectWheel):
        wheel = project_wheel
    else:
        wheel = _given_wheel(project_wheel)
    _ensure_remote_dir(conn)
    remote_wheel = None
    if wheel is not None:
        remote_wheel = f"{REMOTE_DIR}/{wheel.path.name}"
        conn.put(str(wheel.path), remote=remote_wheel)
    plan = InstallPlan(profile, project_wheel=remote_wheel, project_version=wheel.version if wheel else None,
                       wheelhouse=wheelhouse, **plan_options)
    script = f"{REMOTE_DIR}/install-{profile.name}.sh"
    conn.put(io.StringIO(install_script(plan)), remote=script)
    sink = _LineSink(progress)
    result = conn.run(f"bash {script}", hide=False, out_stream=sink, err_stream=sink, warn=True, timeout=timeout,
                      in_stream=False, pty=False)
    if result.failed:
        raise UnexpectedExit(result)
    return _result_from(getattr(conn, "host", "?"), result.stdout + result.stderr, time.monotonic() - start, True)


def check_node(conn, profile: Profile, *, project_version: str | None = None, instance: InstanceType | None = None,
               min_free_gib: float = DEFAULT_MIN_FREE_GIB) -> CheckReport:
    """What is on the node compared with the profile (raises only when SSH itself fails)."""
    import shlex

    result = conn.run(f"bash -c {shlex.quote(check_script(profile))}", hide=True, warn=True, in_stream=False)
    return evaluate_check(profile, parse_events(result.stdout), project_version=project_version,
                          instance=instance, min_free_gib=min_free_gib)


def prepare_for_bake(conn, *, restore_host_keys_after_s: int | None = 300) -> None:
    """Remove what must not go into an image (host keys, history, cloud-init state, private keys).

    Host keys are moved to /run and put back `restore_host_keys_after_s` seconds later, so the
    running master still accepts SSH after the no-reboot snapshot; take the snapshot within that
    time (new connections are refused until then). Raises invoke.UnexpectedExit on failure.
    """
    _ensure_remote_dir(conn)
    script = f"{REMOTE_DIR}/prebake.sh"
    conn.put(io.StringIO(prebake_script(restore_host_keys_after_s=restore_host_keys_after_s)), remote=script)
    conn.run(f'if [ "$(id -u)" = 0 ]; then bash {script}; else sudo -n bash {script}; fi; rc=$?; '
             f"rm -rf {REMOTE_DIR}; exit $rc", hide=True, in_stream=False)


# ---------------------------------------------------------------------------- every node


def _parallel(names: list[str], work: Callable[[str], object]) -> list:
    with ThreadPoolExecutor(max_workers=max(len(names), 1), thread_name_prefix="xc-node") as pool:
        return list(pool.map(work, names))


def setup_nodes(inventory: Inventory, *, conns: dict | None = None, profile: Profile | None = None,
                progress: Callable[[str, str], None] = lambda node, msg: None,
                project_wheel: str | Path | ProjectWheel | bool | None = None,
                connect_timeout: float = connections.CONNECT_TIMEOUT, timeout: float | None = INSTALL_TIMEOUT_S,
                **plan_options) -> list[InstallResult]:
    """Install the profile on every node in parallel; one InstallResult per node, rank order.

    Controller-side work (the project wheel, the wheelhouse) happens once, first; its failure
    raises InstallError. A node that fails or cannot be reached does not stop the others.
    """
    profile = profile or get_profile(inventory.profile)
    if project_wheel is None or project_wheel is True:
        project_wheel = build_project_wheel()
    if inventory.wheelhouse:
        fill_wheelhouse(profile, inventory.wheelhouse, lambda msg: progress("controller", msg))

    def one(name: str) -> InstallResult:
        conn = conns[name]
        start = time.monotonic()
        try:
            conn.open()
        except Exception as exc:  # noqa: BLE001 - every connect failure is reported per node
            result = InstallResult(name, False, None, seconds=time.monotonic() - start,
                                   error=connections.explain(exc, conn), unreachable=True)
            progress(name, result.error)
            return result
        try:
            if inventory.wheelhouse and inventory.kind != "local":
                copied = sync_wheelhouse(conn, inventory.wheelhouse)
                if copied:
                    progress(name, f"wheelhouse: copied {copied} file(s)")
            result = install_profile(conn, profile, wheelhouse=inventory.wheelhouse, project_wheel=project_wheel,
                                     progress=lambda msg: progress(name, msg), timeout=timeout, **plan_options)
            result.node, result.seconds = name, time.monotonic() - start
            return result
        except UnexpectedExit as exc:
            r = exc.result
            return _result_from(name, r.stdout + r.stderr, time.monotonic() - start, False)
        except CommandTimedOut as exc:
            return InstallResult(name, False, None, seconds=time.monotonic() - start,
                                 error=f"timed out after {exc.timeout} s", tail=tuple(
                                     (exc.result.stdout or "").splitlines()[-OUTPUT_TAIL_LINES:]))
        except Exception as exc:  # noqa: BLE001 - a dropped connection mid-install, reported per node
            return InstallResult(name, False, None, seconds=time.monotonic() - start,
                                 error=connections.explain(exc, conn), unreachable=connections.is_unreachable(exc))

    own = conns is None
    conns = conns or connections.connections_for(inventory, connect_timeout=connect_timeout)
    try:
        return _parallel(list(conns), one)
    finally:
        if own:
            connections.close_all(conns)


@dataclass
class NodeCheck:
    node: str
    report: CheckReport | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.report is not None and self.report.ok


def check_nodes(inventory: Inventory, *, conns: dict | None = None, profile: Profile | None = None,
                project_version: str | None = None, min_free_gib: float = DEFAULT_MIN_FREE_GIB,
                connect_timeout: float = connections.CONNECT_TIMEOUT) -> list[NodeCheck]:
    """`check_node` on every node in parallel, rank order; unreachable nodes carry the reason."""
    profile = profile or get_profile(inventory.profile)
    own = conns is None
    conns = conns or connections.connections_for(inventory, connect_timeout=connect_timeout)
    try:
        instance = inventory.machine() if inventory.instance_type else None
    except ValueError:
        instance = None

    def one(name: str) -> NodeCheck:
        conn = conns[name]
        try:
            return NodeCheck(name, check_node(conn, profile, project_version=project_version, instance=instance,
                                              min_free_gib=min_free_gib))
        except Exception as exc:  # noqa: BLE001
            return NodeCheck(name, None, connections.explain(exc, conn))

    try:
        return _parallel(list(conns), one)
    finally:
        if own:
            connections.close_all(conns)


_print_lock = threading.Lock()


def print_progress(node: str, message: str) -> None:
    """Per-node progress line, safe from several threads."""
    with _print_lock:
        print(f"  {node}: {message}", flush=True)
