"""What a soak leaves behind (bench/soak.py): this machine's processes, namespaces, mounts and files of the soak
after its teardown, and the run's checkpoint objects in the store it no longer needs."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from bench.soak_faults import LocalCluster
from bench.soak_store import Store
from node_setup.local import state as local_state

KEEP = 2  # the job's --save_total_limit default: checkpoints of the run it keeps


def controller_processes(name: str) -> list[str]:
    """fab processes of this cluster on this machine (the soak's own `fab status` polls excepted)."""
    found = []
    for argv, pid in _processes():
        if "fabric" in " ".join(argv[:3]) and f"local:{name}" in argv and "status" not in argv:
            found.append(f"{pid} {' '.join(argv)[:200]}")
    return found


def _processes():
    mine = {os.getpid(), os.getppid()}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if argv and argv[0]:
            yield [a for a in argv if a], int(entry.name)


def left_behind(cluster: LocalCluster, folder: str, run_ids: list[str], own: bool) -> dict:
    """After the teardown: processes, namespaces (and the bridge), mounts and files of this soak still there (of
    a cluster it did not make: the run's processes, mounts and folders; the cluster's own stay). `folder`: the
    soak's folder in each node's home."""
    name = cluster.name
    marks = ([f"/local/{name}/", f"local:{name}"] if own else []) + [folder] + [r for r in run_ids if r]
    processes = [f"{pid} {' '.join(argv)[:200]}" for argv, pid in _processes()
                 if any(m in " ".join(argv) for m in marks)
                 or (own and "node_setup.local.keeper" in argv and name in argv)]
    state = local_state.load_state(cluster.paths)
    mountinfo = [Path("/proc/self/mountinfo")] + ([Path(f"/proc/{state.nodes[0].sshd_pid}/mountinfo")] if state else [])
    mounts = [line for path in mountinfo if path.exists() for line in path.read_text().splitlines() if folder in line]
    files = [str(Path(n.dir) / "root" / folder) for n in (state.nodes if state else [])
             if (Path(n.dir) / "root" / folder).exists()]
    if not own:
        return {"processes_left": processes, "namespaces_left": [], "mounts_left": mounts, "files_left": files}
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    prefix = local_state.namespace_name(name, 0)[:-1]
    left = [n for n in namespaces if n.startswith(prefix)]
    bridge = local_state.bridge_name(name)
    if subprocess.run(["ip", "link", "show", bridge], capture_output=True).returncode == 0:
        left.append(f"bridge {bridge}")
    config = cluster.paths.cluster_dir
    files += [str(p) for p in config.iterdir()] if config.exists() else []
    return {"processes_left": processes, "namespaces_left": left, "mounts_left": mounts, "files_left": files}


def checkpoint_objects(store: Store, label: str) -> dict:
    """The run's objects in the bucket: what it needs (its KEEP newest complete checkpoints and its spec)."""
    keys = store.keys(f"{label}/")
    complete = sorted((int(m.group(1)) for k in keys
                       for m in [re.match(rf"^{re.escape(label)}/checkpoint-([0-9]+)/xeon-checkpoint\.json$", k)] if m),
                      reverse=True)[:KEEP]
    needed = [k for k in keys if any(k.startswith(f"{label}/checkpoint-{s}/") for s in complete)
              or k.startswith(f"{label}/xeon-cluster-run/")]
    return {"objects": len(keys), "kept_checkpoints": sorted(complete),
            "not_needed": [k for k in keys if k not in needed]}
