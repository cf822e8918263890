"""The setup step's provider logic: against a real sshd on loopback, and with test doubles.

`create()` never runs under Pulumi mocks, so these tests call `run_profile_setup` (what `create()`
runs) directly. The real installer would run apt and pip, so the node_setup.ssh.install functions are
replaced by test doubles (`check_double`, `install_double`) that run real commands over the same
Fabric connection. An sshd started by the test on 127.0.0.1 (own host key, own authorized_keys,
a free port) is the "master"; it is stopped by its PID at the end.

Why this module is longer than about 400 lines (about 670): all of it is the one provider in
infra/setup_step.py. The tests over SSH share the `sshd` and `config_home` fixtures and
`RecordingInstaller`; the tests with a scripted connection and the diff tests build the same
properties with `make_props`; the last four check how Pulumi stores and loads that provider.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from cluster.node.profiles import PROFILES
from infra import setup_step
from infra.setup_step import ProfileSetupProvider, SetupError, run_profile_setup

SSHD = "/usr/sbin/sshd"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


def _needs_sshd() -> None:
    if os.geteuid() != 0 or not os.access(SSHD, os.X_OK) or not shutil.which("ssh-keygen"):
        pytest.skip("needs root, /usr/sbin/sshd (openssh-server) and ssh-keygen")


def start_sshd(home: Path, port: int, host_key: Path) -> subprocess.Popen:
    """An sshd on 127.0.0.1:`port` presenting `host_key`, admitting home/authorized_keys (stop it by PID)."""
    config = home / f"sshd_config.{host_key.name}"
    config.write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {host_key}",
        f"AuthorizedKeysFile {home / 'authorized_keys'}", f"PidFile {home / (host_key.name + '.pid')}",
        "UsePAM no", "StrictModes no", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password", "Subsystem sftp internal-sftp", ""]))
    os.makedirs("/run/sshd", exist_ok=True)  # privilege separation directory
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"test sshd did not start: {proc.stderr.read().decode()[-500:]}")
            time.sleep(0.1)


def stop_sshd(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def cloud_init_console(host_key: Path) -> str:
    """What cloud-init prints on an EC2 console at the end of boot for this host key (`ssh-keygen -l`'s own
    fingerprint line behind its syslog tag, then the key), after a kernel line."""
    pub = host_key.with_name(host_key.name + ".pub")
    listed = subprocess.run(["ssh-keygen", "-l", "-f", str(pub)], check=True, capture_output=True,
                            text=True).stdout.strip()
    tag = "<14>Mar  4 10:00:01 ec2: "
    return (f"[   12.402114] cloud-init[812]: Cloud-init v. 24.4 running 'modules:final'\n"
            f"{tag}-----BEGIN SSH HOST KEY FINGERPRINTS-----\n{tag}{listed}\n"
            f"{tag}-----END SSH HOST KEY FINGERPRINTS-----\n-----BEGIN SSH HOST KEY KEYS-----\n"
            f"{pub.read_text().strip()}\n-----END SSH HOST KEY KEYS-----\n")


def _shown_elsewhere() -> str:
    """A console listing the fingerprint of tests/infra/conftest.py's public key (the tests with a scripted
    connection never present a key; the step only needs the console to list one before it connects)."""
    from cluster.node.console import FINGERPRINTS_BEGIN, FINGERPRINTS_END, fingerprint
    from tests.infra.conftest import PUBLIC_KEY

    listed = f"256 {fingerprint(PUBLIC_KEY.split()[1])} test@xeon-cluster (ED25519)"
    return f"{FINGERPRINTS_BEGIN}\n{listed}\n{FINGERPRINTS_END}\n"


class ConsoleDouble:
    """Test double for the master's console (the ConsoleSource the step reads its host key from; on AWS its
    EC2 console output, tested through moto below): a fixed text, for the instance of make_props."""

    kind = "aws"
    wait_s, poll_s = 1.0, 0.1

    def __init__(self, text: str, instance: str = "i-0master"):
        self.text, self.instance_id = text, instance

    def instance(self, address: str) -> str:
        return self.instance_id

    def read(self, address: str) -> str:
        return self.text

    def where(self, address: str) -> str:
        return f"console of {self.instance_id}"

    def advice(self, address: str) -> str:
        return "compare the two"


SHOWN = ConsoleDouble(_shown_elsewhere())


def _sshd_home(home: Path) -> SimpleNamespace:
    for name in ("host_key", "other_host_key", "client_key", "other_key"):
        _keygen(home / name)
    shutil.copy(home / "client_key.pub", home / "authorized_keys")
    return SimpleNamespace(port=_free_port(), home=home, key=home / "client_key", other_key=home / "other_key",
                           host_key=home / "host_key", other_host_key=home / "other_host_key", user=getpass.getuser(),
                           console=ConsoleDouble(cloud_init_console(home / "host_key")))


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    _needs_sshd()
    server = _sshd_home(tmp_path_factory.mktemp("sshd"))
    proc = start_sshd(server.home, server.port, server.host_key)
    yield server
    stop_sshd(proc)


@pytest.fixture(autouse=True)
def config_home(tmp_path, monkeypatch):
    """The toolkit's config directory (cluster known_hosts) for this test only."""
    path = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(path))
    return path


