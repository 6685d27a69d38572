"""The fetch's worker thread (:class:`WriterThread`: the stager's writes beside the reads) and its
progress log lines (:class:`Progress`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from airflow_provider_plgd.jetstream.messages import StreamMessage

#: Batches handed to the writer thread and not yet written, at most.
WRITE_AHEAD = 2


class WriterThread:
    """One worker thread that runs writer calls in submission order (``with`` block: the thread
    is drained and stopped on exit, also on errors, before the writer itself is aborted)."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plgd-staging-writer")
        self._pending: list[asyncio.Future] = []

    def __enter__(self) -> WriterThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    async def submit(self, fn, *args) -> None:
        """Queue ``fn(*args)``; wait while more than ``WRITE_AHEAD`` calls are queued; raise their errors."""
        self._pending.append(asyncio.get_running_loop().run_in_executor(self._executor, fn, *args))
        while len(self._pending) > WRITE_AHEAD or (self._pending and self._pending[0].done()):
            await self._pending.pop(0)

    async def call(self, fn, *args):
        """Wait for every queued call, then run ``fn(*args)`` on the thread and return its result."""
        while self._pending:
            await self._pending.pop(0)
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)


class Progress:
    """Progress log lines during long fetches: messages, bytes, rate and lag behind the stream head.

    Logs at most every ``interval_seconds`` or every ``every`` messages, whichever comes first.
    """

    def __init__(self, log, label: str, head_seq: int, interval_seconds: float, every: int) -> None:
        self.log, self.label, self.head = log, label, head_seq
        self.interval_seconds, self.every = float(interval_seconds), int(every)
        self.count = self.bytes = 0
        self.started = self.last_time = time.monotonic()
        self.last_count = 0
        self.seq = 0
        self.time_ns = 0

    def update(self, batch: Sequence[StreamMessage]) -> None:
        self.count += len(batch)
        self.bytes += sum(len(m.data) for m in batch)
        self.seq, self.time_ns = batch[-1].stream_seq, batch[-1].time_ns
        now = time.monotonic()
        if now - self.last_time >= self.interval_seconds or self.count - self.last_count >= self.every:
            self._log(now)

    def _log(self, now: float) -> None:
        elapsed = max(now - self.started, 1e-9)
        self.log.info(
            "%s: %s msgs, %.1f MB, %.0f msgs/s, %.1f MB/s; at seq %s, %s behind the stream head, %.1f s behind now",
            self.label, self.count, self.bytes / 1e6, self.count / elapsed, self.bytes / 1e6 / elapsed,
            self.seq, max(self.head - self.seq, 0), max(time.time() - self.time_ns / 1e9, 0.0),
        )
        self.last_time, self.last_count = now, self.count

    def done(self) -> None:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        self.log.info("%s: done, %s msgs, %.1f MB in %.1f s (%.0f msgs/s)", self.label, self.count,
                      self.bytes / 1e6, elapsed, self.count / elapsed)
