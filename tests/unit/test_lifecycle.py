"""`fab up` and `fab down` (node_setup/tasks/lifecycle.py) with a test double of the Pulumi CLI.

The steps and command lines (cluster/stack/lifecycle.py) are checked as data; the rest runs the real `fab`
(python -m fabric) against a stack file in a temporary directory, with tests/unit/fake_pulumi.py
installed as `pulumi` on PATH. What needs AWS (preflight's checks, the sweep's listing) is replaced
by test doubles in the in-process tests at the end; the Pulumi double and the process handling are
real processes and signals.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from invoke import Context, Exit

from cluster.stack import catalog, image_build, lifecycle
from tests.unit.test_fab_bad_input import ROOT, STACK
from tests.fab_run import fab_in_process

FAKE = Path(__file__).with_name("fake_pulumi.py")
UP_ARGV = ["up", "--stack", "lab", "--refresh", "--yes", "--non-interactive"]
DESTROY_ARGV = ["destroy", "--stack", "lab", "--yes", "--non-interactive"]


# --- the steps, as data ---------------------------------------------------------------------------

def test_up_is_preflight_then_pulumi_up_with_refresh():
    steps = lifecycle.up_steps("dev")
    assert [s.kind for s in steps] == [lifecycle.PREFLIGHT_STEP, lifecycle.PULUMI_STEP]
    assert [s.command for s in steps] == ["fab preflight --stack dev", "pulumi up --stack dev --refresh"]
    assert steps[1].run_argv == ("pulumi", "up", "--stack", "dev", "--refresh", "--yes", "--non-interactive")
    assert [s.kind for s in lifecycle.up_steps("dev", preflight=False)] == [lifecycle.PULUMI_STEP]


def test_down_is_destroy_then_forget_then_the_sweep_listing():
    steps = lifecycle.down_steps("dev", "xeon-dev")
    assert [s.command for s in steps] == ["pulumi destroy --stack dev", "fab forget --cluster xeon-dev",
                                          "fab sweep --stack dev"]
    assert steps[0].run_argv == ("pulumi", "destroy", "--stack", "dev", "--yes", "--non-interactive")


@pytest.mark.parametrize("stack", ["", "a;b", "../dev", "-rf", "dev\n", "x" * 101])
def test_a_stack_name_outside_pulumi_s_is_refused_before_any_command_line(stack):
    with pytest.raises(ValueError, match=r"--stack: .* is not allowed"):
        lifecycle.up_steps(stack)


def test_the_missing_cli_message_is_one_line_per_command_in_order():
    lines = lifecycle.missing_cli_message(lifecycle.down_steps("dev", "xeon-dev")).splitlines()
    assert "not on PATH" in lines[0]
    assert lines[1:] == ["  pulumi destroy --stack dev", "  fab forget --cluster xeon-dev", "  fab sweep --stack dev"]


def test_a_first_up_builds_the_image_on_its_small_instance_then_boots_every_node_from_it():
    metal = lifecycle.first_up(catalog.lookup("r7iz.metal-16xl"), 40)
    other = lifecycle.first_up(catalog.lookup("c6i.16xlarge"), 60)
    assert [s.name for s in metal.steps] == ["resources", "the build instance's boot (m7i.large)", "install on it",
                                             "the image's snapshot (40 GiB)", "every node's boot from the image",
                                             "cloud-init", "check"]
    # by hand: 1 min + the build (m7i.large's typical boot 2 min, 10 min install, 18 s per GiB) + every node's typical
    # boot (9 min for a 7th-generation metal type, 2 for a virtual one) + 3 min cloud-init + a 30 s check
    assert (metal.seconds, other.seconds) == (60 + 120 + 600 + 720 + 540 + 180 + 30,
                                              60 + 120 + 600 + 1080 + 120 + 180 + 30)
    # No node bills during the build: the master from its launch, each worker its boot; the build instance its own.
    assert metal.instance_seconds(4) == 540 + 180 + 30 + 3 * 540 and metal.worker_seconds == 540
    assert metal.builder_seconds == 120 + 600 + 720
    assert metal.builder_usd == pytest.approx((120 + 600 + 720) / 3600 * image_build.BUILDER_USD_PER_HOUR)
    assert "metal type" in metal.source and "non-metal" in other.source and "typical boot 9m 00s" in metal.source


def test_the_worst_case_first_up_takes_every_boot_s_wait_budget():
    worst = lifecycle.first_up(catalog.lookup("r7iz.metal-16xl"), 40, worst_case=True)
    # by hand: the build instance's boot budget 15 min, a metal node's 40 min
    assert worst.seconds == 60 + 900 + 600 + 720 + 2400 + 180 + 30
    assert worst.instance_seconds(4) == 2400 + 180 + 30 + 3 * 2400 and worst.builder_seconds == 900 + 600 + 720
    assert "boot budget 40m 00s" in worst.source
    typical = lifecycle.first_up(catalog.lookup("r7iz.metal-16xl"), 40)
    assert worst.seconds - typical.seconds == (2400 - 540) + (900 - 120)


def test_a_first_up_from_a_kept_image_builds_nothing():
    metal = catalog.lookup("r7iz.metal-16xl")
    kept = lifecycle.first_up(metal, 40, kept_image=True)
    assert [s.name for s in kept.steps] == ["resources", "every node's boot from the kept image", "cloud-init", "check"]
    assert kept.seconds == 60 + 540 + 180 + 30 and kept.worker_seconds == 540 and kept.builder_usd == 0
    assert kept.instance_seconds(4) == 540 + 180 + 30 + 3 * 540 == lifecycle.first_up(metal, 40).instance_seconds(4)
    assert kept.seconds == lifecycle.first_up(metal, 40).seconds - (120 + 600 + 720)  # the build's time saved


# --- the real `fab` with the Pulumi double ----------------------------------------------------------

@pytest.fixture
def site(tmp_path):
    """(cwd with Pulumi.lab.yaml, environment with the double as `pulumi` on PATH, the double's log)."""
    (tmp_path / "Pulumi.lab.yaml").write_text(STACK)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "pulumi"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    wrapper.chmod(0o755)
    log = tmp_path / "pulumi.log"
    env = {"PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin", "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path),
           "FAKE_PULUMI_LOG": str(log), "AWS_EC2_METADATA_DISABLED": "true", "PYTHONUNBUFFERED": "1"}
    return tmp_path, env, log


def fab(site, *argv, **extra_env):
    cwd, env, _ = site
    return subprocess.run([sys.executable, "-m", "fabric", "-r", str(ROOT), *argv], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env={**env, **extra_env})


def logged(log: Path) -> list:
    return [json.loads(line) if line.startswith("[") else line for line in log.read_text().splitlines()]


def test_fab_up_runs_pulumi_up_for_the_stack_and_passes_its_output_on(site):
    result = fab(site, "up", "--stack", "lab", "--no-preflight")
    assert result.returncode == 0, result.stdout + result.stderr
    assert logged(site[2]) == [UP_ARGV]
    out = result.stdout
    assert out.index("fake pulumi: step 1") < out.index("fake pulumi: step 2") < out.index("fake pulumi: step 3")
    assert "up: cluster xeon-lab is up" in out


def test_fab_up_and_down_exit_with_pulumi_s_exit_code(site):
    up = fab(site, "up", "--stack", "lab", "--no-preflight", FAKE_PULUMI_EXIT="3")
    assert up.returncode == 3 and "`pulumi up` exited with code 3" in up.stderr
    assert "is up" not in up.stdout
    down = fab(site, "down", "--stack", "lab", "--yes", FAKE_PULUMI_EXIT="4")
    assert down.returncode == 4 and "`pulumi destroy` exited with code 4" in down.stderr
    assert logged(site[2]) == [UP_ARGV, DESTROY_ARGV]  # nothing ran after the failed destroy


@pytest.mark.parametrize("task", ["up", "down"])
def test_without_the_cli_both_print_the_commands_to_run_and_exit_2(site, task):
    cwd, env, log = site
    empty = cwd / "empty"
    empty.mkdir()
    result = fab_in_process(task, "--stack", "lab", cwd=cwd, env={**env, "PATH": str(empty)})
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("error: the Pulumi CLI (`pulumi`) is not on PATH")
    expected = (["  fab preflight --stack lab", "  pulumi up --stack lab --refresh"] if task == "up" else
                ["  pulumi destroy --stack lab", "  fab forget --cluster xeon-lab", "  fab sweep --stack lab"])
    assert lines[1:] == expected
    assert not log.exists() and "Traceback" not in result.stderr


def test_a_bad_stack_name_is_one_line_and_exit_2(site):
    cwd, env, _ = site
    result = fab_in_process("up", "--stack", "lab;rm", "--no-preflight", cwd=cwd, env=env)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --stack: 'lab;rm' is not allowed; allowed: a stack name of letters, digits, '_', '.' and '-' "
        "(up to 100, starting with a letter or digit)"]
    assert not site[2].exists()