def known_hosts(config_home: Path, cluster: str = "xeon-test") -> Path:
    return config_home / "xeon-cluster" / "keys" / cluster / "known_hosts"


def make_props(**overrides):
    profile = PROFILES["stock"]
    props = {
        "host": "127.0.0.1", "port": 22, "user": "ubuntu", "private_key_path": "~/.ssh/id_ed25519",
        "cluster": "xeon-test",
        "instance_id": "i-0master", "profile": profile.name, "pip_pins": list(profile.pip_pins),
        "fingerprint": profile.fingerprint(), "kept_image": "ami-0image",
        "ssh_timeout_seconds": 10, "cloud_init_timeout_seconds": 30, "__provider": "serialized",
    }
    props.update(overrides)
    return props


@dataclass
class RecordingInstaller:
    """Test double for node_setup.ssh.install: runs real commands over the connection it is given; its check
    finds this project's wheel differs, so the install runs."""

    marker: Path
    fail_with: str | None = None

    def __post_init__(self):
        self.calls: list[str] = []

    def check_double(self, conn, profile, *, project_version, min_free_gib):
        from cluster.node.setup_script import CheckItem, CheckReport

        self.calls.append(f"check:{profile.name}")
        conn.run(f"echo checked {profile.name} > {self.marker}", hide=True)
        return CheckReport((CheckItem("venv", True, "present"), CheckItem("xeon-cluster", False, "another version")))

    def install_double(self, conn, profile):
        self.calls.append(f"install:{profile.name}")
        command = self.fail_with or f"echo installed {profile.name} >> {self.marker}"
        conn.run(command, hide=True)

    @property
    def functions(self):
        return {"check": self.check_double, "install": self.install_double}


# ------------------------------------------------------------------------- against real sshd


@pytest.mark.ssh
def test_setup_checks_then_installs_what_differs_over_real_ssh(sshd, tmp_path):
    installer = RecordingInstaller(tmp_path / "node-state")
    props = make_props(port=sshd.port, user=sshd.user, private_key_path=str(sshd.key))
    outs = run_profile_setup(props, **installer.functions, console=sshd.console)
    assert installer.calls == ["check:stock", "install:stock"]
    assert (tmp_path / "node-state").read_text() == "checked stock\ninstalled stock\n"  # really ran remotely
    assert outs["installed"].startswith("from kept image ami-0image: installed what differed (xeon-cluster)")
    assert outs["kept_image"] == "ami-0image" and "__provider" not in outs
    assert outs["private_key_path"] == str(sshd.key)
    assert "PRIVATE KEY" not in repr(outs)


@pytest.mark.ssh
def test_failed_install_reports_the_remote_command_exit_and_output(sshd, tmp_path):
    installer = RecordingInstaller(tmp_path / "node-state",
                                   fail_with="echo 'E: Unable to locate package libfoo' >&2; exit 100")
    props = make_props(port=sshd.port, user=sshd.user, private_key_path=str(sshd.key))
    with pytest.raises(SetupError) as caught:
        run_profile_setup(props, **installer.functions, console=sshd.console)
    message = str(caught.value)
    assert "installing profile 'stock' on 127.0.0.1 failed" in message
    assert "exited 100" in message and "E: Unable to locate package libfoo" in message
    assert installer.calls == ["check:stock", "install:stock"]


