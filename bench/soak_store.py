"""The soak's checkpoint store: moto's S3 on this machine, behind a fault proxy the nodes use.

moto's ThreadedMotoServer listens on 127.0.0.1 (the soak itself reads the bucket there); the proxy
listens on the cluster bridge's address, the nodes' way to this machine, and forwards every request
to moto unchanged, until `failing(True)` switches it to answer every request with an error S3 sends
under load: 503 SlowDown (throttling) and 500 InternalError, in turn. Nothing reaches moto while it
fails, so an upload either retries through the outage or fails whole (the manifest goes last:
training/checkpoint_s3.py), never half-written by the proxy.
"""

from __future__ import annotations

import http.client
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
ERRORS = ((503, "SlowDown", "Please reduce your request rate."),
          (500, "InternalError", "We encountered an internal error. Please try again."))
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


class FaultProxy(ThreadingHTTPServer):
    """Forwards to `upstream` (host, port); while failing, answers with ERRORS in turn and counts them."""

    daemon_threads = True

    def __init__(self, address: str, upstream: tuple[str, int]):
        super().__init__((address, free_port(address)), _Handler)
        self.upstream = upstream
        self._failing = False
        self._lock = threading.Lock()
        self.forwarded = 0
        self.refused = {code: 0 for code, _, _ in ERRORS}

    def failing(self, on: bool) -> None:
        with self._lock:
            self._failing = on

    def next_error(self) -> tuple[int, str, str] | None:
        """The error to answer with now (None: forward), counted."""
        with self._lock:
            if not self._failing:
                self.forwarded += 1
                return None
            error = ERRORS[sum(self.refused.values()) % len(ERRORS)]
            self.refused[error[0]] += 1
            return error

    def handle_error(self, request, client_address) -> None:
        pass  # a reclaimed node's connection reset mid-request: its client retries, nothing to print

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as S3 clients expect; Expect: 100-continue answered

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _answer(self, code: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response(code)
        length = str(len(body))
        for name, value in headers:
            if name.lower() == "content-length" and self.command == "HEAD":
                length = value  # a HEAD's answer says the object's length and has no body
            elif name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                self.send_header(name, value)
        self.send_header("Content-Length", length)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _handle(self) -> None:
        body = self._body()
        error = self.server.next_error()  # type: ignore[attr-defined]
        if error is not None:
            code, name, message = error
            xml = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{name}</Code><Message>{message}</Message>'
                   f"<RequestId>soak</RequestId></Error>").encode()
            self._answer(code, [("Content-Type", "application/xml")], xml)
            return
        host, port = self.server.upstream  # type: ignore[attr-defined]
        upstream = http.client.HTTPConnection(host, port, timeout=120)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP | {"content-length"}}
            headers["Content-Length"] = str(len(body))
            upstream.request(self.command, self.path, body=body, headers=headers)
            answer = upstream.getresponse()
            data = answer.read()
            self._answer(answer.status, answer.getheaders(), data)
        finally:
            upstream.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle


class Store:
    """moto on 127.0.0.1 with a bucket, and the fault proxy in front of it on `node_address`."""

    def __init__(self, node_address: str, bucket: str):
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server logs every request otherwise

        self.bucket = bucket
        port = free_port("127.0.0.1")
        self.moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self.moto.start()
        self.direct = f"http://127.0.0.1:{port}"
        self.proxy = FaultProxy(node_address, ("127.0.0.1", port))
        self._thread = threading.Thread(target=self.proxy.serve_forever, daemon=True)
        self._thread.start()
        self.client().create_bucket(Bucket=bucket)

    def client(self):
        """boto3's S3 client straight to moto (the soak's own reads: never through the faults)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.direct, region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
                            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])

    def controller_env(self) -> dict[str, str]:
        """This machine's fab reaches the store straight (never through the faults)."""
        return {"AWS_ENDPOINT_URL_S3": self.direct, **CREDENTIALS}

    def node_env(self) -> str:
        """fab train's --env: the nodes reach S3 through the proxy."""
        return " ".join([f"AWS_ENDPOINT_URL_S3={self.proxy.url}"] + [f"{k}={v}" for k, v in CREDENTIALS.items()])

    def keys(self, prefix: str) -> list[str]:
        found = []
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            found += [item["Key"] for item in page.get("Contents", [])]
        return found

    def close(self) -> None:
        self.proxy.shutdown()
        self.proxy.server_close()
        self.moto.stop()
