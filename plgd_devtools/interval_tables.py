"""Interval tables without Spark, for tests and benchmarks of table maintenance and the status view.

Simulated plgd traffic (``airflow_provider_plgd.simulator``) is decoded with the decode
application's own batch decoder (``spark.decode_batch.decode_batch_parts``) and committed with the
project's commit functions (``delta_tables.commit_interval``), in the layout the Spark applications
write: ``events`` and ``events_deduped`` with ``files_per_partition`` files per (interval, event
type) (one per Spark task), ``quarantine`` one file per interval when it has rows, ``msgid_index``
one file per msg-ID bucket. The snapshot chain's head is recorded like ``rebuild_snapshots`` does
(a ``_device_state`` commit whose metadata is the snapshot record), without snapshot rows: the
maintenance and status code read only the record.

Not in the wheel (``plgd_devtools``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_plgd import times
from airflow_provider_plgd.spark import schemas, snapshot_buckets
from airflow_provider_plgd.spark.decode_batch import decode_batch_parts
from airflow_provider_plgd.spark.dedupe_job import MSGID_BUCKETS, MSGID_INDEX_SCHEMA, msgid_bucket
from airflow_provider_plgd.spark.parquet_io import write_parquet_file
from airflow_provider_plgd.tables import delta_tables, file_records
from airflow_provider_plgd.tables import snapshot_store as ss
from airflow_provider_plgd.tables.layout import Layout, StorageRoot
from airflow_provider_plgd.tables.storage import to_fs

#: Staging columns the decoder reads.
_STAGING = pa.schema([("stream", pa.string()), ("stream_seq", pa.int64()), ("subject", pa.string()),
                      ("published_at", pa.timestamp("us", tz="UTC")), ("msg_id", pa.string()),
                      ("data", pa.binary())])


def interval_ids(sim) -> list[str]:
    """The interval IDs of a simulation's intervals, in order."""
    config = sim.config
    step = int(config.interval_seconds * 1e9)
    return [times.interval_id(config.start_time_ns + k * step, config.start_time_ns + (k + 1) * step)
            for k in range(config.intervals)]