@pytest.mark.ssh
def test_wrong_key_is_retried_then_reported_within_the_bound(sshd, tmp_path, monkeypatch):
    monkeypatch.setattr(setup_step, "SSH_RETRY_SECONDS", 0.3)
    installer = RecordingInstaller(tmp_path / "node-state")
    props = make_props(port=sshd.port, user=sshd.user, private_key_path=str(sshd.other_key),
                       ssh_timeout_seconds=1.5)
    with pytest.raises(SetupError, match=r"did not accept SSH within 2 s \(\d+ attempts; .*AuthenticationException"
                                         r".*privateKeyPath"):  # the bound it applied, in its words
        run_profile_setup(props, **installer.functions, console=sshd.console)
    assert installer.calls == []


@pytest.mark.ssh
def test_first_connect_records_the_masters_host_key(sshd, tmp_path, config_home):
    installer = RecordingInstaller(tmp_path / "node-state")
    props = make_props(port=sshd.port, user=sshd.user, private_key_path=str(sshd.key))
    run_profile_setup(props, **installer.functions, console=sshd.console)
    keytype, b64 = (sshd.host_key.with_suffix(".pub")).read_text().split()[:2]
    # verified from the master's console, so recorded with its instance (a later instance there is verified anew)
    assert known_hosts(config_home).read_text() == f"[127.0.0.1]:{sshd.port} {keytype} {b64} i-0master\n"
    assert oct(known_hosts(config_home).stat().st_mode & 0o777) == "0o600"
    # The same key again: accepted, nothing added (what `fab` then finds recorded too).
    run_profile_setup(props, **installer.functions, console=sshd.console)
    assert known_hosts(config_home).read_text().count("\n") == 1


@pytest.mark.ssh
def test_another_host_key_on_the_same_address_is_refused_with_fabs_message(tmp_path, config_home):
    """A replaced master that reuses the address: refused at once, as `fab` refuses it."""
    from node_setup.ssh import keys

    _needs_sshd()
    (tmp_path / "sshd").mkdir()
    server = _sshd_home(tmp_path / "sshd")
    installer = RecordingInstaller(tmp_path / "node-state")
    props = make_props(port=server.port, user=server.user, private_key_path=str(server.key),
                       ssh_timeout_seconds=30)
    first = start_sshd(server.home, server.port, server.host_key)
    try:
        run_profile_setup(props, **installer.functions, console=server.console)
    finally:
        stop_sshd(first)
    recorded = known_hosts(config_home).read_text()
    second = start_sshd(server.home, server.port, server.other_host_key)
    try:
        with pytest.raises(SetupError) as caught:
            run_profile_setup(props, **installer.functions, console=server.console)
    finally:
        stop_sshd(second)
    message = str(caught.value)
    # connections.explain's words for paramiko's BadHostKeyException: what `fab` prints.
    assert message.startswith("setup step: host key mismatch for 127.0.0.1: got ssh-ed25519 SHA256:")
    assert ", recorded SHA256:" in message
    assert message.endswith("; " + keys.forget_hint("xeon-test", "127.0.0.1"))
    # refused at once: retried until the 30 s bound it would end with "did not accept SSH within 30 s" instead
    assert installer.calls == ["check:stock", "install:stock"]  # only the first master was set up
    assert known_hosts(config_home).read_text() == recorded  # the recorded key is kept


@pytest.mark.ssh
def test_a_host_key_of_another_type_than_recorded_is_refused(sshd, tmp_path, config_home):
    from node_setup.ssh import keys

    rsa = tmp_path / "rsa_host"
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-N", "", "-f", str(rsa)], check=True)
    keytype, b64 = rsa.with_suffix(".pub").read_text().split()[:2]
    path = known_hosts(config_home)
    path.parent.mkdir(parents=True)
    recorded = f"[127.0.0.1]:{sshd.port} {keytype} {b64}\n"
    path.write_text(recorded)
    installer = RecordingInstaller(tmp_path / "node-state")
    props = make_props(port=sshd.port, user=sshd.user, private_key_path=str(sshd.key), ssh_timeout_seconds=30)
    with pytest.raises(SetupError) as caught:
        run_profile_setup(props, **installer.functions, console=sshd.console)
    message = str(caught.value)
    assert message.startswith("setup step: host key ") and "ssh-ed25519" in message
    assert "forget the old key with `fab forget --cluster xeon-test --host " in message
    assert message.endswith("and rerun; otherwise do not connect")
    assert installer.calls == [] and path.read_text() == recorded
    assert keys.forget_hint("xeon-test", "h").endswith("and rerun; otherwise do not connect")


