"""The snapshot tables: Delta tables under ``{root}/snapshots/``, copy-on-write by bucket.

Layout below the storage root (a local path or any fsspec URL;
``airflow_provider_plgd.tables.delta_tables`` owns the names)::

    {root}/snapshots/{table}/_delta_log/...                       the Delta log of each table
    {root}/snapshots/{table}/bucket={b}/part-{run_id}.parquet     data files

* Tables: the four public tables of ``docs/data-contracts.md`` (columns from
  ``airflow_provider_plgd.plgd.tables``) and the internal :data:`STATE_TABLE` (one row per device:
  the serialised fold state of :mod:`airflow_provider_plgd.spark.fold`, see :data:`STATE_SCHEMA`).
  Each has one more column, the partition column ``bucket`` (int):
  ``pmod(xxhash64(device_id), buckets)`` (Spark SQL; :data:`BUCKET_EXPR`). All rows of a device,
  in every table, are in the same bucket.
* A rebuild rewrites only the buckets its new events touch (plus buckets with pendings that expire
  by the new snapshot time): one Delta commit per table, ``overwrite`` with the partition filter
  ``bucket in (...)``; every other bucket's files stay (carried over by the log).
* **A snapshot version** (``YYYYMMDDTHHMMSSZ``, the snapshot time; :func:`version_id`) is one Delta
  version of each table. The public tables are committed first and ``_device_state`` last: its
  commit is the snapshot's commit. Its ``commitInfo`` carries the snapshot record under ``plgd``
  (:func:`latest`, :func:`snapshot`)::

    {"snapshot": str (version), "snapshot_time_ns": int, "snapshot_time": ISO str,
     "parent": str | null, "run_id": str, "interval_id": str (newest interval folded),
     "intervals": [str] (folded by this rebuild),
     "inputs": {interval: {"rows", "sha256"}} (what was folded of each, ``rebuild_job.input_fingerprint``),
     "buckets": int, "bucket_expr": str, "next_expiry_ns": {"<bucket>": int} (smallest pending
     valid_until per bucket), "rows": {table: int}, "delta_versions": {table: int}, "stats": {...}}

  The public tables' commits carry ``{"snapshot", "snapshot_time", "interval_id", "run_id"}``.
* A rebuild killed between its commits leaves the snapshot record of ``_device_state`` at the
  previous snapshot; the next rebuild builds on that one and rewrites every bucket that differs
  from it (``rebuild_job``).
* Retention: ``DeltaTable.vacuum`` (``delta_tables.vacuum``) after each rebuild, default 168 h.

Readers: :func:`read_snapshot` (``deltalake``, thin), Spark ``format("delta")``, Trino, DuckDB,
Polars (``docs/snapshots.md``).
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any, Iterable, Mapping

import pyarrow as pa

from airflow_provider_plgd import times
from airflow_provider_plgd.tables import delta_tables, file_records, storage
from airflow_provider_plgd.tables.layout import Layout
from airflow_provider_plgd.plgd import tables as snapshot_tables
from airflow_provider_plgd.spark.parquet_io import write_parquet_file

__all__ = [
    "ALL_TABLES",
    "BUCKET_EXPR",
    "DEFAULT_BUCKETS",
    "PUBLIC_TABLES",
    "STATE_SCHEMA",
    "STATE_TABLE",
    "device_bucket",
    "latest",
    "latest_snapshot",
    "read_snapshot",
    "read_table",
    "roll_back",
    "snapshot",
    "snapshot_table_uri",
    "table_schema",
    "version_id",
]

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
    import xxhash

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

#: The four public tables of ``docs/data-contracts.md``: resources, device_metadata, device_links,
#: owner_devices (order and columns from ``airflow_provider_plgd.plgd.tables``).
PUBLIC_TABLES: tuple[str, ...] = tuple(snapshot_tables.SNAPSHOT_TABLES)
#: The internal per-device fold state (not part of the public contract).
STATE_TABLE = "_device_state"
ALL_TABLES: tuple[str, ...] = PUBLIC_TABLES + (STATE_TABLE,)

#: ``_device_state`` rows: ``device_id``; ``next_expiry_ns`` = smallest non-zero ``valid_until``
#: of the device's open pendings (unix ns, null = none); ``state_json`` = ``fold.dumps_state``.
STATE_SCHEMA = pa.schema([
    pa.field("device_id", pa.string(), nullable=False),
    pa.field("next_expiry_ns", pa.int64()),
    pa.field("state_json", pa.string(), nullable=False),
])


def table_schema(table: str) -> pa.Schema:
    """Arrow schema of snapshot table ``table`` (public tables: ``docs/data-contracts.md``).

    :raises ValueError: unknown table name.
    """
    if table == STATE_TABLE:
        return STATE_SCHEMA
    return snapshot_tables.snapshot_schema(table)


def sort_keys(table: str) -> tuple[str, ...]:
    """Columns that identify a row of ``table``; files are sorted by them.

    :raises ValueError: unknown table name.
    """
    if table == STATE_TABLE:
        return ("device_id",)
    keys = snapshot_tables.SNAPSHOT_SORT_KEYS
    if table not in keys:
        raise ValueError(f"unknown snapshot table {table!r}; expected one of {list(ALL_TABLES)}")
    return keys[table]


# ---------------------------------------------------------------------------------------------
# Names and paths
# ---------------------------------------------------------------------------------------------

def version_id(snapshot_time_ns: int) -> str:
    """Snapshot version of a snapshot time (unix ns): ``YYYYMMDDTHHMMSSZ`` (+ ``.ffffff`` or
    ``.fffffffff`` when there is a fraction), UTC; sorts like the time. Same format as the
    sides of an interval ID (``airflow_provider_plgd.times.compact_time``).

    :raises ValueError: negative times.
    """
    if snapshot_time_ns < 0:
        raise ValueError(f"snapshot time must be >= 0 ns, got {snapshot_time_ns}")
    return times.compact_time(snapshot_time_ns)




def snapshot_table_uri(root: str | Layout, table: str) -> str:
    """``{root}/snapshots/{table}``: the Delta table of a snapshot table.

    :raises ValueError: not a snapshot table.
    """
    if table not in ALL_TABLES:
        raise ValueError(f"unknown snapshot table {table!r}; expected one of {list(ALL_TABLES)}")
    return Layout.at(root).snapshot_table(table)


def delta_schema(table: str) -> pa.Schema:
    """The Delta table's schema: :func:`table_schema` plus the partition column ``bucket`` (int32)."""
    return table_schema(table).append(pa.field(delta_tables.BUCKET_COLUMN, pa.int32()))