class Lines:
    """A process's stdout, read on a thread: wait for a line (an event) rather than sleeping."""

    def __init__(self, proc):
        self.seen: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [self._queue.put(line) for line in proc.stdout], daemon=True).start()

    def wait_for(self, text: str, timeout: float = 60) -> str:
        while True:
            line = self._queue.get(timeout=timeout)  # queue.Empty fails the test
            self.seen.append(line)
            if text in line:
                return line


def _start_gated(site, gate, *argv, **extra_env):
    cwd, env, _ = site
    os.mkfifo(gate)
    return subprocess.Popen([sys.executable, "-m", "fabric", "-r", str(ROOT), *argv], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**env, "FAKE_PULUMI_GATE": str(gate), **extra_env})


def _open_gate(gate):
    """Let the double go on; without a reader (it never started, or ended) there is nothing to open."""
    try:
        fd = os.open(gate, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: no process has the FIFO open for reading
        return
    os.write(fd, b"go\n")
    os.close(fd)


def test_pulumi_s_output_arrives_while_it_still_runs(site):
    gate = site[0] / "gate"
    proc = _start_gated(site, gate, "up", "--stack", "lab", "--no-preflight")
    lines = Lines(proc)
    try:
        lines.wait_for("fake pulumi: step 1")
        assert proc.poll() is None  # the double waits on the gate: its first line came through while it runs
        assert not any("step 2" in line for line in lines.seen)
    finally:
        _open_gate(gate)
    lines.wait_for("fake pulumi: step 3")
    assert proc.wait(timeout=60) == 0


def test_ctrl_c_is_passed_to_pulumi_once_and_fab_waits_for_it_never_killing_it(site):
    gate = site[0] / "gate"
    proc = _start_gated(site, gate, "down", "--stack", "lab", "--yes", FAKE_PULUMI_EXIT="255")
    lines = Lines(proc)
    try:
        pid = int(lines.wait_for("fake pulumi: step 1").split("pid ")[1].rstrip(")\n"))
        proc.send_signal(signal.SIGINT)  # a Ctrl-C at the terminal reaches fab (Pulumi has its own group)
        lines.wait_for("fab: Ctrl-C passed to pulumi")
        lines.wait_for("fake pulumi: got SIGINT")
        proc.send_signal(signal.SIGINT)  # a second Ctrl-C: not passed on
        assert "never killed" in lines.wait_for("fab: still waiting for pulumi")
        os.kill(pid, 0)  # the double still runs
        assert proc.poll() is None
    finally:
        _open_gate(gate)
    lines.wait_for("fake pulumi: step 3")  # it finished its run after the cancel
    assert proc.wait(timeout=60) == 255  # its exit code, not fab's own for an interrupt
    assert logged(site[2]) == [DESTROY_ARGV, "signal INT"]  # one SIGINT, no SIGTERM, no second SIGINT


# --- in process, with test doubles for what needs AWS -----------------------------------------------

@pytest.fixture
def here(site, monkeypatch):
    cwd, env, log = site
    monkeypatch.chdir(cwd)
    for key in ("PATH", "XDG_CONFIG_HOME", "FAKE_PULUMI_LOG"):
        monkeypatch.setenv(key, env[key])
    return log


def test_a_failing_preflight_stops_fab_up_before_pulumi_runs(here, monkeypatch, capsys):
    from node_setup.tasks import lifecycle as task

    calls = []
    monkeypatch.setattr(task, "run_stack_preflight",  # test double: the real checks ask AWS
                        lambda spec, ip_check: calls.append((spec.stack, ip_check)) or 1)
    with pytest.raises(Exit) as stopped:
        task.up(Context(), stack="lab", ip_check=False)
    assert stopped.value.code == 1 and "preflight failed" in stopped.value.message
    assert calls == [("lab", False)] and not here.exists()
    monkeypatch.setattr(task, "run_stack_preflight", lambda spec, ip_check: calls.append("passed") or 0)
    task.up(Context(), stack="lab")
    assert calls[-1] == "passed" and logged(here) == [UP_ARGV]


def test_fab_down_forgets_the_keys_and_lists_what_is_left_after_the_destroy(here, tmp_path, monkeypatch, capsys):
    from node_setup.tasks import lifecycle as task

    store = tmp_path / "xeon-cluster" / "keys" / "xeon-lab"
    store.mkdir(parents=True)
    (store / "known_hosts").write_text("10.0.0.5 ssh-ed25519 AAAA\n")
    swept = []

    class LeftOver:  # test double of the sweep's listing: one leaked resource
        def leaked(self):
            return ["sg-1"]

    monkeypatch.setattr(task, "sweep_listing", lambda region: swept.append(region) or (LeftOver(), "", region, ()))
    task.down(Context(), stack="lab", yes=True)
    out = capsys.readouterr().out
    assert logged(here) == [DESTROY_ARGV] and swept == ["eu-west-1"] and not store.exists()
    assert "forgot cluster 'xeon-lab'" in out and "run `fab sweep --delete`" in out


def test_fab_down_keeps_the_keys_when_the_destroy_fails_or_is_not_confirmed(here, tmp_path, monkeypatch):
    from node_setup.tasks import lifecycle as task

    store = tmp_path / "xeon-cluster" / "keys" / "xeon-lab"
    store.mkdir(parents=True)
    monkeypatch.setattr(task, "sweep_listing", lambda region: pytest.fail("no sweep after a failed destroy"))
    monkeypatch.setattr("builtins.input", lambda prompt: "no")
    with pytest.raises(Exit) as refused:
        task.down(Context(), stack="lab")
    assert refused.value.code == 1 and not here.exists()
    monkeypatch.setenv("FAKE_PULUMI_EXIT", "6")
    with pytest.raises(Exit) as failed:
        task.down(Context(), stack="lab", yes=True)
    assert failed.value.code == 6 and store.exists() and logged(here) == [DESTROY_ARGV]
