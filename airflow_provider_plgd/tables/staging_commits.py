"""The staging table's commit protocol: one Delta commit per fetch range, per batch, per plan and per expiry.

Files are written first (``fetch/stager.py``), then committed here with ``deltalake``'s
``create_write_transaction`` (add and remove actions in one commit) and an app transaction per
range or batch (``app_transactions``), so a retried task commits nothing twice and an older run
is refused. :func:`begin_interval` starts a run of an interval (its files removed, the run
version recorded); :func:`commit_range` and :func:`commit_batches` commit a fetch;
:func:`expire_intervals` removes reconciled intervals' staging (retention). The layout, schema,
names and readers: :mod:`airflow_provider_plgd.tables.staging`. Errors: ``TableCommitError``
after the retries of a conflicting commit (``COMMIT_TRIES``); ``LedgerError`` for a commit of a
run older than the one recorded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_plgd.exceptions import LedgerError, TableCommitError
from airflow_provider_plgd.tables import delta_tables
from airflow_provider_plgd.tables.layout import Layout
from airflow_provider_plgd.tables.staging import (
    COMMIT_TRIES,
    CREATED_BY,
    DEFAULT_VACUUM_RETENTION_HOURS,
    EVENT_TYPE_COLUMN,
    HISTORY_SEARCH,
    INTERVAL_COLUMN,
    PARTITION_COLUMNS,
    TABLE_SCHEMA,
    StagedFile,
    batch_app_id,
    batch_file_prefix,
    file_batch_owner,
    file_range,
    log,
    log_files,
    new_write_id,
    plan_app_id,
    range_app_id,
    staged_intervals,
    validate_partition_value,
)


@dataclass(frozen=True)
class StagingCommit:
    """What a staging commit did: the Delta ``version`` it created (None: nothing new, the same run
    had committed already) and the files of the batches or range now committed."""

    version: int | None
    files: tuple[StagedFile, ...]


def _table(layout: Layout, stream: str):
    return delta_tables.ensure_table(layout.staging_table(stream), TABLE_SCHEMA, PARTITION_COLUMNS)


def _remove(f: StagedFile, now_ms: int):
    from deltalake.transaction import RemoveAction  # lazy: deltalake stays off the DAG-parse path

    return RemoveAction(f.path, True, now_ms, f.size, {INTERVAL_COLUMN: f.interval_id, EVENT_TYPE_COLUMN: f.event_type})


def _commit(dt: Any, actions: list, apps: Mapping[str, int], metadata: Mapping[str, Any],
            now_ms: int) -> tuple[int, Any]:
    """One Delta commit (``append`` mode: adds and removes as given) with app transactions.

    :return: ``(its version, the table at the latest version)``.
    :raises CommitFailedError: Delta's conflict check refused it (deltalake's exception).
    """
    from deltalake.transaction import CommitProperties, Transaction  # lazy: as in _remove

    commit_id = new_write_id()
    props = CommitProperties(
        custom_metadata={delta_tables.METADATA_KEY: json.dumps({**metadata, "commit_id": commit_id}, sort_keys=True,
                                                               default=str)},
        app_transactions=[Transaction(app, int(v), now_ms) for app, v in apps.items()])
    dt.create_write_transaction(actions, mode="append", schema=TABLE_SCHEMA, partition_by=list(PARTITION_COLUMNS),
                                commit_properties=props)
    dt.update_incremental()
    for entry in dt.history(limit=20):  # delta-rs may have committed after other writers' commits
        if delta_tables.commit_metadata(entry).get("commit_id") == commit_id:
            return int(entry["version"]), dt
    return int(dt.version()), dt


def _retrying(uri: str, what: str, attempt: Callable[[], StagingCommit]) -> StagingCommit:
    """Run ``attempt`` (which reopens the table, re-checks and commits) until Delta accepts its
    commit: a conflict with another writer's commit (another range's, an expiry's delete) is
    retried on the new version; after :data:`COMMIT_TRIES` the last conflict is raised as
    ``TableCommitError``."""
    from deltalake.exceptions import CommitFailedError  # lazy: as in _remove

    last: Exception | None = None
    for i in range(COMMIT_TRIES):
        try:
            return attempt()
        except CommitFailedError as exc:
            last = exc
            log.info("%s: %s conflicted with another commit (%s); trying again on the new version", uri, what, exc)
            time.sleep(min(0.05 * 2 ** i, 1.0))
    raise TableCommitError(f"{uri}: {what} conflicted with other commits {COMMIT_TRIES} times ({last}); "
                           "nothing committed by this task", table=uri) from last


def _check_newer(uri: str, app: str, done: int | None, run_version: int, what: str) -> bool:
    """True when ``app`` already holds ``run_version``; raise when it holds a newer one."""
    if done is None or int(done) < run_version:
        return False
    if int(done) == run_version:
        return True
    raise TableCommitError(f"{uri}: a newer run committed {what} first ({app}: version {done} > this run's "
                           f"{run_version}); nothing committed by this task", table=uri)


def begin_interval(layout: Layout, stream: str, interval_id: str, run_version: int,
                   metadata: Mapping[str, Any] | None = None) -> StagingCommit:
    """Start run ``run_version`` of an interval (the ETL's ``plan``): one commit that removes every
    staging file of the interval and records ``run_version`` (:func:`plan_app_id`). The fetch
    commits of the run check it (:func:`commit_range`). A retry of the same run is a no-op.

    :return: the commit (``files``: the files removed; ``version`` None when the run had begun already).
    :raises TableCommitError: a newer run of the interval began first.
    """
    uri = layout.staging_table(stream)
    validate_partition_value(interval_id, "interval_id")

    def attempt() -> StagingCommit:
        dt = _table(layout, stream)
        app = plan_app_id(interval_id)
        if _check_newer(uri, app, dt.transaction_version(app), run_version, f"the plan of interval {interval_id}"):
            return StagingCommit(None, ())
        old = log_files(dt, uri, [interval_id])
        now_ms = int(time.time() * 1000)
        meta = {"operation": "begin_interval", "interval_id": interval_id, "run_version": run_version,
                "removed_files": len(old), "removed_rows": sum(f.rows for f in old), "created_by": CREATED_BY,
                **(metadata or {})}
        return StagingCommit(_commit(dt, [_remove(f, now_ms) for f in old], {app: run_version}, meta, now_ms)[0],
                             tuple(old))

    return _retrying(uri, f"the start of interval {interval_id}'s run {run_version}", attempt)


def range_files(dt: Any, uri: str, interval_id: str, range_index: int, run_version: int) -> list[StagedFile]:
    """The files of range ``range_index`` of plan ``run_version`` that table ``dt`` names."""
    return [f for f in log_files(dt, uri, [interval_id]) if file_range(f.path) == (range_index, run_version)]


def committed_range(layout: Layout, stream: str, interval_id: str, range_index: int,
                    run_version: int) -> StagingCommit | None:
    """The range's commit of plan ``run_version`` when it is in the log (a retried task's check
    before it reads anything), else None. Its ``version`` is found among the latest
    :data:`HISTORY_SEARCH` commits (else None).

    :raises TableCommitError: a newer plan began the interval, or committed the range.
    :raises LedgerError: the plan's run is not recorded in the table (its ``plan`` did not run
        :func:`begin_interval`).
    """
    uri = layout.staging_table(stream)
    dt = delta_tables.open_table(uri)
    _check_plan(dt, uri, interval_id, run_version)
    if _check_newer(uri, range_app_id(interval_id, range_index), dt.transaction_version(
            range_app_id(interval_id, range_index)), run_version, f"range {range_index} of interval {interval_id}"):
        version = None
        for entry in dt.history(limit=HISTORY_SEARCH):  # the commit's version, when it is recent
            meta = delta_tables.commit_metadata(entry)
            if (meta.get("operation"), meta.get("interval_id"), meta.get("range"), meta.get("run_version")) == (
                    "fetch_range", interval_id, range_index, run_version):
                version = int(entry["version"])
                break
        return StagingCommit(version, tuple(range_files(dt, uri, interval_id, range_index, run_version)))
    return None


def _check_plan(dt: Any, uri: str, interval_id: str, run_version: int) -> None:
    begun = None if dt is None else dt.transaction_version(plan_app_id(interval_id))
    if begun is not None and int(begun) > run_version:
        raise TableCommitError(f"{uri}: a newer plan of interval {interval_id} began its run ({begun} > this task's "
                               f"plan {run_version}); nothing committed by this task", table=uri)
    if begun is None or int(begun) != run_version:
        raise LedgerError(f"interval {interval_id}: the staging table {uri} records no start of the plan's run "
                          f"{run_version} (found {begun}); run the interval again from its plan task",
                          interval_id=interval_id)


def commit_range(layout: Layout, stream: str, interval_id: str, range_index: int, run_version: int,
                 records: Sequence[Mapping[str, Any]], metadata: Mapping[str, Any] | None = None) -> StagingCommit:
    """Commit the files of one fetch range in **one** Delta append (the ETL's fetch task).

    The commit carries the app transaction :func:`range_app_id` with the plan's ``run_version``.
    Before it, in the version it commits on, the plan's run must be the interval's current one
    (:func:`begin_interval`), and the range must not be committed yet: a retried task's commit is a
    no-op (its files stay unnamed), two tasks of the range at once cannot both commit (the second
    sees the first's transaction, or Delta refuses it), and an older plan's task is refused.
    Conflicts with other writers' commits (other ranges, an expiry) are retried.

    :param records: the files (``file_records.file_record`` dicts; paths relative to the table).
    :return: the commit; ``version`` None when the range was committed already (``files``: the
        files of that commit).
    :raises TableCommitError: a newer plan began the interval or committed the range.
    :raises LedgerError: the plan's run is not recorded in the table.
    """
    uri = layout.staging_table(stream)
    app = range_app_id(interval_id, range_index)

    def attempt() -> StagingCommit:
        dt = _table(layout, stream)
        _check_plan(dt, uri, interval_id, run_version)
        if _check_newer(uri, app, dt.transaction_version(app), run_version, f"range {range_index} of {interval_id}"):
            return StagingCommit(None, tuple(range_files(dt, uri, interval_id, range_index, run_version)))
        now_ms = int(time.time() * 1000)
        meta = {"operation": "fetch_range", "interval_id": interval_id, "range": range_index,
                "run_version": run_version, "files": len(records), "rows": sum(int(r["rows"]) for r in records),
                "created_by": CREATED_BY, **(metadata or {})}
        version, dt = _commit(dt, delta_tables.add_actions(records, now_ms), {app: run_version}, meta, now_ms)
        return StagingCommit(version, tuple(range_files(dt, uri, interval_id, range_index, run_version)))

    return _retrying(uri, f"range {range_index} of interval {interval_id}", attempt)


def commit_batches(layout: Layout, stream: str, interval_id: str, owner_id: str, event_types: Sequence[str],
                   records: Sequence[Mapping[str, Any]], run_version: int,
                   metadata: Mapping[str, Any] | None = None) -> StagingCommit:
    """Replace the batches (``owner_id``, each of ``event_types``) of an interval in one Delta
    commit (the operator's modes other than the ETL's range): the batches' earlier files
    (:func:`file_batch_owner`) are removed and ``records`` added. Each batch's app transaction
    (:func:`batch_app_id`) carries ``run_version`` (the task's start, ms): a retried commit of the
    same task is a no-op, an older task's commit is refused. Other writers' commits are retried.

    :return: the commit (``files``: the batches' files now).
    :raises TableCommitError: a newer task committed one of the batches first.
    """
    uri = layout.staging_table(stream)
    types = sorted(set(event_types))
    apps = {batch_app_id(interval_id, owner_id, t): run_version for t in types}
    batch_file_prefix(owner_id, "x")  # the owner is safe in a file name

    def mine(f: StagedFile) -> bool:
        return f.event_type in types and file_batch_owner(f.path) == owner_id

    def attempt() -> StagingCommit:
        dt = _table(layout, stream)
        done = [_check_newer(uri, app, dt.transaction_version(app), run_version, f"batch {app}") for app in apps]
        if done and all(done):
            return StagingCommit(None, tuple(f for f in log_files(dt, uri, [interval_id]) if mine(f)))
        old = [f for f in log_files(dt, uri, [interval_id]) if mine(f)]
        now_ms = int(time.time() * 1000)
        meta = {"operation": "fetch_batches", "interval_id": interval_id, "owner_id": owner_id, "event_types": types,
                "run_version": run_version, "files": len(records), "rows": sum(int(r["rows"]) for r in records),
                "replaced_files": len(old), "created_by": CREATED_BY, **(metadata or {})}
        version, dt = _commit(dt, [_remove(f, now_ms) for f in old] + delta_tables.add_actions(records, now_ms),
                              apps, meta, now_ms)
        return StagingCommit(version, tuple(f for f in log_files(dt, uri, [interval_id]) if mine(f)))

    return _retrying(uri, f"the batches of owner {owner_id} in interval {interval_id}", attempt)


# --------------------------------------------------------------------------------------------------
# Retention
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Expiry:
    """What :func:`expire_intervals` did: the intervals whose files it removed (one Delta
    ``version``, None when none), the files and rows removed, and the files vacuum deleted."""

    intervals: tuple[str, ...]
    version: int | None
    files: int
    rows: int
    vacuumed: int


def expire_intervals(layout: Layout, stream: str, *, retention_seconds: float, now_s: float | None = None,
                     committed: Callable[[str], bool] | None = None,
                     vacuum_retention_hours: int = DEFAULT_VACUUM_RETENTION_HOURS) -> Expiry:
    """Expire staging: remove the files of every interval staged more than ``retention_seconds``
    ago (the newest file's commit time) for which ``committed(interval_id)`` is true (default:
    every such interval), in one Delta commit, then ``vacuum`` the table (files removed, or never
    committed, more than ``vacuum_retention_hours`` ago). Safe while fetch tasks commit other
    intervals (their commits are retried on the new version) and while decode reads others.

    The ETL calls it after each reconciled interval (``etl.summarize_interval``) with
    ``committed`` = the interval's ledger reconciled; table maintenance may call it too.

    :param retention_seconds: how long staging of a committed interval is kept (s, >= 0).
    :param now_s: the current time (unix s; default the clock).
    :param vacuum_retention_hours: vacuum's retention (>= 0; -1: no vacuum).
    :return: :class:`Expiry`.
    :raises ValueError: a negative retention.
    """
    if retention_seconds < 0:
        raise ValueError(f"staging retention must be >= 0 seconds, got {retention_seconds!r}")
    uri = layout.staging_table(stream)
    cutoff_ms = int(((time.time() if now_s is None else now_s) - retention_seconds) * 1000)
    old_intervals = sorted(iid for iid, s in staged_intervals(layout, stream).items() if s["modified_ms"] <= cutoff_ms)
    chosen = tuple(iid for iid in old_intervals if committed is None or committed(iid))
    result: list[StagingCommit] = []

    def attempt() -> StagingCommit:
        dt = _table(layout, stream)
        old = log_files(dt, uri, chosen)
        if not old:
            return StagingCommit(None, ())
        now_ms = int(time.time() * 1000)
        meta = {"operation": "expire", "intervals": list(chosen), "retention_seconds": retention_seconds,
                "removed_files": len(old), "created_by": CREATED_BY}
        return StagingCommit(_commit(dt, [_remove(f, now_ms) for f in old], {}, meta, now_ms)[0], tuple(old))

    if chosen:
        result.append(_retrying(uri, f"the expiry of {len(chosen)} interval(s)", attempt))
    vacuumed = delta_tables.vacuum(uri, vacuum_retention_hours)
    done = result[0] if result else StagingCommit(None, ())
    if chosen:
        log.info("Staging %s: expired %s interval(s) (%s files, %s rows), vacuumed %s file(s)", uri, len(chosen),
                 len(done.files), sum(f.rows for f in done.files), vacuumed)
    return Expiry(chosen, done.version, len(done.files), sum(f.rows for f in done.files), vacuumed)
