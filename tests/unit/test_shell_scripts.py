"""cluster/shell/: the shell files, how they are filled in, and shellcheck on both.

shellcheck runs on every shipped .sh file and on the rendered scripts (header + body) for
representative inputs; any finding fails. It comes from Debian's `shellcheck` package, which
scripts/setup-dev.sh installs.
"""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from importlib import resources

import pytest

from cluster.node import autostop
from cluster.stack import catalog
from cluster import shell
from cluster.job.launch import FLAVOURS, RANK_WRAPPER, plan_launch
from cluster.job.layout import plan_layout
from cluster.node.profiles import PROFILES
from cluster.node.setup_script import InstallPlan, check_script, install_script
from node_setup.ssh import job
from node_setup.ssh.wheels import build_project_wheel

NAMES = shell.names()


def shellcheck(text: str, label: str) -> None:
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed: run scripts/setup-dev.sh (it apt-installs shellcheck)")
    result = subprocess.run(["shellcheck", "--severity=style", "-"], input=text, capture_output=True, text=True)
    assert result.returncode == 0, f"shellcheck on {label}:\n{result.stdout}{result.stderr}"


def test_the_package_ships_every_script():
    assert set(NAMES) >= {"install.sh", "check.sh", "job.sh", "rank-wrapper.sh", "job-ranks.sh",
                          "job-stop-node.sh", "job-stop-master.sh", "job-state.sh"}


@pytest.mark.parametrize("name", NAMES)
def test_every_shipped_file_passes_shellcheck(name):
    text = shell.source(name)
    assert text.startswith(("#!/bin/sh\n", "#!/bin/bash\n")), f"{name}: needs a #!/bin/sh or #!/bin/bash line"
    shellcheck(text, name)


def _job_scripts():
    layout = plan_layout(catalog.lookup("r7iz.metal-16xl"), backend="gloo")
    for flavour in FLAVOURS:
        plan = plan_launch(flavour=flavour, job_id="20260101-000000-abcd", hosts=["node0", "node1"],
                           master_addr="10.0.0.10", layout=layout, program=["/opt/v/bin/python", "-m", "training"],
                           venv="/opt/v", extra_env={"HF_TOKEN": "x'y $(z)"})
        yield f"job script ({flavour})", plan.script()


def _rendered():
    stock = PROFILES["stock"]
    yield "install (online)", install_script(InstallPlan(stock, project_wheel="/tmp/p.whl", project_version="0.1"))
    yield "install (wheelhouse)", install_script(InstallPlan(stock, wheelhouse="/var/cache/w h"))
    yield "check", check_script(stock)
    yield "rank wrapper", RANK_WRAPPER
    yield "autostop service", autostop.service_script()
    yield "autostop power-off", autostop.poweroff_script()
    yield "autostop install", autostop.install_script()
    yield "autostop install (elsewhere, no unit)", autostop.install_script("/tmp/x c/bin")
    for name in ("RANKS_SH", "STOP_NODE_SH", "STOP_MASTER_SH", "STATE_SH"):
        yield f"node_setup.ssh.job.{name}", getattr(job, name)
    yield from _job_scripts()


@pytest.mark.parametrize("label,text", [pytest.param(label, text, id=label) for label, text in _rendered()])
def test_rendered_scripts_pass_shellcheck(label, text):
    assert text.startswith("#!/bin/") and shell.HEADER_START in text, label
    shellcheck(text, label)


def test_render_quotes_every_value_and_knows_bash_arrays_from_positional_parameters():
    bash = shell.header({"A": "it's $(x)", "L": ["a b", "`c`", ""], "N": "1"}, bash=True, exported=["A"])
    assert [line for line in bash if not line.startswith("#")] == ["export A='it'\"'\"'s $(x)'", "L=('a b' '`c`' '')",
                                                                   "N=1"]
    assert [line.split("  #")[0] for line in bash if line.startswith("#")] == ["# shellcheck disable=SC2016"] * 2
    out = subprocess.run(["bash", "-c", "\n".join(bash) + '\nprintf "%s|" "$A" "${L[@]}"'],
                         capture_output=True, text=True, check=True).stdout
    assert out == "it's $(x)|a b|`c`||"
    sh = shell.header({"ARGV": ("mpirun", "-x", "K=$HOME")}, bash=False)
    assert sh[-1] == "set -- mpirun -x 'K=$HOME'"
    with pytest.raises(ValueError, match="one sequence"):
        shell.header({"A": ["x"], "B": ["y"]}, bash=False)
    with pytest.raises(ValueError, match="not a shell variable name"):
        shell.header({"A;rm": "x"}, bash=True)
    with pytest.raises(ValueError, match="have no value"):
        shell.header({"A": "x"}, bash=True, exported=["B"])
    with pytest.raises(TypeError):
        shell.header({"A": 3}, bash=True)  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="not in cluster/shell"):
        shell.render("nope.sh")


def test_render_puts_the_header_right_after_the_shebang():
    text = shell.render("job-state.sh", {"JOBS_DIR": "a b"})
    lines = text.splitlines()
    assert lines[:4] == ["#!/bin/sh", shell.HEADER_START, "JOBS_DIR='a b'", shell.HEADER_END]
    assert "\n".join(lines[4:]) + "\n" == shell.source("job-state.sh").partition("\n")[2]


def test_the_project_wheel_carries_the_scripts(tmp_path):
    wheel = build_project_wheel(cache_dir=tmp_path)
    with zipfile.ZipFile(wheel.path) as zf:
        shipped = {n.rsplit("/", 1)[1] for n in zf.namelist() if n.startswith("cluster/shell/") and n.endswith(".sh")}
    assert shipped == set(NAMES)
    assert {p.name for p in resources.files("cluster.shell").iterdir() if p.name.endswith(".sh")} == set(NAMES)
