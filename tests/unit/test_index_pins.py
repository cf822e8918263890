"""Dependency confusion: a package of the profile's own index is taken from that index alone, never
from PyPI (cluster/node/profiles.py IndexPin), on a node (cluster/shell/install.sh) and in the
controller's wheelhouse (node_setup/ssh/wheels.py).

Run for real with pip against two local file:// indexes made here: "public" plays PyPI (pip's
default index, through PIP_INDEX_URL, with the machine's pip configuration switched off) and
serves a same-named, same-version package with a build tag, which pip would prefer if it could see
both; "private" plays the package's own index.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from cluster.node.profiles import PROFILES, IndexPin, Profile
from cluster.node.setup_script import InstallPlan, install_script, parse_events
from node_setup.ssh.wheels import fill_wheelhouse
from tests.unit.test_setup_script import OS_PYTHON, fake_tools, needs_os_python


def wheel(directory: Path, name: str, version: str, who: str, build: str = "") -> Path:
    """A pure-Python wheel whose module says where it came from (`who`)."""
    module = name.replace("-", "_")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{module}-{version}{'-' + build if build else ''}-py3-none-any.whl"
    info = f"{module}-{version}.dist-info"
    files = {f"{module}/__init__.py": f"WHO = {who!r}\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
                              + (f"Build: {build}\n" if build else "")}
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for arcname, text in files.items():
            zf.writestr(arcname, text)
    return path


def simple_index(root: Path, wheels: list[Path]) -> str:
    """A PEP 503 index of `wheels` under `root` (one folder per project with an index.html); its URL."""
    for path in wheels:
        project = root / path.name.split("-")[0].replace("_", "-").lower()
        project.mkdir(parents=True, exist_ok=True)
        target = project / path.name
        target.write_bytes(path.read_bytes())
        links = "".join(f'<a href="{p.name}">{p.name}</a>\n' for p in sorted(project.glob("*.whl")))
        (project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    return root.as_uri() + "/"


@pytest.fixture
def indexes(tmp_path):
    """(public URL, private URL, sha256 of the private wheel): xc-private 1.0 on both, xc-dummy on public."""
    made = tmp_path / "made"
    genuine = wheel(made / "private", "xc-private", "1.0", "private")
    public = simple_index(tmp_path / "public", [wheel(made / "public", "xc-private", "1.0", "public", build="1"),
                                                 wheel(made / "public", "xc-dummy", "1.0", "public")])
    private = simple_index(tmp_path / "private", [genuine])
    return public, private, hashlib.sha256(genuine.read_bytes()).hexdigest()


def public_only_env(public: str) -> dict:
    """pip's default index is `public`; no pip configuration of this machine applies."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**env, "PIP_INDEX_URL": public, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def profile(private: str, hashes: tuple[str, ...] = ()) -> Profile:
    return Profile(name="confusion", description="tiny", pip_pins=("xc-private==1.0", "xc-dummy==1.0"),
                   index_pins=(IndexPin("xc-private==1.0", private, hashes),), backend="gloo", launcher="intel-mpi",
                   apt_packages=("xc-fake-a",))


def test_the_shipped_profiles_add_no_index_next_to_pypi_and_pin_index_packages_exactly():
    for prof in PROFILES.values():
        script = install_script(InstallPlan(prof))
        assert "--extra-index-url" not in script
        assert "--no-deps \\\n      --index-url \"${INDEX_URLS[$i]}\"" in script
        for pin in prof.index_pins:
            assert pin.pin in prof.pip_pins and "==" in pin.pin
    assert [p.pin for p in PROFILES["intel"].index_pins] == ["torch==2.8.0", "oneccl_bind_pt==2.8.0"]
    assert [p.pin for p in PROFILES["stock"].index_pins] == ["torch==2.13.0"]


@pytest.mark.parametrize("bad, message", [
    (dict(pin="oneccl_bind_pt>=2.8"), "an exact NAME==VERSION"),
    (dict(index_url="http://example.com/simple/"), "an https://"),
    (dict(index_url="https://example.com/simple/ --extra-index-url x"), "an https://"),
    (dict(hashes=("abc",)), "64 lower-case hex digits"),
])
def test_an_index_pin_refuses_what_is_not_exact_https_or_sha256(bad, message):
    given = {"pin": "oneccl_bind_pt==2.8.0", "index_url": "https://example.com/simple/", **bad}
    with pytest.raises(ValueError, match=message):
        IndexPin(**given)
    with pytest.raises(ValueError, match="not one of its pip pins"):
        Profile(name="x", description="", pip_pins=("a==1",), index_pins=(IndexPin("b==1", "https://e.com/"),),
                backend="gloo", launcher="intel-mpi")


@pytest.mark.slow
@needs_os_python
def test_a_node_takes_the_index_package_from_its_index_with_its_hash_never_from_pypi(tmp_path, indexes):
    public, private, digest = indexes
    env = {**public_only_env(public), "PATH": f"{fake_tools(tmp_path)}:{os.environ['PATH']}",
           "FAKE_APT": str(tmp_path / "apt")}
    (tmp_path / "apt").mkdir()
    plan = lambda prof: InstallPlan(prof, python=OS_PYTHON, apt_retry_delay_s=0, apt_lock_timeout_s=0,  # noqa: E731
                                    node_root=str(tmp_path / "opt"), venv=str(tmp_path / "opt" / "venv"))

    wrong = subprocess.run(["bash", "-c", install_script(plan(profile(private, ("0" * 64,))))], env=env,
                           capture_output=True, text=True, timeout=300)
    assert wrong.returncode == 25, wrong.stdout + wrong.stderr  # a file whose hash is not the pinned one
    assert "pip install of xc-private==1.0 from " + private in wrong.stdout
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in wrong.stdout + wrong.stderr

    done = subprocess.run(["bash", "-c", install_script(plan(profile(private, (digest,))))], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert {e.name: e.status for e in parse_events(done.stdout) if e.kind == "step"}["venv"] == "changed"
    python = tmp_path / "opt" / "venv" / "bin" / "python"
    probe = subprocess.run([str(python), "-c", "import xc_private, xc_dummy; print(xc_private.WHO, xc_dummy.WHO)"],
                           capture_output=True, text=True)
    assert probe.stdout.split() == ["private", "public"], probe.stderr  # the rest still comes from PyPI


def test_the_wheelhouse_gets_the_index_package_from_its_index_never_from_pypi(tmp_path, indexes, monkeypatch):
    public, private, digest = indexes
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    for key, value in public_only_env(public).items():
        monkeypatch.setenv(key, value)
    wheelhouse = tmp_path / "wheelhouse"
    assert fill_wheelhouse(profile(private, (digest,)), wheelhouse) is True
    wheels = sorted(p.name for p in wheelhouse.glob("*.whl"))
    assert wheels == ["xc_dummy-1.0-py3-none-any.whl", "xc_private-1.0-py3-none-any.whl"]  # not public's 1.0-1
    assert hashlib.sha256((wheelhouse / "xc_private-1.0-py3-none-any.whl").read_bytes()).hexdigest() == digest
