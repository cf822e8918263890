"""cluster/node/setup_script.py: the install and check scripts, run for real with bash.

The scripts run on this machine against a temporary node root: a real venv from the OS Python,
real pip installs from a wheelhouse of two tiny wheels made here, and `fake_apt` test doubles
(`apt-get`, `apt-cache`, `dpkg-query` on PATH) that play a package database and a dpkg lock held
by another process. Takes ~15 s (two venvs, a handful of pip runs).
"""

from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from cluster.stack.catalog import CATALOG
from cluster.node.profiles import PROFILES, Profile
from cluster.node.setup_script import (InstallPlan, changed, check_script, evaluate_check, fingerprint_digest,
                                  install_script, parse_events, pin_satisfied)

OS_PYTHON = next((p for p in ("/usr/bin/python3", "/usr/bin/python3.11") if os.access(p, os.X_OK)), None)
needs_os_python = pytest.mark.skipif(OS_PYTHON is None, reason="no OS python3 under /usr/bin (apt install "
                                                               "python3-venv)")

TEST_PROFILE = Profile(name="unittest", description="tiny", pip_pins=("xc-dummy==1.0",), index_pins=(),
                       backend="gloo", launcher="intel-mpi", apt_packages=("xc-fake-a",))


def make_wheel(directory: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel (one module) that pip installs offline."""
    module = name.replace("-", "_")
    path = directory / f"{module}-{version}-py3-none-any.whl"
    info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": f"VERSION = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for arcname, text in files.items():
            zf.writestr(arcname, text)
    return path


FAKE_TOOLS = {
    # dpkg-query -W -f=... PKG: "installed" when PKG is listed in $FAKE_APT/installed
    "dpkg-query": 'pkg="${@: -1}"; grep -qx "$pkg" "$FAKE_APT/installed" 2>/dev/null && '
                  'echo "install ok installed" || exit 1\n',
    # apt-cache policy PKG: only the Debian 12 tcmalloc name and the profile's package exist
    "apt-cache": 'case "${@: -1}" in libgoogle-perftools4|xc-fake-a) echo "  Candidate: 1.0";; '
                 '*) echo "  Candidate: (none)";; esac\n',
    # apt-get: the first $FAKE_APT/lock_failures calls find the dpkg lock held
    "apt-get": 'echo "$*" >> "$FAKE_APT/calls"\n'
               'n=$(cat "$FAKE_APT/lock_failures" 2>/dev/null || echo 0)\n'
               'if [ "$n" -gt 0 ]; then echo $((n-1)) > "$FAKE_APT/lock_failures";\n'
               '  echo "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 '
               '(unattended-upgr)"; exit 100; fi\n'
               'case " $* " in *" install "*) for a in "$@"; do case "$a" in -*|install|*=*) ;; '
               '*) echo "$a" >> "$FAKE_APT/installed";; esac; done;; esac\n',
    # a node's passwordless sudo, for runs as a non-root user: drop sudo's options and run the command
    "sudo": 'while [ "${1#-}" != "$1" ]; do shift; done; exec "$@"\n',
}


def fake_tools(tmp_path) -> Path:
    """Test doubles for apt/dpkg and sudo, as scripts in one directory for PATH."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    for tool, body in FAKE_TOOLS.items():
        script = bin_dir / tool
        script.write_text("#!/bin/bash\n" + body)
        script.chmod(0o755)
    return bin_dir


@pytest.fixture
def fake_apt(tmp_path):
    """Test double for apt/dpkg (and sudo): scripts on PATH backed by files under tmp_path/apt."""
    state = tmp_path / "apt"
    state.mkdir()
    env = {**os.environ, "PATH": f"{fake_tools(tmp_path)}:{os.environ['PATH']}", "FAKE_APT": str(state)}
    for var in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL"):
        env.pop(var, None)
    return state, env


def run_bash(script: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=timeout)


def plan_for(tmp_path: Path, **kw) -> InstallPlan:
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir(exist_ok=True)
    project = make_wheel(tmp_path, "xc-project", "0.1")
    defaults = dict(profile=TEST_PROFILE, project_wheel=str(project), project_version="0.1+src1",
                    wheelhouse=str(wheelhouse), python=OS_PYTHON, apt_retry_delay_s=0, apt_lock_timeout_s=0,
                    node_root=str(tmp_path / "opt"), venv=str(tmp_path / "opt" / "venv-unittest"))
    defaults.update(kw)
    return InstallPlan(**defaults)


# ------------------------------------------------------------------------------------ pure text


def test_scripts_are_deterministic_and_parse_as_bash():
    for profile in PROFILES.values():
        plan = InstallPlan(profile, project_wheel="/tmp/p.whl", project_version="0.1.0+abc")
        assert install_script(plan) == install_script(plan)
        for text in (install_script(plan), check_script(profile)):
            assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_install_source_is_the_wheelhouse_when_given_else_each_index_alone_then_pypi_alone():
    stock = PROFILES["stock"]
    online = install_script(InstallPlan(stock))
    assert "INDEX_URLS=(https://download.pytorch.org/whl/cpu)" in online
    assert "INDEX_REQUIREMENTS=(torch==2.13.0)" in online
    assert "PIP_SOURCE=()" in online and "--extra-index-url" not in online and "--no-index" not in online
    offline = install_script(InstallPlan(stock, wheelhouse="/var/cache/w h"))
    assert "--no-index --find-links '/var/cache/w h'" in offline and "--extra-index-url" not in offline
    assert "INDEX_URLS=()" in offline  # the controller took them from their indexes when it filled the wheelhouse
    assert "torch==2.13.0" in offline and "'boto3>=1.35'" in offline  # pins quoted for the shell
    assert "DPkg::Lock::Timeout" in offline and "/opt/xeon-cluster/venv-stock" in offline


def test_install_plan_refuses_a_python_under_root_and_a_wheel_without_version():
    with pytest.raises(ValueError, match="python: '/root/.pyenv/shims/python3' is not allowed"):
        InstallPlan(PROFILES["stock"], python="/root/.pyenv/shims/python3")
    with pytest.raises(ValueError, match="project_version"):
        InstallPlan(PROFILES["stock"], project_wheel="/tmp/x.whl")


def test_pin_satisfied():
    assert pin_satisfied("torch==2.13.0", "2.13.0+cpu")
    assert not pin_satisfied("torch==2.13.0", "2.8.0")
    assert pin_satisfied("boto3>=1.35", "1.40.2") and not pin_satisfied("boto3>=1.35", "1.34.9")
    assert not pin_satisfied("boto3>=1.35", None)


def _check_events(**overrides):
    stock = PROFILES["stock"]
    facts = {"python": "/opt/xeon-cluster/venv-stock/bin/python 3.12.3",
             "profile_marker": fingerprint_digest(stock), "project_marker": "0.1.0+aa",
             "cpu_flags": "amx_bf16 amx_tile avx512_bf16 avx512f",
             "tcmalloc": "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4",
             "disk_free_kib": f"{50 * 2**20} /opt/xeon-cluster/venv-stock"}
    facts.update(overrides.pop("facts", {}))
    pkgs = {"torch": "2.13.0+cpu", "transformers": "5.23.0", "accelerate": "1.15.0", "peft": "0.21.2",
            "datasets": "5.2.0", "impi-rt": "2021.18.1", "boto3": "1.40.0"}
    pkgs.update(overrides.pop("pkgs", {}))
    lines = [f"::xc:: fact {k} {v}" for k, v in facts.items()] + [f"::xc:: fact pkg {k} {v}" for k, v in pkgs.items()]
    return parse_events("\n".join(lines))


def test_evaluate_check_passes_a_good_node_and_names_each_problem():
    stock, spr = PROFILES["stock"], CATALOG["r7iz.metal-16xl"]
    good = evaluate_check(stock, _check_events(), project_version="0.1.0+aa", instance=spr)
    assert good.ok, good.failures()
    bad = evaluate_check(stock, _check_events(pkgs={"transformers": "4.56.2", "impi-rt": "MISSING"},
                                              facts={"cpu_flags": "avx512f", "tcmalloc": "MISSING",
                                                     "disk_free_kib": f"{2**20} /"}),
                         project_version="0.1.0+bb", instance=spr)
    failed = {i.name: i.detail for i in bad.failures()}
    assert set(failed) == {"transformers", "impi-rt", "xeon-cluster", "bf16", "tcmalloc", "disk"}
    assert "4.56.2 (transformers==5.23.0)" in failed["transformers"]
    assert "amx_bf16" in failed["bf16"] and "1.0 GiB free" in failed["disk"]
    # Ice Lake has no bf16 flags: their absence is not a failure there
    icx = evaluate_check(stock, _check_events(facts={"cpu_flags": "avx512f"}), instance=CATALOG["c6i.16xlarge"])
    assert icx.ok


def test_check_script_takes_its_values_literally(tmp_path):
    venv = tmp_path / "v $(touch pwned) `touch pwned`"
    result = subprocess.run(["bash", "-c", check_script(TEST_PROFILE, venv=str(venv))], capture_output=True,
                            text=True, cwd=tmp_path, timeout=60)
    facts = {e.name: e.detail for e in parse_events(result.stdout) if e.kind == "fact"}
    assert facts["python"] == "MISSING" and facts["profile_marker"] == "MISSING", result.stdout + result.stderr
    assert facts["disk_free_kib"].split(" ", 1)[0].isdigit()
    assert not list(tmp_path.rglob("pwned"))


# ------------------------------------------------------------------------- the install, for real


@pytest.mark.slow
@needs_os_python
def test_install_survives_the_dpkg_lock_a_failure_and_reruns_until_nothing_changes(tmp_path, fake_apt):
    """One venv through its life: a failed pip step, a rerun that picks up, a no-op run, a new
    project version, then `check` on the result (one venv creation keeps this test ~15 s)."""
    state, env = fake_apt
    (state / "lock_failures").write_text("2")  # unattended-upgrades holds the lock for two attempts
    plan = plan_for(tmp_path)  # the wheelhouse does not have xc-dummy yet

    failed = run_bash(install_script(plan), env)
    assert failed.returncode == 25, failed.stdout + failed.stderr
    events = parse_events(failed.stdout)
    assert [(e.name, e.status) for e in events if e.kind == "step"] == [("apt", "changed"), ("venv", "failed")]
    assert len([e for e in events if e.kind == "progress" and "dpkg lock is held" in e.detail]) == 2
    assert set((state / "installed").read_text().split()) == {"xc-fake-a", "libgoogle-perftools4"}
    assert changed(events) is None
    venv = Path(plan.venv_path)
    assert (venv / "bin" / "python").exists() and not (venv / ".xeon-cluster-profile").exists()

    make_wheel(tmp_path / "wheelhouse", "xc-dummy", "1.0")
    rerun = run_bash(install_script(plan), env)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    events = parse_events(rerun.stdout)
    assert {e.name: e.status for e in events if e.kind == "step"} == {
        "apt": "unchanged", "venv": "changed", "project": "changed"}
    assert "creating" not in rerun.stdout  # the venv the failed run made is reused
    assert changed(events) is True
    assert (venv / ".xeon-cluster-profile").read_text().strip() == fingerprint_digest(TEST_PROFILE)
    assert (venv / ".xeon-cluster-project").read_text().strip() == "0.1+src1"
    assert list(venv.glob("lib/python3*/site-packages/xc_dummy/__pycache__/*.pyc"))  # compiled by the install
    assert not str((venv / "bin" / "python").resolve()).startswith("/root/")
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", "import xc_dummy, xc_project; print(xc_dummy.VERSION)"],
                           capture_output=True, text=True)
    assert probe.stdout.strip() == "1.0", probe.stderr

    calls_before = (state / "calls").read_text()
    again = run_bash(install_script(plan), env)
    assert again.returncode == 0, again.stdout + again.stderr
    events = parse_events(again.stdout)
    assert {e.name: e.status for e in events if e.kind == "step"} == {
        "apt": "unchanged", "venv": "unchanged", "project": "unchanged"}
    assert changed(events) is False
    assert (state / "calls").read_text() == calls_before  # apt not even asked

    newer = plan_for(tmp_path, project_version="0.1+src2")  # the controller's code changed
    events = parse_events(run_bash(install_script(newer), env).stdout)
    assert {e.name: e.status for e in events if e.kind == "step"} == {
        "apt": "unchanged", "venv": "unchanged", "project": "changed"}

    result = run_bash(check_script(TEST_PROFILE, project_distribution="xc-project", venv=plan.venv_path), env)
    events = parse_events(result.stdout)
    pkgs = dict(e.detail.split(" ", 1) for e in events if e.kind == "fact" and e.name == "pkg")
    assert pkgs == {"xc-dummy": "1.0", "xc-project": "0.1"}
    report = evaluate_check(TEST_PROFILE, events, project_version="0.1+src2", min_free_gib=0.001)
    names = {i.name: i.ok for i in report.items}
    assert names["venv"] and names["profile"] and names["xc-dummy"] and names["xeon-cluster"], report
    assert names["tcmalloc"] == os.path.exists("/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4")
    stale = evaluate_check(TEST_PROFILE, events, project_version="0.1+src3", min_free_gib=0.001)
    assert [i.name for i in stale.failures()] == ["xeon-cluster"]