def new_run_id() -> str:
    """A fresh run ID (32 hex digits)."""
    return uuid.uuid4().hex


# ---------------------------------------------------------------------------------------------
# Snapshot records (the commit metadata of _device_state)
# ---------------------------------------------------------------------------------------------

def _records(root: str) -> list[dict[str, Any]]:
    """The snapshot records of ``_device_state``'s commits, newest first: the commit metadata with
    ``version`` = the snapshot version and ``delta_version`` = the Delta version of the commit."""
    return [{**c, "version": c["snapshot"], "delta_version": c["version"]}
            for c in delta_tables.commits(snapshot_table_uri(root, STATE_TABLE)) if c.get("snapshot")]


def latest(root: str) -> dict[str, Any] | None:
    """The record of the latest snapshot (module docstring), or None when there is none yet."""
    state = delta_tables.open_table(snapshot_table_uri(root, STATE_TABLE))
    if state is None:
        return None
    limit = 8
    while True:  # the newest commits first; a vacuum adds commits without a record
        entries = state.history(limit=limit)
        for entry in entries:
            meta = delta_tables.commit_metadata(entry)
            if meta.get("snapshot"):
                return {**meta, "version": meta["snapshot"], "delta_version": int(entry["version"])}
        if len(entries) < limit:
            return None
        limit *= 4


def latest_snapshot(root: str) -> dict[str, Any] | None:
    """The public name of :func:`latest`: the latest snapshot's record (``version``,
    ``snapshot_time``, ``interval_id``, ``rows``, ``delta_versions`` …), or None."""
    return latest(root)


def snapshot(root: str, version: str) -> dict[str, Any] | None:
    """The record of snapshot ``version`` (``YYYYMMDDTHHMMSSZ``), or None when the log no longer has it."""
    return next((r for r in _records(root) if r["snapshot"] == version), None)


def snapshot_folding(root: str, interval_id: str) -> dict[str, Any] | None:
    """The record of the snapshot that folded ``interval_id`` (its ``intervals`` name it), or None."""
    return next((r for r in _records(root) if interval_id in (r.get("intervals") or [])), None)


def bucket_files(root: str, table: str, delta_version: int | None) -> dict[int, list[str]]:
    """``{bucket: [file URLs]}`` of ``table`` at Delta version ``delta_version`` (None: no files)."""
    if delta_version is None:
        return {}
    found: dict[int, list[str]] = {}
    for f in delta_tables.table_files(snapshot_table_uri(root, table), version=int(delta_version)):
        bucket = f.partition[delta_tables.BUCKET_COLUMN]  # never null: written by this module
        found.setdefault(int(bucket), []).append(f.url)  # type: ignore[arg-type]
    return found


