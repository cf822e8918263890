"""Test double for the Pulumi CLI (the real one cannot run here: it would reach AWS): installed as
`pulumi` on a test's PATH by tests/unit/test_lifecycle.py.

It appends its argv to $FAKE_PULUMI_LOG as one JSON line, then every signal it is sent (`signal
INT`, `signal TERM`), prints `fake pulumi: step N` lines, and exits with $FAKE_PULUMI_EXIT (0 when
unset). With $FAKE_PULUMI_GATE (a FIFO) it prints its first line and its pid, then waits for the
test to write to the FIFO before the rest: the test sees the first line while the process still
runs (the output is streamed), and decides when it ends (no sleeps). Pulumi's own first SIGINT is
a clean cancel, so SIGINT is only recorded and the run goes on to its exit code.
"""

import json
import os
import signal
import sys


def record(text: str) -> None:
    with open(os.environ["FAKE_PULUMI_LOG"], "a") as log:
        log.write(text + "\n")


def on_signal(signum, frame):
    record(f"signal {signal.Signals(signum).name[3:]}")
    print(f"fake pulumi: got SIG{signal.Signals(signum).name[3:]}, cancelling", flush=True)


def main() -> int:
    record(json.dumps(sys.argv[1:]))
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    gate = os.environ.get("FAKE_PULUMI_GATE")
    # open before the first line, read and write (so the open never blocks and a read waits for data):
    # once the test has seen that line, its writer finds a reader
    fd = os.open(gate, os.O_RDWR) if gate else None
    print(f"fake pulumi: step 1 (pid {os.getpid()})", flush=True)
    if fd is not None:
        os.read(fd, 64)  # blocks until the test writes to the FIFO
        os.close(fd)
    print("fake pulumi: step 2", file=sys.stderr, flush=True)
    print("fake pulumi: step 3", flush=True)
    return int(os.environ.get("FAKE_PULUMI_EXIT", "0"))


if __name__ == "__main__":
    sys.exit(main())
