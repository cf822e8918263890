"""The setup step: check the master from within `pulumi up`, and install only what differs.

The master boots the image every node boots (`kept_image`: the one EC2 Image Builder built apart, infra/image.py,
or a kept one, cluster/stack/image_reuse.py), which holds the profile already; the step images nothing. Its
`create()` (and `update()` for a new master) checks the node against the profile and this project's version as
`fab check` does (`check_node`, cluster/node/setup_script.py's check) and installs only when something differs
(`install_profile`, the script `fab setup` runs; it is idempotent: another project version reinstalls the wheel
alone). Its `installed` output says which it was.

Why the step stays now that the master is a group of one (infra/node_group.py) booting the image ready: only it
checks, at `pulumi up`, that the master booted what the stack asked for, installs this project's wheel when it
differs, and arms the idle auto-stop of a master `pulumi up` brought back. Its address and instance id are the
master group's running instance (found by AWS's group-name tag): a master the group launched since the last
`pulumi up` is checked at the next one (and `fab up`, `fab setup` or a job arms it meanwhile).

A `pulumi.dynamic` resource. Its inputs are the master's address and instance id, the SSH user,
the PATH of the private key (never its contents: state must not hold secrets), the cluster's name,
the profile's name, pins and fingerprint, and the image. A change of the profile, any pin or the image
replaces it (a software change builds a new image, which a new master boots). A new master from the same
image (a reclaim, a lost or auto-stopped master, a setting that replaces the master alone) only updates it:
the update checks the new master as the create does and arms its idle auto-stop with the stack's
autoStopIdle (`arm_new_master`). Nothing ties the step's life to the master's (no `deleted_with`): a Pulumi
engine that replaces a resource whose `deletedWith` target is replaced would replace the step with every
replaced master, and a create arms nothing. A change of address, user, key path or cluster name only
records the new values. A replaced step is created before its old record is deleted (it is only a record).
Its `create()` connects with Fabric, waits (bounded) for SSH and for cloud-init, then runs the same
`node_setup.ssh.install` functions `fab check` and `fab setup` use. Failures carry the remote command's exit
code and output, or the message of node_setup.ssh.wheels's InstallError for what fails on this machine (the
wheel build).

A step recorded by the program's earlier versions, which installed on the master and imaged it, holds keys no
step has now (RETIRED); the diff ignores them: such a record with no `kept_image` is replaced (its
`kept_image` changes), and one that had it already sees no difference.

The master's host key is verified as `fab` verifies a new AWS node's (node_setup/ssh/connections.py),
never trusted on first use: before the step's first SSH command, the master's EC2 console output is
read (GetConsoleOutput with the credentials of whoever runs pulumi, node_setup/aws/console.py) until
it lists the host key fingerprints cloud-init prints at the end of boot, for as long as the master's
type may take to boot (`ssh_timeout_seconds`, cluster/stack/catalog.py's boot_wait_s: 40 minutes for
metal); the key the master then presents must be one of them (cluster/node/console.py), and is recorded
with the instance id in the cluster's known_hosts that the toolkit keeps
(`node_setup.ssh.keys.known_hosts_path(cluster)`). A console that lists no fingerprints in time (or
cannot be read), a presented key it does not list, or a host that presents another key than the one
recorded stop the step at once with one line naming the instance and what to check, never retried or
accepted. A record of another instance at the master's address (a lost master's) is dropped first.

The provider is pickled into the state by reference (dill records `infra.setup_step.
ProfileSetupProvider`, not its code), and Pulumi loads it in a separate Python process started
in infra/: keep this module path and class name, and run Pulumi from the project's virtual
environment where the project is installed (Pulumi.yaml `runtime.options.virtualenv`). Its
delete does nothing in AWS, but the engine loads the provider for it (on `pulumi destroy` before the
master is terminated); for a step that cannot be loaded, docs/aws-lifecycle.md gives the
`pulumi state delete` recovery.

Under Pulumi mocks `create()` is never called; tests call `run_profile_setup` directly.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider, UpdateResult

from cluster.node.profiles import Profile, get_profile
from cluster.stack.catalog import BOOT_WAIT_S, METAL_BOOT_WAIT_S, boot_wait_s

# How long the step waits for the master's sshd: its type's boot (cluster/stack/catalog.py, longer for metal).
SSH_TIMEOUT_SECONDS = BOOT_WAIT_S
METAL_SSH_TIMEOUT_SECONDS = METAL_BOOT_WAIT_S
CLOUD_INIT_TIMEOUT_SECONDS = 1800
SSH_RETRY_SECONDS = 5.0
CONNECT_TIMEOUT_SECONDS = 10
OUTPUT_TAIL_LINES = 30

# Inputs whose change means other software on the master (another image booted); the rest only update the record.
REPLACE_ON = ("profile", "fingerprint", "pip_pins", "kept_image")
# Outputs the step sets itself (not inputs): never a difference. `installed`: what the step's last run did;
# `auto_stop`: what arming a new master's idle auto-stop said.
OUTPUT_ONLY = ("auto_stop", "installed")
# The keys of a step recorded by the install-and-bake path of earlier versions (the image's bake tag, the master
# it was made from, its stamp, what it held): never a difference, and no step now has them.
RETIRED = ("bake_tag", "bake_source", "stamp", "baked", "bake_identity")


def ssh_timeout_for(instance_type: str) -> int:
    """How long the step waits for the master's sshd: longer for metal instances."""
    return boot_wait_s(instance_type)


