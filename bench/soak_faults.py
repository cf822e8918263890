"""The soak's faults, done to a local cluster from outside it (root; bench/soak.py).

Each acts the way the fault would arrive on AWS and touches nothing the run owns:

- reclaim, silent: `fab local-reclaim NODE --notice 5s` / `--silent` (the group keeper brings a new machine);
- partition: the worker's sshd stopped with SIGSTOP, then continued: new SSH connections hang, the machine
  and the job's own connections run on, and the keeper's record still says `running` (not a loss);
- slow-link: the worker's link limited to SLOW_LINK_MBIT with tc (the commands of `fab local-up --link-mbit`),
  then unlimited;
- store-errors: the checkpoint store's fault proxy (bench/soak_store.py) answers every request with 503
  SlowDown or 500 InternalError, then forwards again;
- supervisor-kill: the supervisor's own process (the pid its state file names, as the master's own PID
  namespace numbers it, translated to this machine's; checked to be this run's supervisor) killed with
  SIGKILL, as the kernel's OOM killer would;
- disk-full: the master's output filesystem (a tmpfs over the soak's folder in its home, mounted in the
  master's own mount namespace, so only the master sees it) filled with one file to FILL_LEAVES_BYTES
  free, less than a checkpoint needs, and kept so while held (the run's pruning frees space), then the
  file removed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from bench.soak_plan import SLOW_LINK_MBIT, Fault
from cluster.run import supervision as sv
from node_setup.local import state as local_state
from node_setup.local import system as local_system

REPO = Path(__file__).resolve().parents[1]
NOTICE = "5s"
FILL_LEAVES_BYTES = 256 * 1024
FILL_FILE = ".soak-fill"


def fab(env: dict, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fabric", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


class LocalCluster:
    """What the soak needs of its local cluster, read from the state file `fab local-up` keeps."""

    def __init__(self, name: str):
        self.name = name
        self.paths = local_state.paths_for(name)

    def state(self) -> local_state.ClusterState:
        found = local_state.load_state(self.paths)
        if found is None:
            raise RuntimeError(f"local cluster {self.name!r}: no state file at {self.paths.state_path}")
        return found

    def node(self, name: str) -> local_state.NodeState:
        return local_state.find_node(self.state(), name)

    @property
    def master(self) -> local_state.NodeState:
        return self.state().nodes[0]

    @property
    def master_home(self) -> Path:
        """The master's /root, as this machine sees it (its node directory)."""
        return Path(self.master.dir) / "root"

    def in_master(self, path: str) -> Path:
        """An absolute path on the master, through its mount namespace (/proc/PID/root of its sshd)."""
        return Path(f"/proc/{self.master.sshd_pid}/root") / path.lstrip("/")

    def master_mount(self, *argv: str) -> None:
        subprocess.run(["nsenter", "--target", str(self.master.sshd_pid), "--mount", "--", *argv], check=True,
                       capture_output=True, text=True, timeout=30)


