"""Install and check a software profile on nodes over SSH (the scripts come from cluster.node.setup_script).

For the Pulumi setup step (infra/setup_step.py), on one open Fabric Connection:

    install_profile(conn, profile, *, wheelhouse=None, project_wheel=None, progress=None) -> InstallResult
        raises invoke.UnexpectedExit (with the remote output) when the install fails
    check_node(conn, profile, *, project_version=None, ...) -> CheckReport

For `fab setup` / `fab check`, on a whole inventory, every node in parallel, never raising for a
node: `setup_nodes(...)` -> [InstallResult], `check_nodes(...)` -> [NodeCheck], rank order.

This project goes to the nodes as a wheel built from the controller's checkout (`pip wheel
--no-deps` of a clean copy of the sources, so the checkout gets no build/ or egg-info litter),
versioned `<pyproject version>+src.<digest of the sources>`: any change of the controller's code
reinstalls it on the next setup, and nothing else.
"""

from __future__ import annotations

import io
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from invoke.exceptions import CommandTimedOut, UnexpectedExit

from cluster.stack.catalog import InstanceType
from cluster.inventory import Inventory
from cluster.node.profiles import Profile, get_profile
from cluster.names import printable
from cluster.node.setup_script import (DEFAULT_MIN_FREE_GIB, LOCK_HOLDER_MAX, CheckReport, Event, InstallPlan, changed,
                                       check_script, evaluate_check, install_script, parse_events)
from node_setup.controller import PROJECT_ROOT
from node_setup.backends import backend_for
from node_setup.ssh import connections
from node_setup.ssh.fanout import each_node
from node_setup.ssh.wheels import (OUTPUT_TAIL_LINES, ProjectWheel, build_project_wheel,
                                   fill_wheelhouse, given_wheel, sync_wheelhouse)

REMOTE_DIR = ".cache/xeon-cluster"  # relative to the SSH user's home (where ssh commands start)
INSTALL_TIMEOUT_S = 3600
HEARTBEAT_S = 30.0  # a step that long without a line of news gets one saying it still runs

Progress = Callable[[str], None]


# ------------------------------------------------------------------------------ one node


class _LineSink(io.TextIOBase):
    """Where the remote output goes: `::xc::` progress/step lines to `progress`; the rest is dropped
    here (invoke still captures all of it in result.stdout/stderr, which the failure report reads).
    It remembers the last progress line and when it came, for `_heartbeat`."""

    def __init__(self, progress: Progress | None):
        self.progress = progress
        self._partial = ""
        self.last: str | None = None  # the step under way (its progress line), None after a step ended
        self.since = time.monotonic()

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
        if event.kind in ("progress", "step"):
            status = f" {event.status}" if event.status else ""
            line = f"{event.name}{status}: {event.detail}".rstrip(": ")
            self.last, self.since = (line if event.kind == "progress" else None), time.monotonic()
            if self.progress:
                self.progress(line)

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
        wheel = given_wheel(project_wheel)
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
    done = threading.Event()
    if progress is not None:
        threading.Thread(target=_heartbeat, args=(sink, progress, done), daemon=True).start()
    try:
        result = conn.run(f"bash {script}", hide=False, out_stream=sink, err_stream=sink, warn=True, timeout=timeout,
                          in_stream=False, pty=False)
    finally:
        done.set()
    if result.failed:
        raise UnexpectedExit(result)
    return _result_from(getattr(conn, "host", "?"), result.stdout + result.stderr, time.monotonic() - start, True)


def _heartbeat(sink: _LineSink, progress: Progress, done: threading.Event) -> None:
    """While a step runs without news (pip installing torch, apt unpacking), say every HEARTBEAT_S that it
    still runs and for how long, so a long setup is never silent for minutes."""
    every = HEARTBEAT_S
    while not done.wait(every):
        quiet = time.monotonic() - sink.since
        if sink.last is not None and quiet >= every:
            progress(f"{sink.last.split(':')[0]}: still working, {_elapsed(quiet)} since: {sink.last}")


def _elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def check_node(conn, profile: Profile, *, project_version: str | None = None, instance: InstanceType | None = None,
               min_free_gib: float = DEFAULT_MIN_FREE_GIB) -> CheckReport:
    """What is on the node compared with the profile (raises only when SSH itself fails)."""
    import shlex

    result = conn.run(f"bash -c {shlex.quote(check_script(profile))}", hide=True, warn=True, in_stream=False)
    return evaluate_check(profile, parse_events(result.stdout), project_version=project_version,
                          instance=instance, min_free_gib=min_free_gib)


# ---------------------------------------------------------------------------- every node


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
    plan_options.setdefault("lock_holder", lock_holder(inventory))
    backend = backend_for(inventory.kind)
    plan_options.setdefault("compile_bytecode", backend.compiles_bytecode())
    copies_wheelhouse = backend.copies_wheelhouse()  # a local cluster's nodes read it here

    def one(name: str, conn) -> InstallResult:
        start = time.monotonic()
        try:
            conn.open()
        except Exception as exc:  # noqa: BLE001 - every connect failure is reported per node
            error = connections.explain(exc, conn)
            result = InstallResult(name, False, None, seconds=time.monotonic() - start, error=error, unreachable=True)
            progress(name, error)
            return result
        try:
            if inventory.wheelhouse and copies_wheelhouse:
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

    with connections.node_connections(inventory, conns, connect_timeout=connect_timeout) as conns:
        return each_node(conns, one)


def lock_holder(inventory: Inventory) -> str:
    """Who this setup is, as the setup lock's record names it to a node that waits for it (the nodes of a
    local cluster share /opt with every other local cluster on the machine)."""
    checkout = printable(PROJECT_ROOT)
    room = LOCK_HOLDER_MAX - len(inventory.name) - 40
    return f"cluster {inventory.name}, checkout {checkout if len(checkout) <= room else '...' + checkout[-room:]}"


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
    try:
        instance = inventory.machine() if inventory.instance_type else None
    except ValueError:
        instance = None

    def one(name: str, conn) -> NodeCheck:
        try:
            return NodeCheck(name, check_node(conn, profile, project_version=project_version, instance=instance,
                                              min_free_gib=min_free_gib))
        except Exception as exc:  # noqa: BLE001
            return NodeCheck(name, None, connections.explain(exc, conn))

    with connections.node_connections(inventory, conns, connect_timeout=connect_timeout) as conns:
        return each_node(conns, one)


_print_lock = threading.Lock()


def print_progress(node: str, message: str) -> None:
    """Per-node progress line, safe from several threads."""
    with _print_lock:
        print(f"  {node}: {message}", flush=True)
