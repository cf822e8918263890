"""The local cluster, up and down: N "nodes" on one Linux machine, each a network namespace with its own sshd.

What one node is (docs/design.md, "The local cluster")::

    ip netns add xc-<name>-n<i>                      # own network stack
    veth xcv-<tag>-<i> (host, on bridge xcb-<tag>) <-> eth0 (node), 10.x.y.(i+2)/24
    ip netns exec NS unshare --uts --mount --propagation private --pid --fork --mount-proc --kill-child sh -c '
        hostname node<i>; mount --bind <node dir>/root /root; mount --bind <node dir>/etc/hosts /etc/hosts
        mount -t tmpfs xc-hidden <config dir>/keys; ...<config dir>/local  # the controller's secrets: empty on the node
        sshd -D -f <node dir>/etc/sshd_config &     # the init (PID 1 of the node) reaps what is left to it

The bridge holds 10.x.y.1, so the controller on the host reaches every node directly. Nodes share
the host's filesystem except /root, /etc/hosts and the folders of the controller's secrets (its key
store and the local clusters' folders: node_setup/controller.py's SECRET_DIRS); each has its own
PID namespace, so a node's processes see only the node's own (never the controller's /proc).
Every name, address, PID and directory made is recorded in a state file, and `destroy` removes
exactly those (by recorded PID and name), so it is safe to run twice and never touches anything it did not make.
Where its files live: node_setup/local/state.py.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import signal
import time
from functools import partial
from pathlib import Path
from typing import Callable, Collection

import yaml

from node_setup.controller import config_root, secret_folders
from node_setup.local import system
from node_setup.local.imds_server import INSTANCE_ACTION_FILE, REBALANCE_FILE
from node_setup.local.runs import ensure_run_folder
from node_setup.local.state import (
    DEFAULT_NAME,
    DEFAULT_NOTICE_SECONDS,
    DEFAULT_WHEELHOUSE,
    GROUP_FILE,
    KEEPER_LOCK_FILE,
    KEEPER_LOG_FILE,
    KEEPER_PID_FILE,
    LOCAL_INSTANCE_TYPE,
    LOCAL_ZONE,
    ClusterPaths,
    ClusterState,
    LocalClusterError,
    NodeState,
    Progress,
    bridge_name,
    build_inventory,
    describe_link,
    find_node,
    hosts_text,
    instance_action_text,
    inventory_mapping,
    is_ours,
    link_shaping_commands,
    link_unshaping_command,
    load_state,
    namespace_name,
    node_name,
    owner_text,
    paths_for,
    pick_subnet,
    quiet,
    rebalance_text,
    save_state,
    sshd_config_text,
    stamp_owner,
    validate_link,
    validate_name,
    validate_node_count,
    validate_notice,
    veth_name,
)
from training.imds import METADATA_ADDRESS


def is_running(state: ClusterState) -> bool:
    """Every recorded node's namespace exists and its sshd runs."""
    names = system.namespaces()
    return bool(state.nodes) and all(
        n.namespace in names and n.sshd_pid is not None and system.process_alive(n.sshd_pid)
        and system.is_our_sshd(n.sshd_pid, n)
        for n in state.nodes)


