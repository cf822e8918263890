"""The setup step: check the master from within `pulumi up`, and install only what differs.

The program (infra/program.py) always gives it the image the master booted (`kept_image`: the one EC2 Image
Builder built apart, infra/image.py, or a kept one), so it runs the check path described at the end of this
docstring and images nothing. The install-and-bake path (no `kept_image`: install, pre-bake, sync) is the
step's earlier use, which no program run reaches now (a step recorded by it is replaced at the stack's next
`pulumi up`: its `kept_image` changes); it and its tests are still here, to be removed with the pre-bake.

A `pulumi.dynamic` resource. Its inputs are the master's address and instance id, the SSH user,
the PATH of the private key (never its contents: state must not hold secrets), the cluster's name
and the profile's name, pins and fingerprint. A change of the profile or any pin (the software)
replaces it, which re-runs setup, re-bakes the image (its replacement trigger is the bake tag, a
hash of the profile's fingerprint) and so replaces the workers. A new master (a reclaim, a lost or
auto-stopped master) only updates it: the update sets the new master up again with the same
profile and pins, arms its idle auto-stop with the stack's autoStopIdle (`arm_new_master`), and keeps
`bake_source`, the instance the image was made from, so the image and the workers stay (a lost master
costs its setup, not a re-bake and a new cluster). Nothing ties the step's life to the master's
(no `deleted_with`): a Pulumi engine that replaces a resource whose `deletedWith` target is replaced
would make every replaced master a re-bake. A change of address, user, key path or cluster name only
records the new values. A replaced step is created before its old record is deleted (not delete-first):
the image it names and the workers' move to it come before the old image goes (infra/image.py).
Its `create()` connects with Fabric, waits (bounded) for SSH and for cloud-init, then runs the
same `node_setup.ssh.install` functions `fab setup` uses:
`install_profile(conn, profile)` and `prepare_for_bake(conn)`, and syncs the disk so the
no-reboot snapshot is consistent. Failures carry the remote command's exit code and output, or
the message of node_setup.ssh.wheels's InstallError for what fails on this machine (the wheel build).

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

From a kept image (`kept_image`, the image the stack reuses, cluster/stack/image_reuse.py) the master boots
with the profile already installed and there is no bake: `create()` (and `update()` for a new master) checks the
node against the profile and this project's version as `fab check` does (`check_node`, cluster/node/setup_script.py's
check) and installs only when something differs (the install script is idempotent: another project version
reinstalls the wheel alone), then neither cleans up for a bake nor syncs. Its `installed` output says which it
was. A change of `kept_image` (the kept image gone, or another one chosen) replaces the step like a software
change: from a bake the step bakes again on the master it has.

Under Pulumi mocks `create()` is never called; tests call `run_profile_setup` directly.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from typing import Any, Callable

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider, UpdateResult

from cluster.node.profiles import Profile, get_profile
from cluster.stack import image_reuse
from cluster.stack.catalog import BOOT_WAIT_S, METAL_BOOT_WAIT_S, boot_wait_s
from cluster.stack.node_replacement import bake_tag  # the image's identity (its name and replacement trigger)

# How long the step waits for the master's sshd: its type's boot (cluster/stack/catalog.py, longer for metal).
SSH_TIMEOUT_SECONDS = BOOT_WAIT_S
METAL_SSH_TIMEOUT_SECONDS = METAL_BOOT_WAIT_S
CLOUD_INIT_TIMEOUT_SECONDS = 1800
SSH_RETRY_SECONDS = 5.0
CONNECT_TIMEOUT_SECONDS = 10
OUTPUT_TAIL_LINES = 30

# Inputs whose change means "the image must be rebuilt" (or another kept image booted); the rest only update
# the record.
REPLACE_ON = ("profile", "fingerprint", "pip_pins", "bake_tag", "kept_image")
# Outputs the step sets itself (not inputs): never a difference. `baked`: the tags of what its create put into
# the image (the `bake_identity` input then, this project's version it installed, its stamp), kept by updates as
# the image is (cluster/stack/image_reuse.py); `installed`: what the step's last run did.
OUTPUT_ONLY = ("bake_source", "stamp", "auto_stop", "baked", "installed")
# `stamp`: the UTC time the step was created (its setup run), kept by updates; the image is named
# after it (infra/image.py), so an image made again (the step replaced) never has an old image's name.
STAMP_FORMAT = "%Y%m%dT%H%M%SZ"


def setup_stamp(now: dt.datetime | None = None) -> str:
    """The step's stamp for a create at `now` (UTC), e.g. "20260501T120000Z"."""
    return (now or dt.datetime.now(dt.timezone.utc)).strftime(STAMP_FORMAT)


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
    """node_setup.ssh.install's two functions, imported only when setup really runs."""
    try:
        from node_setup.ssh.install import install_profile, prepare_for_bake
    except ImportError as exc:
        raise SetupError(f"setup step: node_setup.ssh.install is not importable ({exc}); install the project "
                         "into the Python that runs pulumi (`.venv/bin/pip install -e '.[controller]'`) or set "
                         "bake: false and run `fab setup` later") from None
    return install_profile, prepare_for_bake