class Injector:
    def __init__(self, cluster: LocalCluster, env: dict, store, output_root: str):
        self.cluster, self.env, self.store, self.output_root = cluster, env, store, output_root

    def refused(self) -> int:
        """Requests the store's fault proxy has refused so far."""
        return sum(self.store.proxy.refused.values())

    def inject(self, fault: Fault) -> str:
        """Do the fault; one line saying what was done."""
        return getattr(self, "_" + fault.kind.replace("-", "_"))(fault, on=True)

    def heal(self, fault: Fault) -> str:
        """Undo a fault that is held (nothing for a single act)."""
        return getattr(self, "_" + fault.kind.replace("-", "_"))(fault, on=False) if fault.hold_s else ""

    def _fab(self, *args: str) -> str:
        done = fab(self.env, *args, "--cluster", f"local:{self.cluster.name}", timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"fab {' '.join(args)} failed ({done.returncode}): {done.stdout[-500:]}{done.stderr}")
        lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
        return next((line for line in reversed(lines) if "reclaimed:" in line), lines[-1] if lines else "")

    def _reclaim(self, fault: Fault, on: bool) -> str:
        return self._fab("local-reclaim", str(fault.node), "--notice", NOTICE)

    def _silent(self, fault: Fault, on: bool) -> str:
        return self._fab("local-reclaim", str(fault.node), "--silent")

    def _partition(self, fault: Fault, on: bool) -> str:
        node = self.cluster.node(str(fault.node))
        cmdline = Path(f"/proc/{node.sshd_pid}/cmdline").read_bytes().decode(errors="replace")
        if node.sshd_config not in cmdline:
            raise RuntimeError(f"{node.name}: pid {node.sshd_pid} is not its sshd ({cmdline[:120]!r})")
        os.kill(int(node.sshd_pid or 0), signal.SIGSTOP if on else signal.SIGCONT)
        return f"{node.name}: sshd (pid {node.sshd_pid}) {'stopped' if on else 'continued'}"

    def _slow_link(self, fault: Fault, on: bool) -> str:
        node = self.cluster.node(str(fault.node))
        commands = (local_state.link_shaping_commands(node.namespace, SLOW_LINK_MBIT, None) if on
                    else [local_state.link_unshaping_command(node.namespace)])
        for argv in commands:
            subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30)
        return f"{node.name}: link {f'limited to {SLOW_LINK_MBIT:g} Mbit/s' if on else 'unlimited'}"

    def _store_errors(self, fault: Fault, on: bool) -> str:
        self.store.proxy.failing(on)
        return "checkpoint store " + ("answers 503 SlowDown / 500 InternalError" if on else "answers again")

    def _supervisor_kill(self, fault: Fault, on: bool) -> str:
        state = supervisor_state(self.cluster)
        pid, run = state.get("pid"), str(state.get("run"))
        # the state file names the supervisor as the master numbers it (its own PID namespace): this machine's number
        on_host = local_system.host_pid(self.cluster.master.namespace, int(pid)) if str(pid).isdigit() else None
        try:
            cmdline = Path(f"/proc/{on_host}/cmdline").read_bytes().decode(errors="replace") if on_host else ""
        except OSError:
            cmdline = ""
        if on_host is None or sv.SUPERVISOR_MODULE not in cmdline or run not in cmdline:
            raise RuntimeError(f"the state file's pid {pid} (on the master) is not run {run}'s supervisor "
                               f"({cmdline[:120]!r})")
        os.kill(on_host, signal.SIGKILL)
        return f"supervisor (pid {pid} on the master, {on_host} here) killed with SIGKILL"

    def keep(self, fault: Fault) -> None:
        """While a fault is held: a full disk stays full (the run's pruning frees space that the fill takes)."""
        if fault.kind == "disk-full":
            self._fill()

    def _disk_full(self, fault: Fault, on: bool) -> str:
        if not on:
            self.cluster.in_master(f"{self.output_root}/{FILL_FILE}").unlink(missing_ok=True)
            return "master's output filesystem freed"
        return f"master's output filesystem filled ({self._fill() // 1024} KiB free)"

    def _fill(self) -> int:
        """The fill file grown to leave FILL_LEAVES_BYTES free; the bytes free then."""
        fill = self.cluster.in_master(f"{self.output_root}/{FILL_FILE}")
        free = os.statvfs(fill.parent)
        more = free.f_bavail * free.f_frsize - FILL_LEAVES_BYTES
        if more > 0:
            fd = os.open(fill, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, os.fstat(fd).st_size, more)
            except OSError:
                pass  # the run wrote meanwhile: full enough
            finally:
                os.close(fd)
        left = os.statvfs(fill.parent)
        return left.f_bavail * left.f_frsize


def supervisor_state(cluster: LocalCluster) -> dict:
    """The newest supervised run's state file on the master ({} when there is none yet)."""
    try:
        found = json.loads((cluster.master_home / sv.CURRENT_LINK / sv.STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}