class SetupError(RuntimeError):
    """The setup step failed; the message says where, with the remote output."""


def _tail(text: str) -> str:
    lines = (text or "").rstrip().splitlines()
    return "\n".join(lines[-OUTPUT_TAIL_LINES:])


def _ssh_connections():
    """node_setup.ssh.connections and keys (host-key pinning), imported only when setup really runs."""
    try:
        from node_setup.ssh import connections, keys
    except ImportError as exc:
        raise SetupError(f"setup step: node_setup.ssh is not importable ({exc}); install the project into "
                         "the Python that runs pulumi (`.venv/bin/pip install -e '.[controller]'`)") from None
    return connections, keys


def _boot_wait(props: dict[str, Any]) -> float:
    """How long the master's type may take to boot (cluster/stack/catalog.py's boot_wait_s, via ssh_timeout_for)."""
    return float(props.get("ssh_timeout_seconds") or SSH_TIMEOUT_SECONDS)


def master_console(props: dict[str, Any]):
    """The master's EC2 console output as the source of its host key (node_setup/aws/console.py): its instance
    at the step's address, read with the caller's credentials in the stack's region, until it lists the
    fingerprints for as long as the master's type may take to boot."""
    from cluster.inventory import Inventory, Node
    from cluster.stack.tags import ROLE_MASTER

    try:
        from node_setup.aws.console import AwsConsole
    except ImportError as exc:
        raise SetupError(f"setup step: node_setup.aws is not importable ({exc}); install the project into the Python "
                         "that runs pulumi (`.venv/bin/pip install -e '.[controller]'`)") from None
    master = Node("node0", props["host"], props["host"], 0, role=ROLE_MASTER, instance_id=props["instance_id"])
    inventory = Inventory(name=props["cluster"], kind="aws", user=props["user"], nodes=(master,),
                          region=props.get("region") or None)
    return AwsConsole(inventory, wait_s=_boot_wait(props))


def master_host_keys(props: dict[str, Any], console=None):
    """The cluster's known_hosts, a never-seen master verified from its console (`console`, by default
    master_console's), after the master's console listed its fingerprints: SetupError with one line naming
    the instance and what to check when it lists none in time or cannot be read. A record of another
    instance at the master's address (a lost master's) is dropped first."""
    connections, keys = _ssh_connections()
    try:
        known_hosts = keys.known_hosts_path(props["cluster"])
    except keys.KeyStoreError as exc:
        raise SetupError(f"setup step: {exc}") from None
    store = connections.PinnedHostKeys(known_hosts, props["cluster"], console or master_console(props))
    store.forget_replaced()
    try:
        store.prepare(connections.host_key_name(props["host"], int(props.get("port") or 22)))
    except connections.HostKeyUnverified as exc:
        raise SetupError(f"setup step: {exc}") from None
    return store


def open_connection(props: dict[str, Any], key_path: str, host_keys):
    """A Fabric connection to the master that uses only the given key, no ssh_config, and the
    cluster's pinned host keys (`host_keys`: master_host_keys's), configured as `fab`'s."""
    from fabric import Connection

    connections, _ = _ssh_connections()
    conn = Connection(
        props["host"], user=props["user"], port=int(props.get("port") or 22),
        config=connections.fabric_config(load_ssh_configs=False, cluster=props["cluster"]),
        connect_timeout=CONNECT_TIMEOUT_SECONDS,
        connect_kwargs={"key_filename": key_path, "look_for_keys": False, "allow_agent": False})
    host_keys.attach(conn.client)
    return conn


