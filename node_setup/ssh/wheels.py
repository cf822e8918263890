"""What `fab setup` ships to the nodes from this controller: the project wheel and the wheelhouse.

The project goes to the nodes as a wheel built from the controller's checkout (`pip wheel
--no-deps` of a clean copy of the sources, so the checkout gets no build/ or egg-info litter),
versioned `<pyproject version>+src.<digest of the sources>` (node_setup/controller.py): any change
of the controller's code reinstalls it on the next setup, and nothing else. A wheelhouse holds
every wheel of a profile for nodes without internet (the local cluster's nodes).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from cluster.node.profiles import IndexPin, Profile
from cluster.node.setup_script import index_download_args, pip_download_args, wheelhouse_marker_name
from node_setup.controller import PROJECT_PACKAGES, PROJECT_ROOT, cache_root, project_version

INDEX_PROBE_TIMEOUT_S = 5
OUTPUT_TAIL_LINES = 15

Progress = Callable[[str], None]


def tail(text: str, lines: int = OUTPUT_TAIL_LINES) -> str:
    """The last `lines` lines of a command's output, for error messages."""
    return "\n".join((text or "").rstrip().splitlines()[-lines:])


class InstallError(RuntimeError):
    """Something on the controller side of setup failed (wheel build, wheelhouse); says what to do."""

# ------------------------------------------------------------------------------ the project wheel


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
    cache = cache_dir or cache_root() / "wheels"
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
            raise InstallError(f"building the xeon-cluster wheel failed (`{' '.join(cmd)}`, exit "
                               f"{result.returncode}):\n"
                               + tail(result.stdout + result.stderr) +
                               "\ninstall setuptools and wheel into the controller's Python (pip install -e .[dev])")
        out.mkdir(parents=True, exist_ok=True)
        target = out / wheels[0].name
        # another fab on this controller may be reading the cache: the wheel appears whole or not at all
        partial = out / f".{wheels[0].name}.{os.getpid()}.partial"
        shutil.copy2(wheels[0], partial)
        os.replace(partial, target)
    return ProjectWheel(target, version)


def given_wheel(path: str | Path) -> ProjectWheel:
    path = Path(path).expanduser()
    if not path.is_file() or path.suffix != ".whl":
        raise InstallError(f"project_wheel: {str(path)!r} is not a wheel file; give the path of a .whl")
    version = path.name.split("-")[1]
    return ProjectWheel(path, f"{version}+whl.{hashlib.sha256(path.read_bytes()).hexdigest()[:12]}")


# --------------------------------------------------------------------------------- the wheelhouse


def reachable_indexes(urls: Iterable[str], timeout: float = INDEX_PROBE_TIMEOUT_S) -> tuple[list[str], list[str]]:
    """Split index URLs into (reachable, unreachable with reason) from the controller.

    pip retries an unreachable index five times per package (minutes per fill), so the fill does
    not ask one that does not answer: that index's packages then come from the controller's own
    find-links (`--no-index`), never from PyPI.
    """
    good: list[str] = []
    bad: list[str] = []
    for url in urls:
        if url.startswith("file://"):  # a local index (a mirror, or a test's)
            (good if Path(urllib.request.url2pathname(url[len("file://"):])).is_dir() else bad).append(url)
            continue
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
    reachable, unreachable = reachable_indexes(sorted({p.index_url for p in profile.index_pins}))
    for entry in unreachable:
        progress(f"wheelhouse: index {entry} is unreachable from here; its packages come from this controller's "
                 "own find-links or not at all (never from PyPI)")
    progress(f"wheelhouse {wheelhouse}: pip download of profile {profile.name} ({len(profile.pip_pins)} pins)")
    start = time.monotonic()
    files = {pin.name: str(_download_index_pin(pin, wheelhouse, pin.index_url in reachable))
             for pin in profile.index_pins}
    cmd = [sys.executable, "-m", "pip", *pip_download_args(profile, str(wheelhouse), files)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise InstallError(f"filling the wheelhouse {wheelhouse} failed (exit {result.returncode}):\n"
                           + tail(result.stdout + result.stderr) +
                           "\nthe controller needs the profile's packages from PyPI or its pip find-links")
    marker.write_text(f"{profile.fingerprint()}\n")
    progress(f"wheelhouse {wheelhouse}: filled in {time.monotonic() - start:.0f} s")
    return True


def _download_index_pin(pin: IndexPin, wheelhouse: Path, index_reachable: bool) -> Path:
    """One index-only package into the wheelhouse, from its own index alone (cluster/node/profiles.py)."""
    with tempfile.TemporaryDirectory(prefix="xc-index-pin-") as tmp:
        requirement = Path(tmp) / "requirement.txt"
        requirement.write_text(pin.requirement() + "\n")
        got = Path(tmp) / "got"
        cmd = [sys.executable, "-m", "pip",
               *index_download_args(pin, str(got), str(requirement), index_reachable=index_reachable)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        found = sorted(got.iterdir()) if got.is_dir() else []
        if result.returncode != 0 or len(found) != 1:
            where = (pin.index_url if index_reachable
                     else f"this controller's find-links ({pin.index_url} is unreachable)")
            raise InstallError(f"filling the wheelhouse {wheelhouse}: {pin.pin} from {where} failed "
                               f"(exit {result.returncode}):\n" + tail(result.stdout + result.stderr) +
                               f"\n{pin.name} is taken from its own index only, never from PyPI")
        target = wheelhouse / found[0].name
        shutil.copy2(found[0], target)
    return target


def sync_wheelhouse(conn, wheelhouse: str | Path) -> int:
    """Copy the wheelhouse's files the node lacks (same path on the node); returns how many."""
    wheelhouse = Path(wheelhouse)
    where = shlex.quote(str(wheelhouse))
    listing = conn.run(f"mkdir -p {where} && cd {where} && find . -maxdepth 1 -type f -printf '%f %s\\n'",
                       hide=True, in_stream=False)
    remote = dict(line.rsplit(" ", 1) for line in listing.stdout.splitlines() if " " in line)
    copied = 0
    for path in sorted(wheelhouse.iterdir()):
        if path.is_file() and remote.get(path.name) != str(path.stat().st_size):
            conn.put(str(path), remote=str(wheelhouse / path.name))
            copied += 1
    return copied


