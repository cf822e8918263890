"""Fixtures for the training tests: the offline demo data, Intel MPI from the impi-rt wheel,
a fake instance metadata service and an S3 stand-in (moto), all on 127.0.0.1."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOUBLES = Path(__file__).resolve().parent / "doubles"
REGION = "us-east-1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def impi_prefix() -> Path | None:
    """The prefix the impi-rt wheel installed into (its bin/mpirun), or None."""
    try:
        dist = metadata.distribution("impi-rt")
    except metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if str(file).endswith("bin/mpirun"):
            return Path(dist.locate_file(file)).resolve().parent.parent
    return None


def mpi_env(extra: dict | None = None) -> dict:
    """Environment for a one-host Intel MPI run: shared memory, no busy-polling, one thread per rank."""
    prefix = impi_prefix()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "OMPI_", "MPI_", "I_MPI_")) and k not in ("RANK", "WORLD_SIZE",
                                                                                  "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env.update({
        "I_MPI_ROOT": str(prefix),
        "PATH": f"{prefix}/bin:{prefix}/bin/libfabric:{env.get('PATH', '')}",
        "LD_LIBRARY_PATH": f"{prefix}/lib:{env.get('LD_LIBRARY_PATH', '')}",
        "FI_PROVIDER_PATH": f"{prefix}/lib",
        "I_MPI_WAIT_MODE": "1",
        "I_MPI_FABRICS": "shm",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    })
    env.pop("XEON_IMDS_ENDPOINT", None)
    env.update(extra or {})
    return env


def run_mpi(rank_args: list[list[str]], env: dict, per_rank_env: list[dict] | None = None,
            timeout: float = 240) -> subprocess.CompletedProcess:
    """`mpirun` with one `python -m training ...` per entry of rank_args (MPMD, one rank each)."""
    prefix = impi_prefix()
    command = [str(prefix / "bin" / "mpirun"), "-hosts", "localhost"]
    for index, args in enumerate(rank_args):
        if index:
            command.append(":")
        command += ["-n", "1"]
        for key, value in (per_rank_env[index] if per_rank_env else {}).items():
            command += ["-env", key, value]
        command += [sys.executable, "-m", "training", *args]
    return subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


requires_mpi = pytest.mark.skipif(impi_prefix() is None, reason="impi-rt (Intel MPI wheel) is not installed")


@pytest.fixture(scope="session")
def qa_demo(tmp_path_factory) -> dict:
    from training.synthetic import write_demo

    return write_demo(tmp_path_factory.mktemp("qa-demo"), task="qa", examples=600, seed=0)


@pytest.fixture(scope="session")
def classification_demo(tmp_path_factory) -> dict:
    from training.synthetic import write_demo

    return write_demo(tmp_path_factory.mktemp("cls-demo"), task="classification", examples=300, seed=0)


class FakeImds:
    """A fake EC2 instance metadata service (IMDSv2) on 127.0.0.1.

    Tokens come from PUT /latest/api/token; every GET without that token gets 401. The spot
    interruption notice appears `announce_after` seconds after the first metadata GET
    (None: never); `rebalance` makes the rebalance recommendation appear at once instead.
    """

    TOKEN = "fake-imds-token"

    def __init__(self, announce_after: float | None = None, rebalance: bool = False):
        self.announce_after = announce_after
        self.rebalance = rebalance
        self.requests: list[tuple[str, str, bool]] = []
        self.first_get: float | None = None
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, status: int, body: str = ""):
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self):
                ok = self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
                fake.requests.append(("PUT", self.path, bool(ok)))
                self._reply(200, fake.TOKEN) if ok else self._reply(400)

            def do_GET(self):
                has_token = self.headers.get("X-aws-ec2-metadata-token") == fake.TOKEN
                fake.requests.append(("GET", self.path, has_token))
                if not has_token:
                    return self._reply(401)
                now = time.monotonic()
                fake.first_get = fake.first_get or now
                if self.path.endswith("/spot/instance-action") and fake.announce_after is not None \
                        and now - fake.first_get >= fake.announce_after:
                    return self._reply(200, json.dumps({"action": "terminate", "time": "2026-01-01T00:02:00Z"}))
                if self.path.endswith("/events/recommendations/rebalance") and fake.rebalance:
                    return self._reply(200, json.dumps({"noticeTime": "2026-01-01T00:00:00Z"}))
                self._reply(404)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def mocked_s3(aws_credentials):
    """moto in this process: boto3 clients made inside the test talk to it."""
    moto = pytest.importorskip("moto")
    with moto.mock_aws():
        import boto3

        yield boto3.client("s3", region_name=REGION)


@pytest.fixture
def moto_s3_server():
    """moto as an HTTP server on 127.0.0.1, for S3 calls made by other processes (the MPI ranks)."""
    import moto.server as server_module  # dev extra (flask, flask-cors); fail loudly if missing
    port = free_port()
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION,
           "AWS_ENDPOINT_URL_S3": endpoint}
    try:
        yield env
    finally:
        server.stop()


def read_summary(output_dir) -> dict:
    return json.loads((Path(output_dir) / "summary.json").read_text())