def create(nodes: int, name: str = DEFAULT_NAME, *, paths: ClusterPaths | None = None, replace: bool = False,
           wheelhouse: str | None = DEFAULT_WHEELHOUSE, progress: Progress = quiet,
           timeout: float = system.SSHD_START_TIMEOUT, link_mbit: float = 0, link_delay_ms: float = 0,
           moved: Collection[str] = ()) -> ClusterState:
    """Start a local cluster of `nodes` nodes; returns its state (also saved, with the inventory).

    On a cluster with nodes down, brings them back (`_bring_back`); those named in `moved` at a new
    address, not their slot's (the group keeper's lost master, as a new EC2 instance gets its own).

    `link_mbit` (with `link_delay_ms`) limits what every node sends with tc inside its namespace
    (0: not limited); the limit is recorded in the state file and removed by `destroy`.

    An existing cluster of that name is an error unless `replace` (then it is torn down first);
    leftovers of one that is no longer running are cleaned up. If anything fails, what was made
    so far is removed again before the error is raised.
    """
    validate_node_count(nodes)
    mbit, delay_ms = validate_link(link_mbit, link_delay_ms)
    paths = paths or paths_for(name)
    validate_name(paths.name)
    system.check_host()
    if mbit:
        system.check_tc()
    ensure_run_folder(paths.name)  # where its jobs write: root's own, or a refusal before anything is made
    existing = load_state(paths)
    if existing is not None and not is_ours(existing):
        raise LocalClusterError(_not_ours(existing, nodes))
    if existing is not None and not replace and _bridge_up(existing) and not _all_up(existing, nodes):
        return _bring_back(existing, nodes, paths, wheelhouse, progress, timeout, moved)
    if existing is not None:
        if is_running(existing) and not replace:
            flag = "" if paths.name == DEFAULT_NAME else f" --name {paths.name}"
            raise LocalClusterError(
                f"local cluster {paths.name!r} is already up with {len(existing.nodes)} nodes "
                f"(inventory {paths.inventory_path}); run `fab local-down{flag}` first, "
                f"or `fab local-up --replace --nodes {nodes}{flag}` to replace it")
        progress(f"removing the previous local cluster {paths.name!r}")
        destroy(paths, progress=progress)

    state = ClusterState(name=paths.name, bridge=bridge_name(paths.name), subnet="", bridge_address="",
                         data_dir=str(paths.data_dir), cluster_dir=str(paths.cluster_dir),
                         key_path=str(paths.key_path), inventory_path=str(paths.inventory_path),
                         created_at=time.time(), link_mbit=mbit, link_delay_ms=delay_ms)
    stamp_owner(state)
    try:
        _make(state, nodes, paths, progress, timeout)
        sockets, cores = system.machine_topology()
        inventory = build_inventory(state, sockets=sockets, physical_cores=cores, wheelhouse=wheelhouse)
        paths.inventory_path.write_text(yaml.safe_dump(inventory_mapping(inventory), sort_keys=False))
        save_state(paths, state)
    except BaseException:
        progress(f"local-up failed; removing what was made for {paths.name!r}")
        try:
            destroy(paths, progress=progress)
        except LocalClusterError as cleanup_error:  # pragma: no cover - reported with the original error
            progress(f"cleanup incomplete: {cleanup_error}")
        raise
    progress(f"local cluster {paths.name!r}: {nodes} node(s) on {state.subnet}; inventory {paths.inventory_path}")
    return state


def _not_ours(state: ClusterState, nodes: int) -> str:
    """Why local-up leaves another checkout's cluster of that name alone, and what to run instead."""
    up = any(node_up(n) for n in state.nodes)
    line = (f"local cluster {state.name!r} {'is up' if up else 'exists'} and is not this checkout's: "
            f"{owner_text(state)} made it; left alone. Start one of your own under another name: "
            f"`fab local-up --nodes {nodes} --name NAME`, then --cluster local:NAME")
    if not up:  # nothing of it runs: no run to lose
        flag = "" if state.name == DEFAULT_NAME else f" --name {state.name}"
        line += f"; or, if nobody uses it, remove it: `fab local-down --force{flag}`"
    return line


