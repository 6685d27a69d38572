"""One bucket of a snapshot rebuild, on the Spark executors (pyarrow + fsspec, no Spark in the code).

The snapshot tables and their records are ``airflow_provider_plgd.tables.snapshot_store``. A rebuild
(``rebuild_job``) repartitions the new events by bucket, ``pmod(xxhash64(device_id), buckets)``
(Spark SQL, :data:`BUCKET_EXPR`; :func:`device_bucket` computes the same in Python), and each
reduce task runs :func:`rebuild_partition`: per bucket, :func:`rebuild_bucket` folds the events
into the bucket's previous state and writes the bucket's new files of every snapshot table.
"""

from __future__ import annotations

import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash

from airflow_provider_plgd.spark import fold

__all__ = [
    "BUCKET_EXPR",
    "BUCKET_RESULT_SCHEMA",
    "DEFAULT_BUCKETS",
    "device_bucket",
    "new_run_id",
    "rebuild_bucket",
    "rebuild_partition",
]

import json
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from airflow_provider_plgd.spark.parquet_io import write_parquet_file
from airflow_provider_plgd.tables import delta_tables, file_records, storage
from airflow_provider_plgd.tables.layout import Layout
from airflow_provider_plgd.tables.snapshot_store import (
    ALL_TABLES,
    STATE_TABLE,
    snapshot_table_uri,
    sort_keys,
)

DEFAULT_BUCKETS = 32
#: Spark SQL expression of the bucket of a row, given the bucket count.
BUCKET_EXPR = "pmod(xxhash64(device_id), {buckets})"
#: The seed of Spark SQL's ``xxhash64`` function.
SPARK_XXHASH64_SEED = 42


def spark_xxhash64(value: str) -> int:
    """Spark SQL ``xxhash64(value)`` of a string: a signed 64-bit int.

    Spark hashes a string as the XXH64 of its UTF-8 bytes with seed 42
    (``org.apache.spark.sql.catalyst.expressions.XxHash64``) and returns a Java ``long``; the
    ``xxhash`` wheel computes the same XXH64 (unsigned), so only the sign is converted here.
    """
    h = xxhash.xxh64_intdigest(value.encode("utf-8"), SPARK_XXHASH64_SEED)
    return h - (1 << 64) if h >= (1 << 63) else h


def device_bucket(device_id: str, buckets: int) -> int:
    """The bucket of a device: ``pmod(xxhash64(device_id), buckets)`` (:data:`BUCKET_EXPR`), in
    ``[0, buckets)``, computed in Python (no Spark SQL job).

    :raises ValueError: ``buckets`` < 1.
    """
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    return spark_xxhash64(device_id) % buckets


def new_run_id() -> str:
    """A fresh run ID (32 hex digits)."""
    return uuid.uuid4().hex


# ---------------------------------------------------------------------------------------------
# One bucket of a rebuild (runs on an executor: pyarrow + fsspec, no Spark)
# ---------------------------------------------------------------------------------------------

#: Result rows of :func:`rebuild_bucket`: one per table of the bucket, plus one ``_stats`` row.
BUCKET_RESULT_SCHEMA = pa.schema([
    pa.field("bucket", pa.int32()),
    pa.field("table", pa.string()),
    pa.field("file", pa.string()),          # path relative to the table folder; null = no rows
    pa.field("rows", pa.int64()),
    pa.field("size", pa.int64()),           # bytes of the file
    pa.field("stats", pa.string()),         # Delta file statistics (JSON, file_records.parquet_stats)
    pa.field("next_expiry_ns", pa.int64()),  # _device_state only: smallest pending valid_until
    pa.field("events", pa.int64()),          # _stats only: event rows folded
    pa.field("stats_json", pa.string()),     # _stats only: fold.FoldStats as JSON
])


def _read_parquet_files(paths: list[str], schema: pa.Schema) -> pa.Table:
    """The files ``paths`` (URLs or paths, named by the Delta log) read with ``schema`` and concatenated."""
    parts = []
    for url in paths:
        fs, path = storage.to_fs(url)
        with fs.open(path, "rb") as fh:
            parts.append(pq.read_table(fh, schema=schema))
    return pa.concat_tables(parts) if parts else schema.empty_table()


