"""The consuming role of the JetStream hooks: bounded reads and the durable consumer.

:class:`JetStreamConsumeHook` reads stored messages in stream order: :meth:`~JetStreamConsumeHook.aiter_batches`
(an ephemeral, ack-none consumer read by the pull engine, :mod:`.pull`) and
:meth:`~JetStreamConsumeHook.adurable_consumer` (:mod:`.durable`: ack policy explicit, acknowledged
by the caller after its commit). ``iter_batches`` is the sync twin (:func:`.blocking.blocking`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

from airflow_provider_plgd.hooks.base import JetStreamBaseHook, check_bounds
from airflow_provider_plgd.jetstream.blocking import blocking
from airflow_provider_plgd.jetstream.durable import DurableConsumer
from airflow_provider_plgd.jetstream.messages import StreamMessage
from airflow_provider_plgd.jetstream.pull import DEFAULT_BATCH_SIZE, read_batches
from airflow_provider_plgd.plgd.subjects import check_filter_subject


class JetStreamConsumeHook(JetStreamBaseHook):
    """Bounded, batched reads of the stream and its durable consumers (pull consumers)."""

    async def aiter_batches(
        self,
        filter: str | Sequence[str],
        *,
        start_time: dt.datetime | int | None = None,
        end_time: dt.datetime | int | None = None,
        start_seq: int | None = None,
        end_seq: int | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> AsyncGenerator[list[StreamMessage], None]:
        """Read the messages matching ``filter`` in stream order, as lists of :class:`StreamMessage`.

        Bounds: ``[start_time, end_time)`` by server timestamp, ``[start_seq, end_seq]`` by
        sequence, and never past the stream's last sequence read when the iteration starts (so it
        ends even while publishers keep writing). It stops at the first message with time >=
        end_time or seq beyond the bound, or when the server reports no more pending messages.

        Method: one ephemeral consumer (ack none, filter_subject ``filter``, deliver
        ``by_start_sequence``/``by_start_time``/``all``); up to ``PREFETCH_PULLS`` raw
        ``CONSUMER.MSG.NEXT`` pull requests of ``batch_size`` messages (and <= 8 MiB, or 2x the
        server's max_payload if larger) in flight into one inbox subscription; metadata parsed
        from the reply subject. Each yielded list is normally the answer to one pull: at most
        ``batch_size`` messages and at most the pull byte cap of payload. Memory is bounded by
        the pulls in flight (``PREFETCH_PULLS``) plus the batch the caller holds. The consumer
        is deleted at the end, on errors and on cancellation (close the iterator, e.g. with
        ``contextlib.aclosing``, when breaking out early).
        The sync ``iter_batches`` drives a private event loop one batch at a time; between batches
        that loop is idle, so a pause longer than ``ITER_INACTIVE_THRESHOLD_S`` (120 s) lets the
        server remove the consumer, and the next batch then fails with :class:`JetStreamAPIError`.

        :param filter: subject filter, e.g. ``plgd.owners.*.devices.*.metadata.>``, or a list of
            them (one consumer with ``filter_subjects``; nats-server >= 2.10).
        :param batch_size: messages per pull (>= 1).
        :raises ValueError/TypeError: bad filter, bounds or batch_size.
        :raises StreamNotFoundError: missing stream.
        :raises JetStreamConnectionError: connection lost. :raises JetStreamTimeoutError: the
            server stopped answering pulls. :raises JetStreamAPIError: consumer deleted or other
            409/503 status, or a message larger than the pull byte cap.
        """
        for f in [filter] if isinstance(filter, str) else filter:
            check_filter_subject(f)
        start_ns, end_ns, start_seq, end_seq = check_bounds(start_time, end_time, start_seq, end_seq)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        s = await self.aget_settings()
        async with self.aconnect() as nc:
            batches = read_batches(self.api(nc), s.stream, filter, start_ns=start_ns, end_ns=end_ns,
                                   start_seq=start_seq, end_seq=end_seq, batch_size=batch_size)
            async with contextlib.aclosing(batches):
                async for batch in batches:
                    yield batch

    @contextlib.asynccontextmanager
    async def adurable_consumer(self, name: str, filters: Sequence[str], *,
                                ack_wait_seconds: float) -> AsyncIterator[DurableConsumer]:
        """Open durable pull consumer ``name`` of the stream (created on first use, ack policy
        explicit; see :class:`~airflow_provider_plgd.jetstream.durable.DurableConsumer`) on a new
        connection, and yield it; the connection closes on exit.

        :param filters: its subject filters (one or more).
        :param ack_wait_seconds: how long a delivered, unacknowledged message stays invisible (s).
        :raises ValueError: bad filters, or an existing consumer that does not fit (other filters,
            ack policy, ``max_deliver``). :raises JetStreamError: server-side problems.
        """
        for f in filters:
            check_filter_subject(f)
        s = await self.aget_settings()
        async with self.aconnect() as nc:
            yield await DurableConsumer.open(self.api(nc), s.stream, name, filters, ack_wait_seconds=ack_wait_seconds)

    iter_batches = blocking(aiter_batches)