def roll_back(root: str, version: str) -> dict[str, Any]:
    """Make snapshot ``version`` the latest again: ``DeltaTable.restore`` of each public table to the
    Delta version its record names, then of ``_device_state`` with the record as the restore
    commit's metadata (docs/operations.md, "Backfill and reruns"). Later snapshots stay readable by time travel
    until a vacuum; a rebuild of the next interval then builds on ``version``.

    :return: the record of ``version`` (as :func:`latest` now returns it).
    :raises ValueError: no snapshot ``version`` in the Delta log.
    """
    from deltalake.transaction import CommitProperties

    record = snapshot(root, version)
    if record is None:
        raise ValueError(f"no snapshot version {version!r} in the Delta log of {snapshot_table_uri(root, STATE_TABLE)}")
    for table in PUBLIC_TABLES:
        delta_tables.open_table(snapshot_table_uri(root, table)).restore(int(record["delta_versions"][table]))
    meta = {k: v for k, v in record.items() if k not in ("version", "delta_version", "timestamp")}
    delta_tables.open_table(snapshot_table_uri(root, STATE_TABLE)).restore(
        int(record["delta_version"]),
        commit_properties=CommitProperties(custom_metadata={delta_tables.METADATA_KEY: json.dumps(meta)}))
    restored = latest(root)
    assert restored is not None and restored["version"] == version
    return restored


# ---------------------------------------------------------------------------------------------
# Readers (deltalake; no Spark)
# ---------------------------------------------------------------------------------------------

def read_table(root: str, table: str, record: Mapping[str, Any] | None = None) -> pa.Table:
    """Read snapshot table ``table`` into a ``pyarrow.Table`` with ``deltalake``.

    :param root: storage root (path or fsspec URL).
    :param table: one of :data:`PUBLIC_TABLES` (or :data:`STATE_TABLE`).
    :param record: a snapshot record (default: the latest snapshot's).
    :return: the rows, with :func:`table_schema` ``(table)`` (without ``bucket``), sorted by
        :func:`sort_keys`; an empty table when there is no snapshot yet.
    """
    schema = table_schema(table)
    if record is None:
        record = latest(root)
    if record is None:
        return schema.empty_table()
    version = (record.get("delta_versions") or {}).get(table, record.get("delta_version")) \
        if table != STATE_TABLE else record.get("delta_version")
    dt = delta_tables.open_table(snapshot_table_uri(root, table), None if version is None else int(version))
    if dt is None:
        return schema.empty_table()
    result = pa.table(dt.to_pyarrow_table())
    result = result.select([n for n in schema.names]).cast(schema)
    return result.sort_by([(k, "ascending") for k in sort_keys(table)])


def read_snapshot(root: str, table: str, version: str | None = None, *, as_of: datetime | None = None) -> pa.Table:
    """The public reader of the snapshot tables: ``table`` of snapshot ``version`` (default: the
    latest) as a ``pyarrow.Table`` (columns: ``docs/data-contracts.md``), a thin wrapper over
    ``deltalake.DeltaTable(..., version=...)``.

    :param root: storage root (path or fsspec URL, e.g. ``s3://bucket/plgd``).
    :param table: one of :data:`PUBLIC_TABLES`.
    :param version: a snapshot version (``YYYYMMDDTHHMMSSZ``); None = the latest.
    :param as_of: instead of ``version``: the latest snapshot whose snapshot time is at or before
        this aware datetime.
    :return: the rows sorted by :func:`sort_keys`; empty when there is no snapshot yet.
    :raises ValueError: unknown table, no snapshot ``version``, or none at ``as_of``.
    """
    if table not in PUBLIC_TABLES:
        raise ValueError(f"unknown snapshot table {table!r}; expected one of {list(PUBLIC_TABLES)}")
    record = None
    if as_of is not None:
        limit = times.to_ns(as_of, "as_of")
        record = next((r for r in _records(root) if int(r["snapshot_time_ns"]) <= limit), None)
        if record is None:
            raise ValueError(f"no snapshot at or before {as_of.isoformat()} under {root}/snapshots")
    elif version is not None:
        record = snapshot(root, version)
        if record is None:
            raise ValueError(f"no snapshot version {version!r} under {root}/snapshots")
    return read_table(root, table, record)




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
    import pyarrow.parquet as pq

    parts = []
    for url in paths:
        fs, path = storage.to_fs(url)
        with fs.open(path, "rb") as fh:
            parts.append(pq.read_table(fh, schema=schema))
    return pa.concat_tables(parts) if parts else schema.empty_table()


def rebuild_bucket(
    events: pa.Table,
    *,
    root: str,
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
    :param root: the storage root (path or fsspec URL; the tables are ``{root}/snapshots/{table}``).
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
    import pyarrow.compute as pc

    from airflow_provider_plgd.spark import fold

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
            fs, base = storage.to_fs(snapshot_table_uri(root, table))
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
    import pyarrow.compute as pc

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
