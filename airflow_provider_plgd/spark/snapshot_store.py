"""Versioned snapshot layout, manifests and the ``_latest.json`` pointer (copy-on-write by bucket).

Layout below the storage root (a local path or any fsspec URL)::

    {root}/snapshots/_latest.json                      pointer, written last (atomic replace)
    {root}/snapshots/v={version}/_manifest.json        one manifest per snapshot version
    {root}/snapshots/v={version}/r-{run_id}/{table}/bucket={b}/part-00000.parquet  data files

* ``version`` is the snapshot time (the interval end) as ``YYYYMMDDTHHMMSSZ`` (with ``.ffffff``
  or ``.fffffffff`` when the time has a fraction), so versions sort lexicographically by time.
* Every table is split into ``buckets`` hash buckets of the device:
  ``bucket = pmod(xxhash64(device_id), buckets)`` (Spark SQL; :data:`BUCKET_EXPR`). All rows of
  a device, in every table, are in the same bucket number.
* A manifest lists, per table and bucket, the data files that make up that bucket (paths
  relative to ``{root}/snapshots``). A rebuild rewrites only the buckets its new events touch
  (plus buckets with pendings that expire by the new snapshot time); every other bucket's entry
  is copied from the parent manifest, i.e. its files are carried over by reference. So a
  manifest may name files under older ``v=`` folders.
* The files of one run live in their own ``r-{run_id}`` folder; nothing refers to them until the
  manifest is written (one PUT), so the manifest is the commit and a half-written file is never
  read. A rerun
  for the same version writes a new run folder and replaces the manifest;
  readers that still hold the previous manifest keep reading the files it names (deleted only by
  :func:`collect_garbage`, and never while a retained manifest names them).
* Commit order: data files -> ``v={version}/_manifest.json`` -> ``_latest.json`` (each one atomic
  write, ``storage.write_text``). A run that dies
  before the last step leaves ``_latest.json`` naming the previous snapshot, whose files are
  untouched.

Manifest (JSON object; format :data:`MANIFEST_FORMAT`)::

    {"format": 1, "version": str, "snapshot_time_ns": int, "snapshot_time": ISO str,
     "parent": str | null, "run_id": str, "created_at": ISO str,
     "interval_id": str (newest interval folded), "intervals": [str] (folded by this run),
     "inputs": {interval: {"rows", "sha256"}} (what was folded of each, ``rebuild_job.input_fingerprint``),
     "buckets": int, "bucket_expr": str,
     "tables": {table: {"<bucket>": {"files": [rel path], "rows": int}}},
     "next_expiry_ns": {"<bucket>": int}   (smallest pending valid_until per bucket),
     "rows": {table: int}, "touched_buckets": [int], "stats": {...}}

``_latest.json``: ``{"version", "manifest" (rel path), "snapshot_time_ns", "interval_id",
"updated_at"}``.

Tables: the four public tables of ``docs/data-contracts.md`` (columns from
``airflow_provider_plgd.plgd.tables``) and the internal :data:`STATE_TABLE` (one row per
device: the serialised fold state of :mod:`airflow_provider_plgd.spark.fold`, see :data:`STATE_SCHEMA`).

Readers: :func:`read_snapshot` / :func:`read_table` (pyarrow + fsspec through the manifest, no
Spark); every read and write goes through :mod:`airflow_provider_plgd.spark.folders`.
"""

from __future__ import annotations

import json
import posixpath
import uuid
from typing import Any, Iterable, Mapping

import pyarrow as pa

from airflow_provider_plgd import times
from airflow_provider_plgd.plgd import tables as snapshot_tables
from airflow_provider_plgd import storage
from airflow_provider_plgd.spark import folders

__all__ = [
    "ALL_TABLES",
    "BUCKET_EXPR",
    "DEFAULT_BUCKETS",
    "LATEST_NAME",
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "PUBLIC_TABLES",
    "SNAPSHOTS_DIR",
    "STATE_SCHEMA",
    "STATE_TABLE",
    "collect_garbage",
    "device_bucket",
    "manifest_path",
    "read_latest",
    "read_manifest",
    "read_snapshot",
    "read_table",
    "table_files",
    "table_schema",
    "version_id",
]

SNAPSHOTS_DIR = "snapshots"
LATEST_NAME = "_latest.json"
MANIFEST_NAME = "_manifest.json"
MANIFEST_FORMAT = 1
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




def snapshots_root(root: str) -> str:
    """``{root}/snapshots``."""
    return storage.join_path(root, SNAPSHOTS_DIR)


def manifest_path(root: str, version: str) -> str:
    """``{root}/snapshots/v={version}/_manifest.json``."""
    return storage.join_path(snapshots_root(root), f"v={version}", MANIFEST_NAME)


