"""The Spark data source ``plgd-jetstream``: bounded, exactly-once reads of a JetStream stream.

A Python data source (``pyspark.sql.datasource``, Spark 4) with a batch reader and a streaming
reader. It runs on executors that have ``requirements-executor.txt`` and the ``--py-files`` zip:
no Airflow. Page: ``docs/spark-datasource.md``. Example::

    from airflow_provider_plgd.spark.datasource import JetStreamDataSource
    spark.dataSource.register(JetStreamDataSource)
    df = (spark.read.format("plgd-jetstream").option("servers", "nats://nats:4222")
          .option("start", "2026-01-01T00:00:00Z").option("end", "2026-01-01T01:00:00Z").load())

Columns: exactly the staging schema (:data:`airflow_provider_plgd.tables.staging.SCHEMA`: ``stream``,
``stream_seq``, ``subject``, ``published_at``, ``msg_id``, ``headers``, ``data``).

**Batch** (:class:`JetStreamBatchReader`). On the driver, the bounds become the stream-sequence
range ``[first, stop)`` (``jetstream.counting.resolve_range``: ``start``/``end`` on the server's clock,
``start_seq``/``end_seq`` inclusive, never past the stream's last sequence), cut into partitions
of at most ``max_partition_messages`` messages matching ``subjects``, each with the server's exact
count (``jetstream.counting.split_range``). Before that, an ``end`` must be complete on the server's
clock (``completeness``: a stored message at or after it, or the server's time past ``end +
settle_seconds``) and a ``start``/``start_seq`` must still be retained (``fetch.retention``). On an
executor, each partition reads exactly its range with one ephemeral consumer
(``jetstream.pull.read_batches``) and fails with :class:`~airflow_provider_plgd.exceptions.RangeChangedError`
naming the range when it reads another number of messages than counted (a purge, a deletion or
an expiry during the read) or when the stream was re-created. Same bounds, same rows.

**Streaming** (:class:`JetStreamStreamReader`). Offsets are ``{"created", "next_seq",
"messages"}``: the stream's creation time, the next stream sequence to read, and the matching
messages the server counted in the micro-batch that ends there. ``maxMessagesPerTrigger`` is
``ReadMaxRows`` admission control (at most that many sequences, so at most that many rows, per
micro-batch); ``Trigger.AvailableNow`` reads up to the stream's last sequence when the query
starts. Partitions are planned and checked as in batch, against the offset's count, so a restarted
query replays a logged micro-batch exactly or fails.

**Secrets** (``password``, ``token``, ``nkey_seed_secret``) are Spark options: Spark does not put
a Python data source's options in the query plan or the event log, and redacts options whose name
matches ``spark.redaction.regex`` (default ``(?i)secret|password|token|access[.]?key``, which every
secret option name here matches) where it prints options. This module logs options only through
:func:`redacted_options`, and its errors never contain them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from airflow_provider_plgd.exceptions import RangeChangedError
from airflow_provider_plgd.fetch.retention import check_retained
from airflow_provider_plgd.jetstream.api import JetStreamApi, StreamState
from airflow_provider_plgd.jetstream.blocking import iterate_in_loop
from airflow_provider_plgd.jetstream.client import connect
from airflow_provider_plgd.jetstream.completeness import read_interval_status, require_interval_complete
from airflow_provider_plgd.jetstream.counting import count_boundaries, resolve_range, seq_at, split_range
from airflow_provider_plgd.jetstream.messages import StreamMessage
from airflow_provider_plgd.jetstream.pull import read_batches
from airflow_provider_plgd.spark.datasource_options import (
    DEFAULT_MAX_PARTITION_MESSAGES,
    DEFAULT_SETTLE_SECONDS,
    NAME,
    REDACTED,
    SECRET_OPTION,
    SETTINGS_LABEL,
    ReadOptions,
    options_from_settings,
    parse_options,
    redacted_options,
)
from airflow_provider_plgd.spark.schemas import to_spark_schema
from airflow_provider_plgd.tables.staging import SCHEMA, message_arrays
from airflow_provider_plgd.times import parse_rfc3339_ns

__all__ = [
    "DEFAULT_MAX_PARTITION_MESSAGES",
    "DEFAULT_SETTLE_SECONDS",
    "NAME",
    "REDACTED",
    "SECRET_OPTION",
    "JetStreamBatchReader",
    "JetStreamDataSource",
    "JetStreamStreamReader",
    "ReadOptions",
    "SequenceRange",
    "options_from_settings",
    "parse_options",
    "redacted_options",
]

_log = logging.getLogger(__name__)

@dataclass(frozen=True)
class SequenceRange(InputPartition):
    """One partition: the stream sequences ``[first_seq, end_seq_exclusive)``, the messages the
    server counted there for the read's subject filters, and the stream's ``created`` time then."""

    first_seq: int
    end_seq_exclusive: int
    count: int
    created: str | None


# ------------------------------------------------------------------------------------------------
# JetStream access (async), run on the driver (planning) and on executors (reading)


def _api(nc: Any, opts: ReadOptions) -> JetStreamApi:
    return JetStreamApi(nc, opts.settings.safe_servers(), _log)


def _check_created(opts: ReadOptions, info: Mapping[str, Any], created: str | None, first: int, stop: int,
                   expected: int) -> None:
    if info.get("created") != created:
        raise RangeChangedError(
            f"{opts.describe()} was re-created (created {info.get('created')}, planned on the stream created "
            f"{created}): sequences [{first}, {stop}) are other messages now; start a new read (streaming: a new "
            "checkpoint)",
            stream=opts.stream, first_seq=first, end_seq_exclusive=stop, expected=expected, found=None,
        )


def _mismatch(opts: ReadOptions, first: int, stop: int, expected: int, found: int, when: str) -> RangeChangedError:
    return RangeChangedError(
        f"{opts.describe()}, stream sequences [{first}, {stop}): {found} messages {when}, but the server counted "
        f"{expected} when the read was planned; messages were purged, deleted or expired meanwhile (or the "
        "stream's limits removed them). The Spark task fails so that nothing of this read is committed; read "
        "again to plan on what the stream holds now",
        stream=opts.stream, first_seq=first, end_seq_exclusive=stop, expected=expected, found=found,
    )


async def _plan_ranges(api: JetStreamApi, opts: ReadOptions, created: str | None, first: int,
                       stop: int) -> list[SequenceRange]:
    pieces = await split_range(api, opts.stream, opts.subject_filter, first, stop, opts.max_partition_messages)
    return [SequenceRange(a, b, c, created) for a, b, c in pieces if c > 0]


async def _aplan_batch(opts: ReadOptions) -> tuple[list[SequenceRange], int, int]:
    """The batch read's partitions and its range ``[first, stop)`` (see the module docstring)."""
    stream = opts.stream
    async with connect(opts.settings, SETTINGS_LABEL) as nc:
        api = _api(nc, opts)
        info = await api.stream_info(stream)
        if opts.end_ns is not None:
            status = await read_interval_status(lambda: api.stream_info(stream), end_ns=opts.end_ns,
                                                settle_seconds=opts.settle_seconds)
            require_interval_complete(status, stream, opts.start_ns)
        state = StreamState.of_info(info)
        if opts.start_ns is not None:
            horizon = opts.end_ns if opts.end_ns is not None else parse_rfc3339_ns(info.get("ts")) or opts.start_ns + 1
            check_retained(state, stream, {"kind": "time", "start_ns": opts.start_ns, "end_ns": horizon},
                           when="before the read")
        if opts.start_seq is not None:
            check_retained(state, stream, {"kind": "seq", "start_seq": opts.start_seq, "end_seq": opts.end_seq},
                           when="before the read")
        first, stop = await resolve_range(api, stream, info, start_ns=opts.start_ns, end_ns=opts.end_ns,
                                          start_seq=opts.start_seq, end_seq=opts.end_seq)
        return await _plan_ranges(api, opts, info.get("created"), first, stop), first, stop


