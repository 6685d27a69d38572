"""The plgd ETL DAG factory: JetStream → staging → decode → dedupe → rebuild snapshots.

``dags/plgd_events_etl.py`` calls :func:`build_etl_dag`; other deployments can call it with their
own ``dag_id``, schedule and defaults. Source of the task order: ``docs/architecture.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from airflow_provider_plgd.spark_conf import DEFAULT_SPARK_CONF  # noqa: F401 - re-exported
from airflow_provider_plgd import delta_tables, times
from airflow_provider_plgd.exceptions import MissingDataIntervalError, OffScheduleIntervalError, OldLayoutError
from airflow_provider_plgd.storage_root import resolve_storage_root
from airflow_provider_plgd.compat import (
    AIRFLOW_V_3,
    Asset,
    CronDataIntervalTimetable,
    DeltaDataIntervalTimetable,
)

#: Params of the ETL DAG; every one can be overridden per run (``--conf``) or per backfill.
DEFAULT_PARAMS: dict[str, Any] = {
    "stream": "EVENTS",
    "owners": [],  # [] = every owner with messages in the interval (and the unrouted messages)
    "event_types": [],  # [] = every event type on NATS (plgd.event_types.EVENT_TYPES: live + old hubs' snapshots)
    "storage_root": "",  # "" = the connection's storage_root extra, else $AIRFLOW_HOME/plgd
    "settle_seconds": 60,
    "max_fetch_tasks": 16,
    "lookback_intervals": 24,
    "accept_fewer_messages": False,  # True: a rerun may replace committed data with fewer messages
    "max_content_bytes": 4 * 1024 * 1024,  # decode: larger decoded events -> quarantine content_too_large
    "spark_conf": {},  # Spark settings of this run, merged over the DAG's (SPARK_CONF_PARAM_DESCRIPTION)
}

#: Messages per fetch task that ``plan`` aims at (``build_etl_dag(fetch_range_messages=...)``).
DEFAULT_FETCH_RANGE_MESSAGES = 100_000

#: One-line DAG description (the DAG list and the DAG page header show it).
DAG_DESCRIPTION = ("plgd hub events from NATS JetStream, one data interval per run: staging, then Spark "
                   "decode, dedupe and snapshot tables")

#: Doc shown in the DAG's docs panel when the caller gives none (``dags/plgd_events_etl.py`` passes its own).
DEFAULT_DOC_MD = """plgd ETL DAG (built by `airflow_provider_plgd.etl.build_etl_dag`).