def _make(state: ClusterState, count: int, paths: ClusterPaths, progress: Progress, timeout: float) -> None:
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory (shared, kept)
    paths.data_dir.mkdir(parents=True, exist_ok=True)
    paths.data_dir.chmod(0o700)
    controller_key = system.keygen(paths.key_path, f"xeon-cluster local {paths.name}")
    save_state(paths, state)  # from here on every step is recorded before the next one

    with system.host_lock():
        if system.link_exists(state.bridge):
            raise LocalClusterError(f"bridge {state.bridge} already exists but is not recorded for {paths.name!r}; "
                                    f"another local cluster uses it: choose another --name")
        subnet = pick_subnet(paths.name, system.taken_networks())
        hosts = list(subnet.hosts())
        state.subnet, state.bridge_address = str(subnet), str(hosts[0])
        save_state(paths, state)
        system.run(["ip", "link", "add", state.bridge, "type", "bridge"])
        system.run(["ip", "addr", "add", f"{state.bridge_address}/{subnet.prefixlen}", "dev", state.bridge])
        system.run(["ip", "link", "set", state.bridge, "up"])
    progress(f"bridge {state.bridge} {state.bridge_address}/{subnet.prefixlen}")

    taken_namespaces = system.namespaces()
    for i in range(count):
        node = _new_node(paths, i, hosts)
        if node.namespace in taken_namespaces:
            raise LocalClusterError(f"network namespace {node.namespace} already exists and is not recorded for "
                                    f"{paths.name!r}; choose another --name or remove it (`ip netns del "
                                    f"{node.namespace}`)")
        state.nodes.append(node)
        _start_node(state, node, subnet.prefixlen, controller_key, paths, progress)
    system.wait_for_sshd(state.nodes, timeout, progress)
    system.wait_for_imds(state.nodes)


def _new_node(paths: ClusterPaths, i: int, hosts: list, address: str | None = None) -> NodeState:
    """Slot `i`'s machine, at the slot's address (the subnet's (i+2)th) unless given another."""
    return NodeState(name=node_name(i), namespace=namespace_name(paths.name, i), veth=veth_name(paths.name, i),
                     address=address or str(hosts[i + 1]), dir=str(paths.data_dir / node_name(i)),
                     sshd_config=str(paths.data_dir / node_name(i) / "etc" / "sshd_config"))


def _start_node(state: ClusterState, node: NodeState, prefixlen: int, controller_key: str, paths: ClusterPaths,
                progress: Progress) -> None:
    """One new machine: fresh home and host key, namespace and veth, link limit, sshd, metadata service.
    Every step is recorded in the state file before the next one."""
    _prepare_node_dir(node, controller_key)
    node.instance_id = f"i-{secrets.token_hex(8)}"
    node.reclaimed_at = None
    save_state(paths, state)
    system.run(["ip", "netns", "add", node.namespace])
    system.run(["ip", "link", "add", node.veth, "type", "veth", "peer", "name", "eth0", "netns", node.namespace])
    system.run(["ip", "link", "set", node.veth, "master", state.bridge, "up"])
    system.run(["ip", "-n", node.namespace, "addr", "add", f"{node.address}/{prefixlen}", "dev", "eth0"])
    system.run(["ip", "-n", node.namespace, "link", "set", "lo", "up"])
    system.run(["ip", "-n", node.namespace, "link", "set", "eth0", "up"])
    if state.link_mbit:
        for argv in link_shaping_commands(node.namespace, state.link_mbit, state.link_delay_ms):
            result = system.run(argv, check=False)
            if result.returncode != 0 and "netem" in argv and "unknown" in result.stderr:
                raise LocalClusterError(f"--link-delay-ms: {state.link_delay_ms:g} needs the kernel's netem "
                                        "queueing discipline (sch_netem), which this kernel does not have; "
                                        "leave out --link-delay-ms (--link-mbit alone works)")
            if result.returncode != 0:
                raise LocalClusterError(f"`{' '.join(argv)}` failed (exit {result.returncode}): "
                                        f"{(result.stderr or result.stdout).strip()}")
    # the secrets of this cluster's config directory and of this controller's (where they differ)
    hide = [*secret_folders(paths.cluster_dir.parent.parent), *secret_folders(config_root())]
    node.sshd_pid = system.start_sshd(node, hide)
    save_state(paths, state)
    node.imds_pid = system.start_imds(node, METADATA_ADDRESS, LOCAL_INSTANCE_TYPE, LOCAL_ZONE)
    save_state(paths, state)
    progress(f"  {node.name}: namespace {node.namespace}, {node.address}, hostname {node.name}, "
             f"metadata service {METADATA_ADDRESS} ({node.instance_id})"
             + (f", link {describe_link(state.link_mbit, state.link_delay_ms)}" if state.link_mbit else ""))


