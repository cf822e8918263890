"""The CPU-seconds each test file cost, printed at the end of every run (the ten heaviest files and the total).

Where the machine has cgroup v1's cpuacct controller and lets this process make a group (root, as the
local-cluster tests need), each pytest process moves itself into a cpuacct group of its own, and a
test's figure is that group's CPU time from the start of its setup to the end of its teardown: the
test's processes and everything they started, also the ranks a local node's sshd started (the node's
sshd is a child of the process that brought the cluster up). Elsewhere it is the process's own CPU
time and that of the children it waited for (`getrusage`), which misses the nodes' ranks. A module's
fixtures count in the file that made them, a session fixture's teardown in the last test of its
worker, a process a test left running in the tests after it. Wall times vary up to 1.7x between
machines of one kind; CPU-seconds compare across them. Every file's figure is kept in pytest's cache
(CACHE_KEY).
"""

import os
import resource
from collections import defaultdict
from pathlib import Path

import pytest

HEAVIEST_SHOWN = 10
CACHE_KEY = "cpu_seconds/per_file"  # every file's figure, heaviest first: .pytest_cache/v/cpu_seconds/per_file
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
_START = pytest.StashKey[float]()
_group: Path | None = None  # this process's cpuacct group, while it is in one


def _join_own_group() -> None:
    """Move this process into a cpuacct group named after it (left as it was where that cannot be done)."""
    global _group
    group = CPUACCT / f"xc-tests-{os.getpid()}"
    try:
        group.mkdir()
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        return
    _group = group


def _leave_own_group() -> None:
    """Back to the parent group; the group itself goes once nothing of this run is left in it."""
    global _group
    if _group is None:
        return
    try:
        (_group.parent / "cgroup.procs").write_text(str(os.getpid()))
        _group.rmdir()
    except OSError:
        pass
    _group = None


def _cpu_now() -> float:
    if _group is not None:
        return int((_group / "cpuacct.usage").read_text()) / 1e9
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_configure(config):
    _join_own_group()


def pytest_unconfigure(config):
    _leave_own_group()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_START] = _cpu_now()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "teardown" and _START in item.stash:
        counted_by = "cgroup" if _group is not None else "getrusage"
        outcome.get_result().user_properties += [("cpu_s", _cpu_now() - item.stash[_START]), ("cpu_by", counted_by)]


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    per_file: dict[str, float] = defaultdict(float)
    counted_by: set[str] = set()
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) != "teardown":
                continue
            properties = dict(getattr(report, "user_properties", ()))
            if "cpu_s" in properties:
                per_file[report.nodeid.split("::")[0]] += properties["cpu_s"]
                counted_by.add(properties["cpu_by"])
    if not per_file:
        return
    heaviest_first = dict(sorted(per_file.items(), key=lambda kv: -kv[1]))
    cache = getattr(terminalreporter.config, "cache", None)  # None with -p no:cacheprovider
    if cache is not None:
        cache.set(CACHE_KEY, heaviest_first)
    counted = ("with all they started (cgroup cpuacct)" if counted_by == {"cgroup"}
               else "and their waited-for children (getrusage)")
    terminalreporter.write_sep("=", f"CPU-seconds per file, its processes {counted}: the {HEAVIEST_SHOWN} heaviest")
    for path, seconds in list(heaviest_first.items())[:HEAVIEST_SHOWN]:
        terminalreporter.write_line(f"{seconds:8.1f}  {path}")
    terminalreporter.write_line(f"{sum(per_file.values()):8.1f}  all {len(per_file)} files")
