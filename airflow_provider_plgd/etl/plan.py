"""The ETL's ``plan`` step: count the interval on the server, write its ledger, decide whether Spark runs.

:func:`plan_interval` is the ``plan`` task's work as a plain function; the task adds the Airflow
context (the run's data interval, the lineage report).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow_provider_plgd import run_params, times
from airflow_provider_plgd.compat import AirflowFailException as _FailWithoutRetry
from airflow_provider_plgd.exceptions import (
    FewerMessagesError,
    NarrowerRerunError,
    OldLayoutError,
    OutOfOrderIntervalError,
    PipelineIdentityError,
    StorageRootOverlapError,
)
from airflow_provider_plgd.fetch.selection import Selection
from airflow_provider_plgd.hooks.base import resolve_layout
from airflow_provider_plgd.plgd.subjects import owner_filter
from airflow_provider_plgd.spark_deps import build_private_py_files_zip
from airflow_provider_plgd.tables import (
    chain,
    delta_tables,
    identity,
    ledger,
    ledger_guards,
    root_guard,
    snapshot_store,
    staging_commits,
)
from airflow_provider_plgd.tables.interval_plan import IntervalPlan
from airflow_provider_plgd.tables.layout import Layout
from airflow_provider_plgd.tables.run_summary import APPS, read_app_summary

if TYPE_CHECKING:
    from airflow_provider_plgd.hooks.info import JetStreamInfoHook

#: Messages per fetch task that ``plan`` aims at (``build_etl_dag(fetch_range_messages=...)``).
DEFAULT_FETCH_RANGE_MESSAGES = 100_000

_log = logging.getLogger(__package__)  # the ETL's one logger: "airflow_provider_plgd.etl"


def plan_interval(params: Mapping[str, Any], *, start: datetime, end: datetime, dag_id: str,
                  jetstream_conn_id: str, spark_conf_policy: Mapping[str, str | None], allowed_roots: Iterable[str],
                  author: Any, fetch_range_messages: int = DEFAULT_FETCH_RANGE_MESSAGES,
                  hook_factory: Callable[[str], JetStreamInfoHook] | None = None,
                  report_lineage: Callable[[Sequence[str], str, Layout], None] | None = None,
                  build_py_files: bool = True) -> IntervalPlan:
    """Plan one interval: check the run params, record the interval ledger, build the --py-files zip.

    The body of the ETL DAG's ``plan`` task without its Airflow context. In order: every run param
    a triggering user may set is checked, and those of the pipeline's identity against the DAG
    author's (``run_params.check_run``); the storage
    root is resolved, refused when it lies inside or above another root or a table
    (``tables.root_guard.check_apart``), and its layout checked; the identity is compared with the one recorded at the
    root (``identity.check_recorded``); a new interval older than the chain's head is refused
    (``chain.check_not_behind_head``); no unplanned stretch may precede the interval
    (``ledger_guards.check_no_gap_before``, ``ledger_guards.check_no_hole_before``); the interval must be complete on the server
    (``require_interval_complete``); the identity is recorded when the root has none
    (``identity.record_first``, one create-if-absent; a root recorded at the same moment inside
    or above this one is found by a second ``check_apart``) and the ledger's ``stream.json`` is written
    (:func:`write_interval_ledger`); the ``--py-files`` zip is built (never on the storage root),
    unless ``build_py_files`` is False.

    :param params: the run's params (the DAG's :data:`~airflow_provider_plgd.etl.params.DEFAULT_PARAMS`
        updated with the run's conf; untrusted).
    :param start: the data interval start (aware); ``end``: its end (aware).
    :param dag_id: the DAG ID (the gap check names it).
    :param jetstream_conn_id: the ``plgd_jetstream`` connection.
    :param spark_conf_policy: the Spark settings a run may set (``run_params.run_spark_conf_policy``).
    :param allowed_roots: storage roots a run may choose besides the connection's.
    :param author: the DAG author's params, checked (``run_params.RunParams``): the pipeline's identity.
    :param fetch_range_messages: messages per fetch range aimed at.
    :param hook_factory: called with the checked stream name, returns the hook that checks
        completeness and counts (``require_interval_complete``, ``count_ranges``, ``get_settings``);
        default a ``JetStreamInfoHook`` (the stream-info role) on ``jetstream_conn_id``.
    :param report_lineage: called with ``(servers, stream, layout)`` after the zip is built
        (the ``plan`` task reports its OpenLineage datasets with it).
    :param build_py_files: build the ``--py-files`` zip (``spark-submit``); False for a DAG on Spark
        Connect, whose applications ship their own code (``addArtifacts``): the plan's ``py_files``
        is then None.
    :return: the plan (its ``to_xcom()`` is the ``plan`` XCom).
    :raises UntrustedRunParamError: a run param that fails its check or differs from the DAG
        author's identity (no retries).
    :raises AirflowFailException: a storage root inside or above another root or a table
        (``StorageRootOverlapError``), a storage root of the old layout (``OldLayoutError``), settings
        other than the identity recorded at the root (``PipelineIdentityError``), a new interval older than
        the chain's head (``OutOfOrderIntervalError``), a rerun that would narrow the selection or
        lose messages (``NarrowerRerunError``, ``FewerMessagesError``): the same answer on every retry.
    :raises IntervalGapError: an interval before this one that no run planned
        (``ledger_guards.check_no_gap_before``, ``ledger_guards.check_no_hole_before``).
    :raises IntervalNotCompleteError: the interval is not complete on the server.
    """
    # the trust boundary: every param a triggering user may set, checked before anything is read
    checked = run_params.check_run(params, author, spark_conf_policy=spark_conf_policy, storage_roots=allowed_roots,
                                   jetstream_conn_id=jetstream_conn_id)
    layout = resolve_layout(checked.storage_root, jetstream_conn_id)  # the one resolution of the run's root
    dag_roots = run_params.own_roots(author, jetstream_conn_id)
    try:  # a root inside or above another root or a table (by their records), then the layout before Delta Lake
        root_guard.check_apart(layout, dag_roots if layout.root != dag_roots[0] else ())
        delta_tables.check_layout(layout)
    except StorageRootOverlapError as err:
        raise _FailWithoutRetry(f"{type(err).__name__}: {err}") from err
    except OldLayoutError as err:
        raise _FailWithoutRetry(str(err)) from None
    pipeline_identity = identity.PipelineIdentity.of(storage_root=layout.root, **checked.identity())
    window = times.Interval.of(start, end)
    interval = window.id
    try:
        identity.check_recorded(layout, pipeline_identity.as_dict())
        # a new interval older than what the tables already built on (refused, never replayed)
        chain.check_not_behind_head(
            interval, chain.dedupe_log(layout), stage="plan",
            processed_before=ledger.read_plan(layout, checked.stream, interval) is not None)
    except (PipelineIdentityError, OutOfOrderIntervalError) as err:
        raise _FailWithoutRetry(f"{type(err).__name__}: {err}") from err
    # what dedupe and rebuild would refuse after decode's commit: stale intervals before this one,
    # a rerun older than the snapshots the log still holds (retried: a run before may still finish)
    chain.check_before_run(layout, interval)
    selection = Selection(checked.owners, checked.event_types)  # checked once, in check_run_params
    # a stretch before this interval that no run planned (IntervalGapError, retried, then fails):
    # its events would be missing from this interval's snapshot
    ledger_guards.check_no_gap_before(layout, checked.stream, interval, dag_id=dag_id)
    # and no hole further back, between intervals planned in another order (a backfill run's plan
    # may run before the scheduled run of an earlier interval): the scheduler's skip of a backfill
    ledger_guards.check_no_hole_before(layout, checked.stream, interval, dag_id=dag_id)
    if hook_factory is None:
        # lazy: the JetStream hook stays off the DAG-parse path (CONTRIBUTING.md, "Imports at the top")
        from airflow_provider_plgd.hooks.info import JetStreamInfoHook

        hook = JetStreamInfoHook(jetstream_conn_id, stream=checked.stream)
    else:
        hook = hook_factory(checked.stream)
    # the sensor's rule again before counting (a mirror's link may have dropped since): complete, or raise
    hook.require_interval_complete(start, end, settle_seconds=checked.numbers["settle_seconds"])
    owners = list(selection.owners) or None  # None: every owner, read through plgd.>
    try:
        # the first plan on a root records it (checked above), atomically: of two at once one wins
        _recorded, first = identity.record_first(layout, pipeline_identity)
        if first:  # a root made at the same moment inside or above this one: its record is there now
            try:
                root_guard.check_apart(layout)
            except StorageRootOverlapError as err:
                identity.forget(layout)
                raise _FailWithoutRetry(f"{type(err).__name__}: {err}") from err
        record = write_interval_ledger(
            hook, layout, window, owners, list(selection.event_types),
            accept_fewer=checked.accept_fewer_messages,
            max_ranges=int(checked.numbers["max_fetch_tasks"]), range_messages=fetch_range_messages,
        )
    except (NarrowerRerunError, FewerMessagesError, PipelineIdentityError) as err:  # the same on every retry
        raise _FailWithoutRetry(f"{type(err).__name__}: {err}") from err
    # Never on the storage root: the Spark driver runs this code inside the worker
    # (docs/operations.md, "Shipping the plgd code to executors").
    py_files = build_private_py_files_zip(storage_root=layout.root) if build_py_files else None
    if report_lineage is not None:
        report_lineage(hook.get_settings().servers, checked.stream, layout)
    # each fetch task gets its range's number; the range is in the ledger: XCom stays small
    return IntervalPlan(layout=layout, interval_id=interval, snapshot_time=end.isoformat(),
                        ledger=layout.ledger_interval_dir(checked.stream, interval),
                        owners=None if owners is None else len(owners), messages=int(record["total"]),
                        fetch_ranges=int(record["fetch_ranges"]),
                        py_files=None if py_files is None else str(py_files),
                        spark_skip=record.get("spark_skip"))


def write_interval_ledger(hook: JetStreamInfoHook, layout: Layout, window: times.Interval, owners: list[str] | None, event_types: list[str], *, accept_fewer: bool,
                          max_ranges: int = 1, range_messages: int = DEFAULT_FETCH_RANGE_MESSAGES) -> dict[str, Any]:
    """Count what the stream holds for the interval on the server and write the ledger's ``stream.json``.

    The fetch reads ``ledger.SCOPE_FILTER`` (``plgd.>``), or with selected ``owners`` their
    ``plgd.owners.{owner}.>`` filters; the interval's stream-sequence range is cut into at most
    ``max_ranges`` ranges of about ``range_messages`` messages, each counted exactly
    (:meth:`JetStreamHook.acount_ranges`: consumers per range boundary, none per owner). A previous
    record of the interval with more messages (a re-created or purged stream, deletes) raises
    :class:`FewerMessagesError` unless ``accept_fewer``; one whose run staged owners or event types
    this one does not select raises :class:`~airflow_provider_plgd.exceptions.NarrowerRerunError`
    (``ledger_guards.check_selection_covers``; the earlier run's owners from its staging,
    ``ledger_guards.owners_of_run``, only when this run selects owners). Then the run begins in the
    staging table (``staging_commits.begin_interval``: the interval's earlier staging removed, the run
    version recorded, which every fetch commit of the run checks), and the interval's old fetch
    records are removed, so the rerun's are its own. ``spark_skip`` in the record: :func:`spark_skip_reason`.

    :param window: the interval (its ID names the ledger folder). :param owners: checked owner IDs
        (``fetch.selection.Selection``), or None for every owner.
    :return: the record (``ledger.PlanRecord.as_dict``, with ``spark_skip``).
    """
    interval = window.id
    run_version = time.time_ns() // 1_000_000
    read_filters = [ledger.SCOPE_FILTER] if owners is None else [owner_filter(o) for o in owners]
    counted = hook.count_ranges(read_filters, start_time=window.start_ns, end_time=window.end_ns,
                                range_messages=range_messages, max_ranges=max_ranges, scope_filter=ledger.SCOPE_FILTER)
    plan = ledger.PlanRecord.of(counted, interval_id=interval, owners=owners, event_types=event_types,
                                read_filters=read_filters, bounds=window.bounds(), run_version=run_version)
    plan = dataclasses.replace(plan, spark_skip=spark_skip_reason(layout, plan.as_dict(), window.end_ns))
    record = plan.as_dict()
    base = layout.ledger_interval_dir(plan.stream, interval)
    previous_plan, earlier_records = ledger.read_records(layout, plan.stream, interval)
    # the rerun guards read every ledger version: the records' JSON
    previous = None if previous_plan is None else previous_plan.as_dict()
    previous_records = [r.as_dict() for r in earlier_records]
    ledger_guards.check_selection_covers(
        previous, record, previous_records,
        staged_owners=lambda: ledger_guards.owners_of_run(layout, plan.stream, interval, previous_records))
    lost = ledger_guards.check_not_fewer(previous, record, accept_fewer=accept_fewer)
    if lost:
        _log.warning("Interval %s: accepting fewer messages than before (accept_fewer_messages): %s", interval,
                     "; ".join(lost))
    if plan.deleted_in_range:
        _log.warning("Interval %s: %s stream sequences of its range [%s, %s) hold no message (deleted from the "
                     "stream, e.g. max_msgs_per_subject or single deletes); the ledger records it",
                     interval, plan.deleted_in_range, plan.first_seq, plan.end_seq_exclusive)
    staging_commits.begin_interval(layout, plan.stream, interval, run_version, {"total": plan.total})
    ledger.write_ledger_file(f"{base}/{ledger.PLAN_FILE}", record)
    ledger.clear_fetch_records(layout, plan.stream, interval)
    _log.info("Interval %s: the fetch reads %s messages of %s (sequences %s..%s) in %s range(s); the stream holds "
              "%s of %s", interval, plan.total, "every owner" if owners is None else f"{len(owners)} owner(s)",
              plan.first_seq, plan.end_seq_exclusive - 1, len(plan.ranges), plan.scope_total, ledger.SCOPE_FILTER)
    return record



def spark_skip_reason(layout: Layout, record: Mapping[str, Any], end: datetime | int) -> str | None:
    """Why ``decode``, ``dedupe`` and ``rebuild`` may skip the interval of a plan record, or None.

    They skip only when all of these hold, so skipping changes no table:

    * the stream holds no message for the interval (``record["total"] == 0``);
    * no Spark application has a run summary of the interval (else an earlier run wrote outputs,
      and a rerun must replace them);
    * no pending of the latest snapshot expires before the interval end (``next_expiry_ns`` of its
      record, the rule of ``rebuild_snapshots``), or there is no snapshot yet (intervals before
      the stream's first message).

    A skipped interval commits nothing: dedupe's lookback counts intervals with rows, so it then
    reaches further back in time, never less; rebuild folds every interval with rows after its
    base snapshot, so the next non-empty interval builds on the last snapshot.

    :param layout: the storage root; ``record``: the plan record; ``end``: the interval end (aware, or unix ns).
    """
    if int(record["total"]):
        return None
    interval = record["interval_id"]
    if any(read_app_summary(layout, app, interval) is not None for app in APPS):
        return None
    latest = snapshot_store.latest(layout)
    if latest is None:
        return "the stream holds no message for the interval and there is no snapshot yet"
    end_ns = times.to_ns(end, "end")
    if any(ns is not None and int(ns) < end_ns for ns in (latest.get("next_expiry_ns") or {}).values()):
        return None
    return f"the stream holds no message for the interval and no pending of snapshot {latest['version']} expires in it"

