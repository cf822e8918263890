"""Idle auto-stop: the master powers the cluster off once no job or `fab exec` has run for a while.

Pure text and decisions; the service itself is `cluster/shell/autostop.sh`, installed by
`fab setup` (and the image's build, so it is in the image) as SERVICE_PATH on every
node, with the power-off command `cluster/shell/autostop-poweroff.sh` as POWEROFF_PATH.

Activity, on the master (the only node the service acts on):
- a job of `fab train` owns `~/<JOBS_DIR>/<id>/`; it is running while its recorded pid runs the job
  script (the rule of job-state.sh), and every file the job writes there (log, exit code) moves
  its last activity;
- a `fab exec` on the master runs wrapped by `recorded_command`: `~/<ACTIVITY_DIR>/exec-<pid>`
  exists while it runs and `~/<ACTIVITY_DIR>/last-exec` is touched when it ends. The record holds
  the pid and that process's start time (field 22 of /proc/<pid>/stat); it counts as running only
  while a process of that pid with that start time exists, so the leftover record of a command
  that died (its pid since reused by another process) is removed, never waited on forever.

The idle rule (autostop.sh `status`, the only implementation): nothing running, and the clock
started at the later of arming and the last activity has reached the idle time:

    deadline = max(armed at, last activity) + idle; power off when now >= deadline and none running

Arming (`fab autostop --idle 30m`; `fab setup` on an AWS cluster with the stack's `autoStopIdle`,
or on any cluster with `fab setup --auto-stop 30m`; the first job of `fab train` on an AWS
cluster, unless armed or cancelled) writes `~/<STATE_DIR>/armed`; `--cancel` removes it. The
power-off mode is decided when arming, on the master: `system` (`shutdown -h now` through sudo) on
a machine of its own, `local` on a local cluster's node, which shares the host's kernel and must
never run a real power-off: there the node's own metadata service takes it down
(node_setup/local/imds_server.py). `system` is allowed only where the power-off command provably
runs in the machine's own PID namespace (the kernel's fixed number for it, INIT_PID_NAMESPACE) and
in the network namespace of the machine's PID 1, and in no named one.

Which nodes it powers off: every node of the cluster's full node list (`node_list_files`: the
nodes, an ssh config and their host keys under STATE_DIR), written by `fab setup`, `fab distribute`
and `fab autostop` for the whole cluster, and never by `fab train --nodes N`, which narrows
`~/hosts` to its job's nodes (the names in `~/hosts` are powered off too). A worker counts as
stopped only when its power-off command answered POWEROFF_ACK; if any worker was not stopped (or
no full list was recorded), the master stays up, `~/<STATE_DIR>/unstopped` names them, `fab status`
shows it, and the service tries those workers again at every poll.

On AWS the workers and the master are each an Auto Scaling group, which would launch a powered-off node
again. So before any node is powered off the service sets the workers' group's minimum, maximum and desired
capacity to 0, then the master's group's (STOP_GROUP_PATH, `stop_group_script`: the AWS API with the master
role's credentials, which may set exactly those two groups to 0, infra/node_role.py), from the groups named in
GROUP_FILE (`group_file_text`, written by fab with the node list); if AWS refuses either, no worker is powered
off, the master stays up and UNSTOPPED_FILE says why (a master group left at 1 would launch the powered-off
master again, billed). `pulumi up --refresh` (`fab up`) sets both groups back.
"""

from __future__ import annotations

import datetime as dt
import re
import shlex
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from cluster import records, shell
from cluster.job.launch import JOBS_DIR
from cluster.node.profiles import NODE_ROOT
from cluster.inventory import Node
from cluster.node.render import HOSTFILE_NAME, MasterPaths, hostfile_text, known_hosts_text, ssh_config_block
from cluster.durations import format_duration, parse_duration

DEFAULT_IDLE = "30m"  # `fab autostop --idle` and the stack's autoStopIdle
OFF = "off"  # the stack setting's value that arms nothing
MIN_IDLE_S = 1
MAX_IDLE_S = 7 * 24 * 3600
DEFAULT_POLL_S = 30  # how often the service looks
MAX_POLL_S = 3600

