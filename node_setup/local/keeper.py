"""The local cluster's group keeper: what an Auto Scaling group does for AWS workers, and what `pulumi up`
does for a lost master, on the host.

`fab local-up --keeper-delay S` starts it detached (`python -m node_setup.local.keeper NAME S`, its
pid in KEEPER_PID_FILE beside the state file; `fab local-down` ends it). Every POLL_S it

- writes the group's record, GROUP_FILE in the cluster's data directory (which every node shares
  with the host): each slot's machine (name, address, instance id) and its state, `running` or
  `terminated` once the node is down (reclaimed with or without a notice). The supervisor on the
  master reads it as it reads the AWS group and EC2's instance states (node_setup/backends/local.py);
- brings a node that has been down for S seconds back as a new machine, exactly as `fab local-up`
  does (new host key, instance id and empty /root, the same software through the shared venv; its
  console file shows the new key), and runs the workers' first-boot script there, the one the launch
  template's user data holds on AWS (cluster/node/boot_script.py): it authorizes the cluster key, `from=` the
  cluster's subnet, so the master can reach the new machine once it has verified its host key from its
  console;
- takes down a worker the run supervisor handed back (a request file, HANDBACK_PREFIX + its instance id, in
  the data directory: node_setup/backends/local.py's `hand_back`), as terminating it through an Auto
  Scaling group does, so that it comes back as another new machine after S seconds;
- with a console delay C (`fab local-up --keeper-console-delay C`), holds a new worker's console (its host
  keys) back for C seconds, as a metal instance's console lists them only at the end of a long boot: the
  supervisor must wait for them (cluster/run/supervision.py);
- brings a lost master (the first node) back as the master's group of one replaces one on AWS: a new machine
  at the master's name, at a new address (`moved`: a new EC2 instance gets an address of its own, and the
  stack holds no Elastic IP; the controller finds the master again by its name), with new host keys on its
  console and without the workers' first-boot script, and runs the master's boot script there, the one the
  master's user data holds on AWS (cluster/node/boot_script.py's master_boot_script): it continues the
  cluster's unfinished supervised run from its newest checkpoint (node_setup/supervisor/boot.py). The
  controller verifies the new master's host key from its console as any new node's (docs/long-spot-runs.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from cluster.node.boot_script import boot_script
from cluster.node.render import RenderError
from node_setup.controller import KEY_STORE_DIR, SPEC_KEY_FILE, config_root
from node_setup.local import cluster as local_cluster
from node_setup.local import state as local_state
from node_setup.local.console import console_path
from node_setup.local.state import GROUP_FILE, HANDBACK_PREFIX, KEEPER_LOCK_FILE, KEEPER_LOG_FILE, KEEPER_PID_FILE

POLL_S = 1.0
MAX_DELAY_S = 3600.0
HELD_SUFFIX = ".held"  # a new worker's console while the keeper holds it back (its boot, on AWS)
# How long the first-boot script may take on a new machine (it writes one file).
BOOT_TIMEOUT_S = 30


def validate_delay(value, option: str = "--keeper-delay",
                   what: str = "before a lost node comes back (0: no keeper)") -> float:
    try:
        delay = float(value)
    except (TypeError, ValueError):
        delay = -1.0
    if not 0 <= delay <= MAX_DELAY_S:
        raise local_state.LocalClusterError(f"{option}: {value!r} is not allowed; allowed: seconds from 0 "
                                            f"to {MAX_DELAY_S:g} {what}")
    return delay


def validate_console_delay(value) -> float:
    return validate_delay(value, "--keeper-console-delay", "that a new machine's console host keys are held back")


def take_down_handed_back(paths: local_state.ClusterPaths, state: local_state.ClusterState, progress=print) -> bool:
    """Take down each worker the supervisor handed back (its request file names its instance id); True when
    one went down. A request for a machine no longer in the group (already replaced) is dropped."""
    went = False
    for request in sorted(Path(state.data_dir).glob(f"{HANDBACK_PREFIX}i-*")):
        instance_id = request.name[len(HANDBACK_PREFIX):]
        request.unlink(missing_ok=True)
        node = next((n for n in state.nodes[1:] if n.instance_id == instance_id), None)  # a worker's
        if node is None:
            progress(f"keeper: {instance_id} was handed back, but no worker is that machine now")
            continue
        try:
            local_cluster.reclaim(paths, node.name, silent=True, progress=progress)
            progress(f"keeper: {node.name} ({instance_id}) handed back by the supervisor: taken down")
            went = True
        except local_state.LocalClusterError as exc:
            progress(f"keeper: {node.name} ({instance_id}) handed back, not taken down: {exc}")
    return went


def hold_console(node: local_state.NodeState) -> None:
    """Move a new machine's console aside (its host keys not listed yet), as a long boot shows them late."""
    path = console_path(node)
    if path.exists():
        os.replace(path, path.with_name(path.name + HELD_SUFFIX))