def decoded_intervals(sim, *, stream: str = "EVENTS") -> dict[int, tuple[pa.Table, pa.Table]]:
    """``{interval index: (events rows, quarantine rows)}`` of a simulation, decoded like decode
    does (stream sequences = publish order, ``published_at`` = the event's own timestamp)."""
    ids = interval_ids(sim)
    by_interval: dict[int, list[int]] = {}
    for i, message in enumerate(sim.messages):
        by_interval.setdefault(message.interval, []).append(i)
    out: dict[int, tuple[pa.Table, pa.Table]] = {}
    for k in range(sim.config.intervals):
        idx = by_interval.get(k, [])
        msgs = [sim.messages[i] for i in idx]
        batch = pa.RecordBatch.from_pydict({
            "stream": [stream] * len(msgs), "stream_seq": [i + 1 for i in idx],
            "subject": [m.subject for m in msgs], "published_at": [m.timestamp_ns // 1000 for m in msgs],
            "msg_id": [None] * len(msgs), "data": [m.data for m in msgs]}, schema=_STAGING)
        parts = decode_batch_parts(batch, ids[k])
        union = pa.Table.from_batches(parts, schema=schemas.UNION_SCHEMA) if parts else \
            schemas.UNION_SCHEMA.empty_table()
        is_event = pc.is_valid(union.column("event_type"))
        events = union.filter(is_event).select(schemas.EVENTS_SCHEMA.names).cast(schemas.EVENTS_SCHEMA)
        quarantine = union.filter(pc.invert(is_event)).select(schemas.QUARANTINE_SCHEMA.names) \
            .cast(schemas.QUARANTINE_SCHEMA)
        out[k] = (events, quarantine)
    return out


def _write(uri: str, rows: pa.Table, partition: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Write ``rows`` (without the partition columns) as one file of the table at ``uri``."""
    fs, base = to_fs(uri)
    rel = "/".join(f"{k}={v}" for k, v in partition.items()) + f"/{name}"
    data = rows.drop_columns([c for c in partition if c in rows.column_names])
    size, meta = write_parquet_file(fs, f"{base}/{rel}", data)
    return file_records.file_record(rel, rows=rows.num_rows, size=size, partition=partition,
                                    stats=file_records.parquet_stats(meta))


def _split(rows: pa.Table, parts: int) -> list[pa.Table]:
    """``rows`` cut into ``parts`` contiguous slices (fewer when there are fewer rows)."""
    n = rows.num_rows
    parts = max(1, min(parts, n))
    bounds = [round(i * n / parts) for i in range(parts + 1)]
    return [rows.slice(a, b - a) for a, b in itertools.pairwise(bounds) if b > a]


def _by_type(uri: str, rows: pa.Table, interval_id: str, files: int, write_id: str) -> list[dict[str, Any]]:
    records = []
    for event_type in sorted(set(rows.column("event_type").to_pylist())):
        mine = rows.filter(pc.equal(rows.column("event_type"), event_type))
        for task, part in enumerate(_split(mine, files)):
            records.append(_write(uri, part, {"interval_id": interval_id, "event_type": event_type},
                                  f"part-{task:05d}-{write_id}.parquet"))
    return records


def commit_interval_tables(root: StorageRoot, interval_id: str, events: pa.Table, quarantine: pa.Table, *,
                           files_per_partition: int = 2, run_version: int | None = None,
                           dedupe: bool = True) -> dict[str, int | None]:
    """Commit one interval to ``events`` + ``quarantine`` (app ``decode``) and, when ``dedupe``,
    to ``msgid_index`` + ``events_deduped`` (app ``dedupe``: the first row of each message ID
    kept), as the Spark applications lay them out. :return: ``{table: Delta version}``."""
    run_version = time.time_ns() // 1000 if run_version is None else run_version
    write_id = f"{run_version:x}"
    layout = Layout.of(root)
    uri = {name: delta_tables.interval_table_uri(layout, name) for name in delta_tables.INTERVAL_TABLES}
    ev = _by_type(uri[delta_tables.EVENTS], events, interval_id, files_per_partition, write_id)
    q = [_write(uri[delta_tables.QUARANTINE], quarantine, {"interval_id": interval_id},
                f"part-00000-{write_id}.parquet")] if quarantine.num_rows else []
    meta = {"interval_id": interval_id, "run_version": run_version}
    commits = delta_tables.commit_interval("decode", interval_id, [
        (delta_tables.EVENTS, uri[delta_tables.EVENTS], schemas.EVENTS_SCHEMA, ev, events.num_rows),
        (delta_tables.QUARANTINE, uri[delta_tables.QUARANTINE], schemas.QUARANTINE_SCHEMA, q, quarantine.num_rows),
    ], run_version=run_version, metadata=meta)
    if not dedupe:
        return {name: c.version for name, c in commits.items()}
    seen: set[str] = set()
    keep = []
    for i, msg_id in enumerate(events.column("msg_id").to_pylist()):
        if msg_id not in seen:
            seen.add(msg_id)
            keep.append(i)
    kept = events.take(pa.array(keep, pa.int64()))
    ids = sorted(seen)
    buckets = [msgid_bucket(m) for m in ids]
    # a null content_digest: the ID stands for every content (as an index written before the digest)
    index = pa.table({"msg_id": ids, "content_digest": [None] * len(ids), "interval_id": [interval_id] * len(ids),
                      "bucket": buckets}, schema=MSGID_INDEX_SCHEMA)
    idx = []
    for b in range(MSGID_BUCKETS):
        rows = index.filter(pc.equal(index.column("bucket"), b))
        if rows.num_rows:
            idx.append(_write(uri[delta_tables.MSGID_INDEX], rows, {"interval_id": interval_id, "bucket": b},
                              f"part-{b:05d}-{write_id}.parquet"))
    dd = _by_type(uri[delta_tables.EVENTS_DEDUPED], kept, interval_id, files_per_partition, write_id)
    commits.update(delta_tables.commit_interval("dedupe", interval_id, [
        (delta_tables.MSGID_INDEX, uri[delta_tables.MSGID_INDEX], MSGID_INDEX_SCHEMA, idx, index.num_rows),
        (delta_tables.EVENTS_DEDUPED, uri[delta_tables.EVENTS_DEDUPED], schemas.EVENTS_SCHEMA, dd, kept.num_rows),
    ], run_version=run_version, metadata=meta))
    return {name: c.version for name, c in commits.items()}


def commit_snapshot_record(root: StorageRoot, interval_id: str, intervals: Sequence[str], *,
                           parent: str | None = None) -> str:
    """Record a snapshot that folded ``intervals`` (newest ``interval_id``) as the chain's head:
    a ``_device_state`` commit carrying the snapshot record (no rows). :return: its version."""
    end_ns = times.parse_interval_id(interval_id)["end_ns"]
    version = ss.version_id(end_ns)
    record = {"snapshot": version, "snapshot_time_ns": end_ns, "snapshot_time": times.ns_to_rfc3339(end_ns),
              "parent": parent, "run_id": snapshot_buckets.new_run_id(), "interval_id": interval_id,
              "intervals": list(intervals), "buckets": 1, "rows": {}, "delta_versions": {}}
    delta_tables.commit_files(ss.snapshot_table_uri(Layout.of(root), ss.STATE_TABLE), [], schema=ss.delta_schema(ss.STATE_TABLE),
                              partition_by=(delta_tables.BUCKET_COLUMN,), replace=[], metadata=record,
                              app_id=f"test.snapshot/{version}", run_version=time.time_ns())
    return version


def build_chain(root: StorageRoot, sim, *, files_per_partition: int = 2, snapshot_through: int | None = None,
                skip: Iterable[int] = ()) -> list[str]:
    """Commit every interval of ``sim`` (except ``skip``) and record the snapshot head at
    ``snapshot_through`` (default the last interval). :return: the interval IDs, in order."""
    ids = interval_ids(sim)
    skipped = set(skip)
    decoded = decoded_intervals(sim)
    done = []
    for k, interval_id in enumerate(ids):
        if k in skipped:
            continue
        events, quarantine = decoded[k]
        commit_interval_tables(root, interval_id, events, quarantine, files_per_partition=files_per_partition)
        done.append(interval_id)
    head = len(ids) - 1 if snapshot_through is None else snapshot_through
    if head >= 0:
        commit_snapshot_record(root, ids[head], [i for i in done if i <= ids[head]])
    return ids
