"""The plgd ETL DAG factory: JetStream → staging → decode → dedupe → rebuild snapshots.

``dags/plgd_events_etl.py`` calls :func:`build_etl_dag`; other deployments can call it with their
own ``dag_id``, schedule and defaults. Source of the task order: ``docs/architecture.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow_provider_plgd.spark_conf import DEFAULT_SPARK_CONF, FAST_LOCAL_SPARK_CONF  # noqa: F401 - re-exported
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
    "owners": [],  # [] = discover from the stream's subjects
    "event_types": [],  # [] = every event type on NATS (plgd.event_types.EVENT_TYPES: live + old hubs' snapshots)
    "storage_root": "",  # "" = the connection's storage_root extra, else $AIRFLOW_HOME/plgd
    "settle_seconds": 60,
    "max_fetch_tasks": 16,
    "lookback_intervals": 24,
    "accept_fewer_messages": False,  # True: a rerun may replace committed data with fewer messages
    "max_content_bytes": 4 * 1024 * 1024,  # decode: larger decoded events -> quarantine content_too_large
}

_log = logging.getLogger(__name__)

try:  # Airflow 3.x
    from airflow.sdk.exceptions import AirflowFailException as _FailWithoutRetry
except ImportError:  # pragma: no cover - Airflow 2.11
    from airflow.exceptions import AirflowFailException as _FailWithoutRetry  # type: ignore[no-redef]


class MissingDataIntervalError(_FailWithoutRetry, ValueError):
    """The DAG run has no data interval, so there is nothing to bound the fetch by.

    On Airflow 3 a run triggered without a logical date (``airflow dags trigger`` without
    ``--logical-date``, the UI's trigger button with an empty date, an asset-triggered run) has
    ``logical_date``, ``data_interval_start`` and ``data_interval_end`` set to ``None``. Raised by
    the first task (``wait_for_interval``, through its ``pre_execute`` hook); it is an
    ``AirflowFailException``, so the task fails at once without retries. Also a ``ValueError``.
    """


def require_data_interval(context: Mapping[str, Any]) -> tuple[datetime, datetime]:
    """Return the run's ``(data_interval_start, data_interval_end)`` (aware datetimes).

    Used as the ``pre_execute`` hook of ``wait_for_interval`` and by ``plan``.

    :param context: the task context (keys ``data_interval_start``, ``data_interval_end``, ``dag_run``).
    :raises MissingDataIntervalError: when either is missing (a run without a logical date on
        Airflow 3), with the ways to run the DAG for an interval.
    """
    start, end = context.get("data_interval_start"), context.get("data_interval_end")
    if start is None or end is None:
        dag_run = context.get("dag_run")
        run_id = getattr(dag_run, "run_id", None)
        raise MissingDataIntervalError(
            f"DAG run {run_id!r} has no data interval (logical date None: a manual or asset-triggered run "
            "on Airflow 3), so there is no interval of the stream to process. Run an interval with a "
            "backfill (`airflow backfill create --dag-id <dag> --from-date <interval start> --to-date "
            "<interval start> --reprocess-behavior completed`) or `airflow dags test <dag> <interval end>`; "
            "see docs/operations.md, \"Backfill and reruns\"."
        )
    if end <= start:
        raise MissingDataIntervalError(f"empty data interval [{start}, {end}) of DAG run {context.get('run_id')!r}")
    return start, end


def log_run_summary(result: Mapping[str, Any], log: logging.Logger | None = None) -> None:
    """Log one run's summary (the dict of :func:`airflow_provider_plgd.run_summary.collect_run_summary`).

    Lines: what the stream holds (the ledger) and what was staged and skipped; messages staged per
    owner and event type (non-zero counts); decoded and quarantined rows (per reason);
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
    log.info("Decoded %s, quarantined %s (by reason: %s)", decode.get("decoded"), decode.get("quarantined"),
             decode.get("per_reason") or {})
    dedupe = result.get("dedupe") or {}
    log.info("Duplicates dropped %s (within the interval %s, seen in earlier intervals %s); %s events kept",
             dedupe.get("duplicates"), dedupe.get("within_batch_duplicates"), dedupe.get("cross_batch_duplicates"),
             dedupe.get("output"))
    rebuild = result.get("rebuild") or {}
    log.info("Snapshot %s rows: %s", rebuild.get("version"), rebuild.get("rows"))
    if chain.get("deleted_in_range"):
        log.warning("%s stream sequences of the interval's range hold no message (deleted from the stream)",
                    chain["deleted_in_range"])
    for problem in result.get("problems") or []:
        log.error("Does not reconcile: %s", problem)
    log.info("Reconciled: %s; lag %s s after the interval end", result.get("reconciled"), result.get("lag_seconds"))


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


def _token_list(value: Any, what: str) -> list[str]:
    """A DAG param of owner IDs or event types as a list of valid subject tokens.

    A single string is one value (not a list of characters); ``""``/``None``/``[]`` give ``[]``.

    :raises ValueError: a value that is not a valid token (``plgd.subjects.validate_token``:
        names ``what`` and the value), or a param that is neither a string nor a list.
    """
    from airflow_provider_plgd.plgd.subjects import validate_token

    if isinstance(value, str):
        values = [value] if value else []
    elif value is None or isinstance(value, (list, tuple)):
        values = list(value or [])
    else:
        raise ValueError(f"{what} param must be a list of strings, got {value!r}")
    return [validate_token(v, what) for v in values]


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
):
    """Build the plgd ETL DAG.

    Runs are chained: ``max_active_runs=1``, and ``depends_on_past=True`` on ``dedupe`` (it reads the
    message-ID index of the earlier intervals) and ``rebuild`` (each snapshot is the previous one
    plus the new events), so scheduled runs and backfills process the intervals oldest first and a
    failed interval stops the chain until it is cleared or fixed. Runs without a data interval
    (Airflow 3 runs without a logical date) fail in ``wait_for_interval`` with
    :class:`MissingDataIntervalError`, without retries.

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
        Spark tasks; a ``None`` value removes a default. E.g. :data:`FAST_LOCAL_SPARK_CONF` for
        small local runs, or ``{"spark.executor.memory": "4g"}``. Values may be Jinja templates.
    :param default_args: extra default args (retries, …).
    :param tags: DAG tags.
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
        from airflow.decorators import task

    merged_params = {**DEFAULT_PARAMS, **(params or {})}
    conf = _merge_spark_conf(spark_conf)
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
        doc_md=__doc__,
    ) as dag:
        wait = JetStreamIntervalCompleteSensor(
            task_id="wait_for_interval",
            jetstream_conn_id=jetstream_conn_id,
            subject_filter="plgd.>",
            stream="{{ params.stream }}",
            settle_seconds="{{ params.settle_seconds }}",
            deferrable=True,
            poke_interval=5,
            timeout=6 * 3600,
            pre_execute=require_data_interval,
        )

        @task
        def plan(**context) -> dict[str, Any]:
            """Resolve the storage root, discover owners, record the interval ledger, group fetches and
            build the --py-files zip."""
            from airflow_provider_plgd import ledger, lineage, staging
            from airflow_provider_plgd.hooks.jetstream import JetStreamHook
            from airflow_provider_plgd.operators.jetstream_to_staging import parse_bool
            from airflow_provider_plgd.plgd.event_types import EVENT_TYPES, event_type_info
            from airflow_provider_plgd.spark_deps import build_private_py_files_zip

            p = context["params"]
            start, end = require_data_interval(context)
            root = resolve_storage_root(p["storage_root"], jetstream_conn_id)
            # validate both params before anything is discovered, built or written
            owners = _token_list(p["owners"], "owner_id")
            event_types = [
                event_type_info(e).name for e in _token_list(p["event_types"], "event_type")
            ] or list(EVENT_TYPES)
            hook = JetStreamHook(jetstream_conn_id=jetstream_conn_id, stream=p["stream"])
            discovered = not owners
            owners = owners or sorted(hook.list_owners())
            interval = staging.interval_id(start, end)
            record = write_interval_ledger(
                hook, root, interval, start, end, owners, discovered, event_types,
                accept_fewer=parse_bool(p.get("accept_fewer_messages", False), "accept_fewer_messages"),
                fetch_groups=int(p["max_fetch_tasks"]),
            )
            # Never on the storage root: the Spark driver runs this code inside the worker
            # (docs/operations.md, "Shipping the plgd code to executors").
            py_files = build_private_py_files_zip(storage_root=root)
            lineage.report_task_lineage(context, lineage.plan_lineage, hook.get_settings().servers, p["stream"], root,
                                        ledger.SCOPE_FILTER)
            # the owners of each fetch task are in the ledger: XCom stays small at any number of owners
            groups: list[dict[str, Any]] = [{"ledger_group": i} for i in range(record["fetch_groups"])]
            if record["unrouted"]:
                groups.append({"unrouted": True})
            return {
                "storage_root": root,
                "interval_id": interval,
                "snapshot_time": end.isoformat(),
                "ledger": ledger.interval_dir(root, p["stream"], interval),
                "owners": len(owners),
                "messages": record["total"],
                "fetch_groups": groups,
                "py_files": str(py_files),
            }

        @task
        def fetch_groups(planned_value: dict[str, Any]) -> list[dict[str, Any]]:
            """The fetch task kwargs, one dict per owner group (Airflow maps over a plain return value)."""
            return planned_value["fetch_groups"]

        planned = plan()

        fetch = JetStreamToStagingOperator.partial(
            task_id="fetch",
            jetstream_conn_id=jetstream_conn_id,
            stream="{{ params.stream }}",
            destination="{{ ti.xcom_pull(task_ids='plan')['storage_root'] }}",
            ledger="{{ ti.xcom_pull(task_ids='plan')['ledger'] }}",
            accept_fewer_messages="{{ params.accept_fewer_messages }}",
            settle_seconds="{{ params.settle_seconds }}",  # the sensor's rule, re-checked before the commit
            outlets=[assets["staging"]],
        ).expand_kwargs(fetch_groups(planned))

        x = "ti.xcom_pull(task_ids='plan')"
        common = {
            "conn_id": spark_conn_id,
            "py_files": "{{ " + x + "['py_files'] }}",
            "conf": conf,
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
            outlets=[assets["events"], assets["quarantine"]],
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
            **common,
        )

        @task
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
            log_run_summary(result)
            result.pop("fetched")  # per owner: logged above, too large for XCom at many owners
            if not result["reconciled"]:
                from airflow_provider_plgd.exceptions import LedgerError

                raise LedgerError(f"interval {result['interval_id']} does not reconcile: "
                                  + "; ".join(result["problems"][:20]),
                                  interval_id=result["interval_id"], problems=result["problems"])
            return result

        wait >> planned
        fetch >> decode >> dedupe >> rebuild >> summary()

    return dag


def write_interval_ledger(hook: Any, root: str, interval: str, start: datetime, end: datetime, owners: list[str],
                          discovered: bool, event_types: list[str], *, accept_fewer: bool,
                          fetch_groups: int = 1) -> dict[str, Any]:
    """Count what the stream holds for the interval on the server and write the ledger's ``stream.json``.

    The counts are ``ledger.SCOPE_FILTER`` (``plgd.>``) and ``plgd.owners.{owner}.>`` per owner
    (:meth:`JetStreamHook.acount_interval`). A previous record of the interval with more messages
    (a re-created or purged stream, deletes) raises :class:`FewerMessagesError` unless
    ``accept_fewer``. The interval's old fetch records are removed, so the rerun's are its own.
    ``fetch_groups``: at most this many fetch tasks share the owners (``ledger.owner_group``).

    :return: the record (``ledger.plan_record``).
    """
    from airflow_provider_plgd import ledger, staging

    counted = hook.count_interval([ledger.SCOPE_FILTER, *(ledger.owner_filter(o) for o in owners)],
                                  start_time=start, end_time=end)
    record = ledger.plan_record(
        counted, interval_id=interval, owners=owners, owners_discovered=discovered, event_types=event_types,
        fetch_groups=fetch_groups,
        bounds=staging.time_bounds(start, end),
    )
    base = ledger.interval_dir(root, counted["stream"], interval)
    lost = ledger.check_not_fewer(ledger.read_json(f"{base}/stream.json"), record, accept_fewer=accept_fewer)
    if lost:
        _log.warning("Interval %s: accepting fewer messages than before (accept_fewer_messages): %s", interval,
                     "; ".join(lost))
    if record["deleted_in_range"]:
        _log.warning("Interval %s: %s stream sequences of its range [%s, %s) hold no message (deleted from the "
                     "stream, e.g. max_msgs_per_subject or single deletes); the ledger records it",
                     interval, record["deleted_in_range"], record["first_seq"], record["end_seq_exclusive"])
    ledger.write_json(f"{base}/stream.json", record)
    ledger.clear_fetch_records(root, counted["stream"], interval)
    _log.info("Interval %s: the stream holds %s messages of %s (sequences %s..%s), %s owners, %s unrouted",
              interval, record["total"], ledger.SCOPE_FILTER, record["first_seq"], record["end_seq_exclusive"] - 1,
              len(owners), record["unrouted"])
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
