"""A small TCP proxy whose link can be cut and restored: a network partition for tests.

:class:`TcpProxy` listens on a loopback port and forwards every accepted connection to
``upstream_host:upstream_port``, byte for byte, with asyncio streams on its own event loop
thread (usable from sync tests). :meth:`TcpProxy.cut` closes every open connection and refuses
new ones (they are accepted and closed at once, as a firewall that resets them would);
:meth:`TcpProxy.restore` lets new connections through again. Used to cut the leafnode link
between two nats-servers (``tests/integration/test_mirror.py``).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from plgd_devtools.nats_server import free_port

__all__ = ["TcpProxy"]

#: Bytes read per chunk when piping.
CHUNK = 64 * 1024


class TcpProxy:
    """Forward ``host:port`` (a free loopback port by default) to ``upstream_host:upstream_port``.

    :param upstream_host: where connections go.
    :param upstream_port: its port.
    :param host: listen address (default 127.0.0.1).
    :param port: listen port (default: a free port).

    Attributes: ``host``, ``port``, ``is_cut`` (bool), ``accepted`` (connections forwarded so far),
    ``refused`` (connections closed because the link was cut). Use as a context manager, or call
    :meth:`start` / :meth:`stop`.
    """

    def __init__(self, *, upstream_host: str, upstream_port: int, host: str = "127.0.0.1",
                 port: int | None = None) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = int(upstream_port)
        self.host = host
        self.port = int(port or free_port(host))
        self.is_cut = False
        self.accepted = 0
        self.refused = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    # -- life cycle ------------------------------------------------------------------------
    def start(self) -> TcpProxy:
        """Start listening (a daemon thread runs the event loop). Returns self."""
        if self._thread is not None:
            return self
        self._loop = loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            self._server = loop.run_until_complete(
                asyncio.start_server(self._accept, self.host, self.port))
            ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=run, name=f"tcp-proxy-{self.port}", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError(f"TCP proxy on {self.host}:{self.port} did not start")
        return self

    def stop(self) -> None:
        """Close every connection and the listener, and end the loop thread."""
        if self._thread is None or self._loop is None:
            return

        async def close() -> None:
            self._drop_all()
            if self._server is not None:
                self._server.close()
                await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self._thread = self._loop = self._server = None

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the link ----------------------------------------------------------------------------
    def cut(self) -> None:
        """Cut the link: close every open connection (both sides) and refuse new ones."""
        self.is_cut = True
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._adrop_all(), self._loop).result(10)

    def restore(self) -> None:
        """Restore the link: new connections are forwarded again (closed ones stay closed)."""
        self.is_cut = False

    # -- internals ------------------------------------------------------------------------------
    async def _adrop_all(self) -> None:
        self._drop_all()

    def _drop_all(self) -> None:
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.is_cut:
            self.refused += 1
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        except OSError:
            self.refused += 1
            writer.close()
            return
        self.accepted += 1
        self._writers.update((writer, up_writer))
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Any:
        try:
            while not self.is_cut:
                data = await reader.read(CHUNK)
                if not data or self.is_cut:
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()
