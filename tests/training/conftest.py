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

from tests import warm_python

REPO = Path(__file__).resolve().parents[2]
DOUBLES = Path(__file__).resolve().parent / "doubles"
REGION = "us-east-1"
_warm: dict[str, str | None] = {}  # interpreter -> the socket of this pytest process's warm one (tests/warm_python.py)


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
    env.pop(warm_python.SOCKET_ENV, None)
    env.update(extra or {})
    return env


def _warm_socket(python: str = sys.executable) -> str | None:
    """The socket of this pytest process's warm `python`, started at the first rank it launches (None: it did
    not start, and the ranks run the real interpreter)."""
    if python not in _warm:
        import atexit
        import shutil
        import tempfile

        folder = tempfile.mkdtemp(prefix="xc-warm-")
        path = os.path.join(folder, "socket")
        proc = subprocess.Popen([python, "-m", "tests.warm_python", "--serve", path], env=mpi_env(),
                                cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True)
        atexit.register(shutil.rmtree, folder, True)
        atexit.register(proc.kill)
        ready = proc.stdout.readline().strip() == "ready" if proc.stdout else False
        _warm[python] = path if ready else None
    return _warm[python]


def rank_command(python: str = sys.executable) -> list[str]:
    """What starts one rank of the job: `python -m training`, through this process's warm interpreter where it
    can stand in (tests/warm_python.py: the same interpreter, the same import-time settings)."""
    if _warm_socket(python):
        return [python, "-m", "tests.warm_python", "-m", "training"]
    return [python, "-m", "training"]


def warm_env(env: dict, python: str = sys.executable) -> dict:
    """`env` with the warm `python`'s socket, for rank_command's processes."""
    socket_path = _warm_socket(python)
    return {**env, warm_python.SOCKET_ENV: socket_path} if socket_path else env


def run_mpi(rank_args: list[list[str]], env: dict, per_rank_env: list[dict] | None = None,
            timeout: float = 240, python: str = sys.executable) -> subprocess.CompletedProcess:
    """`mpirun` with one `<python> -m training ...` per entry of rank_args (MPMD, one rank each)."""
    prefix = impi_prefix()
    command = [str(prefix / "bin" / "mpirun"), "-hosts", "localhost"]
    for index, args in enumerate(rank_args):
        if index:
            command.append(":")
        command += ["-n", "1"]
        for key, value in (per_rank_env[index] if per_rank_env else {}).items():
            command += ["-env", key, value]
        command += [*rank_command(python), *args]
    return subprocess.run(command, env=warm_env(env, python), cwd=REPO, capture_output=True, text=True, timeout=timeout)


requires_mpi = pytest.mark.skipif(impi_prefix() is None, reason="impi-rt (Intel MPI wheel) is not installed")


@pytest.fixture(scope="session")
def qa_demo(tmp_path_factory) -> dict:
    from training.synthetic import write_demo

    return write_demo(tmp_path_factory.mktemp("qa-demo"), task="qa", examples=600, seed=0)


@pytest.fixture(scope="session")
def slow_tokenizer_model(tmp_path_factory, qa_demo) -> Path:
    """The demo model with a tokenizer that only has a Python (slow) implementation."""
    import shutil

    directory = tmp_path_factory.mktemp("slow-tokenizer")
    shutil.copy(Path(qa_demo["model"]) / "config.json", directory / "config.json")
    shutil.copy(Path(qa_demo["model"]) / "model.safetensors", directory / "model.safetensors")
    (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "ByT5Tokenizer"}))
    return directory


@pytest.fixture(scope="session")
def classification_demo(tmp_path_factory) -> dict:
    from training.synthetic import write_demo

    return write_demo(tmp_path_factory.mktemp("cls-demo"), task="classification", examples=300, seed=0)


def iso_in(seconds: float) -> str:
    """The instance-action `time` format, `seconds` from now (negative: in the past)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + seconds))


class FakeImds:
    """A fake EC2 instance metadata service (IMDSv2) on 127.0.0.1.

    Tokens come from PUT /latest/api/token; every GET without that token gets 401. The spot
    interruption notice (`{"action": "terminate", "time": notice_time}`) appears `announce_after`
    seconds after the first metadata GET (None: never; 0: already there at the first GET);
    `rebalance` makes the rebalance recommendation appear at once. `broken` makes the first
    `broken_replies` GETs fail in one way: "bad-status" (a status line that is not HTTP),
    "cut-short" (the connection closes in the middle of the body), "closed" (closes before any
    reply), "not-json" (200 with an HTML body) or "server-error" (500).
    """

    TOKEN = "fake-imds-token"
    PAST = "2026-01-01T00:02:00Z"

    def __init__(self, announce_after: float | None = None, rebalance: bool = False, notice_time: str = PAST,
                 broken: str | None = None, broken_replies: int = 0):
        self.announce_after = announce_after
        self.rebalance = rebalance
        self.notice_time = notice_time
        self.broken = broken
        self.broken_left = broken_replies
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

            def _broken_reply(self) -> bool:
                if not fake.broken or fake.broken_left <= 0:
                    return False
                fake.broken_left -= 1
                self.close_connection = True
                if fake.broken == "bad-status":
                    self.wfile.write(b"SPOT NOTICE HERE\r\n\r\n")
                elif fake.broken == "cut-short":
                    self.send_response(200)
                    self.send_header("Content-Length", "400")
                    self.end_headers()
                    self.wfile.write(b'{"action": "term')
                elif fake.broken == "not-json":
                    self._reply(200, "<html><body>upstream error</body></html>")
                elif fake.broken == "server-error":
                    self._reply(500, "internal error")
                # "closed": nothing at all
                return True

            def do_PUT(self):
                ok = self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
                fake.requests.append(("PUT", self.path, bool(ok)))
                self._reply(200, fake.TOKEN) if ok else self._reply(400)

            def do_GET(self):
                has_token = self.headers.get("X-aws-ec2-metadata-token") == fake.TOKEN
                fake.requests.append(("GET", self.path, has_token))
                if not has_token:
                    return self._reply(401)
                if self._broken_reply():
                    return None
                now = time.monotonic()
                fake.first_get = fake.first_get or now
                if self.path.endswith("/spot/instance-action") and fake.announce_after is not None \
                        and now - fake.first_get >= fake.announce_after:
                    return self._reply(200, json.dumps({"action": "terminate", "time": fake.notice_time}))
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
