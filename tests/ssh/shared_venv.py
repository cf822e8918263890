"""The local nodes' shared venv (/opt/xeon-cluster/venv-<profile>): every local cluster on this machine,
of every pytest worker and session, installs into it. A test that writes its project marker, or checks
that nothing rewrote it, holds the venv's setup lock (cluster/shell/setup-lock.sh's `setup_lock`, the lock
`fab setup` installs under) meanwhile, and leaves the marker as it found it."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest


@contextlib.contextmanager
def setup_lock_held(holder_name: str, profile: str = "stock"):
    """The venv's setup lock, its record naming `holder_name`, held while the block runs."""
    from cluster import shell
    from cluster.node.profiles import NODE_ROOT
    from cluster.node.setup_script import with_setup_lock

    body = 'setup_lock "$1" 900 || exit 23\necho held\nread -r _'  # holds until its stdin closes
    script = with_setup_lock("\n".join(["#!/bin/bash", shell.HEADER_START, shell.HEADER_END, body, ""]), holder_name)
    holder = subprocess.Popen(["bash", "-c", script, "holder", f"{NODE_ROOT}/.setup-{profile}.lock"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        said = []  # while another setup holds it: who, in setup_lock's progress lines
        for line in iter(holder.stdout.readline, ""):
            if line.strip() == "held":
                break
            said.append(line.strip())
        else:
            pytest.fail(f"the setup lock was not taken: {said}")
        yield
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


@contextlib.contextmanager
def marker_restored(marker: Path):
    """The marker's text and modification time put back after the block (call it with the lock held)."""
    text, stat = marker.read_text(), marker.stat()
    try:
        yield text
    finally:
        marker.write_text(text)
        os.utime(marker, ns=(stat.st_atime_ns, stat.st_mtime_ns))