def release_console(node: local_state.NodeState) -> None:
    path = console_path(node)
    held = path.with_name(path.name + HELD_SUFFIX)
    if held.exists():
        os.replace(held, path)


def group_record(state: local_state.ClusterState, up: dict[str, bool], delay: float | None = None) -> dict:
    """The group's record; `keeper` says who keeps it (this process, while it runs) and after how long a
    lost node comes back, so the supervisor and `fab status` know whether a replacement can come."""
    record = {"cluster": state.name, "desired": len(state.nodes), "members": [
        {"name": n.name, "address": n.address, "instance_id": n.instance_id,
         "state": "running" if up.get(n.name) else "terminated"} for n in state.nodes]}
    if delay is not None:
        record["keeper"] = {"pid": os.getpid(), "delay_s": delay}
    return record


def write_group(state: local_state.ClusterState, up: dict[str, bool], delay: float | None = None) -> None:
    path = Path(state.data_dir) / GROUP_FILE
    partial = path.with_name(path.name + ".xc-new")
    partial.write_text(json.dumps(group_record(state, up, delay), indent=2) + "\n")
    partial.chmod(0o644)
    os.replace(partial, path)


def _authorize_cluster_key(state: local_state.ClusterState, node: local_state.NodeState, user: str,
                           progress=print) -> None:
    """Run the workers' first-boot script on a new machine, as cloud-init runs the launch template's user
    data on AWS (cluster/node/boot_script.py): inside the node (its mount namespace, where /root is its own),
    as root, so the script finds the SSH user's home itself. `from=` is the cluster's subnet."""
    public = config_root() / KEY_STORE_DIR / state.name / "id_ed25519.pub"
    if not public.exists():
        return
    try:
        script = boot_script(public.read_text(), state.name, state.subnet, user)
    except RenderError as exc:
        progress(f"keeper: {node.name}: no cluster key written: {exc}")
        return
    _run_boot_script(node, script, "the first-boot script", progress)


def _boot_master(state: local_state.ClusterState, node: local_state.NodeState, user: str, profile: str,
                 progress=print) -> None:
    """Run the master's boot script on a new master, as cloud-init runs the master's user data on AWS
    (cluster/node/boot_script.py's master_boot_script): it continues the cluster's unfinished supervised run
    (node_setup/supervisor/boot.py), its spec verified with this controller's run-spec public key."""
    from cluster.node.boot_script import master_boot_script
    from cluster.node.profiles import get_profile, venv_dir

    public = config_root() / KEY_STORE_DIR / f"{SPEC_KEY_FILE}.pub"
    if not public.exists():
        progress(f"keeper: {node.name}: no run-spec key on this controller: no supervised run to continue")
        return
    try:
        script = master_boot_script(signer=public.read_text(), cluster=state.name, kind="local", ssh_user=user,
                                    python=f"{venv_dir(get_profile(profile))}/bin/python", store=str(state.data_dir))
    except RenderError as exc:
        progress(f"keeper: {node.name}: the master's boot script not run: {exc}")
        return
    _run_boot_script(node, script, "the master's boot script", progress)


