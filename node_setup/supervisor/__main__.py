"""`python -m node_setup.supervisor run RUN_DIR`: supervise the run whose spec is in RUN_DIR (on the master)."""

from __future__ import annotations

import sys

from node_setup.supervisor.onmaster import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
