"""The snapshot tables: Delta tables under ``{root}/snapshots/``, copy-on-write by bucket.

Layout below the storage root (a local path or any fsspec URL; :class:`~airflow_provider_plgd.tables.layout.Layout`
owns the paths)::

    {root}/snapshots/{table}/_delta_log/...                       the Delta log of each table
    {root}/snapshots/{table}/bucket={b}/part-{run_id}.parquet     data files

* Tables: the four public tables of ``docs/data-contracts.md`` (columns from
  ``airflow_provider_plgd.plgd.tables``) and the internal :data:`STATE_TABLE` (one row per device:
  the serialised fold state of :mod:`airflow_provider_plgd.spark.fold`, see :data:`STATE_SCHEMA`).
  Each has one more column, the partition column ``bucket`` (int):
  ``pmod(xxhash64(device_id), buckets)`` (Spark SQL; ``spark.snapshot_buckets.BUCKET_EXPR``). All
  rows of a device, in every table, are in the same bucket.
* A rebuild rewrites only the buckets its new events touch (plus buckets with pendings that expire
  by the new snapshot time): one Delta commit per table, ``overwrite`` with the partition filter
  ``bucket in (...)``; every other bucket's files stay (carried over by the log). The buckets are
  built on the executors by ``spark.snapshot_buckets``.
* **A snapshot version** (``YYYYMMDDTHHMMSSZ``, the snapshot time; :func:`version_id`) is one Delta
  version of each table. The public tables are committed first and ``_device_state`` last: its
  commit is the snapshot's commit. Its ``commitInfo`` carries the snapshot record under ``plgd``
  (:func:`latest`, :func:`snapshot`)::

    {"snapshot": str (version), "snapshot_time_ns": int, "snapshot_time": ISO str,
     "parent": str | null, "run_id": str, "interval_id": str (newest interval folded),
     "intervals": [str] (folded by this rebuild),
     "inputs": {interval: {"rows", "ids", "digest"}} (what was folded of each, by content: ``rebuild_job.input_fingerprint``),
     "supersedes": str | null (the latest snapshot before a repair in place), "run_version": int (ms),
     "buckets": int, "bucket_expr": str, "next_expiry_ns": {"<bucket>": int} (smallest pending
     valid_until per bucket), "rows": {table: int}, "delta_versions": {table: int}, "stats": {...}}

  The public tables' commits carry ``{"snapshot", "snapshot_time", "interval_id", "run_id"}``.
* A rebuild killed between its commits leaves the snapshot record of ``_device_state`` at the
  previous snapshot; the next rebuild builds on that one and rewrites every bucket that differs
  from it (``rebuild_job``).
* Retention: ``DeltaTable.vacuum`` (``delta_tables.vacuum``) after each rebuild, default 168 h.

Readers: :func:`read_snapshot` (``deltalake``, thin), Spark ``format("delta")``, Trino, DuckDB,
Polars (``docs/snapshots.md``). This module imports no Spark.
"""

from __future__ import annotations