@pytest.mark.slow
@needs_os_python
def test_two_nodes_sharing_the_node_root_install_once(tmp_path, fake_apt):
    """Like the local cluster's nodes, which share /opt: one installs, the other waits and finds it done; as the
    local backend asks, the install leaves the bytecode to the jobs' first imports."""
    state, env = fake_apt
    (state / "installed").write_text("xc-fake-a\nlibgoogle-perftools4\n")
    (tmp_path / "wheelhouse").mkdir()
    make_wheel(tmp_path / "wheelhouse", "xc-dummy", "1.0")
    script = install_script(plan_for(tmp_path, compile_bytecode=False))
    procs = [subprocess.Popen(["bash", "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    venv_steps = sorted(next(e.status for e in parse_events(o) if e.kind == "step" and e.name == "venv")
                        for o in outputs)
    assert venv_steps == ["changed", "unchanged"]
    site = next((tmp_path / "opt" / "venv-unittest").glob("lib/python3*/site-packages"))
    assert (site / "xc_dummy" / "__init__.py").exists() and not list(site.glob("xc_*/__pycache__"))


def test_only_a_local_clusters_install_leaves_the_bytecode_to_the_jobs():
    """Its jobs run as root, the venv's owner, so their imports write what they use; an image's or an inventory
    machine's jobs run as another user, who could not: their installs compile it."""
    from node_setup.backends import backend_for

    kinds = {kind: backend_for(kind).compiles_bytecode() for kind in ("local", "aws", "file")}
    assert kinds == {"local": False, "aws": True, "file": True}