def _to_record_batch(stream: str, messages: Sequence[StreamMessage]) -> pa.RecordBatch:
    """Messages as a record batch of :data:`~airflow_provider_plgd.tables.staging.SCHEMA` (the staging
    row rule: :func:`~airflow_provider_plgd.tables.staging.message_arrays`)."""
    columns = message_arrays(stream, [m.stream_seq for m in messages], [m.subject for m in messages],
                             [m.time_ns for m in messages], [m.headers for m in messages], [m.data for m in messages])
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMA)


async def _aread_range(opts: ReadOptions, part: SequenceRange) -> AsyncGenerator[pa.RecordBatch, None]:
    """Read exactly ``part``'s range, as record batches; fail unless it holds ``part.count`` messages."""
    stream, first, stop = opts.stream, part.first_seq, part.end_seq_exclusive
    found = 0
    async with connect(opts.settings, SETTINGS_LABEL) as nc:
        api = _api(nc, opts)
        _check_created(opts, await api.stream_info(stream), part.created, first, stop, part.count)
        batches = read_batches(api, stream, opts.subject_filter, start_seq=first, end_seq=stop - 1)
        async with contextlib.aclosing(batches):
            async for batch in batches:
                found += len(batch)
                if found > part.count:
                    raise _mismatch(opts, first, stop, part.count, found, "read (at least)")
                yield _to_record_batch(stream, batch)
    if found != part.count:
        raise _mismatch(opts, first, stop, part.count, found, "read")