def _run_boot_script(node: local_state.NodeState, script: str, what: str, progress=print) -> None:
    """`script` run inside the node (its mount, UTS, network and PID namespaces) as root; its last line said."""
    if node.sshd_pid is None:
        progress(f"keeper: {node.name}: {what} did not run: its sshd is not running")
        return
    try:
        done = subprocess.run(["nsenter", "--target", str(node.sshd_pid), "--mount", "--uts", "--net", "--pid",
                               "/bin/sh", "-c", script, "xeon-cluster-boot"],
                              capture_output=True, text=True, timeout=BOOT_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        progress(f"keeper: {node.name}: {what} did not run: {exc}")
        return
    line = (done.stdout.strip() or done.stderr.strip()).splitlines()[-1:] or ["no output"]
    progress(f"keeper: {node.name}: {line[0]}" + ("" if done.returncode == 0 else f" (exit {done.returncode})"))


def keep(name: str, delay: float, *, console_delay: float = 0.0, polls: int | None = None,
         progress=print) -> None:
    """The keeper's loop (`polls`: stop after that many, for tests; None: until the cluster is gone), holding
    KEEPER_LOCK_FILE in the data directory while it runs (how a node, which cannot see its pid, knows it runs)."""
    paths = local_state.paths_for(name)
    state = local_state.load_state(paths)
    if state is None:
        return
    with local_cluster.system.holding_lock(Path(state.data_dir) / KEEPER_LOCK_FILE):
        _keep(paths, name, delay, console_delay, polls, progress)


def _keep(paths: local_state.ClusterPaths, name: str, delay: float, console_delay: float, polls: int | None,
          progress) -> None:
    down_since: dict[str, float] = {}
    held: dict[str, tuple[float, local_state.NodeState]] = {}  # name -> (when its console is shown, the node)
    done = 0
    while polls is None or done < polls:
        done += 1
        state = local_state.load_state(paths)
        if state is None:
            return
        if take_down_handed_back(paths, state, progress):
            state = local_state.load_state(paths) or state
        for node_name, (due_at, node) in list(held.items()):
            if time.time() >= due_at:
                release_console(node)
                held.pop(node_name)
                progress(f"keeper: {node_name}: its console lists its host keys now (held {console_delay:g} s)")
        names = local_cluster.system.namespaces()
        up = {n.name: local_cluster.node_up(n, names) for n in state.nodes}
        write_group(state, up, delay)
        now = time.time()
        for n in state.nodes:
            if up[n.name]:
                down_since.pop(n.name, None)
            else:
                down_since.setdefault(n.name, now)
        due = [n for n, since in down_since.items() if now - since >= delay]
        if due:
            progress(f"keeper: {', '.join(due)} down for {delay:g} s; bringing back as new machine(s)")
            try:
                wheelhouse = (yaml.safe_load(paths.inventory_path.read_text()) or {}).get("wheelhouse")
                master = state.nodes[0].name
                after = local_cluster.create(len(state.nodes), name, wheelhouse=wheelhouse, progress=progress,
                                             moved=[master] if master in due else ())
            except local_state.LocalClusterError as exc:
                progress(f"keeper: could not bring them back: {exc}")
                after = None
            if after is not None:
                recorded = yaml.safe_load(paths.inventory_path.read_text()) or {}
                user = recorded.get("user", "root")
                for node in after.nodes[1:]:  # workers: the master's instance has no first-boot script
                    if node.name in due:
                        _authorize_cluster_key(after, node, user, progress)
                        if console_delay:  # before the group's record shows the new machine
                            hold_console(node)
                            held[node.name] = (time.time() + console_delay, node)
                for back in due:
                    down_since.pop(back, None)
                write_group(after, {n.name: True for n in after.nodes}, delay)
                if master in due:  # its boot step reads the group's record: after it shows the new machines
                    _boot_master(after, after.nodes[0], user, recorded.get("profile") or "stock", progress)
        time.sleep(POLL_S)


def start(paths: local_state.ClusterPaths, delay: float, env: dict | None = None, console_delay: float = 0.0) -> int:
    """Start the keeper detached from this process (its own session; its log beside the state file)."""
    from node_setup.controller import PROJECT_ROOT

    local_cluster.stop_keeper(paths)
    with open(paths.cluster_dir / KEEPER_LOG_FILE, "ab") as log:
        argv = [sys.executable, "-m", local_cluster.system.KEEPER_MODULE, paths.name, f"{delay:g}",
                f"{console_delay:g}"]
        process = subprocess.Popen(argv,
                                   cwd=str(PROJECT_ROOT), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                   start_new_session=True, env=env)
    (paths.cluster_dir / KEEPER_PID_FILE).write_text(f"{process.pid}\n")
    return process.pid


def main(argv: list[str]) -> int:
    name, delay = argv[0], validate_delay(argv[1])
    console_delay = validate_console_delay(argv[2]) if len(argv) > 2 else 0.0
    local_state.validate_name(name)
    keep(name, delay, console_delay=console_delay, progress=lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
