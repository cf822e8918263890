"""The CPU-seconds each test file cost, printed at the end of every run (the ten heaviest files and the total).

A test's figure is its process's CPU time (user + system) and that of the child processes it waited
for, from the start of its setup to the end of its teardown: a module's fixtures are counted in the
file that made them, a session fixture's teardown in the last test of its worker. Processes that
a test's processes did not wait for (the ranks a local node's sshd started, while that sshd still
runs) count when their parent is reaped, so a file's figure is close, not exact. Wall times vary up
to 1.7x between machines of one kind; CPU-seconds compare across them.
"""

import resource
from collections import defaultdict

import pytest

HEAVIEST_SHOWN = 10
_START = pytest.StashKey[float]()


def _cpu_now() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_START] = _cpu_now()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "teardown" and _START in item.stash:
        outcome.get_result().user_properties.append(("cpu_s", _cpu_now() - item.stash[_START]))


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    per_file: dict[str, float] = defaultdict(float)
    for reports in terminalreporter.stats.values():
        for report in reports:
            for name, value in getattr(report, "user_properties", ()):
                if name == "cpu_s" and getattr(report, "when", None) == "teardown":
                    per_file[report.nodeid.split("::")[0]] += value
    if not per_file:
        return
    terminalreporter.write_sep("=", f"CPU-seconds per file: the {HEAVIEST_SHOWN} heaviest")
    for path, seconds in sorted(per_file.items(), key=lambda kv: -kv[1])[:HEAVIEST_SHOWN]:
        terminalreporter.write_line(f"{seconds:8.1f}  {path}")
    terminalreporter.write_line(f"{sum(per_file.values()):8.1f}  all {len(per_file)} files")