def _host_key_refused(exc: BaseException, conn) -> str | None:
    """`fab`'s message when `exc` is a refused host key (never retried), else None."""
    import paramiko

    if not isinstance(exc, paramiko.SSHException):
        return None
    connections, _ = _ssh_connections()
    if isinstance(exc, (paramiko.BadHostKeyException, connections.HostKeyMismatch)):
        return f"setup step: {connections.explain(exc, conn)}"
    return None


def wait_for_ssh(connect: Callable[[], Any], timeout: float, retry_every: float = SSH_RETRY_SECONDS):
    """An open connection, retrying while the instance boots; SetupError after `timeout` seconds.

    There is no waiter for "sshd answers", so this is a bounded retry: each attempt gets a fresh
    connection (a half-failed paramiko client cannot be reused). A host key that differs from
    the pinned one is refused at once.
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
            refused = _host_key_refused(exc, conn)
            if refused:
                conn.close()
                raise SetupError(refused) from None
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
    """node_setup.ssh.install's check_node (what `fab check` runs) and install_profile (what `fab setup` runs),
    imported only when setup really runs."""
    try:
        from node_setup.ssh.install import check_node, install_profile
    except ImportError as exc:
        raise SetupError(f"setup step: node_setup.ssh.install is not importable ({exc}); install the project "
                         "into the Python that runs pulumi (`.venv/bin/pip install -e '.[controller]'`)") from None
    return check_node, install_profile


def _project_version() -> str | None:
    """The version of this project the install puts on the node (the controller's checkout's, as its wheel's)."""
    try:
        from node_setup.controller import PROJECT_ROOT, project_version
    except ImportError:
        return None
    return project_version() if (PROJECT_ROOT / "pyproject.toml").exists() else None


def _controller_error_types() -> tuple[type[Exception], ...]:
    """node_setup.ssh.wheels's InstallError (raised on this machine, e.g. building the project wheel)."""
    try:
        from node_setup.ssh.wheels import InstallError
    except ImportError:  # tests that pass install doubles may run without node_setup.ssh.install
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


def arm_new_master(conn, props: dict[str, Any]) -> str:
    """Arm the idle auto-stop of a master that replaced a lost or auto-stopped one, with the stack's idle time
    (`auto_stop_idle_s`; None: autoStopIdle is off), as `fab setup` arms it: a `pulumi up` that no `fab`
    follows brings the cluster back, and nothing else would stop it. Its node list is the master alone (with
    the host key the step verified): the workers are the group's, which the power-off sets to 0 first, so
    nothing is armed without the group (found by its tags; it exists once an image was made). What was done,
    in one line (the step's `auto_stop` output); it never fails the step."""
    idle = props.get("auto_stop_idle_s")
    if not idle:
        return "not armed: autoStopIdle is off"
    try:
        from cluster.inventory import Inventory, Node
        from cluster.node import autostop
        from cluster.stack.tags import ROLE_MASTER
        from node_setup.aws.worker_group import group_file
        from node_setup.ssh import autostop as remote

        if not group_file(props["cluster"], props.get("region")):
            return "not armed: the workers' group was not found (`fab up` or `fab setup` arms it)"
        key = conn.client.get_transport().get_remote_server_key()
        master = Node("node0", props["host"], props["host"], 0, role=ROLE_MASTER)
        inventory = Inventory(name=props["cluster"], kind="aws", user=props["user"], nodes=(master,),
                              region=props.get("region"))
        remote.record_nodes(conn, inventory, {master.name: f"{key.get_name()} {key.get_base64()}"})
        return autostop.status_line(remote.arm(conn, int(idle), autostop.poll_for(int(idle))))
    except Exception as exc:  # noqa: BLE001 - the master is set up; say why nothing was armed
        return f"not armed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"


def install_what_differs(conn, profile: Profile, version: str | None, check: Callable, install: Callable) -> str:
    """On a master booted from the image: check it as `fab check` does (the machine's own items, free disk and
    bf16, left out: an install changes neither) and install only when something differs; what was done, in one
    line."""
    found: list = []
    _remote("checking the node", conn.host,
            lambda: found.append(check(conn, profile, project_version=version, min_free_gib=0)))
    differs = found[0].failures()
    if not differs:
        return f"nothing to install: the node holds profile {profile.name}" + (
            f" and xeon-cluster {version}" if version else "")
    _remote(f"installing profile {profile.name!r}", conn.host, lambda: install(conn, profile))
    return (f"installed what differed ({', '.join(item.name for item in differs)}): the node holds profile "
            f"{profile.name}" + (f" and xeon-cluster {version}" if version else ""))


def run_profile_setup(props: dict[str, Any], *, connect=open_connection, install: Callable | None = None,
                      check: Callable | None = None, arm: Callable[[Any, dict[str, Any]], str] | None = None,
                      console=None) -> dict[str, Any]:
    """What `create()` does (and `update()` for a new master, with `arm`: arm_new_master); returns the
    outputs. `connect`/`install`/`check`/`arm`/`console` (the master's console: master_console's) are seams for
    tests."""
    key_path = os.path.expanduser(str(props["private_key_path"]))
    if not os.path.isfile(key_path):
        raise SetupError(f"privateKeyPath: {props['private_key_path']!r} is not a file on this machine; allowed: "
                         "the path of the private key whose public half is publicKey")
    profile: Profile = get_profile(props["profile"])
    if profile.fingerprint() != props["fingerprint"]:
        raise SetupError(f"softwareProfile: {profile.name!r} changed between preview and update "
                         "(cluster/node/profiles.py was edited); run `pulumi up` again")
    if not (check and install):
        check, install = _node_setup_install()
    version = _project_version()

    host_keys = master_host_keys(props, console)  # its console read before the first SSH command
    conn = wait_for_ssh(lambda: connect(props, key_path, host_keys), _boot_wait(props), retry_every=SSH_RETRY_SECONDS)
    try:
        wait_for_cloud_init(conn, float(props.get("cloud_init_timeout_seconds") or CLOUD_INIT_TIMEOUT_SECONDS))
        image = props["kept_image"]
        installed = f"from kept image {image}: " + install_what_differs(conn, profile, version, check, install)
        armed = arm(conn, props) if arm else None
    finally:
        conn.close()
    outs = {k: v for k, v in props.items() if not k.startswith("__")}
    outs["installed"] = installed
    if armed is not None:
        outs["auto_stop"] = armed
    return outs


class ProfileSetupProvider(ResourceProvider):
    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(f"setup-{props['instance_id']}-{props['kept_image']}", run_profile_setup(props))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        keys = {k for k in set(olds) | set(news) if not k.startswith("__") and k not in OUTPUT_ONLY + RETIRED}
        changed = sorted(k for k in keys if olds.get(k) != news.get(k))
        # A replaced step is made before the old record goes (it is only a record).
        return DiffResult(changes=bool(changed), replaces=[k for k in changed if k in REPLACE_ON],
                          delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        """A new master from the same image: check it (install what differs) and arm its idle auto-stop."""
        outs = run_profile_setup(news, arm=arm_new_master) if olds.get("instance_id") != news.get("instance_id") \
            else {k: v for k, v in news.items() if not k.startswith("__")}
        outs["installed"] = outs.get("installed") or olds.get("installed")
        return UpdateResult(outs)


class ProfileSetup(pulumi.dynamic.Resource, module="xeon-cluster", name="ProfileSetup"):
    """The record that the master, booted from the image, was checked against one profile."""

    instance_id: pulumi.Output[str]
    installed: pulumi.Output[str]  # what its last run did, in one line

    def __init__(self, name: str, *, host: pulumi.Input[str], user: str, private_key_path: str,
                 instance_id: pulumi.Input[str], profile: Profile, cluster: str, kept_image: pulumi.Input[str],
                 port: int = 22, region: str = "", auto_stop_idle_s: int | None = None,
                 ssh_timeout_seconds: int = SSH_TIMEOUT_SECONDS,
                 cloud_init_timeout_seconds: int = CLOUD_INIT_TIMEOUT_SECONDS,
                 opts: pulumi.ResourceOptions | None = None):
        props = {
            "host": host,
            "port": port,
            "user": user,
            "private_key_path": private_key_path,
            "cluster": cluster,  # names the known_hosts the master's host key is pinned in
            "instance_id": instance_id,
            "profile": profile.name,
            "pip_pins": list(profile.pip_pins),
            "fingerprint": profile.fingerprint(),
            "installed": None,  # set by every run
            "kept_image": kept_image,  # the image the master booted: built apart (infra/image.py) or kept
            # A new master's idle auto-stop (arm_new_master): the stack's autoStopIdle, and where its group is.
            "region": region,
            "auto_stop_idle_s": auto_stop_idle_s,
            "ssh_timeout_seconds": ssh_timeout_seconds,
            "cloud_init_timeout_seconds": cloud_init_timeout_seconds,
        }
        super().__init__(ProfileSetupProvider(), name, props, opts)
