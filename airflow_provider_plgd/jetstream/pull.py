"""The pull engine: reads one JetStream consumer with raw pull requests, as batches.

Up to ``PREFETCH_PULLS`` ``$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`` pull requests (``batch``,
``max_bytes``, ``expires`` ns) are in flight into one inbox subscription; each message's metadata
comes from its reply subject (:func:`~airflow_provider_plgd.jetstream.messages.parse_ack_reply`); status
messages ``100`` (heartbeat), ``404``/``408`` (no messages / request expired), ``409`` (max bytes
reached, batch completed, consumer deleted, ...) and ``503`` (no responders) end pulls or the read.
:func:`read_batches` creates the consumer, reads it with :class:`PullReader` and deletes it: the
body of :meth:`JetStreamHook.aiter_batches` and of the Spark data source's partition reads
(``spark/datasource.py``, on executors without Airflow); :func:`.blocking.iterate_in_loop` drives such an
async generator from sync code.

Source: NATS docs, "JetStream wire API reference" (pull ``MSG.NEXT`` requests and their status
codes) and ADR-13 (pull requests).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_plgd.exceptions.jetstream import (
    JetStreamAPIError,
    JetStreamConnectionError,
    JetStreamError,
    JetStreamTimeoutError,
)
from airflow_provider_plgd.jetstream.api import JetStreamApi
from airflow_provider_plgd.jetstream.messages import StreamMessage, parse_ack_reply
from airflow_provider_plgd.times import NS_PER_S

#: Default messages per pull request (= per batch): :meth:`JetStreamHook.aiter_batches`,
#: ``FetchSettings.batch_size`` and ``JetStreamToStagingOperator(batch_size=...)``.
DEFAULT_BATCH_SIZE = 1000
#: Pull requests kept in flight (or answered and not yet taken by the caller) while iterating.
PREFETCH_PULLS = 3
#: Bytes cap per pull request (raised to 2x the server's max_payload if that is larger).
PULL_MAX_BYTES = 8 * 1024 * 1024
#: Seconds a pull request waits on the server for messages before it expires (status 408).
PULL_EXPIRES_S = 30.0
#: Seconds after which the server deletes our ephemeral reading consumers if we vanish.
ITER_INACTIVE_THRESHOLD_S = 120.0

_DONE = object()


async def read_batches(
    api: JetStreamApi,
    stream: str,
    subject_filter: str | Sequence[str] | None,
    *,
    start_ns: int | None = None,
    end_ns: int | None = None,
    start_seq: int | None = None,
    end_seq: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> AsyncGenerator[list[StreamMessage], None]:
    """Read the stored messages matching ``subject_filter`` within the bounds, in stream order,
    as lists of :class:`StreamMessage` (arguments checked by the caller).

    Bounds: ``[start_ns, end_ns)`` by server timestamp (unix ns), ``[start_seq, end_seq]`` by
    sequence, and never past the stream's last sequence when the read starts. One ephemeral
    consumer (ack none; ``filter_subject``, ``filter_subjects`` for a list, none for None) read by
    :class:`PullReader`; deleted at the end, on errors and on cancellation (close the generator,
    e.g. with ``contextlib.aclosing``, when leaving early).
    The errors are :meth:`JetStreamHook.aiter_batches`' (its docstring).
    """
    state = (await api.stream_info(stream))["state"]
    last = state["last_seq"] if end_seq is None else min(end_seq, state["last_seq"])
    if state["messages"] == 0 or (start_seq or 1) > last:
        return
    info = await api.create_consumer(stream, subject_filter, start_ns=start_ns, start_seq=start_seq,
                                     inactive_threshold_s=ITER_INACTIVE_THRESHOLD_S, kind="iter")
    consumer = info["name"]
    reader = PullReader(
        api.nc, stream, consumer,
        last_seq=last,
        start_seq=start_seq or 0,
        start_ns=start_ns or 0,
        end_ns=end_ns if end_ns is not None else float("inf"),
        batch_size=batch_size,
        where=api.where,
    )
    api.log.info("Reading %s of stream %s up to seq %s with consumer %s (%s pending)",
                 subject_filter or "every subject", stream, last, consumer, info.get("num_pending"))
    try:
        if info.get("num_pending", 1) == 0:
            return
        await reader.start()
        while True:
            batch = await reader.next_batch()
            if batch is None:
                return
            yield batch
    finally:
        await reader.stop()
        await api.delete_consumer(stream, consumer)


@dataclass(slots=True, eq=False)
class _Pull:
    """One pull request in flight: its ``id`` (the last token of its reply subject) and the
    messages it may still receive (``remaining``)."""

    id: str
    remaining: int


class PullReader:
    """Pull-request pipeline of one consumer into one inbox subscription (``JetStreamHook.aiter_batches``).

    Pull requests are served by the server in order; ``self._pulls`` holds the pulls
    in flight (:class:`_Pull`), the head receives the messages. A full pull, or a pull ended by a
    status, becomes one batch in ``self._queue``. New pulls are sent only by :meth:`next_batch`
    so that pulls in flight + batches waiting <= ``PREFETCH_PULLS``.
    """

    def __init__(self, nc: Any, stream: str, consumer: str, *, last_seq: int, start_seq: int, start_ns: int,
                 end_ns: float, batch_size: int, where: str) -> None:
        self.nc = nc
        self.stream = stream
        self.consumer = consumer
        self.last_seq = last_seq
        self.start_seq = start_seq
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.batch_size = batch_size
        self.max_bytes = max(PULL_MAX_BYTES, 2 * int(getattr(nc, "max_payload", 0) or 0))
        self.where = where
        self.inbox = nc.new_inbox()
        self.next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self.pull_body = json.dumps(
            {"batch": batch_size, "max_bytes": self.max_bytes, "expires": int(PULL_EXPIRES_S * NS_PER_S)}
        ).encode()
        self.sub = None
        self._pulls: collections.deque[_Pull] = collections.deque()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._batch: list[StreamMessage] = []
        self._batch_bytes = 0
        self._done = False
        self._next_cseq = 1
        self._pull_id = 0
        self._owed = 0  # messages still due to pulls already ended by a status

    async def start(self) -> None:
        # Slack for pulls in flight: the byte cap bounds memory, these limits only must not drop.
        limit = (PREFETCH_PULLS + 1) * self.batch_size + 100
        self.sub = await self.nc.subscribe(
            self.inbox + ".*", cb=self._on_msg, pending_msgs_limit=limit, pending_bytes_limit=0
        )
        await self._refill()

    async def stop(self) -> None:
        self._done = True
        if self.sub is not None:
            with contextlib.suppress(Exception):
                await self.sub.unsubscribe()
            self.sub = None

    async def _refill(self) -> None:
        # lazy: nats loads when a task talks to the server, not when a DAG file is parsed
        import nats.errors

        while not self._done and len(self._pulls) + self._queue.qsize() < PREFETCH_PULLS:
            self._pull_id += 1
            self._pulls.append(_Pull(str(self._pull_id), self.batch_size))
            try:
                await self.nc.publish(self.next_subject, self.pull_body, reply=f"{self.inbox}.{self._pull_id}")
            except nats.errors.Error as exc:  # e.g. ConnectionClosedError when the server goes away
                raise JetStreamConnectionError(
                    f"connection to {self.where} lost while reading stream {self.stream} "
                    f"({type(exc).__name__})"
                ) from exc

    async def next_batch(self) -> list[StreamMessage] | None:
        """The next batch, or None when the iteration is complete."""
        waited = 0.0
        while True:
            try:
                item = await asyncio.wait_for(self._queue.get(), 1.0)
                break
            except asyncio.TimeoutError:
                waited += 1.0
                if self.nc.is_closed or not self.nc.is_connected:
                    raise JetStreamConnectionError(
                        f"connection to {self.where} lost while reading stream {self.stream}"
                    ) from None
                reading = getattr(self.nc, "_reading_task", None)  # nats-py 2.x: its read loop
                if reading is not None and reading.done():
                    # nats-py ends its read loop on an unexpected parser error and only logs it
                    # ("nats: encountered error"); the connection looks open but nothing is read.
                    raise JetStreamConnectionError(
                        f"the NATS client stopped reading from {self.where} while reading stream {self.stream} "
                        f"(consumer {self.consumer}, last delivered consumer sequence {self._next_cseq - 1}): "
                        "its read loop ended on an error logged as 'nats: encountered error'"
                    ) from None
                if waited > PULL_EXPIRES_S + 10:
                    raise JetStreamTimeoutError(
                        f"no message or status from {self.where} for consumer {self.consumer} of stream "
                        f"{self.stream} within {waited:.0f}s"
                    ) from None
        if item is _DONE:
            return None
        if isinstance(item, BaseException):
            raise item
        await self._refill()
        return item

    def _flush(self) -> None:
        if self._batch:
            self._queue.put_nowait(self._batch)
            self._batch = []
            self._batch_bytes = 0

    def _finish(self, error: BaseException | None = None) -> None:
        if self._done:
            return
        self._done = True
        if error is None:
            self._flush()
            self._queue.put_nowait(_DONE)
        else:
            self._queue.put_nowait(error)

    async def _on_msg(self, msg: Any) -> None:
        # Hot path (once per message): keep it flat.
        if self._done:
            return
        try:
            reply = msg.reply
            if not reply:
                self._on_status(msg)
                return
            sseq, cseq, ts, pending = parse_ack_reply(reply)
            if cseq != self._next_cseq:
                raise JetStreamError(
                    f"consumer {self.consumer}: expected delivery {self._next_cseq}, got {cseq}; "
                    "messages were lost (slow consumer?)"
                )
            self._next_cseq = cseq + 1
            last = self.last_seq
            if ts >= self.end_ns or sseq > last:
                self._finish()
                return
            if sseq >= self.start_seq and ts >= self.start_ns:
                data = msg.data
                size = self._batch_bytes + len(data)
                if size > self.max_bytes and self._batch:  # keep each batch within the pull byte cap
                    self._flush()
                    size = len(data)
                self._batch_bytes = size
                self._batch.append(StreamMessage(sseq, msg.subject, ts, msg.headers, data))
            if sseq >= last or pending == 0:
                self._finish()
                return
            if self._owed:
                self._owed -= 1
                return
            pulls = self._pulls
            if pulls:
                head = pulls[0]
                head.remaining -= 1
                if head.remaining <= 0:
                    pulls.popleft()
                    self._flush()
        except BaseException as exc:  # surfaces in next_batch()
            self._finish(exc)

    def _on_status(self, msg: Any) -> None:
        hdr = msg.headers or {}
        status = hdr.get("Status", "")
        desc = next((v for k, v in hdr.items() if k == "Description"), "")
        if status == "100":  # idle heartbeat / flow control: nothing to do
            return
        if status in ("404", "408"):
            # No message available now (404) or the pull expired without enough (408): every
            # message up to our last sequence was stored before the consumer existed, so none is left.
            self._finish()
        elif status == "409" and ("Batch Completed" in desc or "MaxBytes" in desc):
            # The pull ended: complete by count (sent when max_bytes is set), or the next message
            # would exceed max_bytes. Nats-Pending-Messages = how many of its batch it did not get.
            undelivered = hdr.get("Nats-Pending-Messages")
            entry = self._end_pull(msg.subject.rsplit(".", 1)[-1], int(undelivered) if undelivered else None)
            if entry is not None and "MaxBytes" in desc and undelivered and int(undelivered) == self.batch_size:
                raise JetStreamAPIError(
                    f"a message of stream {self.stream} is larger than the pull byte cap: {desc}",
                    code=409, description=desc,
                )
        elif status == "503":
            raise JetStreamAPIError(
                f"consumer {self.consumer} of stream {self.stream} is gone (deleted, or inactive for more "
                f"than {ITER_INACTIVE_THRESHOLD_S:.0f}s)",
                code=503, description=desc,
            )
        else:
            raise JetStreamAPIError(
                f"pull from consumer {self.consumer} of stream {self.stream} failed: {status} {desc}",
                code=int(status) if status.isdigit() else None, description=desc,
            )

    def _end_pull(self, pull_id: str, undelivered: int | None) -> _Pull | None:
        """A status ended pull ``pull_id`` early. Fix the message attribution (the status may
        arrive after messages of the next pull, or before the last of its own) and flush."""
        entry = next((p for p in self._pulls if p.id == pull_id), None)
        if entry is None:  # already complete by count
            return None
        self._pulls.remove(entry)
        counted = self.batch_size - entry.remaining
        actual = counted if undelivered is None else self.batch_size - undelivered
        if actual > counted:  # some of its messages are still on the way
            self._owed += actual - counted
        else:  # messages of later pulls were counted against this one
            excess = counted - actual
            for nxt in self._pulls:
                if not excess:
                    break
                take = min(excess, nxt.remaining)
                nxt.remaining -= take
                excess -= take
        self._flush()
        while self._pulls and self._pulls[0].remaining <= 0:
            self._pulls.popleft()
        return entry