def test_no_sshd_is_reported_within_the_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(setup_step, "SSH_RETRY_SECONDS", 0.3)
    key = tmp_path / "key"
    key.write_text("not read by this test")
    props = make_props(port=_free_port(), private_key_path=str(key), ssh_timeout_seconds=1.2)
    with pytest.raises(SetupError, match=r"ubuntu@127.0.0.1:\d+ did not accept SSH within 1 s .*adminCidrs"):
        run_profile_setup(props, console=SHOWN)  # the bound it applied, in its words


# ------------------------------------------- the master's host key from its EC2 console (moto)

MOTO_EXAMPLE_AMI = "ami-12c6146b"


@pytest.fixture
def ec2_master(aws_credentials):
    """The master's instance in moto's EC2 (its id and region for the step's props). moto answers its
    GetConsoleOutput with a canned kernel log and no host keys; a test that needs a cloud-init console
    replaces that canned text (the module constant moto's answer is built from), so the text still travels
    through boto3 and moto's base64 as a real answer does."""
    import boto3
    import moto

    from tests.conftest import AWS_TEST_REGION

    with moto.mock_aws():
        ec2 = boto3.client("ec2", region_name=AWS_TEST_REGION)
        (instance,) = ec2.run_instances(ImageId=MOTO_EXAMPLE_AMI, MinCount=1, MaxCount=1,
                                        InstanceType="c6i.large")["Instances"]
        yield SimpleNamespace(id=instance["InstanceId"], region=AWS_TEST_REGION)


def ec2_console_shows(monkeypatch, text: str) -> None:
    from moto.ec2.responses import general

    monkeypatch.setattr(general, "SAMPLE_CONSOLE_OUTPUT", text)


@pytest.mark.parametrize("instance_type", ["r7iz.metal-16xl", "c7i.16xlarge"])
def test_the_masters_console_is_its_instances_and_awaited_as_long_as_its_type_boots(instance_type):
    from cluster.stack.catalog import boot_wait_s

    props = make_props(ssh_timeout_seconds=setup_step.ssh_timeout_for(instance_type), region="eu-west-1",
                       host="198.51.100.9")
    console = setup_step.master_console(props)
    assert console.wait_s == boot_wait_s(instance_type)  # the one budget the supervisor's replacements get
    assert console.instance("198.51.100.9") == "i-0master" and console.region == "eu-west-1"
    assert "--instance-id i-0master --region eu-west-1" in console.advice("198.51.100.9")


@pytest.mark.ssh
def test_the_master_presenting_the_key_its_ec2_console_lists_is_set_up_and_recorded(
        sshd, tmp_path, config_home, ec2_master, monkeypatch):
    ec2_console_shows(monkeypatch, cloud_init_console(sshd.host_key))
    installer = RecordingInstaller(tmp_path / "node-state")
    props = make_props(port=sshd.port, user=sshd.user, private_key_path=str(sshd.key), instance_id=ec2_master.id,
                       region=ec2_master.region)
    run_profile_setup(props, **installer.functions)  # the console read through boto3 (moto)
    assert installer.calls == ["check:stock", "install:stock"]
    keytype, b64 = sshd.host_key.with_suffix(".pub").read_text().split()[:2]
    assert known_hosts(config_home).read_text() == f"[127.0.0.1]:{sshd.port} {keytype} {b64} {ec2_master.id}\n"


