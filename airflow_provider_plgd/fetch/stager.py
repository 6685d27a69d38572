"""Writing one fetch task's messages as staging files: per event type, sorted by owner, cut by size.

A fetch task hands every message it stages to a :class:`Stager` with the message's owner and
event type (its batch). The stager keeps them per event type, and at the end writes each event
type's rows ordered by ``owner_id`` then ``stream_seq`` (so each (owner, event type) batch is one
sorted run) into Parquet files under the staging table's partition ``interval_id=…/event_type=…``,
a new file after ``target_file_bytes`` of payload (or ``max_rows_per_file`` rows), row groups of
at most ``row_group_rows`` rows or ``row_group_bytes`` of payload. The files are then committed by
``staging_commits.commit_range`` or ``staging_commits.commit_batches``; until then no reader sees them.

Memory is bounded by ``buffer_bytes`` of buffered payload: past it, every event type's buffer is
sorted and spilled to a local Arrow IPC file (a sorted run, in ``spill_dir``); at the end the runs
of an event type are read through a memory map and merged by their sort keys (the keys and the
row order are in memory: about 16 bytes per row, plus the owner IDs), one row group at a time. The
files depend only on the messages and the size settings, not on when spills happened.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_provider_plgd.tables import file_records, staging, storage

#: File name prefix of the stager's spill files (``plgd-stage-{pid}-{random}-{n}.arrow``).
SPILL_PREFIX = "plgd-stage-"


@dataclass
class TypeSummary:
    """What one event type of a stager holds: ``count`` rows, ``bytes`` of payload, ``batches``
    (distinct owners), ``files`` written, ``first_seq``/``last_seq``."""

    count: int = 0
    bytes: int = 0
    batches: int = 0
    files: int = 0
    first_seq: int | None = None
    last_seq: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "bytes": self.bytes, "batches": self.batches, "files": self.files,
                "first_seq": self.first_seq, "last_seq": self.last_seq}


@dataclass
class _Buffer:
    owners: list[str] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    subjects: list[str] = field(default_factory=list)
    times: list[int] = field(default_factory=list)
    headers: list[Mapping[str, str] | None] = field(default_factory=list)
    datas: list[bytes] = field(default_factory=list)


class Stager:
    """Buffer one fetch task's messages by event type and write them as sorted staging files.

    :param stream: the ``stream`` column's value.
    :param spill_dir: local folder for the sorted runs spilled past ``buffer_bytes`` (created when needed).
    :param buffer_bytes: payload bytes kept in memory before spilling.
    :param target_file_bytes: payload bytes per file before the next one starts.
    :param max_rows_per_file: rows per file before the next one starts.
    :param row_group_rows: rows per Parquet row group. :param row_group_bytes: payload bytes per row group.
    :param compression: Parquet codec.
    :param count_only: keep no rows, only :attr:`summaries` (a retried task whose range is committed
        already counts what it reads; :meth:`summarize` then completes them).
    """

    def __init__(self, *, stream: str, spill_dir: str | None, buffer_bytes: int = 64 * 1024 * 1024,
                 target_file_bytes: int = staging.DEFAULT_TARGET_FILE_BYTES, max_rows_per_file: int = 1_000_000,
                 row_group_rows: int = 50_000, row_group_bytes: int = 32 * 1024 * 1024,
                 compression: str = "snappy", count_only: bool = False) -> None:
        self.stream = stream
        self.spill_dir = spill_dir
        self.buffer_bytes = int(buffer_bytes)
        self.target_file_bytes = int(target_file_bytes)
        self.max_rows_per_file = int(max_rows_per_file)
        self.row_group_rows = int(row_group_rows)
        self.row_group_bytes = int(row_group_bytes)
        self.compression = compression
        self._buffers: dict[str, _Buffer] = {}
        self._runs: dict[str, list[str]] = {}
        self.summaries: dict[str, TypeSummary] = {}
        self.pending_bytes = 0
        self.spills = 0
        self.written: list[str] = []  # data files written (URLs), to remove them when not committed
        self.count_only = count_only
        self._owner_sets: dict[str, set[str]] = {}  # count_only: owners per event type
        self._unique_owners: list[pa.Array] = []  # after write: the owners of each event type

    # -- filling --------------------------------------------------------------------------------
    @property
    def count(self) -> int:
        """Rows added."""
        return sum(s.count for s in self.summaries.values())

    def add(self, owner_id: str, event_type: str, messages: Sequence[Any]) -> None:
        """Add messages of one batch (``StreamMessage`` or ``(stream_seq, subject, time_ns, headers,
        data)`` tuples); spill when the buffered payload passes ``buffer_bytes``."""
        if not messages:
            return
        if self.count_only:
            self._count(owner_id, event_type, messages)
            return
        buf = self._buffers.get(event_type)
        if buf is None:
            buf = self._buffers[event_type] = _Buffer()
        summary = self.summaries.setdefault(event_type, TypeSummary())
        size = 0
        for seq, subject, time_ns, headers, data in messages:
            buf.owners.append(owner_id)
            buf.seqs.append(seq)
            buf.subjects.append(subject)
            buf.times.append(time_ns)
            buf.headers.append(headers)
            buf.datas.append(data)
            size += len(data)
        summary.count += len(messages)
        summary.bytes += size
        self.pending_bytes += size
        if self.pending_bytes > self.buffer_bytes:
            self.spill()

    def _count(self, owner_id: str, event_type: str, messages: Sequence[Any]) -> None:
        summary = self.summaries.setdefault(event_type, TypeSummary())
        self._owner_sets.setdefault(event_type, set()).add(owner_id)
        seqs = [m[0] for m in messages]
        summary.count += len(messages)
        summary.bytes += sum(len(m[4]) for m in messages)
        summary.first_seq = min(seqs) if summary.first_seq is None else min(summary.first_seq, *seqs)
        summary.last_seq = max(seqs) if summary.last_seq is None else max(summary.last_seq, *seqs)

    def summarize(self) -> None:
        """``count_only``: set each summary's ``batches`` (owners with messages of the event type)."""
        for event_type, owners in self._owner_sets.items():
            self.summaries[event_type].batches = len(owners)

    @property
    def owners(self) -> int:
        """Owners with messages (after :meth:`write`, or :meth:`summarize` when ``count_only``)."""
        if self.count_only:
            return len(set().union(*self._owner_sets.values())) if self._owner_sets else 0
        if not self._unique_owners:
            return 0
        return len(pc.unique(pa.chunked_array(self._unique_owners, pa.string())))

    def spill(self) -> None:
        """Write every buffer as a sorted run to ``spill_dir`` and empty the buffers."""
        if not self._buffers:
            return
        if not self.spill_dir:
            raise ValueError("the buffered messages pass buffer_bytes and no spill folder is set")

        with storage.io_error_with_path(None, self.spill_dir, "create the spill folder"):
            os.makedirs(self.spill_dir, exist_ok=True)
        for event_type, buf in sorted(self._buffers.items()):
            table = _sorted(self._table(buf))
            path = os.path.join(self.spill_dir, f"{SPILL_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}-{self.spills}.arrow")
            self._runs.setdefault(event_type, []).append(path)
            with storage.io_error_with_path(None, path, "write the spill file"), pa.OSFile(path, "wb") as sink, \
                    pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table, max_chunksize=self.row_group_rows)
        self.spills += 1
        self._buffers.clear()
        self.pending_bytes = 0

    def _table(self, buf: _Buffer) -> pa.Table:
        columns = staging.message_arrays(self.stream, buf.seqs, buf.subjects, buf.times, buf.headers, buf.datas)
        return pa.Table.from_arrays([*columns, pa.array(buf.owners, pa.string())], schema=staging.FILE_SCHEMA)

    # -- writing --------------------------------------------------------------------------------
    def write(self, table_uri: str, interval_id: str, prefix: str) -> list[dict[str, Any]]:
        """Write every event type's rows as files ``{table_uri}/interval_id=…/event_type=…/{prefix}-NNNNN.parquet``.

        :return: one ``file_records.file_record`` per file (path relative to the table), in
            event-type order; :attr:`summaries` gain ``batches`` and ``files``.
        """
        records: list[dict[str, Any]] = []
        for event_type in sorted(self.summaries):
            records += self._write_type(table_uri, interval_id, event_type, prefix)
        self._buffers.clear()
        self.pending_bytes = 0
        return records

    def _write_type(self, table_uri: str, interval_id: str, event_type: str, prefix: str) -> list[dict[str, Any]]:
        sources = []
        with contextlib.ExitStack() as stack:
            for path in self._runs.get(event_type, []):
                with storage.io_error_with_path(None, path, "read the spill file"):
                    source = stack.enter_context(pa.memory_map(path))
                    sources.append(pa.ipc.open_file(source).read_all())
            buf = self._buffers.get(event_type)
            if buf is not None and buf.seqs:
                sources.append(_sorted(self._table(buf)))
            if not sources:
                return []
            table = pa.concat_tables(sources) if len(sources) > 1 else sources[0]
            order = None if len(sources) == 1 else _sort_order(table)
            owners = table.column(staging.OWNER_COLUMN)
            summary = self.summaries[event_type]
            unique = pc.unique(owners)
            self._unique_owners.append(unique)
            summary.batches = len(unique)
            seqs = table.column("stream_seq")
            summary.first_seq, summary.last_seq = pc.min(seqs).as_py(), pc.max(seqs).as_py()
            lengths = pc.binary_length(table.column("data"))
            if order is not None:
                lengths = lengths.take(order)
            cum = list(accumulate(lengths.to_pylist()))
            folder = staging.partition_folder(interval_id, event_type)
            fs, base = storage.to_fs(table_uri)
            records: list[dict[str, Any]] = []
            file = None
            i, n = 0, len(cum)
            while i < n:
                if file is None:
                    name = f"{folder}/{prefix}-{len(records):05d}.parquet"
                    file = _File(fs, storage.join_path(base, name), name, self.compression)
                    self.written.append(storage.location_url(fs, file.path))
                start = cum[i - 1] if i else 0
                j = _group_end(cum, i, start, min(self.row_group_rows, self.max_rows_per_file - file.rows),
                               self.row_group_bytes, self.target_file_bytes - file.bytes)
                chunk = table.slice(i, j - i) if order is None else table.take(order[i:j])
                file.write(chunk, cum[j - 1] - start)
                i = j
                if file.bytes >= self.target_file_bytes or file.rows >= self.max_rows_per_file:
                    records.append(file.close(interval_id, event_type))
                    file = None
            if file is not None:
                records.append(file.close(interval_id, event_type))
            summary.files = len(records)
            return records

    def remove_written(self) -> None:
        """Delete the data files written (best effort: they are not committed, so no reader sees them)."""
        for url in self.written:
            with contextlib.suppress(Exception):
                fs, path = storage.to_fs(url)
                fs.rm(path)
        self.written.clear()

    def close(self) -> None:
        """Delete the spill files (best effort on error paths too)."""
        for paths in self._runs.values():
            for path in paths:
                with contextlib.suppress(FileNotFoundError), \
                        storage.io_error_with_path(None, path, "delete the spill file"):
                    os.unlink(path)
        self._runs.clear()

    def __enter__(self) -> Stager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _File:
    """One staging data file being written (pyarrow through fsspec)."""

    def __init__(self, fs: Any, path: str, name: str, compression: str) -> None:
        self.fs, self.path, self.name = fs, path, name
        self.rows = self.bytes = 0
        self.metadata: list[Any] = []
        with storage.io_error_with_path(fs, path, "open the staging file"):
            if storage.is_local(fs):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                self.sink = None
                where: Any = path
            else:
                self.sink = fs.open(path, "wb")
                where = self.sink
            self.writer = pq.ParquetWriter(
                where, staging.FILE_SCHEMA, compression=compression,
                use_dictionary=["stream", "subject", "msg_id", staging.OWNER_COLUMN],
                write_statistics=["stream", "stream_seq", "subject", "published_at", staging.OWNER_COLUMN],
                metadata_collector=self.metadata)

    def write(self, chunk: pa.Table, payload_bytes: int) -> None:
        with storage.io_error_with_path(self.fs, self.path, "write the staging file"):
            self.writer.write_table(chunk, row_group_size=max(chunk.num_rows, 1))
        self.rows += chunk.num_rows
        self.bytes += payload_bytes

    def close(self, interval_id: str, event_type: str) -> dict[str, Any]:
        with storage.io_error_with_path(self.fs, self.path, "close the staging file"):
            self.writer.close()
            if self.sink is not None:
                size = self.sink.tell()  # the bytes written, without asking the object store
                self.sink.close()
            else:
                size = os.path.getsize(self.path)
        return file_records.file_record(
            self.name, rows=self.rows, size=size,
            partition={staging.INTERVAL_COLUMN: interval_id, staging.EVENT_TYPE_COLUMN: event_type},
            stats=file_records.parquet_stats(self.metadata[0]))


def _sort_order(table: pa.Table) -> pa.Array:
    return pc.sort_indices(table.select([staging.OWNER_COLUMN, "stream_seq"]),
                           sort_keys=[(staging.OWNER_COLUMN, "ascending"), ("stream_seq", "ascending")])


def _sorted(table: pa.Table) -> pa.Table:
    return table.take(_sort_order(table))


def _group_end(cum: Sequence[int], i: int, start: int, max_rows: int, max_bytes: int, file_room: int) -> int:
    """End (exclusive) of the row group that starts at row ``i``: at most ``max_rows`` rows and
    ``max_bytes`` of payload (``cum``: cumulative payload, ``start`` the payload before row ``i``);
    within the file's room ``file_room`` (payload bytes to its target), plus the one row that
    fills it, so every file but the last holds at least the target. At least one row."""
    hi = min(len(cum), i + max(1, max_rows))
    j = bisect_right(cum, start + min(max_bytes, file_room), lo=i, hi=hi)
    if j < hi and file_room < max_bytes and cum[j] - start <= max_bytes:
        j += 1  # the row that passes the file's target: the file ends with it
    return max(j, i + 1)