def rebuild_bucket(
    events: pa.Table,
    *,
    snapshots: Layout,
    run_id: str,
    old_files: Mapping[str, list[str]],
    table_schemas: Mapping[str, pa.Schema],
    snapshot_time_ns: int,
    bucket_column: str = "_bucket",
    device_column: str = "_device",
    bucket: int | None = None,
) -> pa.Table:
    """Rebuild one bucket: fold its touched devices and write one new file per table.

    Runs in the reduce tasks of ``rebuild_snapshots`` (:func:`rebuild_partition`).

    :param events: the bucket's new ``events`` rows plus ``bucket_column`` (int) and
        ``device_column`` (the device a row applies to; null on the marker row that
        ``rebuild_snapshots`` adds for a bucket without events whose pendings expire).
    :param snapshots: where the snapshot tables are (``{root}/snapshots/{table}``).
    :param run_id: this run's ID: the files are ``bucket={b}/part-{run_id}.parquet``.
    :param old_files: ``{table: [file URLs]}``: the base snapshot's files of this bucket.
    :param table_schemas: ``{table: schema}`` for :data:`ALL_TABLES`.
    :param snapshot_time_ns: the snapshot time (unix ns).
    :param bucket: the bucket number (default: ``bucket_column`` of the first event row; needed
        when ``events`` is empty).
    :return: :data:`BUCKET_RESULT_SCHEMA` rows: per table the written file (null when the bucket
        has no rows of that table any more), its row count, size and Delta stats and, for
        ``_device_state``, the bucket's smallest pending ``valid_until``; and a ``_stats`` row.

    Touched devices = devices with new events + devices whose ``next_expiry_ns`` is before the
    snapshot time. Only their states are parsed and folded (``fold.fold_bucket_arrow``); every
    other row of the bucket is copied with Arrow (``pyarrow.compute.is_in``), never parsed.
    """
    bucket = int(events.column(bucket_column)[0].as_py()) if bucket is None else int(bucket)
    events = events.filter(pc.is_valid(events.column(device_column)))
    old = {t: _read_parquet_files(list(old_files.get(t, [])), table_schemas[t]) for t in ALL_TABLES}
    state = old[STATE_TABLE]
    expiring = pc.less(state.column("next_expiry_ns"), pa.scalar(snapshot_time_ns, pa.int64()))
    touched = pa.concat_arrays([
        events.column(device_column).combine_chunks().cast(pa.string()),
        state.filter(pc.fill_null(expiring, False)).column("device_id").combine_chunks(),
    ]).unique()
    in_touched = pc.is_in(state.column("device_id"), value_set=touched)
    folded = fold.fold_bucket_arrow(events, state.filter(in_touched), snapshot_time_ns=snapshot_time_ns,
                                    table_schemas=table_schemas, bucket_column=bucket_column,
                                    device_column=device_column, bucket=bucket)
    kinds = folded.column("table")
    results: list[dict[str, Any]] = []
    for table in ALL_TABLES:
        schema = table_schemas[table]
        mine = folded.filter(pc.equal(kinds, table)).column(table).combine_chunks()
        new_rows = pa.Table.from_arrays(mine.flatten(), schema=schema) if len(mine) else schema.empty_table()
        keep = pc.invert(pc.is_in(old[table].column("device_id"), value_set=touched))
        merged = pa.concat_tables([old[table].filter(keep), new_rows])
        merged = merged.sort_by([(k, "ascending") for k in sort_keys(table)])
        rel = size = stats = None
        if merged.num_rows:
            rel = f"{delta_tables.BUCKET_COLUMN}={bucket}/part-{run_id}.parquet"
            fs, base = storage.to_fs(snapshot_table_uri(snapshots, table))
            size, metadata = write_parquet_file(fs, f"{base}/{rel}", merged)
            stats = json.dumps(file_records.parquet_stats(metadata), sort_keys=True, default=str)
        expiry = None
        if table == STATE_TABLE and merged.num_rows:
            expiry = pc.min(merged.column("next_expiry_ns")).as_py()
        results.append({"bucket": bucket, "table": table, "file": rel, "rows": merged.num_rows, "size": size,
                        "stats": stats, "next_expiry_ns": expiry, "events": None, "stats_json": None})
    stats_rows = folded.filter(pc.equal(kinds, "_stats")).column("stats_json").to_pylist()
    results.append({"bucket": bucket, "table": "_stats", "file": None, "rows": None, "size": None, "stats": None,
                    "next_expiry_ns": None, "events": events.num_rows,
                    "stats_json": stats_rows[0] if stats_rows else "{}"})
    return pa.Table.from_pylist(results, schema=BUCKET_RESULT_SCHEMA)


def rebuild_partition(batches, *, bucket_column: str = "_bucket", extra_buckets: Iterable[int] = (), **kwargs):
    """Reduce-task body of ``rebuild_snapshots``: one Spark partition (holding whole buckets,
    after ``repartition(n, bucket)``) -> :data:`BUCKET_RESULT_SCHEMA` batches.

    Gathers the partition's batches, then runs :func:`rebuild_bucket` once per bucket value
    (``kwargs`` except ``old_files_by_bucket`` are passed on; ``old_files_by_bucket`` maps a
    bucket to its ``old_files``). Grouping here instead of ``groupBy().applyInArrow`` saves
    Spark's sort of every event row. ``extra_buckets`` are rebuilt too when no event of the
    partition names them (buckets whose pendings expire; ``rebuild_input`` passes them, the
    Spark oracle of tests/integration/test_dedupe_rebuild.py adds a marker row instead).
    """
    old_by_bucket = kwargs.pop("old_files_by_bucket")
    device_column = kwargs.pop("device_column", "_device")
    batches = list(batches)
    table = pa.Table.from_batches(batches) if batches else None
    if table is None or not table.num_rows:
        table = pa.table({bucket_column: pa.array([], pa.int32()), device_column: pa.array([], pa.string())})
    buckets = table.column(bucket_column)
    present = {b for b in pc.unique(buckets).to_pylist() if b is not None}
    for bucket in sorted(present | {int(b) for b in extra_buckets}):
        part = table.filter(pc.equal(buckets, bucket)) if bucket in present else table.slice(0, 0)
        result = rebuild_bucket(part, old_files=old_by_bucket.get(bucket, {}), bucket_column=bucket_column,
                                device_column=device_column, bucket=bucket, **kwargs)
        yield from result.to_batches()
