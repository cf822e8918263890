"""Idle auto-stop's pure parts: durations, the idle rule (run in the real service script on a fake
home, no loop started), the status line, the exec record, the install section and the user data."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from cluster.node import autostop
from cluster import shell
from cluster.node.profiles import PROFILES
from cluster.node.setup_script import InstallPlan, install_script
from node_setup.local import imds_server
from tests.fab_run import fab_in_process


@pytest.mark.parametrize("text,seconds", [("30m", 1800), ("2h", 7200), ("90s", 90), ("1h30m", 5400), ("45", 45)])
def test_idle_durations(text, seconds):
    assert autostop.idle_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "5x", "-3m", "1.5s", "8d", "200h"])
def test_bad_idle_is_one_line_naming_setting_value_and_what_is_allowed(text):
    with pytest.raises(autostop.AutostopError) as err:
        autostop.idle_seconds(text, "--idle")
    message = str(err.value)
    assert message.startswith("--idle: ") and repr(text) in message and "allowed" in message and "\n" not in message


def test_stack_setting_defaults_to_the_fab_default_and_can_be_off():
    assert autostop.stack_idle_seconds(None) == autostop.idle_seconds(autostop.DEFAULT_IDLE) == 1800
    assert autostop.stack_idle_seconds("OFF") is None
    with pytest.raises(autostop.AutostopError, match=r"^autoStopIdle: 'soon' .* \(or off\)$"):
        autostop.stack_idle_seconds("soon")


def test_poll_is_checked():
    assert autostop.poll_seconds("5") == 5
    for bad in ("0", "x", "3601"):
        with pytest.raises(autostop.AutostopError, match="^--poll: "):
            autostop.poll_seconds(bad)


def _home(tmp_path):
    home = tmp_path / "home"
    (home / autostop.STATE_DIR).mkdir(parents=True)
    return home


def _status(home) -> autostop.Status:
    script = autostop.service_script()
    result = subprocess.run(["bash", "-c", script, "xeon-cluster-autostop", "status"],
                            env={**os.environ, "HOME": str(home)},
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return autostop.parse_status(result.stdout)


def _arm(home, idle: int, since: float, host: str | None = None):
    host = host or subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip()
    (home / autostop.STATE_DIR / "armed").write_text(
        f"idle={idle}\npoll=1\nsince={int(since)}\nhost={host}\nmode=local\n")


def _touch(path, at: float):
    """A file with modification time `at`; its folder too (a job's folder changes with its files)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    os.utime(path, (at, at))
    os.utime(path.parent, (at, at))


def test_idle_clock_starts_at_arming_then_at_the_last_activity(tmp_path):
    home = _home(tmp_path)
    now = time.time()
    assert not _status(home).armed
    _arm(home, 600, now - 100)
    s = _status(home)
    assert s.armed and s.running == 0 and s.deadline == int(now - 100) + 600
    assert 490 <= s.left_s <= 500
    # a job that ended after arming resets the clock to its last file
    _touch(home / ".xeon-cluster" / "jobs" / "20260101-000000-abcd" / "exit_code", now - 10)
    s = _status(home)
    assert s.deadline == int(now - 10) + 600 and s.idle_since == int(now - 10)
    # an exec that ended long before arming does not move it back
    _touch(home / autostop.ACTIVITY_DIR / "last-exec", now - 5000)
    assert _status(home).deadline == int(now - 10) + 600


def test_a_running_job_or_exec_is_never_idle_and_another_masters_arming_is_ignored(tmp_path):
    home = _home(tmp_path)
    _arm(home, 1, time.time() - 1000)
    assert _status(home).left_s == 0
    job = home / ".xeon-cluster" / "jobs" / "20260101-000000-abcd"
    job.mkdir(parents=True)
    sleeper = subprocess.Popen(["sh", "-c", "sleep 30", "20260101-000000-abcd"])  # its cmdline names the job
    try:
        (job / "pid").write_text(f"{sleeper.pid}\n")
        s = _status(home)
        assert s.running == 1 and s.left_s is None
        assert "job(s)/exec(s) running" in autostop.status_line(s)
    finally:
        sleeper.kill()
        sleeper.wait()
    (home / autostop.ACTIVITY_DIR).mkdir(parents=True)
    started = open(f"/proc/{os.getpid()}/stat").read().rsplit(") ", 1)[1].split()[19]
    (home / autostop.ACTIVITY_DIR / f"exec-{os.getpid()}").write_text(f"{os.getpid()} {started}\n")  # a live exec
    assert _status(home).running == 1
    (home / autostop.ACTIVITY_DIR / f"exec-{os.getpid()}").unlink()
    _arm(home, 1, time.time() - 1000, host="ip-10-0-0-1")  # the image's copy, on another instance
    assert not _status(home).armed


def test_status_lines():
    now = 1_800_000_000.0
    armed = autostop.Status(armed=True, idle_s=1800, mode="system", since=now - 600, last=now - 1076, running=0,
                            now=now, deadline=now - 600 + 1800)
    assert autostop.status_line(armed) == ("auto-stop: armed, 30m idle; powers off in 20m 00s "
                                           "(idle since 2027-01-15 07:50:00Z)")
    assert autostop.status_line(autostop.Status(armed=False)) == "auto-stop: off"
    assert "fab setup" in autostop.status_line(autostop.parse_status("installed=no\n"))
    assert autostop.short_duration(5400) == "1h 30m" and autostop.short_duration(90) == "1m 30s"


def test_exec_record_keeps_the_commands_exit_code_and_leaves_a_timestamp(tmp_path):
    home = _home(tmp_path)
    wrapped = autostop.recorded_command("echo hi; exit 3")
    result = subprocess.run(["sh", "-c", wrapped], env={**os.environ, "HOME": str(home)},
                            capture_output=True, text=True)
    assert (result.returncode, result.stdout) == (3, "hi\n")
    records = sorted(p.name for p in (home / autostop.ACTIVITY_DIR).iterdir())
    assert records == ["last-exec"]  # the running record is gone, the end is recorded


def test_setup_installs_the_service():
    text = install_script(InstallPlan(PROFILES["stock"]))
    assert text.rstrip().endswith('xc "done" "$CHANGED"')
    assert autostop.SERVICE_PATH in text and autostop.POWEROFF_PATH in text and "progress autostop" in text
    assert autostop.SYSTEMD_UNIT in text
    elsewhere = install_script(InstallPlan(PROFILES["stock"], node_root="/tmp/xc-opt"))
    assert "/tmp/xc-opt/bin/xeon-cluster-autostop" in elsewhere and autostop.SYSTEMD_UNIT not in elsewhere


def test_install_section_installs_and_is_idempotent(tmp_path):
    section = autostop.install_script(str(tmp_path / "bin"))
    preamble = shell.preamble("install.sh")  # what install.sh defines for its sections, written once there
    assert section.startswith(preamble) and preamble.startswith("#!/bin/bash\n")
    assert all(word in preamble for word in ("set -uo pipefail", "CHANGED=0", "xc() {", 'SUDO=""'))
    assert autostop.SYSTEMD_UNIT not in section  # only the standard place gets a unit
    first = subprocess.run(["bash", "-c", section], capture_output=True, text=True)
    second = subprocess.run(["bash", "-c", section], capture_output=True, text=True)
    assert first.returncode == 0 and "progress autostop installed" in first.stdout, first.stdout + first.stderr
    assert "progress autostop unchanged" in second.stdout
    installed = (tmp_path / "bin" / "xeon-cluster-poweroff").read_text()
    assert installed.rstrip("\n") == autostop.poweroff_script().rstrip("\n")


def test_the_power_off_command_refuses_a_real_power_off_inside_a_network_namespace():
    """Run here only where the test itself is not in the machine's network namespace; the text is checked always."""
    text = autostop.poweroff_script()
    assert "in_namespace" in text and "exit 2" in text.split("system)", 1)[1].split(";;", 1)[0]
    assert shell.is_bash(text) is False  # POSIX sh: it runs on any node


def test_local_power_off_path_is_the_metadata_services():
    assert autostop.LOCAL_POWEROFF_PATH == imds_server.POWER_OFF_PATH


def test_the_metadata_service_powers_off_only_inside_a_local_nodes_namespace():
    from node_setup.local.state import namespace_name

    assert namespace_name("local", 0).startswith(imds_server.NAMESPACE_PREFIX)
    assert imds_server.in_own_namespace() is False  # the test runs in the machine's own namespace


def test_the_power_off_command_says_system_only_outside_every_named_network_namespace(tmp_path):
    script = tmp_path / "poweroff"
    script.write_text(autostop.poweroff_script())
    mode = subprocess.run(["sh", str(script), "mode"], capture_output=True, text=True, timeout=30)
    assert mode.returncode == 0 and mode.stdout.strip() in autostop.MODES
    bad = subprocess.run(["sh", str(script), "reboot"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_fab_train_finds_the_stacks_idle_time_for_its_cluster(tmp_path):
    from node_setup.stack_config import read_stack_values, stack_auto_stop_idle

    (tmp_path / "Pulumi.dev.yaml").write_text("config:\n  xeon-cluster:autoStopIdle: 2h\n")
    (tmp_path / "Pulumi.lab.yaml").write_text("config:\n  xeon-cluster:clusterName: gpu-lab\n"
                                              "  xeon-cluster:autoStopIdle: 'off'\n")
    (tmp_path / "Pulumi.bad.yaml").write_text("config:\n  xeon-cluster:autoStopIdle: soon\n")
    assert read_stack_values(tmp_path / "Pulumi.dev.yaml")[2] == []  # a known key, not a typo
    assert stack_auto_stop_idle("xeon-dev", tmp_path) == 7200
    assert stack_auto_stop_idle("gpu-lab", tmp_path) is None
    assert stack_auto_stop_idle("elsewhere", tmp_path) == 1800  # no stack here makes it: the default
    with pytest.raises(autostop.AutostopError, match=r"^Pulumi.bad.yaml: autoStopIdle: 'soon'"):
        stack_auto_stop_idle("xeon-bad", tmp_path)


def test_preflight_and_plan_refuse_a_bad_auto_stop_idle_with_the_other_settings(tmp_path):
    from cluster.stack.spec import ConfigError
    from node_setup.stack_config import load_stack_spec

    (tmp_path / "Pulumi.dev.yaml").write_text("config:\n  aws:region: us-east-1\n  xeon-cluster:autoStopIdle: soon\n")
    with pytest.raises(ConfigError) as err:
        load_stack_spec(root=tmp_path)
    assert any(p.startswith("Pulumi.dev.yaml: autoStopIdle: 'soon'") for p in err.value.problems), err.value.problems


# ------------------------------------------------------------------ hardening: namespaces, stale records, full list


def _can_unshare_net_and_pid() -> bool:
    try:
        return subprocess.run(["unshare", "--net", "--pid", "--fork", "--mount-proc", "true"],
                              capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.skipif(not _can_unshare_net_and_pid(), reason="needs root and unshare (network and PID namespaces)")
def test_a_network_plus_pid_namespace_is_a_local_node_never_the_machine(tmp_path):
    """In its own network and PID namespaces PID 1 is the namespace's own process, whose network
    namespace is the shell's: that must not pass for the machine. `shutdown` here is a stand-in that
    only records that it was called (the real one must never run in a test)."""
    script = tmp_path / "poweroff"
    script.write_text(autostop.poweroff_script())
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "shutdown").write_text(f"#!/bin/sh\necho called > {tmp_path}/shutdown-called\n")
    (fake / "shutdown").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    inside = ["unshare", "--net", "--pid", "--fork", "--mount-proc", "sh", str(script)]
    mode = subprocess.run([*inside, "mode"], capture_output=True, text=True, timeout=30, env=env)
    assert (mode.returncode, mode.stdout.strip()) == (0, "local"), mode.stdout + mode.stderr
    system = subprocess.run([*inside, "system"], capture_output=True, text=True, timeout=30, env=env)
    assert system.returncode == 2 and "refused" in system.stderr, system.stdout + system.stderr
    assert autostop.POWEROFF_ACK not in system.stdout
    assert not (tmp_path / "shutdown-called").exists()


def test_the_machines_own_pid_namespace_is_the_kernels_fixed_number():
    # the test runs outside any PID namespace of ours: either the machine's own (the fixed number)
    # or a container's, which must then count as a node too
    own = os.readlink("/proc/self/ns/pid")
    assert autostop.INIT_PID_NAMESPACE == "pid:[4026531836]"
    assert autostop.INIT_PID_NAMESPACE in autostop.poweroff_script()
    assert own.startswith("pid:[")


def test_the_exec_record_holds_the_pid_and_its_start_time(tmp_path):
    home = _home(tmp_path)
    wrapped = autostop.recorded_command(f"cat {autostop.ACTIVITY_DIR}/exec-* > {tmp_path}/record")
    result = subprocess.run(["sh", "-c", f"cd {home} && {wrapped}"], env={**os.environ, "HOME": str(home)},
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    pid, started = (tmp_path / "record").read_text().split()
    assert pid.isdigit() and started.isdigit() and int(started) > 0


def test_a_stale_exec_record_whose_pid_was_reused_does_not_count_and_is_removed(tmp_path):
    home = _home(tmp_path)
    _arm(home, 1, time.time() - 1000)
    activity = home / autostop.ACTIVITY_DIR
    activity.mkdir(parents=True)
    live = subprocess.Popen(["sleep", "30"])
    try:
        stat = open(f"/proc/{live.pid}/stat").read()
        started = stat.rsplit(") ", 1)[1].split()[19]
        record = activity / f"exec-{live.pid}"
        record.write_text(f"{live.pid} {started}\n")  # the command itself, still running
        assert _status(home).running == 1 and record.exists()
        record.write_text(f"{live.pid} {int(started) - 1}\n")  # another command's, dead; its pid reused
        s = _status(home)
        assert s.running == 0 and s.left_s == 0 and not record.exists()
        record.write_text(f"{live.pid}\n")  # a record without a start time cannot prove it runs
        assert _status(home).running == 0 and not record.exists()
    finally:
        live.kill()
        live.wait()


def test_setup_arms_the_clusters_default_unless_asked():
    """The default is the backend's (tests/unit/test_backend_kinds.py: the stack's on AWS, none elsewhere)."""
    asked = []

    def stack():
        asked.append(1)
        return 3600

    assert autostop.setup_idle("", stack) == 3600 and asked == [1]
    assert autostop.setup_idle(None, lambda: None) is None
    assert autostop.setup_idle("6s", stack) == 6 and autostop.setup_idle("off", stack) is None
    assert asked == [1]  # an explicit --auto-stop never reads the stack
    with pytest.raises(autostop.AutostopError, match=r"^--auto-stop: 'soon' .* \(or off\)$"):
        autostop.setup_idle("soon", stack)


def test_the_full_node_list_names_every_node_with_its_own_host_keys():
    from cluster.inventory import Node

    nodes = [Node(f"node{i}", f"10.0.0.{i + 1}", f"10.0.0.{i + 1}", i, role="master" if i == 0 else "worker")
             for i in range(3)]
    keys = {n.name: f"ssh-ed25519 AAAAkey{i}" for i, n in enumerate(nodes)}
    files = autostop.node_list_files("demo", reversed(nodes), "ubuntu", keys)
    state = autostop.STATE_DIR
    assert files[f"{state}/{autostop.NODES_FILE}"] == "node0\nnode1\nnode2\n"
    config = files[f"{state}/{autostop.SSH_CONFIG_FILE}"]
    assert "Host node2 10.0.0.3" in config and "IdentityFile ~/.ssh/demo_ed25519" in config
    assert f"UserKnownHostsFile ~/{state}/{autostop.KNOWN_HOSTS_FILE}" in config
    assert "StrictHostKeyChecking yes" in config
    assert files[f"{state}/{autostop.KNOWN_HOSTS_FILE}"].splitlines()[2] == "node2,10.0.0.3 ssh-ed25519 AAAAkey2"


def test_workers_left_running_keep_the_master_up_and_are_a_problem_to_show():
    parsed = autostop.parse_status("armed=yes\nidle=6\nunstopped=node2 node3 \nunstopped_at=1800000000\n")
    assert parsed.unstopped == ("node2", "node3")
    line = autostop.status_line(parsed)
    assert line == autostop.problem(parsed)
    assert line.startswith("auto-stop: could not power off node2, node3 at 2027-01-15 08:00:00Z, so the master stays "
                           "up")
    assert autostop.problem(autostop.parse_status("armed=yes\nunstopped=\n")) is None
    unlisted = autostop.problem(autostop.parse_status(f"armed=yes\nunstopped={autostop.UNLISTED}\n"))
    assert "no full node list" in unlisted and "fab distribute" in unlisted


def test_fab_setup_refuses_a_bad_auto_stop_before_touching_a_node(tmp_path):
    inventory = tmp_path / "lab.yaml"
    inventory.write_text("name: lab\nhosts:\n  - address: 192.0.2.1\n")  # TEST-NET: nothing is ever sent there
    result = fab_in_process("setup", "--auto-stop", "soon", "--cluster", str(inventory),
                            env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")})
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--auto-stop: 'soon'" in lines[0] and "allowed" in lines[0], result.stderr
    assert "setup: cluster" not in result.stdout  # nothing started
