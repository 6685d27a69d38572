"""The output tables: Delta Lake tables under the storage root, and the one home of their names,
paths, partitioning and commit rule.

Tables (``{root}`` is a local path or an fsspec URL; all written with ``deltalake``, delta-rs)::

    {root}/events                      decoded rows           partitioned by interval_id, event_type
    {root}/quarantine                  undecodable messages   partitioned by interval_id
    {root}/events_deduped              one row per message   partitioned by interval_id, event_type
    {root}/msgid_index                 internal: each interval's distinct message IDs (dedupe's lookback);
                                       partitioned by interval_id, bucket (of the msg-ID hash)
    {root}/snapshots/{table}           resources, device_metadata, device_links, owner_devices and the
                                       internal _device_state; partitioned by bucket

The staging table ``{root}/staging/{stream}`` is a Delta table too, with its own home and commit
protocol (``airflow_provider_plgd.tables.staging``: one append per fetch range); it uses
:func:`ensure_table`, :func:`add_actions`, :func:`~.file_records.parquet_stats`, :func:`~.file_records.file_record` and
:func:`vacuum` from here. The interval ledger stays JSON (``airflow_provider_plgd.tables.ledger``).
Opening a table and reading its log (the data files of a version, our metadata in its commits) is
:mod:`airflow_provider_plgd.tables.delta_log`; its names are importable from here too.

The commit rule (Delta protocol: https://github.com/delta-io/delta/blob/master/PROTOCOL.md):

* Spark tasks write Parquet data files with pyarrow below the table folder, under names unique to
  their run (``folders.data_file_name``), and return :func:`~.file_records.file_record` dicts to the driver.
* The driver commits a table's files of an interval in **one** Delta transaction
  (:func:`commit_files`): ``DeltaTable.create_write_transaction`` with one ``AddAction`` per file
  (partition values from the records, stats ``numRecords`` and min/max/null counts from the
  Parquet footer). A rerun replaces exactly the interval's rows: ``overwrite`` with a partition
  filter on ``interval_id`` (snapshots: on the rewritten buckets). Every engine's Delta reader
  sees all of the old rows or all of the new ones; a file that no commit names is never read.
* A commit carries ``app_transactions`` (``Transaction(app_id, run version)``) and our metadata
  under ``plgd`` in its ``commitInfo``. A retried commit of the same run is a no-op; a commit of a
  run older than one already committed for the interval is refused.
* Two writers of the same interval at once: Delta's conflict check refuses the second
  (:class:`~airflow_provider_plgd.exceptions.TableCommitError`); on S3 the log entry is written
  with a conditional PUT (``conditional_put=etag``), no lock service.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import pyarrow as pa

from airflow_provider_plgd.exceptions import OldLayoutError, TableCommitError
from airflow_provider_plgd.tables.delta_log import (
    METADATA_KEY,
    DataFile,
    commit_metadata,
    commits,
    delta_uri,
    history_newest_first,
    open_table,
    storage_options,
    table_files,
)
from airflow_provider_plgd.tables.layout import Layout
from airflow_provider_plgd.tables.storage import join_path, to_fs

#: Reading the log lives in :mod:`.delta_log`; these names stay importable from here.
__all__ = [
    "BUCKET_COLUMN", "DEFAULT_VACUUM_RETENTION_HOURS", "EVENTS", "EVENTS_DEDUPED", "INTERVAL_COLUMN",
    "INTERVAL_TABLES", "METADATA_KEY", "MSGID_INDEX", "QUARANTINE", "Commit", "DataFile", "TableCommit",
    "add_actions", "check_layout", "commit_files", "commit_interval", "commit_metadata", "commits",
    "committed_intervals", "ensure_table", "history_newest_first", "interval_filter", "interval_table_uri",
    "open_table", "run_committed", "storage_options", "table_files", "vacuum",
]

log = logging.getLogger("plgd.delta")

EVENTS = "events"
QUARANTINE = "quarantine"
EVENTS_DEDUPED = "events_deduped"
MSGID_INDEX = "msgid_index"
#: The partition column of every interval table (``interval`` is a keyword of delta-rs's predicates).
INTERVAL_COLUMN = "interval_id"
#: The partition column of the snapshot tables (``pmod(xxhash64(device_id), buckets)``) and of
#: ``msgid_index`` (``pmod(xxhash64(msg_id), dedupe_job.MSGID_BUCKETS)``).
BUCKET_COLUMN = "bucket"
#: Partition columns of the interval tables, outermost first.
INTERVAL_TABLES: dict[str, tuple[str, ...]] = {
    EVENTS: (INTERVAL_COLUMN, "event_type"),
    QUARANTINE: (INTERVAL_COLUMN,),
    EVENTS_DEDUPED: (INTERVAL_COLUMN, "event_type"),
    MSGID_INDEX: (INTERVAL_COLUMN, BUCKET_COLUMN),  # dedupe_job.MSGID_BUCKETS buckets of the msg-ID hash
}
#: Default retention of removed snapshot files (``DeltaTable.vacuum``), hours; Delta's own default.
DEFAULT_VACUUM_RETENTION_HOURS = 168


def interval_table_uri(layout: Layout, name: str) -> str:
    """``{root}/{name}`` for an interval table (``events``, ``quarantine``, ``events_deduped``, ``msgid_index``).

    :raises ValueError: an unknown table name.
    """
    if name not in INTERVAL_TABLES:
        raise ValueError(f"unknown table {name!r}; expected one of {sorted(INTERVAL_TABLES)}")
    return layout.table(name)


# ---------------------------------------------------------------------------------------------
# Commits (on the driver)
# ---------------------------------------------------------------------------------------------

def ensure_table(uri: str, schema, partition_by: Sequence[str]):
    """The table at ``uri`` (a ``deltalake.DeltaTable``), created empty with ``schema`` when
    missing; new columns of ``schema`` are added to an existing table (schema evolution: older
    files read them as null)."""
    # lazy: deltalake stays off the DAG-parse path and the Spark executors (they import this module)
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    target = delta_uri(uri)
    options = storage_options(target)
    dt = open_table(uri)
    if dt is None:
        try:
            DeltaTable.create(target, schema, partition_by=list(partition_by) or None, mode="ignore",
                              storage_options=options)
        except DeltaError as exc:  # another writer created it at the same moment
            log.info("%s: created concurrently (%s)", uri, exc)
        dt = DeltaTable(target, storage_options=options)
    have = {f.name for f in dt.schema().fields}
    missing = [f for f in schema if f.name not in have]
    if missing:
        from deltalake import Schema  # lazy: as above

        dt.alter.add_columns(list(Schema.from_arrow(pa.schema(missing)).fields))
        log.info("%s: added columns %s", uri, [f.name for f in missing])
        dt = DeltaTable(target, storage_options=options)
    return dt


def add_actions(records: Sequence[Mapping[str, Any]], now_ms: int) -> list:
    """One ``deltalake`` ``AddAction`` per :func:`~.file_records.file_record` (modification time ``now_ms``, unix ms)."""
    from deltalake.transaction import AddAction  # lazy: deltalake off the DAG-parse path and the executors

    return [AddAction(str(r["path"]), int(r["size"]), dict(r["partition"]), int(now_ms), True, str(r["stats"]))
            for r in records]


@dataclass
class Commit:
    """What :func:`commit_files` did: the table, its new Delta ``version`` (None: nothing new,
    the same run had committed already), the files and rows added."""

    table: str
    version: int | None
    files: int
    rows: int
    metadata: dict[str, Any] = field(default_factory=dict)


def commit_files(uri: str, records: Sequence[Mapping[str, Any]], *, schema, partition_by: Sequence[str],
                 replace: Sequence[tuple[str, str, Any]] | None, metadata: Mapping[str, Any],
                 app_id: str, run_version: int) -> Commit:
    """Commit the data files of one run in one Delta transaction.

    :param uri: the table folder (the records' paths are relative to it).
    :param records: :func:`~.file_records.file_record` dicts.
    :param schema: the table's Arrow schema, partition columns included.
    :param partition_by: partition columns (used when the table is created).
    :param replace: partition filters (``[(column, "=" | "in", value)]``) of the rows this commit
        replaces (``overwrite``); ``[]`` replaces every row; None appends.
    :param metadata: JSON values stored under ``plgd`` in the commit's ``commitInfo``.
    :param app_id: idempotency key of the commit (e.g. ``plgd.decode.events/<interval>``).
    :param run_version: the run's version for ``app_id`` (its start time in ms): a retried commit of
        the same run is skipped; a run older than the last committed one is refused.
    :raises TableCommitError: a newer run of the same interval committed first, or a concurrent
        writer changed the rows this commit replaces (Delta's conflict check); nothing committed.
    """
    # lazy: deltalake stays off the DAG-parse path and the Spark executors
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import CommitProperties, Transaction

    target = delta_uri(uri)
    dt = ensure_table(uri, schema, partition_by)
    done = dt.transaction_version(app_id)
    rows = sum(int(r["rows"]) for r in records)
    if done is not None and int(done) >= run_version:
        if int(done) == run_version:
            log.info("%s: this run's commit (%s %d) is already in the log", uri, app_id, run_version)
            return Commit(uri, None, len(records), rows, dict(metadata))
        raise TableCommitError(
            f"{uri}: a newer run of the same interval committed first ({app_id}: version {done} > this run's "
            f"{run_version}); nothing committed by this run", table=uri)
    adds = add_actions(records, int(time.time() * 1000))
    props = CommitProperties(custom_metadata={METADATA_KEY: json.dumps(dict(metadata), sort_keys=True, default=str)},
                             app_transactions=[Transaction(app_id, int(run_version))])
    try:
        dt.create_write_transaction(adds, mode="append" if replace is None else "overwrite", schema=schema,
                                    partition_by=list(partition_by) or None,
                                    partition_filters=list(replace) if replace else None,
                                    commit_properties=props)
    except CommitFailedError as exc:
        raise TableCommitError(f"{uri}: another writer committed to the same rows meanwhile ({exc}); nothing "
                               "committed by this run", table=uri) from exc
    version = None
    fresh = DeltaTable(target, storage_options=storage_options(target))
    for entry in fresh.history(limit=20):
        if commit_metadata(entry).get("run_version") == metadata.get("run_version") and \
                entry.get("version") is not None and metadata.get("run_version") is not None:
            version = int(entry["version"])
            break
    if version is None:
        version = fresh.version()
    if replace is not None:
        version = _remove_rewritten_leftovers(uri, version, records, replace, app_id, metadata,
                                              fresh) or version
    return Commit(uri, version, len(records), rows, dict(metadata))


def _remove_rewritten_leftovers(uri: str, version: int, records: Sequence[Mapping[str, Any]],
                                replace: Sequence[tuple[str, str, Any]], app_id: str,
                                metadata: Mapping[str, Any], loaded: Any = None) -> int | None:
    """After the ``overwrite`` commit ``version``: remove the files of the replaced partitions that
    it did not add. There are such files only when a compaction (``OPTIMIZE``, table maintenance)
    rewrote those partitions between this commit's read of the log and its commit: delta-rs then
    commits the overwrite without a conflict, and its removes name the files the compaction had
    already replaced, so the compacted file stays beside the new rows (deltalake 1.6.6). One more
    commit, carrying the run's ``metadata`` plus ``repair_of``, removes those of them still in
    the table; readers of the version in between see the interval twice, never without its rows.

    :param loaded: the table already loaded at some version (read again when not at ``version``).
    :return: the repair's Delta version, or None when there was nothing to remove.
    :raises TableCommitError: the repair conflicted three times.
    """
    from deltalake.transaction import CommitProperties, RemoveAction  # lazy: as in commit_files

    where = {column: ([value] if op == "=" else list(value)) for column, op, value in replace}
    ours = {unquote(str(r["path"])) for r in records}
    at = loaded if loaded is not None and loaded.version() == version else None
    leftovers = {f.path for f in table_files(uri, version=version, dt=at, where=where)} - ours
    if not leftovers:
        return None
    log.warning("%s: a compaction rewrote %s while commit %d (%s) replaced them; removing the %d file(s) it left",
                uri, where, version, app_id, len(leftovers))
    props = CommitProperties(custom_metadata={METADATA_KEY: json.dumps({**metadata, "repair_of": app_id},
                                                                      sort_keys=True, default=str)})
    for _attempt in range(3):
        dt = open_table(uri)
        still = [f for f in table_files(uri, dt=dt, where=where) if f.path in leftovers]
        if not still:
            return None
        now_ms = int(time.time() * 1000)
        removes = [RemoveAction(f.path, True, now_ms, f.size, dict(f.partition)) for f in still]
        try:
            dt.create_write_transaction(removes, mode="append", schema=dt.schema(),  # type: ignore[arg-type]
                                        commit_properties=props)
        except Exception as exc:
            log.info("%s: removing the rewritten files conflicted (%s); looking again", uri, exc)
            continue
        return int(open_table(uri).version())
    raise TableCommitError(f"{uri}: files of {where} that commit {version} ({app_id}) replaced are still in the "
                           "table after 3 attempts to remove them; rerun the interval", table=uri)


@dataclass(frozen=True)
class TableCommit:
    """One table's part of :func:`commit_interval`: the table ``name`` (of :data:`INTERVAL_TABLES`),
    its ``uri``, the pyarrow ``schema``, the file ``records`` (``file_records.file_record``) and their ``rows``."""

    name: str
    uri: str
    schema: Any
    records: Sequence[Mapping[str, Any]]
    rows: int


def commit_interval(app: str, interval_id: str, tables: Sequence[TableCommit], *, run_version: int,
                    metadata: Mapping[str, Any]) -> dict[str, Commit]:
    """Commit one run's files of an interval to each of ``tables``, in order, each in its own Delta
    transaction that replaces the interval's rows (:func:`commit_files`, idempotency key
    ``plgd.{app}.{table}/{interval_id}``, so :func:`run_committed` can tell that one run committed
    them all).

    :param tables: one :class:`TableCommit` per table.
    :param metadata: stored in each commit, with ``rows`` of that table added.
    :return: ``{name: Commit}``.
    :raises TableCommitError: as :func:`commit_files`; the tables before it stay committed (the
        next stage waits for a rerun: :func:`run_committed`).
    """
    commits = {}
    for t in tables:
        commits[t.name] = commit_files(
            t.uri, t.records, schema=t.schema, partition_by=INTERVAL_TABLES[t.name], replace=interval_filter(interval_id),
            metadata={**metadata, "rows": t.rows}, app_id=f"plgd.{app}.{t.name}/{interval_id}", run_version=run_version)
    return commits


# ---------------------------------------------------------------------------------------------
# Reading the log (on the driver)
# ---------------------------------------------------------------------------------------------

def committed_intervals(uri: str, *, dt: Any = None) -> list[str]:
    """The interval IDs that the latest version of an interval table (``dt``, when opened already)
    holds files of, sorted."""
    return sorted({i for f in table_files(uri, dt=dt) if (i := f.partition.get(INTERVAL_COLUMN))})


def run_committed(layout: Layout, app: str, tables: Sequence[str], interval_id: str) -> bool:
    """True when one run of ``app`` committed the interval to every table of ``tables`` (their
    ``app_transactions`` entries ``plgd.{app}.{table}/{interval_id}`` exist and carry the same run
    version): a run killed between its commits leaves them unequal, and the next stage waits for a
    rerun."""
    versions = set()
    for name in tables:
        dt = open_table(interval_table_uri(layout, name))
        version = None if dt is None else dt.transaction_version(f"plgd.{app}.{name}/{interval_id}")
        if version is None:
            return False
        versions.add(int(version))
    return len(versions) == 1


def interval_filter(interval_id: str) -> list[tuple[str, str, str]]:
    """The partition filter of one interval's rows."""
    return [(INTERVAL_COLUMN, "=", interval_id)]


def vacuum(uri: str, retention_hours: int) -> int:
    """``DeltaTable.vacuum`` (full: also files no commit ever named, e.g. of killed runs) of files
    removed or written more than ``retention_hours`` ago; returns how many were deleted. A negative
    retention disables it."""
    if retention_hours < 0:
        return 0
    dt = open_table(uri)
    if dt is None:
        return 0
    removed = dt.vacuum(retention_hours=int(retention_hours), dry_run=False, enforce_retention_duration=False,
                        full=True)
    return len(removed)


# ---------------------------------------------------------------------------------------------
# The layout of a storage root
# ---------------------------------------------------------------------------------------------

#: ``interval=…`` folders of one table whose ``_manifest.json`` :func:`check_layout` looks for.
_OLD_LAYOUT_PROBES = 16


def check_layout(layout: Layout) -> None:
    """Refuse a storage root written with the layout before Delta Lake, recognised by its records:
    an ``events/interval=<id>/_manifest.json`` (any interval table) or ``snapshots/_latest.json``.
    A folder name alone is no such record (a run's root may be a folder a user named
    ``interval=…``), and a table folder with a Delta log is a Delta table: it is not listed, so the
    cost does not grow with the data.

    :raises OldLayoutError: names the folder and what to do.
    """
    fs, latest = to_fs(join_path(layout.snapshots_dir(), "_latest.json"))
    probes = [(latest, latest)]  # (what the error names, the record that shows it)
    folders = [to_fs(layout.table(name))[1] for name in INTERVAL_TABLES]
    delta = [fs.exists(join_path(folder, "_delta_log")) for folder in folders]
    for folder, is_delta in zip(folders, delta, strict=True):
        if is_delta:
            continue
        try:
            entries = fs.ls(folder, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            continue
        old = [str(e).rstrip("/") for e in entries if str(e).rstrip("/").rsplit("/", 1)[-1].startswith("interval=")]
        probes[:0] = [(e, join_path(e, "_manifest.json")) for e in old[:_OLD_LAYOUT_PROBES]]
    for shown, probe in probes:
        if fs.exists(probe):
            raise OldLayoutError(
                f"{shown} belongs to the storage layout before Delta Lake (folders with _manifest.json and "
                f"_latest.json); this version writes Delta tables. Use an empty storage root, or move {layout.root}'s "
                "old folders away and rerun the intervals", path=shown)