Each run processes its data interval: `wait_for_interval` → `plan` → `fetch_ranges` → `fetch` (mapped)
→ `spark_needed` → `decode` → `dedupe` → `rebuild` → `summary`. Parameters and operations:
docs/operations.md of airflow-provider-plgd ("DAG parameters", "Backfill and reruns").
"""

#: Task docs (Markdown) of the ETL DAG's sensor, fetch and Spark tasks: the task's "Task Docs" in the UI.
TASK_DOCS: dict[str, str] = {
    "wait_for_interval": (
        "Waits until the run's data interval is complete on the NATS server's clock: a message at or after "
        "its end, or the end plus `settle_seconds` passed (a mirror: its origin in contact since). First it "
        "refuses a run without a data interval or a manual run off the schedule (`OffScheduleIntervalError`; "
        "nothing is read). docs/reliability.md, \"Complete intervals: judged on the NATS server's clock\"; "
        "docs/operations.md, \"Manual runs\"."),
    "fetch": (
        "Copies one stream-sequence range of the interval from JetStream into staging (one consumer per task; "
        "every message goes to its owner and event type: Parquet parts and a `_manifest-rNNNN.json` per "
        "non-empty batch) and records in the interval ledger what it staged and skipped. A stream holding fewer messages than `plan` counted fails it (`MessagesExpiredError`, "
        "`FewerMessagesError`). docs/architecture.md, \"Staging contract\"."),
    "decode": (
        "Spark: decodes the interval's staged messages (snappy, protobuf, CBOR/JSON content) into the `events` "
        "table; what it cannot decode goes to `quarantine` with a reason. Accounts for every staged message "
        "against the ledger. docs/events.md."),
    "dedupe": (
        "Spark: drops message IDs already seen in this interval or in the `lookback_intervals` processed "
        "intervals before it, writing `events_deduped`. Waits for the previous interval's dedupe "
        "(`depends_on_past`). docs/architecture.md, \"Message ID (dedupe key)\"."),
    "rebuild": (
        "Spark: the snapshot tables at the interval's end: the previous snapshot plus the interval's "
        "deduplicated events, committed as one snapshot version. Waits for the previous interval's rebuild "
        "(`depends_on_past`). docs/snapshots.md."),
}

#: JSON-schema ``pattern`` of one owner ID in the trigger form: the rule of
#: ``plgd.subjects.validate_owner_id`` (no leading ``_``; no ``.``, ``*``, ``>``, ``/``, ``\``,
#: ``=``, ``?``, ``[``, ``]``, whitespace or control characters). ``plan`` checks the same again.
OWNER_ID_PATTERN = r"^[^_.*>/\\=?\[\]\s\x00-\x1f\x7f][^.*>/\\=?\[\]\s\x00-\x1f\x7f]*$"
#: JSON-schema ``pattern`` of a stream name (``hooks.connection.check_stream_name``).
STREAM_NAME_PATTERN = r"^[^.*>/\\\s\x00-\x1f\x7f]+$"


def param_schemas() -> dict[str, dict[str, Any]]:
    """JSON-schema keywords and descriptions of each param of :data:`DEFAULT_PARAMS`, for ``Param``.

    The trigger form shows ``description``, validates ``type``/``minimum``, and offers the
    ``examples`` of an array param as a multi-select (Airflow docs, "Params", "Use Params to
    Provide a Trigger UI Form"). Event types come from :data:`plgd.event_types.EVENT_TYPES`.
    """
    from airflow_provider_plgd.plgd.event_types import EVENT_TYPES

    event_types = list(EVENT_TYPES)
    return {
        "stream": {"type": "string", "minLength": 1, "pattern": STREAM_NAME_PATTERN, "title": "Stream",
                   "description": "JetStream stream that holds the plgd events (subjects plgd.>)."},
        # optional params: null (a cleared field) is their default, so the Trigger form submits them empty
        "owners": {"type": ["null", "array"], "items": {"type": "string", "pattern": OWNER_ID_PATTERN},
                   "uniqueItems": True, "title": "Owners",
                   "description": "Owner IDs to process (the <owner> of plgd.owners.<owner>.>, one per line; no "
                                  "'.', '*', '>', '/', '\\', '=', '?', '[', ']' or spaces, not starting with '_'). "
                                  "Empty: every owner with messages in the interval, and messages outside any "
                                  "owner are staged as unrouted."},
        "event_types": {"type": ["null", "array"], "items": {"type": "string", "enum": event_types}, "uniqueItems": True,
                        "examples": event_types, "title": "Event types",
                        "description": "plgd event types to stage; the others are skipped and counted in the "
                                       "ledger. Empty: every event type."},
        "storage_root": {"type": ["null", "string"], "title": "Storage root",
                         "description": "Root of staging and tables: a local path or an fsspec URL such as "
                                        "s3://bucket/plgd, one the DAG author allows (the DAG's default, "
                                        "build_etl_dag(storage_roots=...), or the connection's). Empty: the "
                                        "connection's storage_root extra, else $AIRFLOW_HOME/plgd."},
        "settle_seconds": {"type": "integer", "minimum": 0, "title": "Settle time (s)",
                           "description": "Seconds after the interval end before it counts as complete "
                                          "(late publishes)."},
        "max_fetch_tasks": {"type": "integer", "minimum": 1, "title": "Max fetch tasks",
                            "description": "At most this many mapped fetch tasks, each reading one "
                                           "stream-sequence range of the interval."},
        "lookback_intervals": {"type": "integer", "minimum": 0, "title": "Dedupe lookback (intervals)",
                               "description": "Dedupe drops message IDs seen in this many earlier processed "
                                              "intervals (intervals without messages are not counted)."},
        "accept_fewer_messages": {"type": "boolean", "title": "Accept fewer messages",
                                  "description": "Let a rerun replace committed data although the stream now "
                                                 "holds fewer messages for the interval (purged or re-created "
                                                 "stream). Off: such a rerun fails."},
        "max_content_bytes": {"type": "integer", "minimum": 1, "title": "Max content size (bytes)",
                              "description": "Decoded events larger than this go to quarantine "
                                             "(reason content_too_large)."},
        "spark_conf": {"type": ["null", "object"], "title": "Spark settings",
                       "description": SPARK_CONF_PARAM_DESCRIPTION},
    }


def etl_params(overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """:data:`DEFAULT_PARAMS` updated with ``overrides``, each a ``Param`` with its :func:`param_schemas`.

    A key without a schema (a caller's own param) is passed through as given.
    """
    try:  # Airflow 3.x
        from airflow.sdk import Param
    except ImportError:  # pragma: no cover - Airflow 2.11
        from airflow.models.param import Param  # type: ignore[no-redef]

    schemas = param_schemas()
    merged = {**DEFAULT_PARAMS, **(overrides or {})}
    return {k: Param(v, **schemas[k]) if k in schemas and not isinstance(v, Param) else v
            for k, v in merged.items()}

#: The description of the ``spark_conf`` param (shown in the trigger form).
SPARK_CONF_PARAM_DESCRIPTION = (
    "Resource settings (--conf) of this run for decode, dedupe and rebuild, merged over the DAG's own; "
    "null removes one. Only the settings the DAG author allows (default: spark.executor.memory, "
    "spark.executor.cores, spark.executor.instances, spark.sql.shuffle.partitions, spark.default.parallelism, "
    "spark.dynamicAllocation.min/initial/maxExecutors); any other fails the run before Spark starts. "
    'E.g. {"spark.executor.memory": "4g"}. See docs/operations.md, "Who may set what".'
)
#: Default ``execution_timeout`` of the three Spark tasks (``build_etl_dag(spark_execution_timeout=...)``).
DEFAULT_SPARK_EXECUTION_TIMEOUT = timedelta(hours=2)

_log = logging.getLogger(__name__)

try:  # Airflow 3.x
    from airflow.sdk.exceptions import AirflowFailException as _FailWithoutRetry
except ImportError:  # pragma: no cover - Airflow 2.11
    from airflow.exceptions import AirflowFailException as _FailWithoutRetry  # type: ignore[no-redef]


def schedule_interval_ending_by(schedule: timedelta | str, start_date: datetime,
                                moment: datetime) -> tuple[datetime, datetime]:
    """The last interval ``[start, end)`` of the ETL DAG's schedule with ``end <= moment``.

    :param schedule: the ``build_etl_dag`` schedule: a ``timedelta`` (intervals ``start_date + k *
        schedule``, as ``DeltaDataIntervalTimetable`` schedules them) or a cron string (UTC;
        ``CronDataIntervalTimetable``, whose ``infer_manual_data_interval`` is this rule).
    :param start_date: the DAG's start date (aware).
    :param moment: an aware datetime.
    """
    if isinstance(schedule, timedelta):
        step_ns = schedule // timedelta(microseconds=1) * 1000  # integers: pendulum's Duration // timedelta fails
        k = (times.to_ns(moment, "moment") - times.to_ns(start_date, "start_date")) // step_ns
        end = start_date + k * schedule
        return end - schedule, end
    from airflow.timetables.interval import CronDataIntervalTimetable as CoreCron  # the core computes the grid

    import pendulum

    interval = CoreCron(schedule, timezone="UTC").infer_manual_data_interval(run_after=pendulum.instance(moment))
    return interval.start, interval.end


def require_data_interval(context: Mapping[str, Any], *, schedule: timedelta | str | None = None,
                          start_date: datetime | None = None) -> tuple[datetime, datetime]:
    """Return the run's ``(data_interval_start, data_interval_end)`` (aware datetimes).

    Used as the ``interval_check`` of ``wait_for_interval`` and by ``plan`` (``build_etl_dag``
    passes its ``schedule`` and ``start_date``).

    :param context: the task context (keys ``data_interval_start``, ``data_interval_end``, ``dag_run``).
    :param schedule: with ``start_date``: refuse a manual run whose interval is not one interval
        of this schedule (:func:`schedule_interval_ending_by`).
    :raises MissingDataIntervalError: when either is missing (a run without a logical date on
        Airflow 3), with the ways to run the DAG for an interval.
    :raises OffScheduleIntervalError: a manual run whose data interval is not an interval of the schedule.
    """
    start, end = context.get("data_interval_start"), context.get("data_interval_end")
    if start is None or end is None:
        dag_run = context.get("dag_run")
        run_id = getattr(dag_run, "run_id", None)
        raise MissingDataIntervalError(
            f"DAG run {run_id!r} has no data interval (logical date None: a manual or asset-triggered run\n"
            "on Airflow 3), so there is no interval of the stream to process. Run an interval with a backfill:\n"
            "  airflow backfill create --dag-id <dag> \\\n"
            "    --from-date <interval start> --to-date <interval start> --reprocess-behavior completed\n"
            "or `airflow dags test <dag> <interval end>`; see docs/operations.md, \"Backfill and reruns\"."
        )
    if end <= start:
        raise MissingDataIntervalError(f"empty data interval [{start}, {end}) of DAG run {context.get('run_id')!r}")
    dag_run = context.get("dag_run")
    run_type = getattr(dag_run, "run_type", None)
    if schedule is not None and start_date is not None and str(getattr(run_type, "value", run_type)) == "manual":
        if (start, end) != schedule_interval_ending_by(schedule, start_date, end):
            grid_start, grid_end = schedule_interval_ending_by(schedule, start_date, context.get("logical_date") or end)
            dag_id = getattr(dag_run, "dag_id", None) or "<dag>"
            raise OffScheduleIntervalError(
                f"manual DAG run {getattr(dag_run, 'run_id', None)!r}\n"
                f"has the data interval [{start.isoformat()}, {end.isoformat()}),\n"
                f"which is not an interval of the schedule ({schedule} from {start_date.isoformat()}).\n"
                "It would overlap processed intervals, so nothing was read or written.\n"
                "The last interval of the schedule that ends by the logical date is\n"
                f"  [{grid_start.isoformat()}, {grid_end.isoformat()}).\n"
                "To (re)process it, use a backfill (the Trigger dialog's Backfill option, or the command below),\n"
                "or clear that interval's run:\n"
                f"  airflow backfill create --dag-id {dag_id} \\\n"
                f"    --from-date {grid_start.isoformat()} --to-date {grid_start.isoformat()} \\\n"
                "    --reprocess-behavior completed\n"
                "See docs/operations.md, \"Manual runs\"."
            )
    return start, end


def log_run_summary(result: Mapping[str, Any], log: logging.Logger | None = None) -> None:
    """Log one run's summary (the dict of :func:`airflow_provider_plgd.run_summary.collect_run_summary`).

    Lines: what the stream holds (the ledger) and what was staged and skipped; messages staged per
    owner and event type (non-zero counts); the owners and event types covered and the other params
    the run used (``params``: :func:`run_params_used`); decoded and quarantined rows (per reason);
    duplicates dropped by dedupe (within the interval / against earlier intervals); snapshot rows
    per table; every problem of the ledger's chain (ERROR); whether it reconciled; lag in seconds
    (now minus the interval end).

    :param result: the summary dict.
    :param log: the logger (default: this module's).
    """
    log = log or _log
    chain = result.get("chain") or {}
    log.info("Interval %s: the stream holds %s messages (%s owners, %s unrouted, %s of owners not requested); "
             "%s staged, skipped %s", result.get("interval_id"), chain.get("stream_total"), chain.get("owners"),
             chain.get("unrouted"), chain.get("not_requested_owners_messages"), result.get("fetched_total"),
             chain.get("skipped") or {})
    idle = []
    for owner, counts in (result.get("fetched") or {}).items():
        if not any(counts.values()):
            idle.append(owner)
            continue
        for event_type, count in counts.items():
            if count:
                log.info("  fetched owner=%s event_type=%s count=%s", owner, event_type, count)
    if idle:
        log.info("  %s owners without messages in this interval: %s", len(idle), ", ".join(idle[:20])
                 + (", ..." if len(idle) > 20 else ""))
    decode = result.get("decode") or {}
    selection = chain.get("selection") or {}
    log.info("Covered owners: %s; event types: %s", selection.get("owners"), selection.get("event_types"))
    if result.get("params"):
        log.info("Params of this run: %s", ", ".join(f"{k}={v!r}" for k, v in result["params"].items()))
    if chain.get("spark_skipped") and not decode:
        log.info("Decode, dedupe and rebuild skipped: %s", chain["spark_skipped"])
    else:
        log.info("Decoded %s, quarantined %s (by reason: %s)", decode.get("decoded"), decode.get("quarantined"),
                 decode.get("per_reason") or {})
        dedupe = result.get("dedupe") or {}
        log.info("Duplicates dropped %s (within the interval %s, seen in earlier intervals %s); %s events kept",
                 dedupe.get("duplicates"), dedupe.get("within_batch_duplicates"),
                 dedupe.get("cross_batch_duplicates"), dedupe.get("output"))
        rebuild = result.get("rebuild") or {}
        if rebuild.get("unchanged"):
            log.info("Snapshot %s unchanged (its events are in the latest snapshot %s)", rebuild.get("version"),
                     rebuild.get("latest"))
        else:
            log.info("Snapshot %s rows: %s", rebuild.get("version"), rebuild.get("rows"))
    if chain.get("deleted_in_range"):
        log.warning("%s stream sequences of the interval's range hold no message (deleted from the stream)",
                    chain["deleted_in_range"])
    for problem in result.get("problems") or []:
        log.error("Does not reconcile: %s", problem)
    log.info("Reconciled: %s; lag %s s after the interval end", result.get("reconciled"), result.get("lag_seconds"))


#: The params a run's summary reports besides its selection (owners and event types are in the
#: ledger's ``chain.selection``, bounded): what a backfill or a manual run actually used.
SUMMARY_PARAMS = ("stream", "settle_seconds", "max_fetch_tasks", "lookback_intervals", "accept_fewer_messages",
                  "max_content_bytes", "spark_conf")


def run_params_used(params: Mapping[str, Any], storage_root: str) -> dict[str, Any]:
    """``{"storage_root": the resolved root, **the values of SUMMARY_PARAMS}`` of one run (its
    ``params``: the DAG's defaults updated with the run's conf), for the summary's log line and XCom."""
    return {"storage_root": storage_root, **{k: params.get(k) for k in SUMMARY_PARAMS}}


def spark_app_path(name: str) -> str:
    """Return the path of a Spark application file (``airflow_provider_plgd/spark_apps/<name>.py``).

    :param name: ``decode_events``, ``dedupe_events`` or ``rebuild_snapshots``.
    :raises FileNotFoundError: if the application is not installed next to the provider.
    """
    from airflow_provider_plgd.spark_deps import spark_apps_dir

    path = spark_apps_dir() / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"Spark application {name!r} not found at {path}")
    return str(path)


#: The ETL's output datasets, in task order; each is an Airflow Asset (see :func:`etl_assets`).
ASSET_NAMES = ("staging", "events", "quarantine", "events_deduped", "snapshots")


def etl_assets(dag_id: str = "plgd_events_etl") -> dict[str, Any]:
    """The Assets (Airflow 2.11: Datasets) that the ETL DAG ``dag_id`` updates, by dataset name.

    ``{name: Asset(name=f"{dag_id}.{name}", uri=f"plgd://{dag_id}/{name}")}`` for each name in
    :data:`ASSET_NAMES`: ``staging`` (outlet of ``fetch``), ``events`` and ``quarantine``
    (``decode``), ``events_deduped`` (``dedupe``), ``snapshots`` (``rebuild``). Schedule a consumer
    DAG on ``etl_assets(dag_id)["snapshots"]`` to run after each new snapshot.
    """
    # The name carries the DAG ID like the URI: Airflow keys assets by name too, so two ETL DAGs
    # (build_etl_dag(dag_id=...)) would otherwise claim the same assets and one set stays inactive.
    return {name: Asset(name=f"{dag_id}.{name}", uri=f"plgd://{dag_id}/{name}") for name in ASSET_NAMES}


# -- asset events ----------------------------------------------------------------------------------
def quarantine_outlets(dag_id: str) -> list[Any]:
    """The outlets of ``decode`` for the quarantine dataset.

    Airflow 3: an ``AssetAlias`` (``<dag_id>.quarantine.nonempty``) through which
    :func:`emit_app_asset_events` emits the quarantine asset's event only when rows were
    quarantined (a declared asset outlet always gets an event). Airflow 2.11: the Dataset itself.
    """
    quarantine = etl_assets(dag_id)["quarantine"]
    if not AIRFLOW_V_3:  # pragma: no cover
        return [quarantine]
    from airflow.sdk import AssetAlias

    return [AssetAlias(name=f"{quarantine.name}.nonempty")]


def set_asset_extra(context: Mapping[str, Any], asset: Any, extra: Mapping[str, Any]) -> None:
    """Attach ``extra`` (JSON values) to this task's event of the outlet ``asset`` (Airflow 3;
    a no-op on Airflow 2.11, whose dataset events are emitted without it)."""
    events = context.get("outlet_events")
    if events is not None and AIRFLOW_V_3:
        events[asset].extra.update(extra)


def staging_extra(planned: Mapping[str, Any]) -> dict[str, Any]:
    """``extra`` of the staging asset event: ``{"interval_id", "messages" (the stream holds for the
    selection), "owners" ("all" or the number selected), "fetch_ranges"}``."""
    return {"interval_id": planned["interval_id"], "messages": planned["messages"], "owners": planned["owners"],
            "fetch_ranges": len(planned["fetch_ranges"])}


def app_asset_extras(app: str, summary: Mapping[str, Any], interval_id: str) -> dict[str, dict[str, Any]]:
    """``extra`` of the asset events of one Spark application, by dataset name (see :data:`ASSET_NAMES`).

    Each names its Delta table (``table``: the table's URI; snapshots: ``tables``) and the Delta
    version the run committed (``delta_version``; snapshots: ``delta_versions`` per table):
    ``decode``: ``events`` ``{interval_id, decoded, table, delta_version}``, and ``quarantine``
    ``{interval_id, quarantined, per_reason, table, delta_version}`` only when rows were quarantined;
    ``dedupe``: ``events_deduped`` ``{interval_id, kept, duplicates, table, delta_version}``;
    ``rebuild``: ``snapshots`` ``{interval_id, snapshot_version, rows, tables, delta_versions}``.
    """
    from airflow_provider_plgd import delta_tables

    versions = summary.get("delta_versions") or {}
    if app == "decode":
        root = summary.get("output_root") or ""
        events, quarantine = delta_tables.EVENTS, delta_tables.QUARANTINE
        out = {events: {"interval_id": interval_id, "decoded": summary.get("decoded"),
                        "table": delta_tables.table_uri(root, events), "delta_version": versions.get(events)}}
        if int(summary.get("quarantined") or 0):
            out[quarantine] = {"interval_id": interval_id, "quarantined": summary.get("quarantined"),
                               "per_reason": summary.get("per_reason") or {},
                               "table": delta_tables.table_uri(root, quarantine),
                               "delta_version": versions.get(quarantine)}
        return out
    if app == "dedupe":
        return {delta_tables.EVENTS_DEDUPED: {"interval_id": interval_id, "kept": summary.get("output"),
                                              "duplicates": summary.get("duplicates"),
                                              "table": summary.get("events_deduped_path"),
                                              "delta_version": versions.get(delta_tables.EVENTS_DEDUPED)}}
    if app == "rebuild":
        return {"snapshots": {"interval_id": interval_id, "snapshot_version": summary.get("version"),
                              "rows": summary.get("rows") or {}, "tables": summary.get("tables") or {},
                              "delta_versions": {t: v for t, v in versions.items() if not t.startswith("_")}}}
    raise ValueError(f"unknown Spark application {app!r}, expected decode, dedupe or rebuild")


def emit_app_asset_events(context: Mapping[str, Any], app: str, assets: Mapping[str, Any]) -> None:
    """``post_execute`` of a Spark task: put the application's run summary into its asset events.

    :raises ValueError: the application wrote no run summary (``{root}/_runs/{app}/...``).
    """
    from airflow_provider_plgd.run_summary import read_app_summary

    planned = context["ti"].xcom_pull(task_ids="plan")
    summary = read_app_summary(planned["storage_root"], app, planned["interval_id"])
    if summary is None:
        raise ValueError(f"{app} wrote no run summary for interval {planned['interval_id']} under "
                         f"{planned['storage_root']}/_runs/{app}/")
    for name, extra in app_asset_extras(app, summary, planned["interval_id"]).items():
        if name == "quarantine" and AIRFLOW_V_3:
            from airflow.sdk import AssetAlias

            alias = AssetAlias(name=f"{assets[name].name}.nonempty")
            context["outlet_events"][alias].add(assets[name], extra=extra)
        else:
            set_asset_extra(context, assets[name], extra)


# -- empty intervals -------------------------------------------------------------------------------
def spark_skip_reason(root: str, record: Mapping[str, Any], end: datetime) -> str | None:
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

    :param root: the storage root; ``record``: the plan record; ``end``: the interval end (aware).
    """
    from airflow_provider_plgd.run_summary import APPS, read_app_summary
    from airflow_provider_plgd.spark import snapshot_store

    if int(record["total"]):
        return None
    interval = record["interval_id"]
    if any(read_app_summary(root, app, interval) is not None for app in APPS):
        return None
    latest = snapshot_store.latest(root)
    if latest is None:
        return "the stream holds no message for the interval and there is no snapshot yet"
    end_ns = times.to_ns(end, "end")
    if any(ns is not None and int(ns) < end_ns for ns in (latest.get("next_expiry_ns") or {}).values()):
        return None
    return f"the stream holds no message for the interval and no pending of snapshot {latest['version']} expires in it"


def _token_list(value: Any, what: str) -> list[str]:
    """A DAG param of owner IDs or event types as a list (checked by ``fetch.selection.Selection.of``).

    A single string is one value (not a list of characters); ``""``/``None``/``[]`` give ``[]``.

    :raises ValueError: a param that is neither a string nor a list (names ``what`` and the value).
    """
    if isinstance(value, str):
        return [value] if value else []
    if value is None or isinstance(value, (list, tuple)):
        return list(value or [])
    raise ValueError(f"{what} param must be a list of strings, got {value!r}")


def build_etl_dag(
    *,
    dag_id: str = "plgd_events_etl",
    schedule: timedelta | str = timedelta(hours=1),
    start_date: datetime,
    end_date: datetime | None = None,
    catchup: bool = True,
    params: dict[str, Any] | None = None,
    jetstream_conn_id: str = "plgd_jetstream_default",
    spark_conn_id: str = "spark_default",
    spark_conf: Mapping[str, str | None] | None = None,
    default_args: dict[str, Any] | None = None,
    tags: list[str] | None = None,
    description: str = DAG_DESCRIPTION,
    doc_md: str | None = None,
    spark_execution_timeout: timedelta | None = DEFAULT_SPARK_EXECUTION_TIMEOUT,
    run_spark_conf_keys: Mapping[str, str | None] | Iterable[str] | None = None,
    storage_roots: Iterable[str] = (),
    fetch_range_messages: int = DEFAULT_FETCH_RANGE_MESSAGES,
):
    """Build the plgd ETL DAG.

    Runs are chained: ``max_active_runs=1``, and ``depends_on_past=True`` on ``dedupe`` (it reads the
    message-ID index of the earlier intervals) and ``rebuild`` (each snapshot is the previous one
    plus the new events), so scheduled runs and backfills process the intervals oldest first and a
    failed interval stops the chain until it is cleared or fixed. Runs without a data interval
    (Airflow 3 runs without a logical date) fail in ``wait_for_interval`` with
    :class:`MissingDataIntervalError`, manual runs whose interval is not one of the schedule with
    :class:`OffScheduleIntervalError`, both without retries. An interval for which the stream holds
    no message skips the three Spark tasks (``spark_needed``, :func:`spark_skip_reason`).

    :param dag_id: the DAG ID.
    :param schedule: a ``timedelta`` or cron string; each run handles its data interval.
    :param start_date: the start of the first data interval (timezone-aware).
    :param end_date: no run is scheduled for an interval that starts after it (default: none).
    :param catchup: schedule every interval since ``start_date`` (or since the last run) that
        has not run yet, oldest first (default True: the snapshot chain needs every interval; with
        False, intervals missed while the DAG was paused must be backfilled).
    :param params: overrides of :data:`DEFAULT_PARAMS`.
    :param jetstream_conn_id: the ``plgd_jetstream`` connection (connection IDs are not templated).
    :param spark_conn_id: the ``spark`` connection used by the three ``SparkSubmitOperator`` tasks.
    :param spark_conf: Spark settings (``--conf``) added to :data:`DEFAULT_SPARK_CONF` for the three
        Spark tasks; a ``None`` value removes a default. E.g. ``{"spark.executor.memory": "4g"}``. Values may be Jinja templates.
        The ``spark_conf`` DAG param of a run is merged over these when the task runs.
    :param default_args: extra default args (retries, …).
    :param tags: DAG tags.
    :param description: the DAG's one-line description.
    :param doc_md: the DAG docs (Markdown) for the UI's docs panel; default :data:`DEFAULT_DOC_MD`
        (``dags/plgd_events_etl.py`` passes its module docstring, the user docs).
    :param spark_execution_timeout: ``execution_timeout`` of ``decode``, ``dedupe`` and ``rebuild``
        (default :data:`DEFAULT_SPARK_EXECUTION_TIMEOUT`; ``None``: no limit). An application that
        never gets executors then fails with ``SparkApplicationTimeoutError`` instead of waiting forever.
    :param run_spark_conf_keys: the Spark settings a run may set with the ``spark_conf`` param:
        ``None`` (default) the resource settings of
        :data:`~airflow_provider_plgd.run_params.DEFAULT_RUN_SPARK_CONF_KEYS`, or the author's own
        names (or ``{name: value pattern}``). Every user who may trigger the DAG can then set them.
        Others are refused before ``spark-submit`` (:class:`~airflow_provider_plgd.run_params.UntrustedRunParamError`).
    :param storage_roots: storage roots a run may choose with the ``storage_root`` param (each
        root and the folders below it), besides the param's default and the connection's
        ``storage_root`` extra (default: none).
    :param fetch_range_messages: messages per fetch task aimed at: ``plan`` cuts the interval's
        stream-sequence range into ``min(max_fetch_tasks, ceil(messages / fetch_range_messages))``
        ranges, one mapped ``fetch`` task each (default :data:`DEFAULT_FETCH_RANGE_MESSAGES`).
    :return: the ``DAG``. Its assets are ``plgd://<dag_id>/{staging,events,quarantine,events_deduped,snapshots}``.
    :raises TypeError: when ``spark_conf`` is not a mapping of strings.
    """
    from airflow_provider_plgd import lineage
    from airflow_provider_plgd.operators.spark_submit import PlgdSparkSubmitOperator as SparkSubmitOperator

    from airflow_provider_plgd.operators.jetstream_to_staging import JetStreamToStagingOperator
    from airflow_provider_plgd.sensors.interval_complete import JetStreamIntervalCompleteSensor

    if AIRFLOW_V_3:
        from airflow.sdk import DAG, task
    else:  # pragma: no cover
        from airflow import DAG
        from airflow.decorators import task  # type: ignore[no-redef,attr-defined]  # Airflow 2.11

    from airflow_provider_plgd import run_params

    merged_params = etl_params(params)
    conf = _merge_spark_conf(spark_conf)
    spark_conf_policy = run_params.run_spark_conf_policy(run_spark_conf_keys)
    default_root = merged_params["storage_root"]
    allowed_roots = [getattr(default_root, "value", default_root) or "", *storage_roots]
    args = {"retries": 2, "retry_delay": timedelta(seconds=30), **(default_args or {})}
    assets = etl_assets(dag_id)

    # Explicit data-interval timetables: Airflow 3 turns a bare timedelta into a
    # DeltaTriggerTimetable, whose runs have no data interval to bound the fetch by.
    timetable = (
        DeltaDataIntervalTimetable(schedule)
        if isinstance(schedule, timedelta)
        else CronDataIntervalTimetable(schedule, timezone="UTC")
    )
    with DAG(
        dag_id=dag_id,
        schedule=timetable,
        start_date=start_date,
        end_date=end_date,
        catchup=catchup,
        max_active_runs=1,
        params=merged_params,
        default_args=args,
        tags=tags or ["plgd", "jetstream", "spark"],
        description=description,
        doc_md=doc_md or DEFAULT_DOC_MD,
    ) as dag:
        def check_interval(context: Mapping[str, Any]) -> tuple[datetime, datetime]:
            return require_data_interval(context, schedule=schedule, start_date=start_date)

        wait = JetStreamIntervalCompleteSensor(
            task_id="wait_for_interval",
            jetstream_conn_id=jetstream_conn_id,
            subject_filter="plgd.>",
            stream="{{ params.stream }}",
            settle_seconds="{{ params.settle_seconds }}",
            deferrable=True,
            poke_interval=5,
            timeout=6 * 3600,
            interval_check=check_interval,  # in execute: its error shows where the task's page shows failures
            doc_md=TASK_DOCS["wait_for_interval"],
            task_display_name="Wait until the interval is complete",
        )

        @task(task_display_name="Plan: count the stream, split it into ranges")
        def plan(**context) -> dict[str, Any]:
            """Resolve the storage root, record the interval ledger (its sequence ranges and their
            counts), and build the --py-files zip."""
            from airflow_provider_plgd import ledger, lineage, times
            from airflow_provider_plgd.hooks.jetstream import JetStreamHook
            from airflow_provider_plgd.exceptions import FewerMessagesError, NarrowerRerunError
            from airflow_provider_plgd.fetch.selection import Selection
            from airflow_provider_plgd.plgd.event_types import EVENT_TYPES
            from airflow_provider_plgd.spark_deps import build_private_py_files_zip

            p = context["params"]
            start, end = check_interval(context)
            # the trust boundary: every param a triggering user may set, checked before anything is read
            checked = run_params.check_run_params(p, spark_conf_policy=spark_conf_policy,
                                                  storage_roots=allowed_roots, jetstream_conn_id=jetstream_conn_id)
            root = resolve_storage_root(checked.storage_root, jetstream_conn_id)
            try:  # tables of the layout before Delta Lake: refused before anything is fetched
                delta_tables.check_layout(root)
            except OldLayoutError as err:
                raise _FailWithoutRetry(str(err)) from None
            # check the owners and event types once, before anything is counted, built or written
            try:
                selection = Selection.of(_token_list(p["owners"], "owner_id"),
                                         _token_list(p["event_types"], "event_type") or EVENT_TYPES)
            except ValueError as err:  # a triggering user's input: fails without retries
                raise run_params.UntrustedRunParamError(str(err)) from None
            interval = times.interval_id(start, end)
            # a stretch before this interval that no run planned (IntervalGapError, retried, then fails):
            # its events would be missing from this interval's snapshot
            ledger.check_no_gap_before(root, checked.stream, interval, dag_id=dag_id)
            hook = JetStreamHook(jetstream_conn_id=jetstream_conn_id, stream=checked.stream)
            # the sensor's rule again before counting (a mirror's link may have dropped since): complete, or raise
            hook.require_interval_complete(start, end, settle_seconds=checked.numbers["settle_seconds"])
            owners = list(selection.owners) or None  # None: every owner, read through plgd.>
            try:
                record = write_interval_ledger(
                    hook, root, interval, start, end, owners, list(selection.event_types),
                    accept_fewer=checked.accept_fewer_messages,
                    max_ranges=int(checked.numbers["max_fetch_tasks"]), range_messages=fetch_range_messages,
                )
            except (NarrowerRerunError, FewerMessagesError) as err:  # the same answer on every retry
                raise _FailWithoutRetry(f"{type(err).__name__}: {err}") from err
            # Never on the storage root: the Spark driver runs this code inside the worker
            # (docs/operations.md, "Shipping the plgd code to executors").
            py_files = build_private_py_files_zip(storage_root=root)
            lineage.report_task_lineage(context, lineage.plan_lineage, hook.get_settings().servers, checked.stream, root,
                                        ledger.SCOPE_FILTER)
            # each fetch task gets its range's number; the range is in the ledger: XCom stays small
            return {
                "storage_root": root,
                "interval_id": interval,
                "snapshot_time": end.isoformat(),
                "ledger": ledger.interval_dir(root, checked.stream, interval),
                "owners": "all" if owners is None else len(owners),
                "messages": record["total"],
                "fetch_ranges": [{"ledger_range": i} for i in range(record["fetch_ranges"])],
                "py_files": str(py_files),
                "spark_skip": record.get("spark_skip"),
            }

        @task(task_display_name="Sequence ranges of the fetch")
        def fetch_ranges(planned_value: dict[str, Any]) -> list[dict[str, Any]]:
            """The fetch task kwargs, one dict per stream-sequence range (Airflow maps over a plain return value)."""
            return planned_value["fetch_ranges"]

        planned = plan()

        fetch = JetStreamToStagingOperator.partial(
            task_id="fetch",
            jetstream_conn_id=jetstream_conn_id,
            stream="{{ params.stream }}",
            destination="{{ ti.xcom_pull(task_ids='plan')['storage_root'] }}",
            ledger="{{ ti.xcom_pull(task_ids='plan')['ledger'] }}",
            accept_fewer_messages="{{ params.accept_fewer_messages }}",
            settle_seconds="{{ params.settle_seconds }}",  # the sensor's rule, re-checked before the commit
            task_display_name="Fetch a sequence range into staging",
            doc_md=TASK_DOCS["fetch"],
        ).expand_kwargs(fetch_ranges(planned))  # type: ignore[arg-type]  # an XComArg of the task's dict

        # One staging asset event per run (not one per mapped fetch task), and the gate of the Spark tasks.
        @task.short_circuit(ignore_downstream_trigger_rules=False, outlets=[assets["staging"]],
                            task_display_name="Spark needed? (skip empty intervals)")
        def spark_needed(**context) -> bool:
            """False (skip decode, dedupe, rebuild) when ``plan`` found the interval empty (``spark_skip``)."""
            planned_value = context["ti"].xcom_pull(task_ids="plan")
            set_asset_extra(context, assets["staging"], staging_extra(planned_value))
            if planned_value.get("spark_skip"):
                _log.info("Skipping decode, dedupe and rebuild of interval %s: %s", planned_value["interval_id"],
                          planned_value["spark_skip"])
                return False
            return True

        x = "ti.xcom_pull(task_ids='plan')"
        common = {
            "conn_id": spark_conn_id,
            "py_files": "{{ " + x + "['py_files'] }}",
            "conf": conf,
            "run_conf_param": "spark_conf",
            "run_conf_keys": spark_conf_policy,
            "execution_timeout": spark_execution_timeout,
            **lineage.spark_submit_kwargs(),  # OpenLineage: the task's run is the Spark application's parent
        }
        root_arg = "{{ " + x + "['storage_root'] }}"
        interval_arg = "{{ " + x + "['interval_id'] }}"
        decode = SparkSubmitOperator(
            task_id="decode",
            name="plgd-decode-events",
            application=spark_app_path("decode_events"),
            application_args=[
                "--staging-root", root_arg, "--stream", "{{ params.stream }}",
                "--interval-id", interval_arg, "--output-root", root_arg, "--ledger",
                "--max-content-bytes", "{{ params.max_content_bytes }}",
            ],
            outlets=[assets["events"], *quarantine_outlets(dag_id)],
            post_execute=lambda context, result=None: emit_app_asset_events(context, "decode", assets),
            task_display_name="Decode events (Spark)",
            doc_md=TASK_DOCS["decode"],
            **common,
        )
        dedupe = SparkSubmitOperator(
            task_id="dedupe",
            name="plgd-dedupe-events",
            application=spark_app_path("dedupe_events"),
            application_args=[
                "--root", root_arg, "--interval-id", interval_arg,
                "--lookback-intervals", "{{ params.lookback_intervals }}",
            ],
            depends_on_past=True,
            outlets=[assets["events_deduped"]],
            post_execute=lambda context, result=None: emit_app_asset_events(context, "dedupe", assets),
            task_display_name="Deduplicate events (Spark)",
            doc_md=TASK_DOCS["dedupe"],
            **common,
        )
        rebuild = SparkSubmitOperator(
            task_id="rebuild",
            name="plgd-rebuild-snapshots",
            application=spark_app_path("rebuild_snapshots"),
            application_args=[
                "--root", root_arg, "--interval-id", interval_arg,
                "--snapshot-time", "{{ " + x + "['snapshot_time'] }}",
            ],
            depends_on_past=True,
            outlets=[assets["snapshots"]],
            post_execute=lambda context, result=None: emit_app_asset_events(context, "rebuild", assets),
            task_display_name="Rebuild snapshots (Spark)",
            doc_md=TASK_DOCS["rebuild"],
            **common,
        )

        # none_failed: runs after skipped Spark tasks (an empty interval) and reconciles 0 = 0.
        @task(trigger_rule="none_failed", task_display_name="Summary: reconcile the interval")
        def summary(**context) -> dict[str, Any]:
            """Check the interval ledger's whole chain (fails the run when it does not add up), log it,
            and return its numbers (bounded XCom: no per-owner lists)."""
            from airflow_provider_plgd import lineage
            from airflow_provider_plgd.run_summary import collect_run_summary

            planned_value = context["ti"].xcom_pull(task_ids="plan")
            lineage.report_task_lineage(context, lineage.summary_lineage, context["params"]["stream"],
                                        planned_value["storage_root"])
            result = collect_run_summary(planned_value["storage_root"], context["params"]["stream"],
                                         planned_value["interval_id"])
            result["params"] = run_params_used(context["params"], planned_value["storage_root"])
            log_run_summary(result)
            result.pop("fetched")  # per owner: logged above, too large for XCom at many owners
            if not result["reconciled"]:
                from airflow_provider_plgd.exceptions import LedgerError

                raise LedgerError(f"interval {result['interval_id']} does not reconcile: "
                                  + "; ".join(result["problems"][:20]),
                                  interval_id=result["interval_id"], problems=result["problems"])
            return result

        wait >> planned
        fetch >> spark_needed() >> decode >> dedupe >> rebuild >> summary()

    return dag


def write_interval_ledger(hook: Any, root: str, interval: str, start: datetime, end: datetime,
                          owners: list[str] | None, event_types: list[str], *, accept_fewer: bool,
                          max_ranges: int = 1, range_messages: int = DEFAULT_FETCH_RANGE_MESSAGES) -> dict[str, Any]:
    """Count what the stream holds for the interval on the server and write the ledger's ``stream.json``.

    The fetch reads ``ledger.SCOPE_FILTER`` (``plgd.>``), or with selected ``owners`` their
    ``plgd.owners.{owner}.>`` filters; the interval's stream-sequence range is cut into at most
    ``max_ranges`` ranges of about ``range_messages`` messages, each counted exactly
    (:meth:`JetStreamHook.acount_ranges`: consumers per range boundary, none per owner). A previous
    record of the interval with more messages (a re-created or purged stream, deletes) raises
    :class:`FewerMessagesError` unless ``accept_fewer``; one whose run staged owners or event types
    this one does not select raises :class:`~airflow_provider_plgd.exceptions.NarrowerRerunError`
    (``ledger.check_selection_covers``). The interval's old fetch records are removed, so the
    rerun's are its own. ``spark_skip`` in the record: :func:`spark_skip_reason`.

    :return: the record (``ledger.plan_record`` plus ``spark_skip``).
    """
    from airflow_provider_plgd import ledger, times

    read_filters = [ledger.SCOPE_FILTER] if owners is None else [ledger.owner_filter(o) for o in owners]
    counted = hook.count_ranges(read_filters, start_time=start, end_time=end, range_messages=range_messages,
                                max_ranges=max_ranges, scope_filter=ledger.SCOPE_FILTER)
    record = ledger.plan_record(counted, interval_id=interval, owners=owners, event_types=event_types,
                                read_filters=read_filters, bounds=times.time_bounds(start, end))
    record["spark_skip"] = spark_skip_reason(root, record, end)
    base = ledger.interval_dir(root, counted["stream"], interval)
    previous, previous_records = ledger.read_records(root, counted["stream"], interval)
    ledger.check_selection_covers(previous, record, previous_records)
    lost = ledger.check_not_fewer(previous, record, accept_fewer=accept_fewer)
    if lost:
        _log.warning("Interval %s: accepting fewer messages than before (accept_fewer_messages): %s", interval,
                     "; ".join(lost))
    if record["deleted_in_range"]:
        _log.warning("Interval %s: %s stream sequences of its range [%s, %s) hold no message (deleted from the "
                     "stream, e.g. max_msgs_per_subject or single deletes); the ledger records it",
                     interval, record["deleted_in_range"], record["first_seq"], record["end_seq_exclusive"])
    ledger.write_json(f"{base}/stream.json", record)
    ledger.clear_fetch_records(root, counted["stream"], interval)
    _log.info("Interval %s: the fetch reads %s messages of %s (sequences %s..%s) in %s range(s); the stream holds "
              "%s of %s", interval, record["total"], "every owner" if owners is None else f"{len(owners)} owner(s)",
              record["first_seq"], record["end_seq_exclusive"] - 1, record["fetch_ranges"],
              record["scope_total"], ledger.SCOPE_FILTER)
    return record


def _merge_spark_conf(spark_conf: Mapping[str, str | None] | None) -> dict[str, str]:
    """:data:`DEFAULT_SPARK_CONF` updated with ``spark_conf`` (``None`` values remove keys).

    :raises TypeError: when ``spark_conf`` is not a mapping of string keys to string (or None) values.
    """
    merged = dict(DEFAULT_SPARK_CONF)
    if spark_conf is None:
        return merged
    if not isinstance(spark_conf, Mapping):
        raise TypeError(f"spark_conf must be a mapping of Spark setting -> string, got {type(spark_conf).__name__}")
    for key, value in spark_conf.items():
        if not isinstance(key, str) or not (value is None or isinstance(value, (str, int, float, bool))):
            raise TypeError(f"spark_conf entry {key!r}: {value!r} must be a string setting name and a string value")
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return merged