@pytest.mark.ssh
def test_a_master_presenting_another_key_than_its_ec2_console_lists_is_refused_before_any_command(
        sshd, tmp_path, config_home, ec2_master, monkeypatch):
    ec2_console_shows(monkeypatch, cloud_init_console(sshd.other_host_key))
    installer = RecordingInstaller(tmp_path / "node-state")
    props = make_props(port=sshd.port, user=sshd.user, private_key_path=str(sshd.key), instance_id=ec2_master.id,
                       region=ec2_master.region, ssh_timeout_seconds=30)
    with pytest.raises(SetupError) as caught:
        run_profile_setup(props, **installer.functions)
    line = str(caught.value)
    listed = subprocess.run(["ssh-keygen", "-l", "-f", str(sshd.other_host_key) + ".pub"], check=True,
                            capture_output=True, text=True).stdout.split()[1]
    assert line.startswith(f"setup step: host key of [127.0.0.1]:{sshd.port} (instance {ec2_master.id}) refused: "
                           "it presents ssh-ed25519 SHA256:")
    assert f"its EC2 console output of {ec2_master.id} shows {listed} (ED25519)" in line and "do not connect" in line
    assert f"aws ec2 get-console-output --latest --instance-id {ec2_master.id} --region {ec2_master.region}" in line
    assert "\n" not in line
    assert installer.calls == []  # refused in the handshake: no command ran
    assert known_hosts(config_home).read_text() == ""


def test_a_master_whose_ec2_console_never_lists_its_host_keys_is_refused_without_connecting(
        tmp_path, config_home, ec2_master):
    """moto's own canned console (a kernel log, no host keys): refused once the boot's wait is over."""
    props = _props_with_key(tmp_path, host="198.51.100.9", instance_id=ec2_master.id, region=ec2_master.region,
                            ssh_timeout_seconds=0.5)
    console = setup_step.master_console(props)  # the step's own, read through boto3
    console.poll_s = 0.1  # its 10 s between reads would outlast this test's short boot

    def connect_double(props, key, host_keys):
        raise AssertionError("must not connect to a master whose host key could not be verified")

    with pytest.raises(SetupError) as caught:
        run_profile_setup(props, connect=connect_double, console=console)
    line = str(caught.value)
    assert line.startswith(f"setup step: host key of 198.51.100.9 (instance {ec2_master.id}) not verified: its EC2 "
                           f"console output of {ec2_master.id} shows no SSH host key fingerprints after 0.5 s; refused")
    assert f"aws ec2 get-console-output --latest --instance-id {ec2_master.id}" in line and "\n" not in line
    assert known_hosts(config_home).read_text() == ""


class DeniedConsoleEc2:
    """Test double of an EC2 client whose caller lacks ec2:GetConsoleOutput (moto enforces no IAM)."""

    def get_console_output(self, **_):
        from botocore.exceptions import ClientError

        raise ClientError({"Error": {"Code": "UnauthorizedOperation", "Message": "You are not authorized to perform "
                                     "this operation."}, "ResponseMetadata": {"HTTPStatusCode": 403}},
                          "GetConsoleOutput")


def test_a_master_whose_console_cannot_be_read_is_refused_at_once_in_one_line_not_after_its_boot(tmp_path,
                                                                                                  config_home):
    """A read error is not a console that lists nothing yet: refused at its first read, though the metal master's
    boot may take 40 minutes, naming the permission (`fab preflight`'s console check asks about it first)."""
    props = _props_with_key(tmp_path, host="198.51.100.9", instance_id="i-0master", region="us-east-1",
                            ssh_timeout_seconds=setup_step.ssh_timeout_for("r7iz.metal-16xl"))
    console = setup_step.master_console(props)
    console._ec2 = DeniedConsoleEc2()

    def connect_double(props, key, host_keys):
        raise AssertionError("must not connect to a master whose host key could not be verified")

    started = time.monotonic()
    with pytest.raises(SetupError) as caught:
        run_profile_setup(props, connect=connect_double, console=console)
    assert time.monotonic() - started < console.wait_s / 100 and console.wait_s == 2400
    line = str(caught.value)
    assert line.startswith("setup step: host key of 198.51.100.9 (instance i-0master) not verified: cannot read the "
                           "console of i-0master (UnauthorizedOperation: You are not authorized")
    assert "allow ec2:GetConsoleOutput on i-0master" in line and line.endswith("; refused") and "\n" not in line
    assert known_hosts(config_home).read_text() == ""


# ------------------------------------------------------------------------ with test doubles


