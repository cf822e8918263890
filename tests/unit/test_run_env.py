"""The ranks' environment policy (cluster/job/run_env.py): a test per documented source of the refused
names, each name of a source refused (naming what it changes) unless --allow-env names it, and where the
tool is on this machine its own behaviour as the reference that the name does what the source says."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from cluster.job.checks import RequestError
from cluster.job.run_env import REFUSED_ENV_SOURCES, check_env, refused_source

SOURCES = list(REFUSED_ENV_SOURCES)


def _refused(name: str, source: str) -> None:
    with pytest.raises(RequestError, match=rf"^--env: {name} changes how {source.split(' (')[0]}"):
        check_env({name: "x"})
    assert check_env({name: "x"}, allow=[name]) == ((name, "x"),)


@pytest.mark.parametrize("source", SOURCES)
def test_every_name_of_each_documented_source_is_refused_unless_allowed(source):
    names, prefixes = REFUSED_ENV_SOURCES[source]
    assert names or prefixes
    for name in (*names, *(f"{p}X" for p in prefixes)):
        assert refused_source(name) == source
        _refused(name, source)


def test_python_every_variable_pythons_own_help_lists():
    """python --help-env (3.11+) is the interpreter's own list: every name there is refused."""
    listed = subprocess.run([sys.executable, "--help-env"], capture_output=True, text=True, check=True).stdout
    names = set(re.findall(r"^(PYTHON[A-Z0-9_]*)\b", listed, re.M))
    assert len(names) > 15, listed
    for name in names:
        _refused(name, "Python (python(1) ENVIRONMENT VARIABLES)")


def test_the_shell_bash_env_runs_a_file_before_the_command(tmp_path):
    marker = tmp_path / "ran"
    rc = tmp_path / "rc"
    rc.write_text(f"touch {marker}\n")
    subprocess.run(["bash", "-c", "true"], env={"BASH_ENV": str(rc), "PATH": "/usr/bin:/bin"}, check=True)
    assert marker.exists()  # the reference: what the name does
    _refused("BASH_ENV", "the shell (bash(1) Shell Variables, dash(1) ENV)")


@pytest.mark.skipif(not shutil.which("openssl"), reason="no openssl command here")
def test_a_tls_library_openssl_modules_and_conf_choose_what_it_loads(tmp_path):
    loaded = subprocess.run(["openssl", "list", "-providers", "-provider", "xc"], capture_output=True, text=True,
                            env={"OPENSSL_MODULES": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert f"{tmp_path}/xc.so" in loaded.stdout + loaded.stderr  # the library it tried to load: the folder's
    conf = tmp_path / "openssl.cnf"
    conf.write_text(f"openssl_conf = init\n[init]\nproviders = prov\n[prov]\nxc = xc_sect\n[xc_sect]\n"
                    f"module = {tmp_path}/evil.so\nactivate = 1\n")
    plain = subprocess.run(["openssl", "list", "-providers"], capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin", "OPENSSL_CONF": "/dev/null"})
    chosen = subprocess.run(["openssl", "list", "-providers"], capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "OPENSSL_CONF": str(conf)})
    assert plain.stdout != chosen.stdout  # the configuration named decides which providers are loaded
    for name in ("OPENSSL_MODULES", "OPENSSL_CONF"):
        _refused(name, "a TLS library (openssl-env(7))")


def test_names_the_issue_found_missing_are_refused_and_plain_settings_are_not():
    for name in ("OPENSSL_CONF", "OPENSSL_MODULES", "FI_PROVIDER_PATH", "I_MPI_OFI_LIBRARY", "OMP_TOOL_LIBRARIES",
                 "CXX", "CC"):
        assert refused_source(name) is not None, name
    for name in ("TMPDIR", "FI_PROVIDER", "OMP_NUM_THREADS", "HF_TOKEN", "CCL_LOG_LEVEL", "I_MPI_DEBUG", "TZ"):
        assert refused_source(name) is None, name