__all__ = [
    "ALL_TABLES",
    "PUBLIC_TABLES",
    "STATE_SCHEMA",
    "STATE_TABLE",
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

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import pyarrow as pa

from airflow_provider_plgd import times
from airflow_provider_plgd.plgd import tables as snapshot_tables
from airflow_provider_plgd.tables import delta_tables
from airflow_provider_plgd.tables.layout import Layout, StorageRoot

#: The four public tables of ``docs/data-contracts.md``: resources, device_metadata, device_links,
#: owner_devices (order and columns from ``airflow_provider_plgd.plgd.tables``).
PUBLIC_TABLES: tuple[str, ...] = tuple(snapshot_tables.SNAPSHOT_TABLES)
#: The internal per-device fold state (not part of the public contract).
STATE_TABLE = "_device_state"
ALL_TABLES: tuple[str, ...] = (*PUBLIC_TABLES, STATE_TABLE)

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




def snapshot_table_uri(layout: Layout, table: str) -> str:
    """``{root}/snapshots/{table}``: the Delta table of a snapshot table.

    :raises ValueError: not a snapshot table.
    """
    if table not in ALL_TABLES:
        raise ValueError(f"unknown snapshot table {table!r}; expected one of {list(ALL_TABLES)}")
    return layout.snapshot_table(table)



def delta_schema(table: str) -> pa.Schema:
    """The Delta table's schema: :func:`table_schema` plus the partition column ``bucket`` (int32)."""
    return table_schema(table).append(pa.field(delta_tables.BUCKET_COLUMN, pa.int32()))



# ---------------------------------------------------------------------------------------------
# Snapshot records (the commit metadata of _device_state)
# ---------------------------------------------------------------------------------------------

def _records(layout: Layout) -> list[dict[str, Any]]:
    """The snapshot records of ``_device_state``'s commits, newest first: the commit metadata with
    ``version`` = the snapshot version and ``delta_version`` = the Delta version of the commit."""
    return [{**c, "version": c["snapshot"], "delta_version": c["version"]}
            for c in delta_tables.commits(snapshot_table_uri(layout, STATE_TABLE)) if c.get("snapshot")]


def latest(layout: Layout) -> dict[str, Any] | None:
    """The record of the latest snapshot (module docstring), or None when there is none yet."""
    state = delta_tables.open_table(snapshot_table_uri(layout, STATE_TABLE))
    if state is None:
        return None
    # the newest commits first; a vacuum adds commits without a record
    for entry, meta in delta_tables.history_newest_first(state, first=8):
        if meta.get("snapshot"):
            return {**meta, "version": meta["snapshot"], "delta_version": int(entry["version"])}
    return None


def latest_snapshot(root: StorageRoot) -> dict[str, Any] | None:
    """The public name of :func:`latest`: the latest snapshot's record (``version``,
    ``snapshot_time``, ``interval_id``, ``rows``, ``delta_versions`` …), or None.

    :param root: the storage root (a path, an fsspec URL, or a :class:`Layout`).
    :raises ValueError: a root that the storage layers would not resolve (``Layout.of``)."""
    return latest(Layout.of(root))


def snapshot(layout: Layout, version: str) -> dict[str, Any] | None:
    """The record of snapshot ``version`` (``YYYYMMDDTHHMMSSZ``), or None when the log no longer has it."""
    return next((r for r in _records(layout) if r["snapshot"] == version), None)


def snapshot_folding(layout: Layout, interval_id: str) -> dict[str, Any] | None:
    """The record of the snapshot that folded ``interval_id`` (its ``intervals`` name it), or None."""
    return next((r for r in _records(layout) if interval_id in (r.get("intervals") or [])), None)


def bucket_files(layout: Layout, table: str, delta_version: int | None) -> dict[int, list[str]]:
    """``{bucket: [file URLs]}`` of ``table`` at Delta version ``delta_version`` (None: no files)."""
    if delta_version is None:
        return {}
    found: dict[int, list[str]] = {}
    for f in delta_tables.table_files(snapshot_table_uri(layout, table), version=int(delta_version)):
        bucket = f.partition[delta_tables.BUCKET_COLUMN]  # never null: written by this module
        found.setdefault(int(bucket), []).append(f.url)  # type: ignore[arg-type]
    return found


def roll_back(root: StorageRoot, version: str) -> dict[str, Any]:
    """Make snapshot ``version`` the latest again: ``DeltaTable.restore`` of each public table to the
    Delta version its record names, then of ``_device_state`` with the record as the restore
    commit's metadata (docs/operations.md, "Backfill and reruns"). Later snapshots stay readable by time travel
    until a vacuum; a rebuild of the next interval then builds on ``version``.

    :return: the record of ``version`` (as :func:`latest` now returns it).
    :raises ValueError: no snapshot ``version`` in the Delta log, or a root that ``Layout.of`` refuses.
    """
    # lazy: deltalake stays off the DAG-parse path and the Spark executors
    from deltalake.transaction import CommitProperties

    layout = Layout.of(root)
    record = snapshot(layout, version)
    if record is None:
        raise ValueError(f"no snapshot version {version!r} in the Delta log of {snapshot_table_uri(layout, STATE_TABLE)}")
    for table in PUBLIC_TABLES:
        delta_tables.open_table(snapshot_table_uri(layout, table)).restore(int(record["delta_versions"][table]))
    meta = {k: v for k, v in record.items() if k not in ("version", "delta_version", "timestamp")}
    delta_tables.open_table(snapshot_table_uri(layout, STATE_TABLE)).restore(
        int(record["delta_version"]),
        commit_properties=CommitProperties(custom_metadata={delta_tables.METADATA_KEY: json.dumps(meta)}))
    restored = latest(layout)
    assert restored is not None and restored["version"] == version
    return restored


# ---------------------------------------------------------------------------------------------
# Readers (deltalake; no Spark)
# ---------------------------------------------------------------------------------------------

def read_table(layout: Layout, table: str, record: Mapping[str, Any] | None = None) -> pa.Table:
    """Read snapshot table ``table`` into a ``pyarrow.Table`` with ``deltalake``.

    :param layout: storage root (path or fsspec URL).
    :param table: one of :data:`PUBLIC_TABLES` (or :data:`STATE_TABLE`).
    :param record: a snapshot record (default: the latest snapshot's).
    :return: the rows, with :func:`table_schema` ``(table)`` (without ``bucket``), sorted by
        :func:`sort_keys`; an empty table when there is no snapshot yet.
    """
    schema = table_schema(table)
    if record is None:
        record = latest(layout)
    if record is None:
        return schema.empty_table()
    version = (record.get("delta_versions") or {}).get(table, record.get("delta_version")) \
        if table != STATE_TABLE else record.get("delta_version")
    dt = delta_tables.open_table(snapshot_table_uri(layout, table), None if version is None else int(version))
    if dt is None:
        return schema.empty_table()
    result = pa.table(dt.to_pyarrow_table())
    result = result.select([n for n in schema.names]).cast(schema)
    return result.sort_by([(k, "ascending") for k in sort_keys(table)])


def read_snapshot(root: StorageRoot, table: str, version: str | None = None, *, as_of: datetime | None = None) -> pa.Table:
    """The public reader of the snapshot tables: ``table`` of snapshot ``version`` (default: the
    latest) as a ``pyarrow.Table`` (columns: ``docs/data-contracts.md``), a thin wrapper over
    ``deltalake.DeltaTable(..., version=...)``.

    :param root: storage root (path or fsspec URL, e.g. ``s3://bucket/plgd``, or a :class:`Layout`).
    :param table: one of :data:`PUBLIC_TABLES`.
    :param version: a snapshot version (``YYYYMMDDTHHMMSSZ``); None = the latest.
    :param as_of: instead of ``version``: the latest snapshot whose snapshot time is at or before
        this aware datetime.
    :return: the rows sorted by :func:`sort_keys`; empty when there is no snapshot yet.
    :raises ValueError: unknown table, no snapshot ``version``, none at ``as_of``, or a root that
        ``Layout.of`` refuses.
    """
    if table not in PUBLIC_TABLES:
        raise ValueError(f"unknown snapshot table {table!r}; expected one of {list(PUBLIC_TABLES)}")
    layout = Layout.of(root)
    record = None
    if as_of is not None:
        limit = times.to_ns(as_of, "as_of")
        record = next((r for r in _records(layout) if int(r["snapshot_time_ns"]) <= limit), None)
        if record is None:
            raise ValueError(f"no snapshot at or before {as_of.isoformat()} under {layout.snapshots_dir()}")
    elif version is not None:
        record = snapshot(layout, version)
        if record is None:
            raise ValueError(f"no snapshot version {version!r} under {layout.snapshots_dir()}")
    return read_table(layout, table, record)
