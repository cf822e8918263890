"""`python -m node_setup.supervisor.respawn RUN_DIR -- COMMAND...`: the supervisor's keeper where no systemd
unit runs it (a local cluster's master, an inventory file's machines), as Restart=on-abnormal keeps the
unit on AWS.

It runs COMMAND (the supervisor of the run whose directory is RUN_DIR) as its child, in its own session
and with its output (the run's log); when the child is killed by a signal other than a clean stop's
(SIGKILL, the OOM killer, a crash) while the run's state file says the run goes on, it says so in the
run's log and starts it again after RESTART_DELAY_S: the new supervisor carries on from the state file
(node_setup/supervisor/loop.py). Any other end (the run ended, a clean stop, a bad spec) ends the keeper
too, with the child's code. A TERM, INT or HUP it gets is passed to the child.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from cluster.run import supervision as sv


def _status(run_dir: Path) -> str | None:
    try:
        state = json.loads((run_dir / sv.STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return state.get("status") if isinstance(state, dict) else None


def keep(run_dir: Path, command: list[str], *, delay_s: float = sv.RESTART_DELAY_S, sleep=time.sleep) -> int:
    """Run `command` until it ends other than killed while its run goes on; its last exit code."""
    child: subprocess.Popen | None = None

    def forward(signum, frame):
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    while True:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL)
        code = child.wait()
        status = _status(run_dir)
        if not sv.restarted(code, status):
            return code if code >= 0 else 128 - code
        sys.stdout.write(sv.log_line(time.time(), f"the supervisor (pid {child.pid}) was killed by "
                                                  f"{signal.Signals(-code).name} while the run was {status}: started "
                                                  f"again in {delay_s:g} s, it carries on from its state file"))
        sys.stdout.flush()
        sleep(delay_s)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m node_setup.supervisor.respawn RUN_DIR -- COMMAND...", file=sys.stderr)
        return 2
    return keep(Path(argv[0]).expanduser(), argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