class ScriptedConnection:
    """Test double for a Fabric connection: answers each command with a scripted result."""

    def __init__(self, results: dict[str, tuple[int, str]]):
        self.results = results
        self.commands: list[str] = []
        self.host, self.user, self.port = "198.51.100.9", "ubuntu", 22
        self.closed = False

    def open(self):
        pass

    def close(self):
        self.closed = True

    def run(self, command, hide=None, warn=False, timeout=None):
        from invoke.exceptions import UnexpectedExit
        from invoke.runners import Result

        self.commands.append(command)
        key = next((k for k in self.results if k in command), None)
        exited, out = self.results.get(key, (0, ""))
        result = Result(stdout=out, stderr="", command=command, exited=exited, hide=("stdout", "stderr"))
        if exited and not warn:
            raise UnexpectedExit(result)
        return result


def _props_with_key(tmp_path, **overrides):
    key = tmp_path / "id_test"
    key.write_text("placeholder: never read")
    return make_props(private_key_path=str(key), **overrides)


@pytest.mark.parametrize("exit_code", [0, 2])
def test_cloud_init_done_or_degraded_lets_setup_go_on(tmp_path, exit_code):
    conn = ScriptedConnection({"cloud-init status --wait": (exit_code, "status: done")})
    calls: list = []
    run_profile_setup(_props_with_key(tmp_path), connect=lambda props, key, host_keys: conn, console=SHOWN,
                      install=lambda c, p: calls.append("install"), check=_check_double((), calls))
    assert [c[0] for c in calls] == ["check"]
    assert "cloud-init status --wait" in conn.commands[0] and conn.closed


def test_cloud_init_failure_stops_setup_with_its_output(tmp_path):
    conn = ScriptedConnection({"cloud-init status --wait": (1, "status: error\nmodules-final failed")})
    calls: list = []
    with pytest.raises(SetupError, match=r"(?s)cloud-init on 198.51.100.9 ended with exit 1:\n.*modules-final failed"):
        run_profile_setup(_props_with_key(tmp_path), connect=lambda props, key, host_keys: conn, console=SHOWN,
                          install=lambda c, p: calls.append("install"), check=_check_double((), calls))
    assert calls == [] and conn.closed


def test_wheel_build_failure_on_the_controller_is_a_setup_error_with_its_message(tmp_path):
    from node_setup.ssh.wheels import InstallError

    conn = ScriptedConnection({})
    calls: list = []

    def install_double(c, profile):  # what install_profile raises when `pip wheel` fails here
        calls.append("install")
        raise InstallError("building the xeon-cluster wheel failed (`pip wheel ...`, exit 1):\n"
                           "error: invalid command 'bdist_wheel'\ninstall setuptools and wheel")

    with pytest.raises(SetupError) as caught:
        run_profile_setup(_props_with_key(tmp_path), connect=lambda props, key, host_keys: conn, console=SHOWN,
                          install=install_double, check=_check_double(("xeon-cluster",), calls))
    message = str(caught.value)
    assert message.startswith("setup step: installing profile 'stock' for 198.51.100.9 failed on this machine")
    assert "invalid command 'bdist_wheel'" in message and "install setuptools and wheel" in message
    assert [c if isinstance(c, str) else c[0] for c in calls] == ["check", "install"] and conn.closed


def _check_double(failing: tuple[str, ...], calls: list):
    """Test double for node_setup.ssh.install.check_node: a report whose `failing` items differ."""
    from cluster.node.setup_script import CheckItem, CheckReport

    def check(conn, profile, *, project_version, min_free_gib):
        calls.append(("check", project_version, min_free_gib))
        return CheckReport(tuple(CheckItem(name, name not in failing, f"{name} detail")
                                 for name in ("venv", "profile", "xeon-cluster", "disk")))

    return check


def _from_the_image(tmp_path, failing: tuple[str, ...]) -> tuple[dict, list, ScriptedConnection]:
    """The setup step of a master booted from image ami-0kept whose check fails `failing`: (its outputs, the
    check and install calls in order, the connection)."""
    conn = ScriptedConnection({})
    calls: list = []
    outs = run_profile_setup(_props_with_key(tmp_path, kept_image="ami-0kept"),
                             connect=lambda props, key, host_keys: conn, console=SHOWN,
                             install=lambda c, p: calls.append("install"), check=_check_double(failing, calls))
    return outs, calls, conn