def latest_path(root: str) -> str:
    """``{root}/snapshots/_latest.json``."""
    return storage.join_path(snapshots_root(root), LATEST_NAME)


def run_dir(version: str, run_id: str) -> str:
    """Run folder relative to ``{root}/snapshots``: ``v={version}/r-{run_id}``."""
    return f"v={version}/r-{run_id}"


def new_run_id() -> str:
    """A fresh run ID (32 hex digits)."""
    return uuid.uuid4().hex


# ---------------------------------------------------------------------------------------------
# Manifests
# ---------------------------------------------------------------------------------------------

def table_files(root: str, manifest: Mapping[str, Any], table: str) -> list[str]:
    """Absolute paths of the data files of ``table`` in ``manifest`` (sorted by bucket).

    :raises ValueError: ``table`` is not a snapshot table.
    """
    if table not in ALL_TABLES:
        raise ValueError(f"unknown snapshot table {table!r}; expected one of {list(ALL_TABLES)}")
    base = snapshots_root(root)
    entries = manifest.get("tables", {}).get(table, {})
    return [storage.join_path(base, rel) for b in sorted(entries, key=int) for rel in entries[b]["files"]]


def bucket_files(root: str, manifest: Mapping[str, Any], table: str, buckets: Iterable[int]) -> list[str]:
    """Absolute paths of the files of ``table`` in the given buckets of ``manifest``."""
    base = snapshots_root(root)
    entries = manifest.get("tables", {}).get(table, {})
    return [storage.join_path(base, rel) for b in sorted(set(buckets)) for rel in entries.get(str(b), {}).get("files", [])]


def validate_manifest(manifest: Any, where: str) -> dict[str, Any]:
    """Check the shape of a manifest read from ``where``; return it.

    :raises ValueError: not a manifest of format :data:`MANIFEST_FORMAT`.
    """
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ValueError(
            f"{where} is not a snapshot manifest of format {MANIFEST_FORMAT} "
            f"(got format {manifest.get('format') if isinstance(manifest, dict) else type(manifest).__name__!r})"
        )
    for key in ("version", "snapshot_time_ns", "buckets", "tables"):
        if key not in manifest:
            raise ValueError(f"snapshot manifest {where} has no {key!r}")
    return manifest


# ---------------------------------------------------------------------------------------------
# Readers (fsspec + pyarrow; no Spark)
# ---------------------------------------------------------------------------------------------

def _fs(root: str):
    return storage.to_fs(root)


def read_pointer(root: str) -> dict[str, Any] | None:
    """``{root}/snapshots/_latest.json``, or None when there is no snapshot.

    :raises ValueError: the pointer is not JSON or names no manifest.
    """
    pointer = storage.read_json(latest_path(root))
    if pointer is not None and (not isinstance(pointer, dict) or "manifest" not in pointer):
        raise ValueError(f"{latest_path(root)} is not a snapshot pointer: {pointer!r}")
    return pointer


def read_latest(root: str) -> dict[str, Any] | None:
    """The manifest that ``{root}/snapshots/_latest.json`` names, or None when there is no snapshot.

    :raises ValueError: the pointer or the manifest is malformed, or the manifest is missing.
    """
    pointer = read_pointer(root)
    if pointer is None:
        return None
    path = storage.join_path(snapshots_root(root), pointer["manifest"])
    manifest = storage.read_json(path)
    if manifest is None:
        raise ValueError(f"{latest_path(root)} names {path}, which does not exist")
    return validate_manifest(manifest, path)


def read_manifest(root: str, version: str) -> dict[str, Any] | None:
    """The manifest of snapshot ``version`` (None if it does not exist)."""
    path = manifest_path(root, version)
    manifest = storage.read_json(path)
    return None if manifest is None else validate_manifest(manifest, path)


def read_table(root: str, table: str, manifest: Mapping[str, Any] | None = None) -> pa.Table:
    """Read snapshot table ``table`` into a ``pyarrow.Table`` with pyarrow + fsspec (no Spark).

    :param root: storage root (path or fsspec URL).
    :param table: one of :data:`PUBLIC_TABLES` (or :data:`STATE_TABLE`).
    :param manifest: a manifest (default: the latest snapshot's).
    :return: the rows, with :func:`table_schema` ``(table)``, sorted by :func:`sort_keys`; an empty
        table when there is no snapshot yet.
    """
    schema = table_schema(table)
    if manifest is None:
        manifest = read_latest(root)
    if manifest is None:
        return schema.empty_table()
    files = table_files(root, manifest, table)
    if not files:
        return schema.empty_table()
    fs, _ = _fs(root)
    result = _read_parquet_files(fs, files, schema)
    return result.sort_by([(k, "ascending") for k in sort_keys(table)])


