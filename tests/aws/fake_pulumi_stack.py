"""Test double for the Pulumi CLI on the recovery path (the real one would reach AWS): installed as
`pulumi` on a test's PATH by tests/aws/test_pulumi_recovery.py.

Every call appends its argv to $FAKE_PULUMI_LOG as one JSON line, and every signal it gets as
`signal INT`. `stack export` prints a diagnostic line on stderr, then $FAKE_PULUMI_STATE's content;
`refresh` prints a line. `up` is slow: it prints its first line, sleeps $FAKE_PULUMI_UP_SECONDS (longer
than any wait the caller has), prints its last line and records `up finished` - a run that was killed
never records it. Exit code: $FAKE_PULUMI_EXIT (0 when unset).
"""

import json
import os
import signal
import sys
import time


def record(text: str) -> None:
    with open(os.environ["FAKE_PULUMI_LOG"], "a") as log:
        log.write(text + "\n")


def on_signal(signum, frame):
    record(f"signal {signal.Signals(signum).name[3:]}")


def main() -> int:
    args = sys.argv[1:]
    record(json.dumps(args))
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    if args[:2] == ["stack", "export"]:
        print("warning: a diagnostic line on stderr", file=sys.stderr, flush=True)
        with open(os.environ["FAKE_PULUMI_STATE"]) as f:
            sys.stdout.write(f.read())
    elif args[:1] == ["refresh"]:
        print("fake pulumi: refreshing", flush=True)
    elif args[:1] == ["up"]:
        print("fake pulumi: creating the replacement", flush=True)
        time.sleep(float(os.environ.get("FAKE_PULUMI_UP_SECONDS", "0")))
        print("fake pulumi: created", flush=True)
        record("up finished")
    return int(os.environ.get("FAKE_PULUMI_EXIT", "0"))


if __name__ == "__main__":
    sys.exit(main())
