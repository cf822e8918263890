"""What the local cluster does to this machine: network namespaces, links, and node processes.

Every command here acts on names and PIDs the caller recorded in the state file first
(node_setup/local/state.py); nothing is found by pattern. Linux and root only.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from node_setup.local.console import WRITE_CONSOLE, console_path
from node_setup.local.state import DATA_ROOT_ENV, LocalClusterError, NodeState, Progress

SSHD = "/usr/sbin/sshd"
# Held while a subnet is chosen and its bridge made, so concurrent local-ups pick different subnets.
LOCK_PATH = "/run/xeon-cluster-local.lock"
KEEPER_MODULE = "node_setup.local.keeper"  # how the group keeper is started: python -m KEEPER_MODULE NAME DELAY
SSHD_START_TIMEOUT = 30.0
STOP_TIMEOUT = 5.0


# ---------------------------------------------------------------- the machine


def check_host() -> None:
    """Linux, root and the tools local-up runs; a clear error otherwise."""
    if not sys.platform.startswith("linux"):
        raise LocalClusterError(f"the local cluster needs Linux network namespaces; this is {sys.platform}. "
                                "Use an AWS cluster (`pulumi up`) or an inventory file (--cluster path.yaml)")
    if os.geteuid() != 0:
        raise LocalClusterError("the local cluster creates network namespaces and needs root: "
                                "run `sudo fab local-up ...` (or as root)")
    missing = [tool for tool, package in (("ip", "iproute2"), ("unshare", "util-linux"),
                                          ("ssh-keygen", "openssh-client"), ("mount", "mount"))
               if not shutil.which(tool)]
    if missing:
        raise LocalClusterError(f"missing tools for the local cluster: {', '.join(missing)}; "
                                "install iproute2, util-linux and openssh-client")
    if not os.access(SSHD, os.X_OK):
        raise LocalClusterError(f"{SSHD} not found: install openssh-server (apt-get install openssh-server)")


def check_tc() -> None:
    """`tc` for --link-mbit; a clear error otherwise."""
    if not shutil.which("tc"):
        raise LocalClusterError("--link-mbit needs `tc`: install iproute2 (apt-get install iproute2)")


def machine_cpu() -> tuple[str, int]:
    """This machine's CPU model and physical cores as the bench program records a node's (training/hardware.py
    reads /proc/cpuinfo; a local node's is this machine's): what `fab plan --cluster local` plans for."""
    from training.hardware import cpu_model, physical_cores

    return cpu_model(), physical_cores()


def machine_topology() -> tuple[int, int]:
    """(sockets, physical cores in all sockets) of this machine, from sysfs."""
    cpus = Path("/sys/devices/system/cpu")
    cores: set[tuple[str, str]] = set()
    for topo in cpus.glob("cpu[0-9]*/topology"):
        try:
            cores.add(((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip()))
        except OSError:
            continue
    if not cores:
        return 1, os.cpu_count() or 1
    return len({pkg for pkg, _ in cores}), len(cores)


def run(argv: list[str], *, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, env=env)
    if check and result.returncode != 0:
        raise LocalClusterError(f"`{' '.join(argv)}` failed (exit {result.returncode}): "
                                f"{(result.stderr or result.stdout).strip()}")
    return result


def ip_json(*args: str) -> list[dict]:
    out = run(["ip", "-j", *args]).stdout.strip()
    return json.loads(out) if out else []


def taken_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network routed or addressed on the host, except the default route."""
    taken = []
    for route in ip_json("-4", "route", "show", "table", "all"):
        dst = route.get("dst", "")
        if dst in ("default", "") or route.get("type") in ("broadcast",):
            continue
        try:
            taken.append(ipaddress.IPv4Network(dst if "/" in dst else f"{dst}/32", strict=False))
        except ValueError:
            continue
    for link in ip_json("-4", "addr", "show"):
        for info in link.get("addr_info", []):
            try:
                taken.append(ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False))
            except (KeyError, ValueError):
                continue
    return taken


def namespaces() -> set[str]:
    return {entry["name"] for entry in ip_json("netns", "list")}


def namespace_exists(name: str) -> bool:
    return name in namespaces()


def link_exists(name: str) -> bool:
    return run(["ip", "link", "show", "dev", name], check=False).returncode == 0