def read_snapshot(root: str, table: str, version: str | None = None) -> pa.Table:
    """The public reader of the snapshot tables: ``table`` of snapshot ``version`` (default: the
    latest) as a ``pyarrow.Table`` (columns: ``docs/data-contracts.md``), read through the
    manifest with pyarrow + fsspec.

    :param root: storage root (path or fsspec URL, e.g. ``s3://bucket/plgd``).
    :param table: one of :data:`PUBLIC_TABLES`.
    :param version: a snapshot version (``YYYYMMDDTHHMMSSZ``); None = the latest.
    :return: the rows sorted by :func:`sort_keys`; empty when there is no snapshot yet.
    :raises ValueError: unknown table, or no snapshot ``version``.
    """
    if table not in PUBLIC_TABLES:
        raise ValueError(f"unknown snapshot table {table!r}; expected one of {list(PUBLIC_TABLES)}")
    manifest = None
    if version is not None:
        manifest = read_manifest(root, version)
        if manifest is None:
            raise ValueError(f"no snapshot version {version!r} under {snapshots_root(root)}")
    return read_table(root, table, manifest)


def write_json(path: str, value: Mapping[str, Any]) -> None:
    """Write a manifest or the pointer (one atomic write, ``storage.write_text``).

    :raises OSError: the write failed.
    """
    storage.write_text(path, json.dumps(value, indent=1, sort_keys=True) + "\n")


def interval_kind(interval_id: str) -> str:
    """``"time"`` for ``<start>_<end>`` IDs, else the prefix (``"seq"``/``"durable"``): IDs of one
    kind sort in stream order; IDs of different kinds are not comparable."""
    for prefix in ("seq-", "durable-"):
        if interval_id.startswith(prefix):
            return prefix[:-1]
    return "time"


# ---------------------------------------------------------------------------------------------
# Garbage collection
# ---------------------------------------------------------------------------------------------

def collect_garbage(root: str, keep_versions: int) -> dict[str, int]:
    """Delete snapshot versions older than the newest ``keep_versions`` committed ones.

    A data file is deleted only when no retained manifest names it (files carried over by
    reference stay). The run folders of retained versions are never touched (a concurrent run
    may be about to commit one). ``keep_versions <= 0`` disables collection.

    :return: ``{"versions_removed": n, "files_removed": n}``.
    """
    result = {"versions_removed": 0, "files_removed": 0}
    if keep_versions <= 0:
        return result
    base = snapshots_root(root)
    fs, jbase = _fs(base)
    jbase = jbase.rstrip("/")
    if not fs.exists(jbase):
        return result
    versions = sorted(
        posixpath.basename(e["name"].rstrip("/"))[2:] for e in fs.ls(jbase, detail=True)
        if e.get("type") == "directory" and posixpath.basename(e["name"].rstrip("/")).startswith("v=")
    )
    committed = [v for v in versions if storage.exists(manifest_path(root, v))]
    pointer = read_pointer(root) or {}
    kept = set(committed[-keep_versions:])
    if pointer.get("version"):
        kept.add(pointer["version"])
    referenced: set[str] = set()
    for v in kept:
        manifest = read_manifest(root, v)
        for entries in (manifest or {}).get("tables", {}).values():
            for entry in entries.values():
                referenced.update(entry["files"])
    oldest_kept = min(kept) if kept else None
    for v in versions:
        if v in kept or (oldest_kept is not None and v > oldest_kept):
            continue
        vdir = f"{jbase}/v={v}"
        removed_all = True
        for path in fs.find(vdir):
            rel = path[len(jbase) + 1:]
            if rel in referenced:
                removed_all = False
            else:
                fs.rm(path)
                result["files_removed"] += 1
        if removed_all:
            if fs.exists(vdir):
                fs.rm(vdir, recursive=True)
            result["versions_removed"] += 1
    return result


# ---------------------------------------------------------------------------------------------
# One bucket of a rebuild (runs on an executor: pyarrow + fsspec, no Spark)
# ---------------------------------------------------------------------------------------------

#: Result rows of :func:`rebuild_bucket`: one per table of the bucket, plus one ``_stats`` row.
BUCKET_RESULT_SCHEMA = pa.schema([
    pa.field("bucket", pa.int32()),
    pa.field("table", pa.string()),
    pa.field("file", pa.string()),          # path relative to {root}/snapshots; null = no rows
    pa.field("rows", pa.int64()),
    pa.field("next_expiry_ns", pa.int64()),  # _device_state only: smallest pending valid_until
    pa.field("events", pa.int64()),          # _stats only: event rows folded
    pa.field("stats_json", pa.string()),     # _stats only: fold.FoldStats as JSON
])