def test_a_master_that_matches_its_image_is_checked_and_nothing_installed(tmp_path):
    outs, calls, conn = _from_the_image(tmp_path, ())
    assert [c[0] for c in calls] == ["check"] and calls[0][2] == 0  # the machine's free disk is no install's
    assert calls[0][1] == setup_step._project_version()  # this checkout's, what an install would put there
    assert conn.closed
    assert outs["installed"].startswith("from kept image ami-0kept: nothing to install: the node holds profile stock")


def test_what_differs_from_the_image_is_installed(tmp_path):
    outs, calls, _ = _from_the_image(tmp_path, ("xeon-cluster",))
    assert [c[0] if isinstance(c, tuple) else c for c in calls] == ["check", "install"]
    assert outs["installed"] == ("from kept image ami-0kept: installed what differed (xeon-cluster): the node holds "
                                 f"profile stock and xeon-cluster {setup_step._project_version()}")


def test_missing_private_key_fails_before_connecting(tmp_path):
    def connect_double(props, key):
        raise AssertionError("must not connect without a key")

    with pytest.raises(SetupError, match=r"privateKeyPath: '.*/absent' is not a file on this machine"):
        run_profile_setup(make_props(private_key_path=str(tmp_path / "absent")), connect=connect_double)


def test_profile_edited_since_preview_is_refused(tmp_path):
    with pytest.raises(SetupError, match=r"softwareProfile: 'stock' changed between preview and update"):
        run_profile_setup(_props_with_key(tmp_path, fingerprint="stale"), connect=None)


def test_missing_node_setup_install_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "node_setup.ssh.install", None)  # makes the import fail
    with pytest.raises(SetupError, match=r"node_setup.ssh.install is not importable.*pip install -e"):
        run_profile_setup(_props_with_key(tmp_path), connect=None)


def test_create_names_the_record_after_instance_and_image_and_records_what_the_setup_did(monkeypatch):
    monkeypatch.setattr(setup_step, "run_profile_setup", lambda props, **seams: {"installed": "nothing to install"})
    result = ProfileSetupProvider().create(make_props())
    assert result.id == "setup-i-0master-ami-0image"
    assert result.outs == {"installed": "nothing to install"}  # nothing about an image made from the master


@pytest.mark.parametrize("change, replaced", [
    ({"pip_pins": ["torch==2.14.0"]}, ["pip_pins"]),
    ({"profile": "intel"}, ["profile"]),
    ({"instance_id": "i-0new"}, []),  # a new master: set up again by the update, the image stays
    ({"host": "198.51.100.10"}, []),
    ({"private_key_path": "~/.ssh/other"}, []),
    ({"user": "admin"}, []),
    ({"kept_image": "ami-0kept"}, ["kept_image"]),  # another image to boot: checked again
])
def test_diff_replaces_only_for_what_changes_the_image(change, replaced):
    olds = make_props()
    diff = ProfileSetupProvider().diff("id", olds, {**olds, **change})
    assert diff.changes is True and diff.replaces == replaced


def test_diff_without_changes():
    olds = make_props(installed="nothing to install")
    diff = ProfileSetupProvider().diff("id", olds, {**olds, "installed": None})  # an output is never a difference
    assert diff.changes is False and diff.replaces == []


# What the install-and-bake path of earlier versions recorded beside the inputs a step has now.
BAKED_RECORD = {"bake_tag": "0a1b2c3d4e5f", "bake_source": "i-0master", "stamp": "20260501T120000Z",
                "baked": {"xeon-cluster:project-version": "1.0"}, "bake_identity": {"xeon-cluster:profile": "stock"}}


def test_a_step_recorded_by_the_bake_is_replaced_and_one_that_booted_the_image_is_unchanged():
    news = make_props()
    baked = {**news, **BAKED_RECORD, "kept_image": None}  # installed on the master, then imaged it
    diff = ProfileSetupProvider().diff("id", baked, news)
    assert diff.changes is True and diff.replaces == ["kept_image"] and not diff.delete_before_replace
    booted = {**news, **BAKED_RECORD, "bake_source": None, "baked": None}  # booted the image, with the old keys
    assert ProfileSetupProvider().diff("id", booted, news).changes is False