def _node_setup_check():
    """node_setup.ssh.install's check_node (what `fab check` runs), imported only when setup really runs."""
    try:
        from node_setup.ssh.install import check_node
    except ImportError as exc:
        raise SetupError(f"setup step: node_setup.ssh.install is not importable ({exc}); install the project "
                         "into the Python that runs pulumi (`.venv/bin/pip install -e '.[controller]'`)") from None
    return check_node


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
    """On a master booted from a kept image: check it as `fab check` does (the machine's own items, free disk and
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


def run_profile_setup(props: dict[str, Any], *, connect=open_connection,
                      install: tuple[Callable, Callable] | None = None, check: Callable | None = None,
                      arm: Callable[[Any, dict[str, Any]], str] | None = None, console=None) -> dict[str, Any]:
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
    install_profile, prepare_for_bake = install or _node_setup_install()
    kept = props.get("kept_image")
    check_node = (check or _node_setup_check()) if kept else None
    version = _project_version()

    host_keys = master_host_keys(props, console)  # its console read before the first SSH command
    conn = wait_for_ssh(lambda: connect(props, key_path, host_keys), _boot_wait(props), retry_every=SSH_RETRY_SECONDS)
    try:
        wait_for_cloud_init(conn, float(props.get("cloud_init_timeout_seconds") or CLOUD_INIT_TIMEOUT_SECONDS))
        if kept:
            installed = f"from kept image {kept}: " + install_what_differs(conn, profile, version, check_node,
                                                                            install_profile)
        else:
            _remote(f"installing profile {profile.name!r}", conn.host, lambda: install_profile(conn, profile))
            _remote("preparing the image", conn.host, lambda: prepare_for_bake(conn))
            _remote("flushing the disk", conn.host, lambda: conn.run("sync", hide=True))
            installed = f"installed profile {profile.name}" + (f" and xeon-cluster {version}" if version else "")
        armed = arm(conn, props) if arm else None
    finally:
        conn.close()
    outs = {k: v for k, v in props.items() if not k.startswith("__")}
    outs.update(installed=installed, project_version=version)  # create records the version in `baked`
    if armed is not None:
        outs["auto_stop"] = armed
    return outs


class ProfileSetupProvider(ResourceProvider):
    def create(self, props: dict[str, Any]) -> CreateResult:
        outs = run_profile_setup(props)
        version = outs.pop("project_version", None)
        outs["stamp"] = setup_stamp()  # names the image: new with every create of the step
        # The image is made from this master, and holds what this run installed (nothing from a kept image).
        baked = not props.get("kept_image")
        outs["bake_source"] = props["instance_id"] if baked else None
        outs["baked"] = image_reuse.baked_tags(props.get("bake_identity") or {}, project_version=version,
                                               created=outs["stamp"]) if baked else None
        return CreateResult(f"setup-{props['instance_id']}-{props['bake_tag']}", outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        keys = {k for k in set(olds) | set(news) if not k.startswith("__") and k not in OUTPUT_ONLY}
        changed = sorted(k for k in keys if olds.get(k) != news.get(k))
        replaces = [k for k in changed if k in REPLACE_ON]
        # A step recorded before steps had a stamp: an update gives it one (nothing is run again).
        unstamped = not olds.get("stamp")
        # A replaced step is made before the old record goes (it is only a record): the new image it names is
        # made, and the workers moved to it, before the old image is deleted (infra/image.py).
        return DiffResult(changes=bool(changed) or unstamped, replaces=replaces, delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        """A new master with the same software: set it up again (same profile and pins) and arm its idle
        auto-stop; the image stays."""
        outs = run_profile_setup(news, arm=arm_new_master) if olds.get("instance_id") != news.get("instance_id") \
            else {k: v for k, v in news.items() if not k.startswith("__")}
        outs["bake_source"] = None if news.get("kept_image") else (
            olds.get("bake_source") or olds.get("instance_id") or news["instance_id"])
        # The image stays, and so do its name's stamp (a step recorded before stamps gets one now) and what it
        # holds.
        outs["stamp"] = olds.get("stamp") or setup_stamp()
        outs.pop("project_version", None)
        outs["baked"] = None if news.get("kept_image") else olds.get("baked")
        outs["installed"] = outs.get("installed") or olds.get("installed")
        return UpdateResult(outs)


class ProfileSetup(pulumi.dynamic.Resource, module="xeon-cluster", name="ProfileSetup"):
    """The record that the master was set up with one profile; `bake_tag` names the image."""

    bake_tag: pulumi.Output[str]
    instance_id: pulumi.Output[str]
    bake_source: pulumi.Output[str]  # the master instance the image is made from
    stamp: pulumi.Output[str]  # when the step was created: the image's name ends with it
    baked: pulumi.Output[dict]  # the tags of what its create put into the image (image_reuse.baked_tags)
    installed: pulumi.Output[str]  # what its last run did, in one line

    def __init__(self, name: str, *, host: pulumi.Input[str], user: str, private_key_path: str,
                 instance_id: pulumi.Input[str], profile: Profile, cluster: str, port: int = 22,
                 region: str = "", auto_stop_idle_s: int | None = None, kept_image: str | None = None,
                 bake_identity: pulumi.Input[dict] | None = None,
                 ssh_timeout_seconds: int = SSH_TIMEOUT_SECONDS,
                 cloud_init_timeout_seconds: int = CLOUD_INIT_TIMEOUT_SECONDS,
                 opts: pulumi.ResourceOptions | None = None):
        fingerprint = profile.fingerprint()
        props = {
            "host": host,
            "port": port,
            "user": user,
            "private_key_path": private_key_path,
            "cluster": cluster,  # names the known_hosts the master's host key is pinned in
            "instance_id": instance_id,
            "profile": profile.name,
            "pip_pins": list(profile.pip_pins),
            "fingerprint": fingerprint,
            "bake_tag": bake_tag(fingerprint),
            "bake_source": None,  # set by create (this master) and kept by update (a new master)
            "stamp": None,  # set by create, kept by update
            "baked": None,  # set by create, kept by update
            "installed": None,  # set by every run
            "kept_image": kept_image,  # the kept image the master booted (no bake), or None
            # What a bake on this master puts in the image (image_reuse.bake_identity); its create records it.
            "bake_identity": bake_identity,
            # A new master's idle auto-stop (arm_new_master): the stack's autoStopIdle, and where its group is.
            "region": region,
            "auto_stop_idle_s": auto_stop_idle_s,
            "ssh_timeout_seconds": ssh_timeout_seconds,
            "cloud_init_timeout_seconds": cloud_init_timeout_seconds,
        }
        super().__init__(ProfileSetupProvider(), name, props, opts)
