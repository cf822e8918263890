"""A local node's instance-metadata service: IMDSv2 on 169.254.169.254:80, inside the node's namespace.

Standard library only, run as a script (`python imds_server.py --dir DIR ...`) by `fab local-up`
inside one node's network namespace, where the metadata address sits on the node's own `lo`, so
nothing outside that namespace can reach it (and nothing on the host is ever sent there).

It answers as EC2's does for what a training job reads:

    PUT /latest/api/token                     X-aws-ec2-metadata-token-ttl-seconds: 1..21600 -> token
    GET /latest/meta-data/instance-id         (every GET needs X-aws-ec2-metadata-token: 401 without;
    GET /latest/meta-data/instance-type        IMDSv1 is refused, as with HttpTokens=required)
    GET /latest/meta-data/placement/availability-zone
    GET /latest/meta-data/spot/instance-action             404 until a notice is posted, then the notice
    GET /latest/meta-data/events/recommendations/rebalance 404 until a recommendation is posted

Notices are posted by `fab local-reclaim` as files in DIR (`spot-instance-action`, `rebalance`),
read on every request; once there they stay, as on EC2.

One request EC2 does not have, the local stand-in for a node's own `shutdown -h now` (which on a
local node would stop the host that runs it): `PUT /xeon-cluster/power-off` with a valid token,
sent by the idle auto-stop's power-off command from inside the node. The service answers, then
takes its node down as `fab local-reclaim` does: every process in its own network namespace is
killed, the node's `eth0` goes down, `powered-off` in DIR records when, and the service exits.
It refuses (403) unless it runs in a local node's named network namespace (`xc-...`).
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TOKEN_PATH = "/latest/api/token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
MAX_TTL = 21600
# control files in the node's metadata directory, and the path each answers
INSTANCE_ACTION_FILE = "spot-instance-action"
REBALANCE_FILE = "rebalance"
# the idle auto-stop's power-off request (cluster/node/autostop.py LOCAL_POWEROFF_PATH) and its record
POWER_OFF_PATH = "/xeon-cluster/power-off"
POWERED_OFF_FILE = "powered-off"
POWER_OFF_DELAY_S = 0.3  # the answer leaves before the node goes down
NETNS_DIR = "/run/netns"  # where `ip netns add` mounts the namespaces it names
NAMESPACE_PREFIX = "xc-"  # node_setup/local/state.py namespace_name
NOTICE_FILES = {
    "/latest/meta-data/spot/instance-action": INSTANCE_ACTION_FILE,
    "/latest/meta-data/events/recommendations/rebalance": REBALANCE_FILE,
}


class Metadata:
    def __init__(self, control_dir: Path, instance_id: str, instance_type: str, zone: str):
        self.control_dir = control_dir
        self.static = {
            "/latest/meta-data/instance-id": instance_id,
            "/latest/meta-data/instance-type": instance_type,
            "/latest/meta-data/placement/availability-zone": zone,
        }
        self.tokens: dict[str, float] = {}
        self.lock = threading.Lock()

    def new_token(self, ttl: int) -> str:
        token = secrets.token_urlsafe(32)
        with self.lock:
            self.tokens[token] = time.monotonic() + ttl
        return token

    def token_valid(self, token: str | None) -> bool:
        with self.lock:
            expires = self.tokens.get(token or "")
        return expires is not None and expires > time.monotonic()

    def lookup(self, path: str) -> str | None:
        if path in self.static:
            return self.static[path]
        name = NOTICE_FILES.get(path)
        if name:
            try:
                return (self.control_dir / name).read_text().strip()
            except FileNotFoundError:
                return None
        return None


def _net_namespace(pid: int | str) -> tuple[int, int]:
    st = os.stat(f"/proc/{pid}/ns/net")
    return st.st_dev, st.st_ino


def in_own_namespace() -> bool:
    """Whether this process runs in a local cluster node's network namespace: one that `ip netns`
    names `xc-...` (what local-up makes), never the machine's own."""
    try:
        own = _net_namespace("self")
        named = [p for p in Path(NETNS_DIR).glob(f"{NAMESPACE_PREFIX}*") if
                 (p.stat().st_dev, p.stat().st_ino) == own]
    except OSError:
        return False
    return bool(named)


def power_off(control_dir: Path) -> int:
    """Take this node down like a machine switched off; returns how many processes were killed.

    Only processes in this process's own network namespace (the node's) are killed, never this one;
    nothing is done unless that namespace is not the machine's own.
    """
    if not in_own_namespace():
        return 0
    own, me, killed = _net_namespace("self"), os.getpid(), 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            if _net_namespace(entry) == own:
                os.kill(int(entry), signal.SIGKILL)
                killed += 1
        except OSError:
            pass
    subprocess.run(["ip", "link", "set", "eth0", "down"], capture_output=True, check=False)
    (control_dir / POWERED_OFF_FILE).write_text(f"{time.time():.0f} {killed}\n")
    return killed


def _power_off_and_exit(control_dir: Path) -> None:
    time.sleep(POWER_OFF_DELAY_S)
    try:
        power_off(control_dir)
    finally:
        os._exit(0)


def handler_for(metadata: Metadata):
    class Handler(BaseHTTPRequestHandler):
        server_version = "EC2ws"
        sys_version = ""

        def _send(self, status: int, body: str = "") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_PUT(self):  # noqa: N802 - http.server's naming
            if self.path == POWER_OFF_PATH:
                if not metadata.token_valid(self.headers.get(TOKEN_HEADER)):
                    return self._send(401)
                if not in_own_namespace():
                    return self._send(403, "not a local cluster's node: refused")
                self._send(200, "powering off")
                threading.Thread(target=_power_off_and_exit, args=(metadata.control_dir,), daemon=True).start()
                return None
            if self.path != TOKEN_PATH:
                return self._send(404)
            try:
                ttl = int(self.headers.get(TTL_HEADER, ""))
            except ValueError:
                return self._send(400)
            if not 1 <= ttl <= MAX_TTL:
                return self._send(400)
            self._send(200, metadata.new_token(ttl))

        def do_GET(self):  # noqa: N802
            if not metadata.token_valid(self.headers.get(TOKEN_HEADER)):
                return self._send(401)
            body = metadata.lookup(self.path)
            if body is None:
                return self._send(404)
            self._send(200, body)

        def log_message(self, format, *args):  # noqa: A002 - quiet: one line per request is noise
            pass

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, type=Path, help="the node's metadata directory (control files)")
    parser.add_argument("--address", default="169.254.169.254")
    parser.add_argument("--port", type=int, default=80)
    parser.add_argument("--instance-id", required=True)
    parser.add_argument("--instance-type", required=True)
    parser.add_argument("--zone", required=True)
    args = parser.parse_args(argv)
    metadata = Metadata(args.dir, args.instance_id, args.instance_type, args.zone)
    server = ThreadingHTTPServer((args.address, args.port), handler_for(metadata))
    server.daemon_threads = True
    ready = args.dir / "ready"
    ready.write_text(f"{os.getpid()}\n")  # bound: local-up waits for this
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