def node_up(node: NodeState, names: set[str] | None = None) -> bool:
    """The node's namespace exists and its sshd runs (a reclaimed node is down)."""
    names = system.namespaces() if names is None else names
    return (node.reclaimed_at is None and node.namespace in names and node.sshd_pid is not None
            and system.process_alive(node.sshd_pid) and system.is_our_sshd(node.sshd_pid, node))


def _bridge_up(state: ClusterState) -> bool:
    return bool(state.bridge and state.subnet and state.nodes) and system.link_exists(state.bridge)


def _all_up(state: ClusterState, count: int) -> bool:
    names = system.namespaces()
    return len(state.nodes) >= count and all(node_up(n, names) for n in state.nodes)


def _free_address(state: ClusterState, hosts: list) -> str:
    """The highest address of the subnet that neither the bridge nor a recorded node holds (the one being
    replaced included): slots take theirs from the bottom, so no node added later lands on it."""
    taken = {state.bridge_address, *(n.address for n in state.nodes)}
    return next(str(h) for h in reversed(hosts) if str(h) not in taken)


def _bring_back(state: ClusterState, count: int, paths: ClusterPaths, wheelhouse: str | None, progress: Progress,
                timeout: float, moved: Collection[str] = ()) -> ClusterState:
    """`fab local-up` on a cluster with nodes down or missing: each comes back as a new machine (new
    host key, instance id and empty home; the same software through the shared venv), at its old
    name and address (those in `moved`: at a free address of the subnet); the nodes that are up are
    left alone."""
    import ipaddress

    subnet = ipaddress.ip_network(state.subnet)
    hosts = list(subnet.hosts())
    controller_key = system.keygen(paths.key_path, f"xeon-cluster local {paths.name}")
    names = system.namespaces()
    back: list[NodeState] = []
    for i in range(max(count, len(state.nodes))):
        if i < len(state.nodes) and node_up(state.nodes[i], names):
            continue
        if i < len(state.nodes):
            old = state.nodes[i]
            _clear_node(old, names)
            node = _new_node(paths, i, hosts, _free_address(state, hosts) if old.name in moved else None)
            state.nodes[i] = node
            progress(f"  {old.name}: was down; bringing it back as a new machine"
                     + (f" at a new address, {node.address} (was {old.address})" if node.address != old.address
                        else ""))
        else:
            node = _new_node(paths, i, hosts)
            if node.namespace in names:
                raise LocalClusterError(f"network namespace {node.namespace} already exists and is not recorded for "
                                        f"{paths.name!r}; remove it (`ip netns del {node.namespace}`)")
            state.nodes.append(node)
        # the host and the nodes still up may map the address to the old machine's MAC: forget it there
        system.run(["ip", "neigh", "flush", "to", node.address, "dev", state.bridge], check=False)
        for other in state.nodes:
            if other is not node and other.namespace in names and node_up(other, names):
                system.run(["ip", "-n", other.namespace, "neigh", "flush", "to", node.address], check=False)
        _start_node(state, node, subnet.prefixlen, controller_key, paths, progress)
        back.append(node)
    system.wait_for_sshd(back, timeout, progress)
    system.wait_for_imds(back)
    sockets, cores = system.machine_topology()
    inventory = build_inventory(state, sockets=sockets, physical_cores=cores, wheelhouse=wheelhouse)
    paths.inventory_path.write_text(yaml.safe_dump(inventory_mapping(inventory), sort_keys=False))
    save_state(paths, state)
    progress(f"local cluster {paths.name!r}: {', '.join(n.name for n in back)} back; "
             f"{len(state.nodes)} node(s) on {state.subnet}; inventory {paths.inventory_path}")
    return state


def _clear_node(node: NodeState, names: set[str]) -> None:
    """What is left of a down node (processes, namespace, veth), by its recorded names."""
    if node.namespace in names:
        system.kill_namespace(node.namespace)
        system.run(["ip", "netns", "del", node.namespace])
    if system.link_exists(node.veth):
        system.run(["ip", "link", "del", node.veth], check=False)