def test_a_new_master_is_set_up_again_and_an_address_change_only_recorded(monkeypatch):
    ran = []
    monkeypatch.setattr(setup_step, "run_profile_setup", lambda props, **seams: ran.append(props["instance_id"]) or
                        {**{k: v for k, v in props.items() if not k.startswith("__")}, "installed": "checked"})
    olds = {**{k: v for k, v in make_props().items() if k != "__provider"}, **BAKED_RECORD, "installed": "before"}
    news = make_props(instance_id="i-0new", host="198.51.100.10")
    diff = ProfileSetupProvider().diff("id", olds, news)
    assert diff.changes is True and diff.replaces == []  # an update, not a replacement
    result = ProfileSetupProvider().update("id", olds, news)
    assert ran == ["i-0new"]  # the new master is checked with the same profile and pins
    assert result.outs["instance_id"] == "i-0new" and result.outs["installed"] == "checked"
    assert result.outs["pip_pins"] == olds["pip_pins"] and not set(result.outs) & set(setup_step.RETIRED)
    # Only an address change: recorded, nothing run, what the last run did kept.
    kept = ProfileSetupProvider().update("id", olds, make_props(host="198.51.100.10")).outs
    assert ran == ["i-0new"] and kept["installed"] == "before"


def _serialized_provider() -> str:
    """The provider as `pulumi.dynamic` stores it in the state (dill, base64; module classes by reference)."""
    from pulumi.dynamic.dynamic import serialize_provider

    return serialize_provider(ProfileSetupProvider())


# What pulumi/dynamic/__main__.py's get_provider does with the state's `__provider` (that module
# starts the provider server when imported, so its two lines are repeated here).
LOAD_LIKE_PULUMI = ("import base64, dill, sys; p = dill.loads(base64.b64decode(sys.argv[1])); "
                    "print(type(p).__module__, type(p).__qualname__, "
                    "p.diff('i', {'profile': 'a'}, {'profile': 'b'}).replaces)")


def test_provider_is_serialized_by_reference_to_a_stable_class_path():
    """Pulumi pickles the provider into every state: renaming or moving the class breaks old stacks."""
    import base64

    payload = _serialized_provider()
    assert len(payload) < 400  # a reference, not a copy of code or data
    raw = base64.b64decode(payload)
    assert b"infra.setup_step" in raw and b"ProfileSetupProvider" in raw
    assert ProfileSetupProvider.__module__ == "infra.setup_step"


def test_serialized_provider_loads_in_a_fresh_python_started_in_infra():
    """As Pulumi's dynamic provider process: cwd infra/, no PYTHONPATH; the project comes from the venv."""
    from tests.infra.conftest import ROOT

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run([sys.executable, "-c", LOAD_LIKE_PULUMI, _serialized_provider()], cwd=ROOT / "infra",
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["infra.setup_step", "ProfileSetupProvider", "['profile']"]


def test_no_module_of_infra_hides_a_package_of_the_project():
    """The provider process has infra/ first on sys.path: an infra/cluster.py would shadow `cluster`."""
    from node_setup.controller import PROJECT_PACKAGES
    from tests.infra.conftest import ROOT

    assert not {p.stem for p in (ROOT / "infra").glob("*.py")} & set(PROJECT_PACKAGES)


def test_without_the_project_installed_the_provider_does_not_load(tmp_path):
    """Why Pulumi.yaml names the project's venv: a Python without the project cannot load the step."""
    # A Python with the same packages but without the project: `-S` skips site-packages' .pth files
    # (the editable install's finder is one), then site-packages itself goes back on sys.path.
    # Started in infra/ like the provider process.
    import dill

    from tests.infra.conftest import ROOT

    site_packages = str(Path(dill.__file__).resolve().parents[1])
    code = "import sys; sys.path.append(sys.argv[2]); " + LOAD_LIKE_PULUMI
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run([sys.executable, "-S", "-c", code, _serialized_provider(), site_packages],
                          cwd=ROOT / "infra",
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "No module named 'infra'" in done.stderr
