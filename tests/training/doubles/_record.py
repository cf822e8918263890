"""Shared by the test doubles: append one JSON line to $XEON_TEST_DOUBLE_LOG."""

import json
import os


def record(**event) -> None:
    path = os.environ.get("XEON_TEST_DOUBLE_LOG")
    if path:
        with open(path, "a") as handle:
            handle.write(json.dumps(event) + "\n")