STATE_DIR = ".xeon-cluster/autostop"  # in the SSH user's home on the master: armed, log, lock, pid
ACTIVITY_DIR = ".xeon-cluster/activity"  # `fab exec` records, on the master
BIN_DIR = f"{NODE_ROOT}/bin"
SERVICE_PATH = f"{BIN_DIR}/xeon-cluster-autostop"
POWEROFF_PATH = f"{BIN_DIR}/xeon-cluster-poweroff"
STOP_GROUP_PATH = f"{BIN_DIR}/xeon-cluster-stop-group"
# in STATE_DIR: name=<the cluster's worker group>, region=<its region>, master=<the master's group> (when it has one)
GROUP_FILE = "worker-group"
GROUP_UNSTOPPED = "(worker-group)"  # in UNSTOPPED_FILE: the group could not be set to 0
# An Auto Scaling group's name as the program makes it, and an AWS region (whole value).
GROUP_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,255}\Z")
REGION_RE = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]\Z")
SYSTEMD_UNIT = "xeon-cluster-autostop.service"
MODES = ("system", "local")
# the machine's own PID namespace, as readlink /proc/self/ns/pid names it: the kernel gives the
# initial PID namespace this fixed number (PROC_PID_INIT_INO); any other is a container's or a node's
INIT_PID_NAMESPACE = "pid:[4026531836]"
POWEROFF_ACK = "xeon-cluster-poweroff: accepted"  # the power-off command's answer before it acts

# The full node list on the master (in STATE_DIR), written for the whole cluster (node_list_files)
NODES_FILE = "nodes"  # every node's alias, master first
SSH_CONFIG_FILE = "ssh_config"  # how the master reaches each of them (the cluster key)
KNOWN_HOSTS_FILE = "known_hosts"  # their host keys, as the controller verified them
UNSTOPPED_FILE = "unstopped"  # at=<time>, then one `<node> <reason>` line per worker not stopped
STOPPED_FILE = "stopped"  # workers already stopped in this power-off
UNLISTED = "(unlisted)"  # in UNSTOPPED_FILE: no full node list was recorded, other workers may run
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")  # what a status line's node name may be

# The local metadata service's power-off request (a PUT with a token, from inside the node only).
LOCAL_POWEROFF_PATH = "/xeon-cluster/power-off"


class AutostopError(ValueError):
    """A bad --idle/--poll or autoStopIdle: one line naming the setting, the value and what is allowed."""


def idle_seconds(text: object, setting: str = "--idle") -> int:
    """`30m`, `2h`, `90s`, `1h30m` or a bare number of seconds -> whole seconds, in range."""
    allowed = (f"{setting}: {text!r} is not allowed; allowed: whole seconds from {MIN_IDLE_S}s to "
               f"{MAX_IDLE_S // 3600}h, written like 30m, 2h, 90s or 1h30m")
    try:
        seconds = parse_duration(str(text), setting)
    except ValueError as exc:
        raise AutostopError(allowed if "longer than zero" in str(exc) else str(exc)) from None
    if not MIN_IDLE_S <= seconds <= MAX_IDLE_S or seconds != int(seconds):
        raise AutostopError(allowed)
    return int(seconds)


def stack_idle_seconds(value: object, setting: str = "autoStopIdle") -> int | None:
    """The stack setting: a duration, or `off` (None: nothing is armed on a new master)."""
    if value is None or str(value).strip() == "":
        value = DEFAULT_IDLE
    if str(value).strip().lower() == OFF:
        return None
    try:
        return idle_seconds(value, setting)
    except AutostopError as exc:
        raise AutostopError(f"{exc} (or {OFF})") from None


def setup_idle(option: object, default_idle) -> int | None:
    """What `fab setup` arms: `--auto-stop` when given (a duration or `off`); otherwise the cluster's
    default (`default_idle()`, its backend's `default_idle_stop`: on AWS the stack's autoStopIdle, seconds
    or None for off; on a local cluster or machines of your own None, nothing unless asked)."""
    if option not in (None, ""):
        return stack_idle_seconds(option, "--auto-stop")
    return default_idle()


