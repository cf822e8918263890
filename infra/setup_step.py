"""The setup step: install the software profile on the master from within `pulumi up`, then bake.

A `pulumi.dynamic` resource. Its inputs are the master's address and instance id, the SSH user,
the PATH of the private key (never its contents: state must not hold secrets) and the profile's
name, pins and fingerprint. A change of the instance, the profile or any pin replaces it, which
re-runs setup, renames (so re-bakes) the image and so replaces the workers; a change of address,
user or key path only updates it. Its `create()` connects with Fabric, waits (bounded) for SSH
and for cloud-init, then runs the same `node_setup.install` functions `fab setup` uses:
`install_profile(conn, profile)` and `prepare_for_bake(conn)`, and syncs the disk so the
no-reboot snapshot is consistent. Failures carry the remote command's exit code and output, or
the message of node_setup.install's InstallError for what fails on this machine (the wheel build).

Under Pulumi mocks `create()` is never called; tests call `run_profile_setup` directly.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any, Callable

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider, UpdateResult

from cluster.profiles import Profile, get_profile

SSH_TIMEOUT_SECONDS = 900  # bare-metal instances can take 10 minutes to boot
CLOUD_INIT_TIMEOUT_SECONDS = 1800
SSH_RETRY_SECONDS = 5.0
CONNECT_TIMEOUT_SECONDS = 10
OUTPUT_TAIL_LINES = 30

# Inputs whose change means "the image must be rebuilt"; the rest only update the record.
REPLACE_ON = ("instance_id", "profile", "fingerprint", "pip_pins", "bake_tag")


class SetupError(RuntimeError):
    """The setup step failed; the message says where, with the remote output."""


def bake_tag(instance_id: str, fingerprint: str) -> str:
    """A short stable id of one (master instance, profile fingerprint) pair: names the image."""
    return hashlib.sha256(f"{instance_id}|{fingerprint}".encode()).hexdigest()[:12]


def _tail(text: str) -> str:
    lines = (text or "").rstrip().splitlines()
    return "\n".join(lines[-OUTPUT_TAIL_LINES:])


def open_connection(props: dict[str, Any], key_path: str):
    """A Fabric connection to the master that uses only the given key and no ssh_config."""
    from fabric import Config, Connection

    config = Config(overrides={"load_ssh_configs": False, "run": {"in_stream": False}})
    return Connection(
        props["host"], user=props["user"], port=int(props.get("port") or 22), config=config,
        connect_timeout=CONNECT_TIMEOUT_SECONDS,
        connect_kwargs={"key_filename": key_path, "look_for_keys": False, "allow_agent": False})


def wait_for_ssh(connect: Callable[[], Any], timeout: float, retry_every: float = SSH_RETRY_SECONDS):
    """An open connection, retrying while the instance boots; SetupError after `timeout` seconds.

    There is no waiter for "sshd answers", so this is a bounded retry: each attempt gets a fresh
    connection (a half-failed paramiko client cannot be reused).
    """
    import paramiko

    deadline = time.monotonic() + timeout
    attempts = 0
    while True:
        attempts += 1
        conn = connect()
        try:
            conn.open()
            return conn
        except (OSError, EOFError, paramiko.SSHException) as exc:
            last = f"{type(exc).__name__}: {exc}"
            conn.close()
        if time.monotonic() + retry_every > deadline:
            raise SetupError(
                f"setup step: {conn.user}@{conn.host}:{conn.port} did not accept SSH within {timeout:.0f} s "
                f"({attempts} attempts; last error {last}). Check that adminCidrs contains the address "
                "you run pulumi from, and that privateKeyPath is the private half of publicKey.")
        time.sleep(retry_every)


def wait_for_cloud_init(conn, timeout: float) -> None:
    """Wait until cloud-init has finished (it installs the key, sets the hostname, runs apt)."""
    command = ("if command -v cloud-init >/dev/null 2>&1; then cloud-init status --wait; "
               "else echo 'cloud-init not installed'; fi")
    result = conn.run(command, hide=True, warn=True, timeout=timeout)
    # cloud-init >= 23.4: 0 done, 2 done with recoverable errors (degraded), 1 failed.
    if result.exited not in (0, 2):
        raise SetupError(f"setup step: cloud-init on {conn.host} ended with exit {result.exited}:\n"
                         f"{_tail(result.stdout + result.stderr)}")


def _node_setup_install():
    """node_setup.install's two functions, imported only when setup really runs."""
    try:
        from node_setup.install import install_profile, prepare_for_bake
    except ImportError as exc:
        raise SetupError(f"setup step: node_setup.install is not importable ({exc}); install the project "
                         "into the Python that runs pulumi (`pip install -e .[controller]`) or set "
                         "bake: false and run `fab setup` later") from None
    return install_profile, prepare_for_bake