def _read(opts: ReadOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if isinstance(partition, SequenceRange):
        return iterate_in_loop(_aread_range(opts, partition))
    if type(partition) is InputPartition and getattr(partition, "value", None) is None:
        return iter(())  # Spark's stand-in when partitions() planned none: nothing to read
    raise TypeError(f"{NAME} reads SequenceRange partitions, got {partition!r}")


# ------------------------------------------------------------------------------------------------
# Spark's interfaces


class JetStreamDataSource(DataSource):
    """The ``plgd-jetstream`` data source: register it with ``spark.dataSource.register(JetStreamDataSource)``.

    Options: docs/spark-datasource.md (checked by :func:`parse_options`, which raises ValueError).
    """

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> Any:
        """The staging schema as a Spark ``StructType``."""
        return to_spark_schema(SCHEMA)

    def reader(self, schema: Any) -> JetStreamBatchReader:
        return JetStreamBatchReader(parse_options(self.options, streaming=False))

    def streamReader(self, schema: Any) -> JetStreamStreamReader:
        return JetStreamStreamReader(parse_options(self.options, streaming=True))


class JetStreamBatchReader(DataSourceReader):
    """The batch reader: partitions planned on the driver, read on executors (module docstring)."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        """The read's :class:`SequenceRange` partitions (none when the range holds no matching message).

        :raises IntervalNotCompleteError: ``end`` is not complete on the server's clock.
        :raises MessagesExpiredError: the stream no longer holds ``start``/``start_seq``.
        :raises JetStreamError: server-side problems (connection, authentication, stream not found).
        """
        parts, first, stop = asyncio.run(_aplan_batch(self.opts))
        _log.info("%s: %s, stream sequences [%s, %s): %s messages in %s partition(s) of at most %s; options %s",
                  NAME, self.opts.describe(), first, stop, sum(p.count for p in parts), len(parts),
                  self.opts.max_partition_messages, redacted_options(self._logged_options()))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Read one partition (on an executor). :raises RangeChangedError: its range changed."""
        return _read(self.opts, partition)

    def _logged_options(self) -> dict[str, Any]:
        return {**options_from_settings(self.opts.settings), "subjects": ",".join(self.opts.subjects)}


class JetStreamStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The streaming reader: stream sequences as offsets (module docstring)."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._target: int | None = None  # Trigger.AvailableNow: the stream's last sequence + 1 at the start

    async def _ainfo(self, work: Any) -> Any:
        async with connect(self.opts.settings, SETTINGS_LABEL) as nc:
            api = _api(nc, self.opts)
            return await work(api, await api.stream_info(self.opts.stream))

    def initialOffset(self) -> dict:
        """``start_seq``, else the first sequence at or after ``start``, else the stream's first message."""
        opts = self.opts

        async def work(api: JetStreamApi, info: dict) -> dict:
            state = StreamState.of_info(info)
            if opts.start_seq is not None:
                seq = opts.start_seq
            elif opts.start_ns is not None:
                seq = await seq_at(api, opts.stream, opts.start_ns, state.head + 1)
            else:
                seq = max(int(state.first_seq or 0), 1)
            return {"created": info.get("created"), "next_seq": int(seq), "messages": 0}

        return asyncio.run(self._ainfo(work))

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_messages_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        async def work(api: JetStreamApi, info: dict) -> int:
            return StreamState.of_info(info).head + 1

        self._target = asyncio.run(self._ainfo(work))

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """The end of the next micro-batch: the stream's last sequence + 1 (``Trigger.AvailableNow``:
        as when the query started), at most ``limit.max_rows`` sequences after ``start``; ``start``
        itself when there is nothing new.

        :raises RangeChangedError: the stream was re-created.
        :raises MessagesExpiredError: sequences from ``start`` on were removed before they were read.
        """
        opts = self.opts
        begin = int(start["next_seq"])

        async def work(api: JetStreamApi, info: dict) -> dict:
            state = StreamState.of_info(info)
            _check_created(opts, info, start.get("created"), begin, max(begin, state.head + 1), 0)
            stop = state.head + 1 if self._target is None else self._target
            if isinstance(limit, ReadMaxRows):
                stop = min(stop, begin + int(limit.max_rows))
            if stop <= begin:
                return start
            check_retained(state, opts.stream, {"kind": "seq", "start_seq": begin, "end_seq": stop - 1},
                           when="before the micro-batch")
            count = (await count_boundaries(api, opts.stream, opts.subject_filter, [begin, stop]))[0]
            return {"created": info.get("created"), "next_seq": stop, "messages": count}

        return asyncio.run(self._ainfo(work))

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        """The micro-batch's partitions, planned as in batch; their counts must add up to ``end``'s.

        :raises RangeChangedError: messages of ``[start, end)`` were removed since the offset was
            logged, or the stream was re-created.
        """
        opts = self.opts
        first, stop, expected = int(start["next_seq"]), int(end["next_seq"]), int(end["messages"])
        if stop <= first:
            return []

        async def work(api: JetStreamApi, info: dict) -> list[SequenceRange]:
            _check_created(opts, info, end.get("created"), first, stop, expected)
            return await _plan_ranges(api, opts, info.get("created"), first, stop)

        parts = asyncio.run(self._ainfo(work))
        found = sum(p.count for p in parts)
        if found != expected:
            raise _mismatch(opts, first, stop, expected, found, "counted now")
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Read one partition (on an executor). :raises RangeChangedError: its range changed."""
        return _read(self.opts, partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: the offsets live in the query's checkpoint, not on the server."""