def _read_parquet_files(fs, paths: list[str], schema: pa.Schema) -> pa.Table:
    """The files ``paths`` (URLs or paths on ``fs``) read with ``schema`` and concatenated."""
    import pyarrow.parquet as pq

    if not paths:
        return schema.empty_table()
    parts = []
    for url in paths:
        _, p = _fs(url)
        parts.append(pq.read_table(p, filesystem=fs, schema=schema))
    return pa.concat_tables(parts)


def rebuild_bucket(
    events: pa.Table,
    *,
    root: str,
    run_rel: str,
    old_files: Mapping[str, list[str]],
    table_schemas: Mapping[str, pa.Schema],
    snapshot_time_ns: int,
    bucket_column: str = "_bucket",
    device_column: str = "_device",
    bucket: int | None = None,
) -> pa.Table:
    """Rebuild one bucket: fold its touched devices and write one new file per table.

    Runs inside the ``mapInArrow`` of ``rebuild_snapshots`` (:func:`rebuild_partition`).

    :param events: the bucket's new ``events`` rows plus ``bucket_column`` (int) and
        ``device_column`` (the device a row applies to; null on the marker row that
        ``rebuild_snapshots`` adds for a bucket without events whose pendings expire).
    :param root: the snapshots' storage root (path or fsspec URL; ``{root}/snapshots/...``).
    :param run_rel: this run's folder relative to ``{root}/snapshots`` (``v=.../r-...``).
    :param old_files: ``{table: [absolute paths]}``: the base snapshot's files of this bucket.
    :param table_schemas: ``{table: schema}`` for :data:`ALL_TABLES`.
    :param snapshot_time_ns: the snapshot time (unix ns).
    :param bucket: the bucket number (default: ``bucket_column`` of the first event row; needed
        when ``events`` is empty).
    :return: :data:`BUCKET_RESULT_SCHEMA` rows: per table the written file (null when the bucket
        has no rows of that table any more), its row count and, for ``_device_state``, the
        bucket's smallest pending ``valid_until``; and a ``_stats`` row.

    Touched devices = devices with new events + devices whose ``next_expiry_ns`` is before the
    snapshot time. Only their states are parsed and folded (``fold.fold_bucket_arrow``); every
    other row of the bucket is copied with Arrow (``pyarrow.compute.is_in``), never parsed.
    """
    import pyarrow.compute as pc

    from airflow_provider_plgd.spark import fold

    bucket = int(events.column(bucket_column)[0].as_py()) if bucket is None else int(bucket)
    events = events.filter(pc.is_valid(events.column(device_column)))
    fs, _ = _fs(root)
    old = {t: _read_parquet_files(fs, list(old_files.get(t, [])), table_schemas[t]) for t in ALL_TABLES}
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
    base = snapshots_root(root)
    results: list[dict[str, Any]] = []
    for table in ALL_TABLES:
        schema = table_schemas[table]
        mine = folded.filter(pc.equal(kinds, table)).column(table).combine_chunks()
        new_rows = pa.Table.from_arrays(mine.flatten(), schema=schema) if len(mine) else schema.empty_table()
        keep = pc.invert(pc.is_in(old[table].column("device_id"), value_set=touched))
        merged = pa.concat_tables([old[table].filter(keep), new_rows])
        merged = merged.sort_by([(k, "ascending") for k in sort_keys(table)])
        rel = None
        if merged.num_rows:
            rel = f"{run_rel}/{table}/bucket={bucket}/part-00000.parquet"
            folders.write_parquet_file(fs, _fs(storage.join_path(base, rel))[1], merged)
        expiry = None
        if table == STATE_TABLE and merged.num_rows:
            expiry = pc.min(merged.column("next_expiry_ns")).as_py()
        results.append({"bucket": bucket, "table": table, "file": rel, "rows": merged.num_rows,
                        "next_expiry_ns": expiry, "events": None, "stats_json": None})
    stats_rows = folded.filter(pc.equal(kinds, "_stats")).column("stats_json").to_pylist()
    results.append({"bucket": bucket, "table": "_stats", "file": None, "rows": None, "next_expiry_ns": None,
                    "events": events.num_rows, "stats_json": stats_rows[0] if stats_rows else "{}"})
    return pa.Table.from_pylist(results, schema=BUCKET_RESULT_SCHEMA)


def rebuild_partition(batches, *, bucket_column: str = "_bucket", extra_buckets: Iterable[int] = (), **kwargs):
    """``mapInArrow`` body of ``rebuild_snapshots``: one Spark partition (holding whole buckets,
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
