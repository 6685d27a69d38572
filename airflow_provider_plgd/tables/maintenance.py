"""Table maintenance of the output tables: compaction of the interval partitions the chain has
passed, checkpoints, log cleanup and vacuum (``deltalake``; no Spark, no Airflow).

* **Which intervals.** The snapshot chain's head is the newest interval the latest snapshot
  folded (``snapshot_store.latest``: read from the ``_device_state`` log, not from Airflow). An
  interval strictly older than the head (a time interval ending at or before the head's start; a
  sequence interval ending before the head's first sequence) is *passed*: the ETL no longer writes
  it, except for a deliberate rerun. The head's own interval and everything after it are never
  touched, so the ETL's commits of the next intervals never meet a maintenance commit.
* **Compaction.** ``DeltaTable.optimize.compact`` with the partition filter ``interval_id in
  (...)``, on the passed intervals that have a partition of more than one file (oldest first, at
  most ``max_intervals`` per table and run, ``intervals_per_commit`` per Delta commit). Compaction
  keeps the rows and their order within each partition (``dataChange = false`` in the log);
  the rows of each compacted interval are counted from the log before and after, and a difference
  fails the run; the compaction's commit carries the content digests of the intervals it rewrote
  (``tables.content``), so the rebuild's "unchanged" check still finds them after the log cleanup (:class:`~airflow_provider_plgd.exceptions.MaintenanceError`). Not Z-order:
  the tables are partitioned by ``interval_id`` (and ``event_type``), an hourly partition is far
  below the target file size, so a compacted partition is one file whose ``device_id`` range spans
  every device: no file can be skipped by a ``device_id`` filter, and delta-rs's ``z_order``
  rewrites every file of a partition at every run (measured in ``bench/bench_maintenance.py``).
  Rows keep the writers' order (decode stages rows by owner), so row-group statistics still prune
  by ``owner_id``.
* **A concurrent rerun** of a passed interval: when the rerun commits first, the compaction's
  commit conflicts and only that table's compaction is skipped until the next run; when the
  compaction commits first, ``delta_tables.commit_files`` removes the compacted file the rerun's
  overwrite left (:func:`airflow_provider_plgd.tables.delta_tables.commit_files`).
* **Checkpoints and log cleanup.** ``create_checkpoint`` then ``cleanup_metadata`` (log entries
  older than the table's ``delta.logRetentionDuration``, 30 days by default, and before the
  checkpoint) on every table, the snapshot tables included. delta-rs also checkpoints every 100
  commits by itself. Time travel, and snapshot records read from the log (``read_snapshot(as_of=...)``),
  reach back as far as the log retention.
* **Vacuum** (``delta_tables.vacuum``, full) of files removed more than
  ``vacuum_retention_hours`` ago, and of files no commit names (killed runs, and a running job's
  files not committed yet). Keep the retention longer than the longest Spark job: a job reads the
  files of the version it started on, and commits the files it wrote at its end.
* **Staging** of reconciled intervals older than ``staging_retention_seconds`` is expired last
  (``reconcile.expire_staging``), when the caller gives a retention.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from airflow_provider_plgd.exceptions import MaintenanceError
from airflow_provider_plgd.tables import content, delta_tables, reconcile, snapshot_store
from airflow_provider_plgd.tables.layout import Layout, StorageRoot
from airflow_provider_plgd.times import IntervalId

log = logging.getLogger("plgd.maintenance")

#: Default bound of the intervals compacted per table and run (a week of hourly intervals).
DEFAULT_MAX_INTERVALS = 168
#: Default number of intervals compacted in one Delta commit (a conflict loses at most that much work).
DEFAULT_INTERVALS_PER_COMMIT = 24
#: The ``operation`` name of our maintenance commits' metadata (``plgd`` in ``commitInfo``).
MAINTENANCE_OPERATION = "maintenance.compact"

@dataclass(frozen=True)
class MaintenanceSettings:
    """What a maintenance run does (fixed by the DAG author).

    :param vacuum_retention_hours: vacuum files removed (or never committed) more than this many
        hours ago; -1 = no vacuum (default :data:`delta_tables.DEFAULT_VACUUM_RETENTION_HOURS`, 168).
    :param max_intervals: at most this many intervals compacted per table and run, oldest first.
    :param intervals_per_commit: intervals per compaction commit.
    :param target_file_bytes: target size of compacted files in bytes (default: the table's
        ``delta.targetFileSize`` or delta-rs's 100 MB).
    :param checkpoint: write a checkpoint of every table at the end.
    :param cleanup_logs: remove expired log entries (``cleanup_metadata``) after the checkpoint.
    :raises ValueError: a value out of range (names it).
    """

    vacuum_retention_hours: int = delta_tables.DEFAULT_VACUUM_RETENTION_HOURS
    max_intervals: int = DEFAULT_MAX_INTERVALS
    intervals_per_commit: int = DEFAULT_INTERVALS_PER_COMMIT
    target_file_bytes: int | None = None
    checkpoint: bool = True
    cleanup_logs: bool = True

    def __post_init__(self) -> None:
        if int(self.vacuum_retention_hours) < -1:
            raise ValueError(f"vacuum_retention_hours must be >= 0 (or -1: no vacuum), got {self.vacuum_retention_hours}")
        if int(self.max_intervals) < 1 or int(self.intervals_per_commit) < 1:
            raise ValueError(f"max_intervals and intervals_per_commit must be >= 1, got {self.max_intervals} and "
                             f"{self.intervals_per_commit}")
        if self.target_file_bytes is not None and int(self.target_file_bytes) < 1024 * 1024:
            raise ValueError(f"target_file_bytes must be at least 1 MiB (1048576), got {self.target_file_bytes}")


@dataclass(frozen=True)
class TableMaintenance:
    """What maintenance did to one table.

    :ivar compacted: the intervals compacted (oldest first). :ivar files_before / files_after: data
        files of the table before and after. :ivar rows: rows in the compacted intervals (equal
        before and after). :ivar version: the table's Delta version at the end (None: no table).
    :ivar vacuumed: files deleted by vacuum. :ivar skipped: why compaction was skipped (a
        concurrent writer), else None. :ivar seconds: wall time.
    """

    table: str
    uri: str
    compacted: tuple[str, ...] = ()
    files_before: int = 0
    files_after: int = 0
    rows: int = 0
    version: int | None = None
    vacuumed: int = 0
    checkpoint_version: int | None = None
    skipped: str | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON form: the compacted intervals as a count with the first and last (bounded for XCom)."""
        out = asdict(self)
        out["compacted"] = {"intervals": len(self.compacted), "first": self.compacted[0] if self.compacted else None,
                            "last": self.compacted[-1] if self.compacted else None}
        out["seconds"] = round(self.seconds, 3)
        return out


@dataclass(frozen=True)
class MaintenanceReport:
    """A maintenance run: the chain's head (None: no snapshot yet, nothing compacted), per table
    what was done, the staging expiry's summary, wall time (s)."""

    root: str
    head_interval: str | None
    tables: tuple[TableMaintenance, ...] = ()
    staging: Mapping[str, Any] | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON form (bounded: no interval lists)."""
        return {"root": self.root, "head_interval": self.head_interval,
                "tables": {t.table: t.as_dict() for t in self.tables},
                "staging": dict(self.staging) if self.staging is not None else None,
                "seconds": round(self.seconds, 3)}


# ---------------------------------------------------------------------------------------------
# the chain's head and the passed intervals
# ---------------------------------------------------------------------------------------------

def chain_head(layout: Layout) -> str | None:
    """The newest interval the latest snapshot folded (its record's ``interval_id``), or None."""
    record = snapshot_store.latest(layout)
    return None if record is None else str(record["interval_id"])


def passed_intervals(intervals: Iterable[str], head: str | None) -> list[str]:
    """The intervals of ``intervals`` that end at or before the start of ``head`` and are of its
    kind (``IntervalId.precedes``; values that are not interval IDs are left out), oldest first;
    ``[]`` without a head.

    :raises ValueError: ``head`` is not an interval ID.
    """
    if head is None:
        return []
    last = IntervalId.parse(head, "head interval ID")
    passed = (IntervalId.parse_or_none(i) for i in intervals)
    return [str(i) for i in sorted(i for i in passed if i is not None and i.precedes(last))]


# ---------------------------------------------------------------------------------------------
# one table
# ---------------------------------------------------------------------------------------------

def _rows_by_interval(files: Sequence[delta_tables.DataFile]) -> dict[str, int]:
    rows: dict[str, int] = {}
    for f in files:
        interval = f.partition.get(delta_tables.INTERVAL_COLUMN) or ""
        rows[interval] = rows.get(interval, 0) + f.rows
    return rows


def needs_compaction(files: Sequence[delta_tables.DataFile]) -> list[str]:
    """The intervals with a partition of more than one file (sorted by ID)."""
    count: dict[tuple, int] = {}
    for f in files:
        key = tuple(sorted(f.partition.items()))
        count[key] = count.get(key, 0) + 1
    return sorted({dict(k).get(delta_tables.INTERVAL_COLUMN) or "" for k, n in count.items() if n > 1} - {""})


def compact_table(uri: str, head: str | None, settings: MaintenanceSettings = MaintenanceSettings(), *,
                  name: str | None = None) -> TableMaintenance:
    """Compact the passed intervals of the interval table at ``uri`` (module docstring).

    :param head: the chain's head (:func:`chain_head`); None compacts nothing.
    :return: the :class:`TableMaintenance` (no vacuum or checkpoint yet).
    :raises MaintenanceError: a compaction commit changed the row count of an interval (names it,
        both counts and the version to restore).
    """
    # lazy: deltalake stays off the DAG-parse path (etl.maintenance imports this module's settings)
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import CommitProperties

    t0 = time.monotonic()
    name = name or uri.rstrip("/").rsplit("/", 1)[-1]
    dt = delta_tables.open_table(uri)
    if dt is None:
        return TableMaintenance(name, uri, seconds=time.monotonic() - t0)
    files = delta_tables.table_files(uri, dt=dt)
    todo = passed_intervals(needs_compaction(files), head)[: int(settings.max_intervals)]
    files_before = len(files)
    compacted: list[str] = []
    skipped = None
    for at in range(0, len(todo), int(settings.intervals_per_commit)):
        chunk = todo[at: at + int(settings.intervals_per_commit)]
        before = _rows_by_interval([f for f in files if f.partition.get(delta_tables.INTERVAL_COLUMN) in chunk])
        meta: dict[str, Any] = {"operation": MAINTENANCE_OPERATION, "intervals": chunk, "head_interval": head}
        # the content digests of the rows it rewrites travel with them (tables.content): the log
        # entries of the interval's dedupe commit may be cleaned up later
        carried = content.interval_contents(uri, chunk, dt=dt)
        if carried:
            meta[content.CONTENT_KEY] = {i: d.as_dict() for i, d in sorted(carried.items())}
        props = CommitProperties(custom_metadata={delta_tables.METADATA_KEY: json.dumps(meta, sort_keys=True)})
        version_before = dt.version()
        try:
            metrics = dt.optimize.compact(partition_filters=[(delta_tables.INTERVAL_COLUMN, "in", chunk)],
                                          target_size=settings.target_file_bytes, commit_properties=props)
        except CommitFailedError as exc:
            skipped = f"a concurrent writer changed intervals {chunk[0]} .. {chunk[-1]} meanwhile ({exc}); retried at the next run"
            log.warning("%s: compaction skipped: %s", uri, skipped)
            break
        files = delta_tables.table_files(uri, dt=dt)  # dt is at the compaction's commit now
        after = _rows_by_interval([f for f in files if f.partition.get(delta_tables.INTERVAL_COLUMN) in chunk])
        if after != before:
            changed = sorted(i for i in set(before) | set(after) if before.get(i) != after.get(i))
            raise MaintenanceError(
                f"{uri}: compaction changed the rows of interval(s) {changed[:5]}: before {[before.get(i) for i in changed[:5]]}, "
                f"after {[after.get(i) for i in changed[:5]]}; restore the table with "
                f"DeltaTable({uri!r}).restore({version_before})", table=uri)
        compacted += chunk
        log.info("%s: compacted %d interval(s) %s .. %s: %d files -> %d (version %d)", uri, len(chunk), chunk[0],
                 chunk[-1], metrics.get("numFilesRemoved"), metrics.get("numFilesAdded"), dt.version())
    rows = sum(f.rows for f in files if f.partition.get(delta_tables.INTERVAL_COLUMN) in set(compacted))
    return TableMaintenance(name, uri, tuple(compacted), files_before, len(files), rows, int(dt.version()),
                            skipped=skipped, seconds=time.monotonic() - t0)


def finish_table(result: TableMaintenance, settings: MaintenanceSettings) -> TableMaintenance:
    """Vacuum, checkpoint and log cleanup of ``result``'s table (each as ``settings`` say)."""
    t0 = time.monotonic()
    vacuumed = delta_tables.vacuum(result.uri, int(settings.vacuum_retention_hours))
    dt = delta_tables.open_table(result.uri)
    if dt is None:
        return result
    checkpoint = None
    if settings.checkpoint:
        dt.create_checkpoint()
        checkpoint = int(dt.version())
    if settings.cleanup_logs:
        dt.cleanup_metadata()
    return replace(result, vacuumed=vacuumed, version=int(dt.version()), checkpoint_version=checkpoint,
                   seconds=result.seconds + time.monotonic() - t0)


# ---------------------------------------------------------------------------------------------
# the root
# ---------------------------------------------------------------------------------------------

def maintain_tables(root: StorageRoot, *, settings: MaintenanceSettings = MaintenanceSettings(), stream: str = "EVENTS",
                    staging_retention_seconds: float | None = None) -> MaintenanceReport:
    """One maintenance run over every output table under ``root`` (module docstring).

    :param root: the storage root (path, fsspec URL or :class:`Layout`).
    :param settings: :class:`MaintenanceSettings`.
    :param stream: the stream whose staging is expired.
    :param staging_retention_seconds: when given, the staging of reconciled intervals staged longer
        ago than this (s) is expired last (``reconcile.expire_staging``); its JSON summary goes into
        the report (``staging``).
    :return: the :class:`MaintenanceReport`.
    :raises MaintenanceError: as :func:`compact_table`.
    :raises ValueError: a root that ``Layout.of`` refuses.
    """
    layout = Layout.of(root)
    t0 = time.monotonic()
    head = chain_head(layout)
    results = []
    for name in delta_tables.INTERVAL_TABLES:
        result = compact_table(delta_tables.interval_table_uri(layout, name), head, settings, name=name)
        results.append(finish_table(result, settings))
    for table in snapshot_store.ALL_TABLES:
        uri = snapshot_store.snapshot_table_uri(layout, table)
        if delta_tables.open_table(uri) is None:
            continue
        files = len(delta_tables.table_files(uri))
        results.append(finish_table(TableMaintenance(f"snapshots/{table}", uri, files_before=files, files_after=files),
                                    settings))
    staging = (None if staging_retention_seconds is None
               else reconcile.expire_staging(layout, stream, staging_retention_seconds))
    report = MaintenanceReport(layout.root, head, tuple(results), staging, time.monotonic() - t0)
    log.info("maintenance of %s (chain head %s): %s", layout.root, head,
             "; ".join(f"{t.table}: {len(t.compacted)} interval(s) compacted, files {t.files_before} -> "
                       f"{t.files_after}, {t.vacuumed} vacuumed" + (f", skipped: {t.skipped}" if t.skipped else "")
                       for t in results))
    return report