@contextmanager
def host_lock() -> Iterator[None]:
    with open(LOCK_PATH, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def keygen(path: Path, comment: str) -> str:
    """An ed25519 key pair at `path` (made if missing); returns the public key text."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    return Path(f"{path}.pub").read_text().strip()


# ---------------------------------------------------------------- processes


def process_alive(pid: int) -> bool:
    """True if `pid` runs and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def is_our_sshd(pid: int, node: NodeState) -> bool:
    """The recorded PID still belongs to this node's sshd (not a recycled PID)."""
    try:
        # sshd rewrites its title ("sshd: /usr/sbin/sshd -D -e -f CONFIG [listener] ..."): match a substring
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return node.sshd_config.encode() in cmdline


def is_keeper(pid: int, name: str) -> bool:
    """`pid` runs the group keeper of local cluster `name` (node_setup/local/keeper.py; not a recycled PID)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return process_alive(pid) and KEEPER_MODULE.encode() in argv and name.encode() in argv


def lock_held(path: Path) -> bool:
    """Some process holds an flock on `path` (False when it does not exist): what a process that cannot see
    the holder's pid (another PID namespace) can still tell."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also ends the shared lock this took
    return False


@contextmanager
def holding_lock(path: Path) -> Iterator[None]:
    """An exclusive flock on `path` (made 0644 if missing) while the block runs; never inherited by a child."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def drops_signal(pid: int, sig: int, proc: Path = Path("/proc")) -> bool:
    """Whether `sig` cannot end `pid` now: it ignores or blocks it (`unshare --fork` blocks SIGTERM while
    it waits for its child), or it is a PID namespace's init with no handler for it (the kernel drops
    such a signal, even from outside the namespace; only SIGKILL and SIGSTOP reach it)."""
    try:
        fields = dict(line.split(":", 1) for line in (proc / str(pid) / "status").read_text().splitlines()
                      if ":" in line)
        bit = 1 << (sig - 1)
        if (int(fields["SigIgn"], 16) | int(fields["SigBlk"], 16)) & bit:
            return True
        return fields["NSpid"].split()[-1] == "1" and not int(fields["SigCgt"], 16) & bit
    except (OSError, KeyError, ValueError, IndexError):
        return False


def stop_pids(pids: list[int], timeout: float = STOP_TIMEOUT, first: int = signal.SIGTERM) -> list[int]:
    """`first` (SIGTERM), then SIGKILL once every process that can take `first` has gone, or after
    `timeout`; returns the PIDs that were still running."""
    live = [pid for pid in pids if process_alive(pid)]
    for pid in live:
        try:
            os.kill(pid, first)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while True:
        for pid in live:
            reap(pid)
        left = [pid for pid in live if process_alive(pid)]
        if all(drops_signal(pid, first) for pid in left) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        reap(pid)
    return live


def namespace_pids(namespace: str) -> list[int]:
    result = run(["ip", "netns", "pids", namespace], check=False)
    return [int(p) for p in result.stdout.split()] if result.returncode == 0 else []


# The node's init, PID 1 of the node's own PID namespace (`unshare --pid --fork --mount-proc`: the
# node's /proc lists only its own processes, so nothing on it can see, signal or read the /proc of a
# controller process). It takes its own hostname, hides each folder given as an argument (the
# controller's secrets: its key store with every cluster's key and the run-spec key, and the local
# clusters' folders with their controller keys; node_setup/controller.py's SECRET_DIRS) under an empty
# 0700 tmpfs in the node's mount namespace (first: a folder under /root is hidden before /root is the
# node's own), then takes its own /root and /etc/hosts. Before sshd, the node
# writes its host keys into its console file as cloud-init does on EC2 (node_setup/local/console.py):
# the controller verifies a new node's host key from it. sshd then runs as the init's child, and the
# init reaps whatever is left to it (`wait` reaps any child), so a stopped sshd leaves the node's other
# processes running, as on a machine whose sshd died.
_NODE_SCRIPT = ('set -e; hostname "$XC_HOSTNAME"; '
                'for hidden in "$@"; do mount -t tmpfs -o mode=0700,size=64k,nosuid,nodev,noexec xc-hidden "$hidden"; '
                'done; mount --bind "$XC_HOME" /root; mount --bind "$XC_HOSTS" /etc/hosts; ' + WRITE_CONSOLE
                + '; "$XC_SSHD" -D -e -f "$XC_CONFIG" & set +e; '
                'while :; do wait; sleep 3600 & done')
# Started in a new session, the launcher puts the node in the background and exits, so the node's
# init is re-parented away from fab and survives it (no SIGHUP: the session has no terminal). It prints
# the PID of `unshare`, whose child is the node's init (--kill-child: if unshare goes, so does the node).
_LAUNCHER = ('ip netns exec "$XC_NS" unshare --uts --mount --propagation private --pid --fork --mount-proc '
             '--kill-child /bin/sh -c "$XC_NODE_SCRIPT" xc-node "$@" </dev/null >>"$XC_LOG" 2>&1 & echo $!')


def _launch_in_namespace(node: NodeState, launcher: str, what: str, values: dict[str, str],
                         args: tuple[str, ...] = ()) -> int:
    """Run `launcher` (a script that starts `what` detached in the node's namespace and prints its PID)
    with `values` as its environment and `args` as its arguments; the PID."""
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
           "XC_NS": node.namespace, **values}
    done = subprocess.run(["/bin/sh", "-c", launcher, "xc-launcher", *args], env=env, capture_output=True,
                          text=True, start_new_session=True, timeout=30)
    if done.returncode != 0 or not done.stdout.strip().isdigit():
        raise LocalClusterError(f"{node.name}: could not start {what} in namespace {node.namespace}: "
                                f"{done.stderr.strip() or done.stdout.strip()}")
    return int(done.stdout.strip())


def children(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """The PIDs whose parent is `pid` (field 4 of /proc/<pid>/stat), as this machine's PID namespace numbers them."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return sorted(found)


def hidden_folders(folders: list[Path], node_dir: Path) -> list[str]:
    """The controller's folders a node must not read (its secrets), absolute and existing (made 0700 if
    missing); a folder that holds the node's own directory cannot be hidden from it: refused."""
    hidden: list[str] = []
    for folder in folders:
        folder = folder.absolute()
        if node_dir.absolute().is_relative_to(folder):
            raise LocalClusterError(f"the local nodes' data folder {node_dir} lies inside {folder}, a folder of "
                                    f"the controller's secrets, which nodes must not read; set {DATA_ROOT_ENV} "
                                    "to a folder outside it")
        if str(folder) not in hidden:
            hidden.append(str(folder))
    for allowed in hidden:  # once every folder is allowed: nothing made before a refusal
        Path(allowed).mkdir(mode=0o700, parents=True, exist_ok=True)
    return hidden


def start_sshd(node: NodeState, hide: list[Path]) -> int:
    """The node's init in its own PID and mount namespaces, hiding the folders `hide`; returns its sshd's
    PID (as this machine numbers it: the init's child, found once it runs sshd)."""
    node_dir = Path(node.dir)
    launched = _launch_in_namespace(node, _LAUNCHER, "sshd", {
        "XC_NODE_SCRIPT": _NODE_SCRIPT, "XC_LOG": str(node_dir / "sshd.log"), "XC_HOSTNAME": node.name,
        "XC_HOME": str(node_dir / "root"), "XC_HOSTS": str(node_dir / "etc" / "hosts"), "XC_SSHD": SSHD,
        "XC_CONFIG": node.sshd_config, "XC_ETC": str(node_dir / "etc"), "XC_CONSOLE": str(console_path(node))},
        tuple(hidden_folders(hide, node_dir)))
    deadline = time.monotonic() + SSHD_START_TIMEOUT
    while time.monotonic() < deadline:
        for init in children(launched):
            for pid in children(init):
                if is_our_sshd(pid, node):
                    return pid
        if not process_alive(launched):
            break
        time.sleep(0.02)
    raise LocalClusterError(f"{node.name}: its sshd did not start in namespace {node.namespace}: {log_tail(node)}")


def host_pid(namespace: str, pid: int) -> int | None:
    """The PID, as this machine numbers it, of the process that node namespace `namespace` numbers `pid`
    (the last NSpid of /proc/<host pid>/status): a node's records hold its own numbers."""
    for candidate in namespace_pids(namespace):
        try:
            status = Path(f"/proc/{candidate}/status").read_text()
        except OSError:
            continue
        numbers = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        if len(numbers) > 1 and numbers[-1] == str(pid):
            return candidate
    return None


def port_open(address: str, port: int = 22) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1) as sock:
            sock.settimeout(2)
            return sock.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def log_tail(node: NodeState, lines: int = 5) -> str:
    try:
        return " | ".join(Path(node.dir, "sshd.log").read_text().strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_for_sshd(nodes: list[NodeState], timeout: float, progress: Progress) -> None:
    """Until every node's sshd answers on port 22 (bounded); names the nodes that did not."""
    waiting = {n.name: n for n in nodes}
    deadline = time.monotonic() + timeout
    while waiting:
        for name, node in list(waiting.items()):
            if node.sshd_pid is None or not process_alive(node.sshd_pid):
                raise LocalClusterError(f"{name}: sshd (pid {node.sshd_pid}) exited at start: {log_tail(node)}")
            if port_open(node.address):
                progress(f"  {name}: sshd up on {node.address}:22 (pid {node.sshd_pid}, namespace {node.namespace})")
                del waiting[name]
        if waiting and time.monotonic() > deadline:
            raise LocalClusterError(f"sshd did not answer within {timeout:.0f} s on: "
                                    + ", ".join(f"{n} ({waiting[n].address}): {log_tail(waiting[n])}" for n in waiting))
        if waiting:
            time.sleep(0.05)


# ---------------------------------------------------------------- the node's metadata service

IMDS_SERVER = Path(__file__).with_name("imds_server.py")
IMDS_START_TIMEOUT = 15.0
# Inside the namespace only: the address on the node's own lo, the server started by `ip netns exec`.
_IMDS_LAUNCHER = ('ip netns exec "$XC_NS" "$XC_PYTHON" "$XC_SERVER" --dir "$XC_DIR" --address "$XC_ADDRESS" '
                  '--instance-id "$XC_ID" --instance-type "$XC_TYPE" --zone "$XC_ZONE" '
                  '</dev/null >>"$XC_DIR/server.log" 2>&1 & echo $!')


def start_imds(node: NodeState, address: str, instance_type: str, zone: str) -> int:
    """The node's metadata service on `address`:80 inside its namespace; returns its PID."""
    control = Path(node.imds_dir)
    control.mkdir(parents=True, exist_ok=True)
    (control / "ready").unlink(missing_ok=True)
    run(["ip", "-n", node.namespace, "addr", "replace", f"{address}/32", "dev", "lo"])
    return _launch_in_namespace(node, _IMDS_LAUNCHER, "the metadata service", {
        "XC_ADDRESS": address, "XC_PYTHON": sys.executable, "XC_SERVER": str(IMDS_SERVER), "XC_DIR": str(control),
        "XC_ID": node.instance_id or "", "XC_TYPE": instance_type, "XC_ZONE": zone})


def is_our_imds(pid: int, node: NodeState) -> bool:
    """The recorded PID still runs this node's metadata service (its control directory is in the command)."""
    try:
        return node.imds_dir.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def wait_for_imds(nodes: list[NodeState], timeout: float = IMDS_START_TIMEOUT) -> None:
    """Until every node's metadata service has bound its address (it writes `ready`); nothing is sent to it."""
    deadline = time.monotonic() + timeout
    waiting = list(nodes)
    while waiting:
        for node in list(waiting):
            if node.imds_pid is None or not process_alive(node.imds_pid):
                raise LocalClusterError(f"{node.name}: the metadata service (pid {node.imds_pid}) exited at start: "
                                        + _tail(Path(node.imds_dir) / "server.log"))
            if (Path(node.imds_dir) / "ready").exists():
                waiting.remove(node)
        if waiting and time.monotonic() > deadline:
            raise LocalClusterError("the metadata service did not start within "
                                    f"{timeout:.0f} s on: {', '.join(n.name for n in waiting)}")
        if waiting:
            time.sleep(0.05)


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text().strip().splitlines()[-lines:]) or "(empty log)"
    except OSError:
        return "(no log)"


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)


def kill_namespace(namespace: str) -> list[int]:
    """SIGKILL every process in the namespace (`ip netns pids`), as a machine that is switched off; returns them."""
    return stop_pids([p for p in namespace_pids(namespace) if p != os.getpid()], first=signal.SIGKILL)