def _controller_error_types() -> tuple[type[Exception], ...]:
    """node_setup.install's InstallError (raised on this machine, e.g. building the project wheel)."""
    try:
        from node_setup.install import InstallError
    except ImportError:  # tests that pass install doubles may run without node_setup.install
        return ()
    return (InstallError,)


def _remote(step: str, host: str, action: Callable[[], Any]) -> None:
    from invoke.exceptions import CommandTimedOut, UnexpectedExit

    try:
        action()
    except _controller_error_types() as exc:
        raise SetupError(f"setup step: {step} for {host} failed on this machine (the one running pulumi): "
                         f"{exc}") from None
    except UnexpectedExit as exc:
        result = exc.result
        raise SetupError(f"setup step: {step} on {host} failed: `{result.command}` exited {result.exited}:\n"
                         f"{_tail(result.stdout + result.stderr)}") from None
    except CommandTimedOut as exc:
        raise SetupError(f"setup step: {step} on {host} timed out after {exc.timeout} s: "
                         f"`{exc.result.command}`") from None


def run_profile_setup(props: dict[str, Any], *, connect=open_connection,
                      install: tuple[Callable, Callable] | None = None) -> dict[str, Any]:
    """What `create()` does; returns the outputs. `connect`/`install` are seams for tests."""
    key_path = os.path.expanduser(str(props["private_key_path"]))
    if not os.path.isfile(key_path):
        raise SetupError(f"privateKeyPath: {props['private_key_path']!r} is not a file on this machine; allowed: "
                         "the path of the private key whose public half is publicKey")
    profile: Profile = get_profile(props["profile"])
    if profile.fingerprint() != props["fingerprint"]:
        raise SetupError(f"softwareProfile: {profile.name!r} changed between preview and update "
                         "(cluster/profiles.py was edited); run `pulumi up` again")
    install_profile, prepare_for_bake = install or _node_setup_install()

    conn = wait_for_ssh(lambda: connect(props, key_path),
                        float(props.get("ssh_timeout_seconds") or SSH_TIMEOUT_SECONDS),
                        retry_every=SSH_RETRY_SECONDS)
    try:
        wait_for_cloud_init(conn, float(props.get("cloud_init_timeout_seconds") or CLOUD_INIT_TIMEOUT_SECONDS))
        _remote(f"installing profile {profile.name!r}", conn.host, lambda: install_profile(conn, profile))
        _remote("preparing the image", conn.host, lambda: prepare_for_bake(conn))
        _remote("flushing the disk", conn.host, lambda: conn.run("sync", hide=True))
    finally:
        conn.close()
    return {k: v for k, v in props.items() if not k.startswith("__")}


class ProfileSetupProvider(ResourceProvider):
    def create(self, props: dict[str, Any]) -> CreateResult:
        outs = run_profile_setup(props)
        return CreateResult(f"setup-{props['instance_id']}-{props['bake_tag']}", outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        keys = {k for k in set(olds) | set(news) if not k.startswith("__")}
        changed = sorted(k for k in keys if olds.get(k) != news.get(k))
        replaces = [k for k in changed if k in REPLACE_ON]
        return DiffResult(changes=bool(changed), replaces=replaces, delete_before_replace=False)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult({k: v for k, v in news.items() if not k.startswith("__")})


class ProfileSetup(pulumi.dynamic.Resource, module="xeon-cluster", name="ProfileSetup"):
    """The record that the master was set up with one profile; `bake_tag` names the image."""

    bake_tag: pulumi.Output[str]
    instance_id: pulumi.Output[str]

    def __init__(self, name: str, *, host: pulumi.Input[str], user: str, private_key_path: str,
                 instance_id: pulumi.Input[str], profile: Profile, port: int = 22,
                 ssh_timeout_seconds: int = SSH_TIMEOUT_SECONDS,
                 cloud_init_timeout_seconds: int = CLOUD_INIT_TIMEOUT_SECONDS,
                 opts: pulumi.ResourceOptions | None = None):
        fingerprint = profile.fingerprint()
        props = {
            "host": host,
            "port": port,
            "user": user,
            "private_key_path": private_key_path,
            "instance_id": instance_id,
            "profile": profile.name,
            "pip_pins": list(profile.pip_pins),
            "fingerprint": fingerprint,
            "bake_tag": pulumi.Output.from_input(instance_id).apply(lambda i: bake_tag(i, fingerprint)),
            "ssh_timeout_seconds": ssh_timeout_seconds,
            "cloud_init_timeout_seconds": cloud_init_timeout_seconds,
        }
        super().__init__(ProfileSetupProvider(), name, props, opts)
