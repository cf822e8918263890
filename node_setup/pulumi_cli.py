"""Run the Pulumi CLI for `fab up`/`fab down`: its output streamed line by line, its exit code returned.

Ctrl-C never kills Pulumi. A killed `pulumi up` or `pulumi destroy` leaves the stack locked with
operations it could not record, and instances (metal ones bill by the hour) that the state no longer
knows. Pulumi cancels cleanly on one SIGINT (it finishes the operations in flight, records them and
exits); a second SIGINT makes it stop at once. So Pulumi runs in a process group of its own (a
Ctrl-C at the terminal reaches `fab` only), the first Ctrl-C is forwarded to that group once, as a
terminal would, and `fab` keeps waiting for Pulumi to exit; a later Ctrl-C is not forwarded: `fab`
says it is still waiting and names Pulumi's pid for whoever decides to stop it harder.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from typing import Callable, Sequence

from cluster.stack.lifecycle import PULUMI


def find_pulumi() -> str | None:
    """The Pulumi CLI on PATH, or None."""
    return shutil.which(PULUMI)


def exit_status(returncode: int) -> int:
    """A process's exit code as a shell reports it (killed by signal N: 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def run_streaming(argv: Sequence[str], *, say: Callable[[str], None] | None = None,
                  write: Callable[[str], None] | None = None) -> int:
    """Run `argv` (stdout and stderr together) and pass each line on as it comes; its exit status.

    `write` gets the process's lines, `say` this module's own (both default to stdout, flushed).
    """
    write = write or _write
    say = say or _say
    proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    interrupts = 0

    def on_sigint(signum, frame):
        nonlocal interrupts
        interrupts += 1
        if interrupts == 1:
            try:
                os.killpg(proc.pid, signal.SIGINT)
            except ProcessLookupError:
                return
            say(f"fab: Ctrl-C passed to {argv[0]} (pid {proc.pid}) once: it cancels cleanly, recording what it "
                "finished; waiting for it to exit (it is never killed)")
        else:
            say(f"fab: still waiting for {argv[0]} (pid {proc.pid}) to finish cancelling; not passed on again "
                "and never killed: an interrupted run leaves the stack locked and resources it cannot record")

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            write(raw.decode(errors="replace"))
        proc.stdout.close()
        return exit_status(proc.wait())
    finally:
        signal.signal(signal.SIGINT, previous)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _say(text: str) -> None:
    """A line of fab's own, also from the SIGINT handler: straight to the descriptor where there is one
    (a handler that wrote through sys.stdout's buffer while the main code did could be refused)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # a replaced stdout (a test's capture)
        _write(text + "\n")
        return
    os.write(fd, (text + "\n").encode())