def poll_for(idle_s: int) -> int:
    """The poll `fab setup` arms with: DEFAULT_POLL_S, or a quarter of a shorter idle time (1 s at least)."""
    return max(1, min(DEFAULT_POLL_S, int(idle_s) // 4))


def poll_seconds(value: object, setting: str = "--poll") -> int:
    try:
        seconds = int(str(value).strip())
    except ValueError:
        raise AutostopError(f"{setting}: {value!r} is not a whole number of seconds") from None
    if not 1 <= seconds <= MAX_POLL_S:
        raise AutostopError(f"{setting}: {seconds} is not allowed; allowed 1 to {MAX_POLL_S} seconds")
    return seconds


# ------------------------------------------------------------------------------- node-side text


def service_script() -> str:
    """The service (arm, cancel, status, run), as installed at SERVICE_PATH."""
    return shell.render("autostop.sh", {
        "STATE_DIR": STATE_DIR, "JOBS_DIR": JOBS_DIR, "ACTIVITY_DIR": ACTIVITY_DIR, "HOSTS_FILE": HOSTFILE_NAME,
        "DEFAULT_POLL": str(DEFAULT_POLL_S), "POWEROFF": POWEROFF_PATH, "ACK": POWEROFF_ACK,
        "NODES_FILE": NODES_FILE, "SSH_CONFIG_FILE": SSH_CONFIG_FILE, "UNSTOPPED_FILE": UNSTOPPED_FILE,
        "STOPPED_FILE": STOPPED_FILE, "UNLISTED": UNLISTED, "STOP_GROUP": STOP_GROUP_PATH,
        "GROUP_FILE": GROUP_FILE, "GROUP_UNSTOPPED": GROUP_UNSTOPPED,
    })


def stop_group_script(node_root: str = NODE_ROOT) -> str:
    """The command that sets the worker group, then the master's group, to 0, as installed at STOP_GROUP_PATH."""
    return shell.render("autostop-stop-group.sh", {"STATE_DIR": STATE_DIR, "GROUP_FILE": GROUP_FILE,
                                                   "VENV_GLOB": f"{node_root}/venv-*/bin/python"})


def group_file_text(name: str, region: str, master: str | None = None) -> str:
    """GROUP_FILE's text (`master`: the master's group, set to 0 after the workers'); a name or region that is
    not whole-value valid is refused here, where it enters."""
    for what, value in (("worker group", name), ("master group", master)):
        if value is not None and not GROUP_NAME_RE.match(value or ""):
            raise AutostopError(f"{what} name {value!r} is not allowed; allowed: letters, digits, . _ - (1-255)")
    if not REGION_RE.match(region or ""):
        raise AutostopError(f"region {region!r} is not allowed; allowed: an AWS region such as us-east-1")
    return f"name={name}\nregion={region}\n" + (f"master={master}\n" if master else "")


def poweroff_script() -> str:
    """The power-off command every node runs, as installed at POWEROFF_PATH."""
    return shell.render("autostop-poweroff.sh", {"LOCAL_POWEROFF_PATH": LOCAL_POWEROFF_PATH, "ACK": POWEROFF_ACK,
                                                 "INIT_PID_NS": INIT_PID_NAMESPACE})


@dataclass(frozen=True)
class _ListPaths(MasterPaths):
    """Where the service's ssh config finds the key (distribution's) and the host keys (its own)."""

    @property
    def known_hosts(self) -> str:
        return f"~/{STATE_DIR}/{KNOWN_HOSTS_FILE}"


def node_list_files(cluster: str, nodes: Iterable[Node], user: str, host_keys: Mapping[str, str]) -> dict[str, str]:
    """The full node list the service powers off: path relative to the master's home -> text.

    Every node (master first) by alias, an ssh config reaching each with the cluster key
    (distribution puts it on the master) and the host keys the controller verified.
    """
    nodes = list(nodes)
    paths = _ListPaths(cluster)
    return {f"{STATE_DIR}/{NODES_FILE}": hostfile_text(nodes),
            f"{STATE_DIR}/{SSH_CONFIG_FILE}": ssh_config_block(cluster, nodes, user, paths),
            f"{STATE_DIR}/{KNOWN_HOSTS_FILE}": known_hosts_text(nodes, host_keys)}


def install_section(bin_dir: str = BIN_DIR) -> str:
    """Bash that installs both scripts into `bin_dir` (and, where systemd runs, the unit); setup runs it.

    A section of the install script (no shebang): it uses install.sh's `xc`, `SUDO` and `CHANGED`.
    The unit is only installed for the standard BIN_DIR (tests install elsewhere, never a unit).
    """
    text = shell.render("autostop-install.sh", {
        "BIN_DIR": bin_dir, "SERVICE_PATH": f"{bin_dir}/{SERVICE_PATH.rsplit('/', 1)[1]}",
        "POWEROFF_PATH": f"{bin_dir}/{POWEROFF_PATH.rsplit('/', 1)[1]}",
        "STOP_GROUP_PATH": f"{bin_dir}/{STOP_GROUP_PATH.rsplit('/', 1)[1]}",
        "SERVICE_TEXT": service_script(), "POWEROFF_TEXT": poweroff_script(), "STOP_GROUP_TEXT": stop_group_script(),
        "UNIT": SYSTEMD_UNIT if bin_dir == BIN_DIR else "",
    })
    return text.partition("\n")[2]


def install_script(bin_dir: str = BIN_DIR) -> str:
    """install_section as a script of its own (`fab autostop` refreshes the nodes with it), after
    install.sh's preamble, which defines what the section uses."""
    return shell.preamble("install.sh") + install_section(bin_dir)


def arm_command(idle_s: int, poll_s: int) -> str:
    return f"{shlex.quote(SERVICE_PATH)} arm {int(idle_s)} {int(poll_s)}"


def arm_default_command(idle_s: int, poll_s: int = DEFAULT_POLL_S) -> str:
    """Arm unless already armed or cancelled on this master (the stack's autoStopIdle at `fab train`)."""
    return f"{shlex.quote(SERVICE_PATH)} arm-default {int(idle_s)} {int(poll_s)}"


def cancel_command() -> str:
    return f"{shlex.quote(SERVICE_PATH)} cancel"


def status_command() -> str:
    return f"{shlex.quote(SERVICE_PATH)} status"


def recorded_command(command: str) -> str:
    """`fab exec`'s command on the master, recorded as activity while it runs and when it ends."""
    d = f'"$HOME"/{ACTIVITY_DIR}'
    started = "$(sed 's/.*) //' /proc/$$/stat 2>/dev/null | cut -d' ' -f20)"  # field 22: after `pid (comm) `
    return (f"mkdir -p {d} 2>/dev/null && echo \"$$ {started}\" > {d}/exec-$$ 2>/dev/null\n"
            f"(\n{command}\n)\nxc_rc=$?\ntouch {d}/last-exec 2>/dev/null; rm -f {d}/exec-$$\nexit $xc_rc")


# ------------------------------------------------------------------------------- reading its status


@dataclass(frozen=True)
class Status:
    armed: bool
    idle_s: int | None = None
    mode: str = ""
    since: float | None = None  # armed at
    last: float | None = None  # last activity (job file, exec end)
    running: int = 0  # jobs and execs running now
    now: float | None = None
    deadline: float | None = None
    powered_off: float | None = None
    installed: bool = True
    unstopped: tuple[str, ...] = field(default_factory=tuple)  # workers the last power-off could not stop
    unstopped_at: float | None = None
    nodes: tuple[str, ...] = field(default_factory=tuple)  # the full node list it powers off (NODES_FILE)

    @property
    def idle_since(self) -> float | None:
        starts = [t for t in (self.since, self.last) if t is not None]
        return max(starts) if starts else None

    @property
    def left_s(self) -> float | None:
        if not self.armed or self.running or self.deadline is None or self.now is None:
            return None
        return max(0.0, self.deadline - self.now)


def _number(value: str | None) -> float | None:
    return records.number(value) if value not in (None, "") else None


def _names(value: str | None) -> tuple[str, ...]:
    """Node names of a status line; a word that cannot be a node's name is left out."""
    return tuple(w for w in (value or "").split() if w == UNLISTED or _NODE_NAME.fullmatch(w))


def parse_status(text: str) -> Status:
    """autostop.sh `status` output (`key=value` lines, read from the master as any record: cluster/records.py,
    its numbers bounded, its names node names) -> Status."""
    try:
        lines = (records.text(text, "auto-stop status") or "").splitlines()
    except records.RecordError:  # larger than any status autostop.sh prints: nothing of it is read
        lines = []
    facts = dict(line.split("=", 1) for line in lines if "=" in line)
    if facts.get("installed") == "no":
        return Status(armed=False, installed=False)
    idle = _number(facts.get("idle"))
    return Status(armed=facts.get("armed") == "yes", idle_s=int(idle) if idle is not None else None,
                  mode=facts.get("mode", ""), since=_number(facts.get("since")), last=_number(facts.get("last")),
                  running=int(_number(facts.get("running")) or 0), now=_number(facts.get("now")),
                  deadline=_number(facts.get("deadline")), powered_off=_number(facts.get("powered_off")),
                  unstopped=_names(facts.get("unstopped")), unstopped_at=_number(facts.get("unstopped_at")),
                  nodes=_names(facts.get("nodes")))


def short_duration(seconds: float) -> str:
    """30m, 2h, 1h 30m, 90s -> 1m 30s: the idle time as given."""
    total = int(seconds)
    h, rest = divmod(total, 3600)
    m, s = divmod(rest, 60)
    parts = [f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (s, "s")) if v]
    return " ".join(parts) or "0s"


def _clock(at: float) -> str:
    try:
        return dt.datetime.fromtimestamp(at, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
    except (ValueError, OverflowError, OSError):  # a time read from the master that no calendar holds
        return "an unreadable time"


def status_line(status: Status) -> str:
    """One line for `fab status` and `fab autostop`."""
    if not status.installed:
        return "auto-stop: not installed on the master (run `fab setup`)"
    if status.powered_off is not None:
        return f"auto-stop: powered the cluster off at {_clock(status.powered_off)}"
    if status.unstopped:
        return problem(status) or ""
    if not status.armed:
        return "auto-stop: off"
    head = f"auto-stop: armed, {short_duration(status.idle_s or 0)} idle"
    if status.nodes:  # the machines it powers off (a replacement's once the supervisor admitted it)
        head += f" (powers off {', '.join(status.nodes)})"
    if status.running:
        return f"{head}; {status.running} job(s)/exec(s) running, the clock starts when they end"
    left = status.left_s
    since = status.idle_since
    tail = f" (idle since {_clock(since)})" if since is not None else ""
    if left is None:
        return head
    if left <= 0:
        return f"{head}; powering off now{tail}"
    return f"{head}; powers off in {format_duration(left)}{tail}"


def problem(status: Status) -> str | None:
    """One line when the last power-off left workers running (the master stays up), else None."""
    if not status.unstopped:
        return None
    at = f" at {_clock(status.unstopped_at)}" if status.unstopped_at is not None else ""
    workers = [name for name in status.unstopped if name != UNLISTED]
    if UNLISTED in status.unstopped:
        return (f"auto-stop: no full node list on the master{at}, so it powered off only the nodes in "
                f"~/{HOSTFILE_NAME}{' (not ' + ', '.join(workers) + ')' if workers else ''} and stays up; "
                "`fab distribute` records the cluster's nodes")
    return (f"auto-stop: could not power off {', '.join(workers)}{at}, so the master stays up "
            f"and tries again every poll; see ~/{STATE_DIR}/log on the master (a replaced node: "
            "`fab distribute` records the cluster's nodes again)")
