"""Start and stop a real S3-compatible HTTP server (moto's standalone server) for tests and demos.

moto's standalone server (``python -m moto.server``, package ``moto[server]``, a dev dependency)
serves the S3 REST API over HTTP from its own process, on ``127.0.0.1`` and a free port, like a
real object store: a client that holds the GIL while it waits for an answer (``deltalake``'s
``DeltaTable.history``) cannot block it. Clients (this process, ``spark-submit`` and its Python
workers) reach it through :meth:`S3Server.env`: the
standard variables ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and
``AWS_DEFAULT_REGION``, which botocore (and so s3fs) reads itself. Source: moto docs, "Non-Python
SDK's / Server Mode"; AWS SDKs and Tools reference guide, "Service-specific endpoints"
(``AWS_ENDPOINT_URL``).

The credentials are dummy values made up per server (moto accepts any); they are test material,
not secrets, and never leave the test session.
"""

from __future__ import annotations

import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

DEFAULT_REGION = "us-east-1"


class S3Server:
    """A moto S3 server on ``127.0.0.1`` with one bucket.

    :param bucket: the bucket created by :meth:`start`.
    :param region: the region given in :meth:`env` (``AWS_DEFAULT_REGION``).

    Attributes after :meth:`start`: ``host``, ``port``, ``endpoint_url`` (``http://127.0.0.1:<port>``),
    ``bucket``, ``access_key_id``, ``secret_access_key``, ``region``.
    """

    def __init__(self, *, bucket: str = "plgd-test", region: str = DEFAULT_REGION) -> None:
        self.bucket = bucket
        self.region = region
        self.access_key_id = "testing-" + secrets.token_hex(4)
        self.secret_access_key = "testing-secret-" + secrets.token_hex(8)
        self.host = "127.0.0.1"
        self.port: int | None = None
        self._server: Any = None

    @property
    def endpoint_url(self) -> str:
        if self.port is None:
            raise RuntimeError("S3Server.start() has not been called")
        return f"http://{self.host}:{self.port}"

    def env(self) -> dict[str, str]:
        """The environment that points botocore/s3fs (in this or any child process) at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_DEFAULT_REGION": self.region,
        }

    def root_url(self, prefix: str = "plgd") -> str:
        """``s3://<bucket>/<prefix>`` (a storage root on this server)."""
        return f"s3://{self.bucket}/{prefix.strip('/')}" if prefix else f"s3://{self.bucket}"

    def start(self) -> S3Server:
        """Start the server process on a free port and create the bucket.

        :raises RuntimeError: when the server does not answer within 60 s or the bucket cannot be created.
        """
        if self._server is not None:
            return self
        with socket.socket() as sock:
            sock.bind((self.host, 0))
            port = sock.getsockname()[1]
        self._server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.port = int(port)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{self.endpoint_url}/moto-api/", timeout=2):  # loopback
                    break
            except OSError:
                if self._server.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto's S3 server did not start on {self.host}:{port}") from None
                time.sleep(0.2)
        self.create_bucket(self.bucket)
        return self

    def create_bucket(self, bucket: str) -> None:
        """Create ``bucket`` (S3 ``CreateBucket``: ``PUT /<bucket>``; idempotent on moto)."""
        request = urllib.request.Request(f"{self.endpoint_url}/{bucket}", method="PUT", data=b"")
        with urllib.request.urlopen(request, timeout=10) as response:  # loopback test server
            if response.status != 200:
                raise RuntimeError(f"CreateBucket {bucket!r} on {self.endpoint_url}: HTTP {response.status}")

    def reset(self) -> None:
        """Drop every bucket and object (moto's ``POST /moto-api/reset``), then recreate the bucket."""
        request = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST", data=b"")
        with urllib.request.urlopen(request, timeout=10):  # loopback test server
            pass
        self.create_bucket(self.bucket)

    def stop(self) -> None:
        """Stop the server process (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
