"""Warm starts for the local nodes' Python jobs: the ranks' and the demo writer's `python -m training...`, a user's
program's runner and torchrun's agent, of the shared node venv, are handed to servers that run that venv's
interpreter with torch, transformers, datasets and peft imported (tests/warm_python.py's node hook), saving each
start about 7 CPU-seconds.

Two servers per pytest process, started once the venv exists: the base server, with no import-time settings
(the demo writer's), and one with the ranks' (the venv's libraries and tcmalloc, as job.sh and the layout give
them). The base server starts one for other settings (torchrun's agents' and workers', the pods') at their second
start. A cluster's nodes use them once its data folder holds the marker naming their folder (`mark`). What ran
cold is in `refused.log` there.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from cluster.node.profiles import DEFAULT_PROFILE, TCMALLOC_PATH, get_profile, venv_dir
from tests import warm_python

VENV = Path(venv_dir(get_profile(DEFAULT_PROFILE)))


class WarmNodes:
    def __init__(self) -> None:
        self.folder: str | None = None  # None: not started (no venv yet, or it did not start)

    def _start(self) -> str | None:
        python = VENV / "bin" / "python"
        if not python.exists():
            return None
        try:  # a venv another worker's setup is remaking this moment: cold, and asked again at the next mark
            site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True, timeout=60).stdout.strip()
            warm_python.install_node_hook(site)
        except (OSError, subprocess.SubprocessError):
            return None
        folder = tempfile.mkdtemp(prefix="xc-warm-nodes-")
        atexit.register(shutil.rmtree, folder, True)
        ranks = {"LD_LIBRARY_PATH": f"{VENV}/lib", **({"LD_PRELOAD": TCMALLOC_PATH} if Path(TCMALLOC_PATH).exists()
                                                       else {})}
        started = []
        for name, settings, spawn in ((warm_python.BASE_SOCKET, {}, ["--spawn"]),
                                      (f"{warm_python.settings_key(ranks)}.socket", ranks, [])):
            env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/root", **settings}
            proc = subprocess.Popen([str(python), "-m", warm_python.HOOK_MODULE, "--serve", os.path.join(folder, name),
                                     *spawn], env=env, cwd="/", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, text=True)
            atexit.register(proc.kill)
            started.append(proc)
        ready = all(proc.stdout and proc.stdout.readline().strip() == "ready" for proc in started)
        return folder if ready else None

    def mark(self, data_dir: str | Path) -> None:
        """Let the nodes of the cluster whose data folder is `data_dir` start their jobs warm (once the servers run)."""
        if not self.folder:
            self.folder = self._start()
        if self.folder:
            (Path(data_dir) / warm_python.NODE_MARKER).write_text(f"{self.folder}\n")