def reclaim(paths: ClusterPaths, name: str, *, notice_seconds: float = DEFAULT_NOTICE_SECONDS,
            rebalance: bool = False, silent: bool = False, progress: Progress = quiet,
            sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.time) -> NodeState:
    """What EC2 does to a spot instance it takes back, on local node `name`.

    `rebalance`: only a rebalance recommendation appears on the node's metadata service. `silent`: no
    notice at all, the node goes down at once (a machine that fails). Otherwise
    the interruption notice appears (and stays); after `notice_seconds` every process in the
    node's namespace is killed and its link goes down, so its address stops answering.
    """
    notice_seconds = validate_notice(notice_seconds)
    state = load_state(paths)
    if state is None:
        raise LocalClusterError(f"no local cluster {paths.name!r} (no state at {paths.state_path}); "
                                "start one with `fab local-up`")
    node = find_node(state, name)
    system.check_host()
    if not node_up(node) or node.imds_pid is None or not system.is_our_imds(node.imds_pid, node):
        raise LocalClusterError(f"{name} of local cluster {paths.name!r} is down or has no metadata service; "
                                f"`fab local-up --nodes {len(state.nodes)}"
                                + ("" if paths.name == DEFAULT_NAME else f" --name {paths.name}")
                                + "` brings it back")
    control = Path(node.imds_dir)
    now = clock()
    if rebalance:
        system.write_atomically(control / REBALANCE_FILE, rebalance_text(now))
        progress(f"  {name}: rebalance recommendation posted on its metadata service ({rebalance_text(now)})")
        return node
    if silent:  # a machine that fails: no notice, down at once
        notice_seconds = 0
        progress(f"  {name}: lost without a notice")
    else:
        body = instance_action_text(now + notice_seconds)
        system.write_atomically(control / INSTANCE_ACTION_FILE, body)
        progress(f"  {name}: spot interruption notice posted on its metadata service: {body}")
    if notice_seconds:
        progress(f"  {name}: taking it down in {notice_seconds:g} s")
        sleep(notice_seconds)
    killed = system.kill_namespace(node.namespace)
    system.run(["ip", "-n", node.namespace, "link", "set", "eth0", "down"], check=False)
    system.run(["ip", "link", "set", node.veth, "down"], check=False)
    node.reclaimed_at, node.sshd_pid, node.imds_pid = clock(), None, None
    save_state(paths, state)
    progress(f"  {name}: reclaimed: {len(killed)} process(es) killed, {node.address} unreachable (link down)")
    return node


def _prepare_node_dir(node: NodeState, controller_key: str) -> None:
    node_dir = Path(node.dir)
    if node_dir.exists():
        shutil.rmtree(node_dir)
    home, etc = node_dir / "root", node_dir / "etc"
    etc.mkdir(parents=True)
    # a fresh machine's root home: the skeleton dotfiles and the controller's key
    if Path("/etc/skel").is_dir():
        shutil.copytree("/etc/skel", home)
    else:
        home.mkdir()
    home.chmod(0o700)
    (home / ".ssh").mkdir(mode=0o700)
    (home / ".ssh" / "authorized_keys").write_text(controller_key + "\n")
    (home / ".ssh" / "authorized_keys").chmod(0o600)
    node.host_key = " ".join(system.keygen(etc / "ssh_host_ed25519_key", f"root@{node.name}").split()[:2])
    Path(node.sshd_config).write_text(sshd_config_text(node_dir))
    (etc / "hosts").write_text(hosts_text(node.name, node.address))


def destroy(paths: ClusterPaths, progress: Progress = quiet, *, force: bool = False) -> bool:
    """Remove exactly what the state file lists; False if there was no such cluster (safe twice).

    Another checkout's cluster is left alone (LocalClusterError) unless `force`.
    Every step checks first and goes on after a failure; if anything is left, the state file is
    kept (a rerun finishes the job) and the error lists what could not be removed.
    """
    state = load_state(paths)
    if state is None:
        progress(f"no local cluster {paths.name!r} (no state at {paths.state_path}); nothing to remove")
        return False
    if not force and not is_ours(state):
        flag = "" if paths.name == DEFAULT_NAME else f" --name {paths.name}"
        raise LocalClusterError(f"local cluster {paths.name!r} is not this checkout's: {owner_text(state)} made it; "
                                f"left alone (a run on it would be lost). `fab local-down --force{flag}` removes "
                                "it anyway")
    system.check_host()
    if stop_keeper(paths):
        progress("  stopped the group keeper")
    problems: list[str] = []
    namespaces = system.namespaces()
    node_pids: dict[str, list[int]] = {}
    for node in state.nodes:
        pids = node_pids[node.name] = []
        if node.sshd_pid is not None and system.is_our_sshd(node.sshd_pid, node):
            pids.append(node.sshd_pid)
        if node.namespace in namespaces:
            # whatever still runs inside the node (ssh sessions, training ranks) goes with it
            pids += [p for p in system.namespace_pids(node.namespace) if p not in pids and p != os.getpid()]
    stopped = set(system.stop_pids([pid for pids in node_pids.values() for pid in pids]))  # all nodes at once
    for node in state.nodes:
        if state.link_mbit and node.namespace in namespaces:
            unshaped = system.run(link_unshaping_command(node.namespace), check=False)
            if unshaped.returncode == 0:
                progress(f"  {node.name}: removed the link limit "
                         f"({describe_link(state.link_mbit, state.link_delay_ms)})")
        if node.namespace in namespaces:
            _remove(["ip", "netns", "del", node.namespace], partial(system.namespace_exists, node.namespace),
                    problems)
        # deleting the namespace takes its veth pair along, asynchronously: delete only what is still there
        if system.link_exists(node.veth):
            _remove(["ip", "link", "del", node.veth], partial(system.link_exists, node.veth), problems)
        progress(f"  {node.name}: stopped {len(stopped.intersection(node_pids[node.name]))} process(es), "
                 f"removed namespace {node.namespace}")
    if state.bridge and state.subnet and system.link_exists(state.bridge):
        _remove(["ip", "link", "del", state.bridge], lambda: system.link_exists(state.bridge), problems)
        progress(f"  removed bridge {state.bridge} ({state.subnet})")
    if problems:
        raise LocalClusterError(f"local-down {paths.name!r} left: {'; '.join(problems)}; "
                                f"fix that and rerun `fab local-down --name {paths.name}` (state kept in "
                                f"{paths.state_path})")
    for node in state.nodes:
        shutil.rmtree(node.dir, ignore_errors=True)
    for name in (GROUP_FILE, KEEPER_LOCK_FILE):
        (Path(state.data_dir) / name).unlink(missing_ok=True)
    _remove_empty_dir(Path(state.data_dir))
    for path in (Path(state.inventory_path), Path(state.key_path), Path(f"{state.key_path}.pub"), paths.state_path,
                 paths.cluster_dir / KEEPER_LOG_FILE):
        try:
            path.unlink()
        except FileNotFoundError:
            pass
    _remove_empty_dir(Path(state.cluster_dir))
    progress(f"local cluster {paths.name!r} removed")
    return True


def _remove(argv: list[str], still_there: Callable[[], bool], problems: list[str]) -> None:
    """Run a delete command; a failure counts only if the thing is still there afterwards."""
    result = system.run(argv, check=False)
    if result.returncode != 0 and still_there():
        problems.append(f"`{' '.join(argv)}`: {result.stderr.strip()}")


def _remove_empty_dir(path: Path) -> None:
    try:
        path.rmdir()
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTEMPTY):
            raise


def keeper_pid(paths: ClusterPaths) -> int | None:
    """The pid of the cluster's running group keeper (node_setup/local/keeper.py), or None when none runs."""
    try:
        pid = int((paths.cluster_dir / KEEPER_PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if system.is_keeper(pid, paths.name) else None


def stop_keeper(paths: ClusterPaths) -> int | None:
    """End the cluster's group keeper (node_setup/local/keeper.py) by its recorded pid (only when that
    process is this cluster's keeper)."""
    pid_file = paths.cluster_dir / KEEPER_PID_FILE
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        pid_file.unlink(missing_ok=True)
        return None
    pid_file.unlink(missing_ok=True)
    if system.is_keeper(pid, paths.name):
        os.kill(pid, signal.SIGTERM)
        return pid
    return None
