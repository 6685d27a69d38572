"""The plgd ETL DAG factory: JetStream → staging → decode → dedupe → rebuild snapshots.

``dags/plgd_events_etl.py`` calls :func:`build_etl_dag`; other deployments can call it with their
own ``dag_id``, schedule and defaults. Source of the task order: ``docs/architecture.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from airflow_provider_plgd.compat import DAG, CronDataIntervalTimetable, DeltaDataIntervalTimetable, task
from airflow_provider_plgd.etl.assets import (
    emit_app_asset_events,
    etl_assets,
    quarantine_outlets,
    set_asset_extra,
    staging_extra,
)
from airflow_provider_plgd.etl.intervals import require_data_interval
from airflow_provider_plgd.etl.metrics import emit_interval_metrics
from airflow_provider_plgd.etl.params import etl_params, params_of_run
from airflow_provider_plgd.etl.plan import DEFAULT_FETCH_RANGE_MESSAGES, IntervalPlan, plan_interval
from airflow_provider_plgd.etl.summary import DEFAULT_STAGING_RETENTION, summarize_interval
from airflow_provider_plgd.operators.links import PlgdTablesLink
from airflow_provider_plgd.spark_conf import DEFAULT_SPARK_CONF, merge_spark_conf
from airflow_provider_plgd.spark_deps import spark_app_path
from airflow_provider_plgd.tables import ledger
from airflow_provider_plgd.tables.layout import Layout

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
        "every message goes to its owner and event type batch; a few files per event type, rows ordered by owner, "
        "one Delta commit per range) and records in the interval ledger what it staged and skipped per event type. A stream holding fewer messages than `plan` counted fails it (`MessagesExpiredError`, "
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

#: Default ``execution_timeout`` of the three Spark tasks (``build_etl_dag(spark_execution_timeout=...)``).
DEFAULT_SPARK_EXECUTION_TIMEOUT = timedelta(hours=2)

_log = logging.getLogger(__package__)  # the ETL's one logger: "airflow_provider_plgd.etl"



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
    spark_connect_conn_id: str | None = None,
    spark_conf: Mapping[str, str | None] | None = None,
    default_args: dict[str, Any] | None = None,
    tags: list[str] | None = None,
    description: str = DAG_DESCRIPTION,
    doc_md: str | None = None,
    spark_execution_timeout: timedelta | None = DEFAULT_SPARK_EXECUTION_TIMEOUT,
    run_spark_conf_keys: Mapping[str, str | None] | Iterable[str] | None = None,
    storage_roots: Iterable[str] = (),
    fetch_range_messages: int = DEFAULT_FETCH_RANGE_MESSAGES,
    spark_ui_url_template: str | None = None,
    partitioned_asset_events: bool = True,
    staging_retention: timedelta | None = DEFAULT_STAGING_RETENTION,
):
    """Build the plgd ETL DAG.

    Runs are chained: ``max_active_runs=1``, and ``depends_on_past=True`` with
    ``wait_for_past_depends_before_skipping=True`` on ``dedupe`` (it reads the message-ID index of
    the earlier intervals) and ``rebuild`` (each snapshot is the previous one plus the new events),
    so scheduled runs and backfills process the intervals oldest first, and a failed interval stops
    the chain until it is cleared or fixed, also across empty intervals. The tasks check the chain
    from the data too (``airflow_provider_plgd.tables.chain``): a hole fails dedupe, rebuild and summary.
    The params ``stream``, ``owners``, ``event_types``, ``lookback_intervals``, ``max_content_bytes``
    and the storage root are the pipeline's identity: their values here are fixed, a run whose
    conf differs fails in ``wait_for_interval`` (``PipelineIdentityError``), and the root records
    them (``airflow_provider_plgd.tables.identity``). Runs without a data interval
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
    :param spark_connect_conn_id: a ``spark_connect`` connection (Spark provider): the three Spark
        tasks then run the applications as Spark Connect clients on that server
        (:class:`~airflow_provider_plgd.operators.spark_connect.PlgdSparkConnectOperator`) instead
        of ``spark-submit``; ``spark_conn_id``, ``spark_conf`` and ``spark_ui_url_template`` are
        not used, and a run's ``spark_conf`` must be empty (refused in ``wait_for_interval``
        otherwise; docs/spark-connect.md). Default: none.
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
    :param spark_ui_url_template: the Spark History Server page of an application, with
        ``{app_id}``, e.g. ``https://spark-history.example:18080/history/{app_id}/``: the "Spark
        application" link of the Spark tasks after their application ended (default: none; while
        it runs the link is the driver's Spark UI). The ``summary`` task's "Tables" link needs
        nothing (``airflow_provider_plgd.operators.links``).
    :param partitioned_asset_events: on Airflow >= 3.3 the asset events of ``staging``,
        ``events`` and ``events_deduped`` carry ``partition_key`` = the interval ID, for consumers
        scheduled with ``PartitionedAssetTimetable`` (default True). Such events do not schedule
        DAGs on those assets that are not partitioned: False keeps them unpartitioned.
    :param staging_retention: how long the staging of a reconciled interval is kept (default
        :data:`DEFAULT_STAGING_RETENTION`, 7 days; ``None``: forever). After an interval
        reconciles, ``summary`` removes the staging of every reconciled interval staged longer ago
        and vacuums the staging table (``staging_commits.expire_intervals``; a failure there is logged,
        not raised: the next run tries again).
    :return: the ``DAG``. Its assets are ``plgd://<dag_id>/{staging,events,quarantine,events_deduped,snapshots}``.
    :raises SparkConfError: when ``spark_conf`` is not a mapping of strings (a ``TypeError``).
    :raises ValueError: ``spark_conf``, ``run_spark_conf_keys`` or ``spark_ui_url_template`` given with
        ``spark_connect_conn_id``.
    :raises ValueError: a value of ``params`` that a run could not have either (an unknown event
        type, a relative storage root, a number out of bounds; names the param).
    """
    # lazy: the run-param checks load when a DAG is built, not when the etl package is imported
    from airflow_provider_plgd import run_params

    if spark_connect_conn_id and (spark_conf or spark_ui_url_template or run_spark_conf_keys):
        raise ValueError("build_etl_dag(spark_connect_conn_id=...): spark_conf, run_spark_conf_keys and "
                         "spark_ui_url_template apply to spark-submit only; on Spark Connect the server's "
                         "settings apply")
    merged_params = etl_params(params)
    conf = merge_spark_conf(DEFAULT_SPARK_CONF, spark_conf, source="build_etl_dag(spark_conf=...)")
    # on Spark Connect a run may set no Spark setting: refused in the first task, before any I/O
    spark_conf_policy = run_params.run_spark_conf_policy({} if spark_connect_conn_id else run_spark_conf_keys)
    default_root = merged_params["storage_root"]
    allowed_roots = [getattr(default_root, "value", default_root) or "", *storage_roots]
    # the pipeline's identity: the author's stream, selection, lookback, decode limit and root
    defaults = {k: getattr(v, "value", v) for k, v in merged_params.items()}
    try:
        author = run_params.check_run_params(defaults, spark_conf_policy=spark_conf_policy,
                                             storage_roots=allowed_roots, jetstream_conn_id=jetstream_conn_id)
    except ValueError as err:
        raise ValueError(f"build_etl_dag(params=...): {err}") from None
    etl = _EtlSettings(
        dag_id=dag_id, schedule=schedule, start_date=start_date, jetstream_conn_id=jetstream_conn_id,
        author=author, defaults=defaults, allowed_roots=tuple(allowed_roots), spark_conf_policy=spark_conf_policy,
        assets=etl_assets(dag_id), fetch_range_messages=fetch_range_messages, spark_conn_id=spark_conn_id,
        spark_connect_conn_id=spark_connect_conn_id, spark_conf=conf, spark_execution_timeout=spark_execution_timeout,
        spark_ui_url_template=spark_ui_url_template, partitioned_asset_events=partitioned_asset_events,
        staging_retention=staging_retention)
    args = {"retries": 2, "retry_delay": timedelta(seconds=30), **(default_args or {})}
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
        # the Spark tasks' arguments read the plan through it: {{ interval_plan(ti).layout.root }}
        user_defined_macros={"interval_plan": interval_plan_of},
    ) as dag:
        wait, planned = _wait_and_plan(etl)
        fetch = _fetch(etl, planned)
        gate, decode, dedupe, rebuild = _spark_stages(etl)
        summarize = _summary(etl)
        wait >> planned
        fetch >> gate >> decode >> dedupe >> rebuild >> summarize
    return dag


def interval_plan_of(ti: Any) -> IntervalPlan:
    """The run's :class:`IntervalPlan`, read back from the ``plan`` task's XCom (the DAG's
    ``interval_plan`` macro, and the tasks after ``plan``).

    :raises ValueError: the XCom is not a plan (``IntervalPlan.from_xcom``).
    """
    return IntervalPlan.from_xcom(ti.xcom_pull(task_ids="plan"))


@dataclass(frozen=True)
class _EtlSettings:
    """What the DAG author fixed in :func:`build_etl_dag`, checked, as the task builders below use it."""

    dag_id: str
    schedule: timedelta | str
    start_date: datetime
    jetstream_conn_id: str
    author: Any  # run_params.RunParams: the pipeline's identity
    defaults: dict[str, Any]
    allowed_roots: tuple[str, ...]
    spark_conf_policy: Mapping[str, str | None]
    assets: dict[str, Any]
    fetch_range_messages: int
    spark_conn_id: str
    spark_connect_conn_id: str | None
    spark_conf: dict[str, str]
    spark_execution_timeout: timedelta | None
    spark_ui_url_template: str | None
    partitioned_asset_events: bool
    staging_retention: timedelta | None

    def check_interval(self, context: Mapping[str, Any]) -> tuple[datetime, datetime]:
        """The run's data interval, and its params against the pipeline's identity (no I/O)."""
        # lazy: the run-param checks load when a DAG is built, not when the etl package is imported
        from airflow_provider_plgd import run_params

        window = require_data_interval(context, schedule=self.schedule, start_date=self.start_date)
        run_params.check_run(params_of_run(context, self.defaults), self.author,
                             spark_conf_policy=self.spark_conf_policy, storage_roots=list(self.allowed_roots),
                             jetstream_conn_id=self.jetstream_conn_id)
        return window


def _wait_and_plan(etl: _EtlSettings) -> tuple[Any, Any]:
    """``wait_for_interval`` (the sensor) and ``plan``; return the sensor and plan's XComArg."""
    # lazy: the operators load when a DAG is built, not when the etl package is imported
    from airflow_provider_plgd.operators import lineage
    from airflow_provider_plgd.sensors.interval_complete import JetStreamIntervalCompleteSensor

    wait = JetStreamIntervalCompleteSensor(
        task_id="wait_for_interval",
        jetstream_conn_id=etl.jetstream_conn_id,
        subject_filter="plgd.>",
        stream=etl.author.stream,
        settle_seconds="{{ params.settle_seconds }}",
        deferrable=True,
        poke_interval=5,
        timeout=6 * 3600,
        interval_check=etl.check_interval,  # in execute: its error shows where the task's page shows failures
        doc_md=TASK_DOCS["wait_for_interval"],
        task_display_name="Wait until the interval is complete",
    )

    @task(task_display_name="Plan: count the stream, split it into ranges")
    def plan(**context) -> dict[str, Any]:
        """Resolve the storage root, record the interval ledger (its sequence ranges and their
        counts), and build the --py-files zip (spark-submit only)."""
        # the work: plan_interval; here only the Airflow context and the lineage report
        start, end = etl.check_interval(context)

        def report_lineage(servers: Sequence[str], stream: str, layout: Layout) -> None:
            lineage.report_task_lineage(context, lineage.plan_lineage, servers, stream, layout, ledger.SCOPE_FILTER)

        return plan_interval(params_of_run(context, etl.defaults), start=start, end=end, dag_id=etl.dag_id,
                             jetstream_conn_id=etl.jetstream_conn_id, spark_conf_policy=etl.spark_conf_policy,
                             allowed_roots=etl.allowed_roots, author=etl.author,
                             fetch_range_messages=etl.fetch_range_messages, report_lineage=report_lineage,
                             # on Spark Connect each application ships its code (addArtifacts)
                             build_py_files=not etl.spark_connect_conn_id).to_xcom()  # the XCom edge

    return wait, plan()


def _fetch(etl: _EtlSettings, planned: Any) -> Any:
    """``fetch_ranges`` and the ``fetch`` tasks mapped over its ranges, each with the plan."""
    # lazy: the operator loads when a DAG is built, not when the etl package is imported
    from airflow_provider_plgd.operators.ledger_range_fetch import LedgerRangeFetchOperator

    @task(task_display_name="Sequence ranges of the fetch")
    def fetch_ranges(planned_value: dict[str, Any]) -> list[dict[str, Any]]:
        """The fetch task kwargs, one ``{"plan", "ledger_range"}`` per stream-sequence range
        (Airflow maps over a plain return value)."""
        interval_plan = IntervalPlan.from_xcom(planned_value)
        return [{"plan": interval_plan.to_xcom(), "ledger_range": i} for i in range(interval_plan.fetch_ranges)]

    return LedgerRangeFetchOperator.partial(
        task_id="fetch",
        jetstream_conn_id=etl.jetstream_conn_id,
        stream=etl.author.stream,
        settle_seconds="{{ params.settle_seconds }}",  # the sensor's rule, re-checked before the commit
        task_display_name="Fetch a sequence range into staging",
        doc_md=TASK_DOCS["fetch"],
    ).expand_kwargs(fetch_ranges(planned))  # type: ignore[arg-type]  # an XComArg of the task's dict


def _spark_stages(etl: _EtlSettings) -> tuple[Any, Any, Any, Any]:
    """``spark_needed`` (the gate that skips empty intervals) and the Spark tasks ``decode``,
    ``dedupe`` and ``rebuild``."""
    assets = etl.assets

    # One staging asset event per run (not one per mapped fetch task), and the gate of the Spark tasks.
    @task.short_circuit(ignore_downstream_trigger_rules=False, outlets=[assets["staging"]],
                        task_display_name="Spark needed? (skip empty intervals)")
    def spark_needed(**context) -> bool:
        """False (skip decode, dedupe, rebuild) when ``plan`` found the interval empty (``spark_skip``)."""
        planned = interval_plan_of(context["ti"])
        set_asset_extra(context, assets["staging"], staging_extra(planned),
                        partition_key=planned.interval_id if etl.partitioned_asset_events else None)
        if planned.spark_skip:
            _log.info("Skipping decode, dedupe and rebuild of interval %s: %s", planned.interval_id,
                      planned.spark_skip)
            return False
        return True

    root_arg, interval_arg = "{{ interval_plan(ti).layout.root }}", "{{ interval_plan(ti).interval_id }}"
    identity = etl.author.identity()
    decode = _spark_task(
        etl, "decode", "decode_events", "plgd-decode-events",
        ["--root", root_arg, "--stream", etl.author.stream, "--interval-id", interval_arg, "--ledger",
         "--max-content-bytes", str(identity["max_content_bytes"])],
        [assets["events"], *quarantine_outlets(etl.dag_id)], "Decode events (Spark)",
    )
    dedupe = _spark_task(
        etl, "dedupe", "dedupe_events", "plgd-dedupe-events",
        ["--root", root_arg, "--interval-id", interval_arg, "--lookback-intervals", str(identity["lookback_intervals"])],
        [assets["events_deduped"]], "Deduplicate events (Spark)", depends_on_past=True,
        wait_for_past_depends_before_skipping=True,
    )
    rebuild = _spark_task(
        etl, "rebuild", "rebuild_snapshots", "plgd-rebuild-snapshots",
        ["--root", root_arg, "--interval-id", interval_arg],
        [assets["snapshots"]], "Rebuild snapshots (Spark)", depends_on_past=True,
        wait_for_past_depends_before_skipping=True,
    )
    return spark_needed(), decode, dedupe, rebuild


def _spark_task(etl: _EtlSettings, app: str, application: str, name: str, args: list[str], outlets: list[Any],
                display_name: str, **kwargs: Any) -> Any:
    """One of the three Spark tasks: task ID ``app`` runs ``spark_apps/<application>.py``
    (``spark-submit``, or a Spark Connect client), and its run summary goes into its asset events."""
    # lazy: the Spark operators load when a DAG is built, not when the etl package is imported
    from airflow_provider_plgd.operators import lineage

    def post_execute(context: Any, result: Any = None) -> None:
        emit_app_asset_events(context, app, etl.assets, partitioned=etl.partitioned_asset_events)

    common = {"application": spark_app_path(application), "application_args": args, "outlets": outlets,
              "run_conf_param": "spark_conf", "run_conf_keys": etl.spark_conf_policy,
              "execution_timeout": etl.spark_execution_timeout, "post_execute": post_execute,
              "task_display_name": display_name, "doc_md": TASK_DOCS[app], **kwargs}
    if etl.spark_connect_conn_id:
        from airflow_provider_plgd.operators.spark_connect import PlgdSparkConnectOperator

        return PlgdSparkConnectOperator(task_id=app, conn_id=etl.spark_connect_conn_id, name=name, **common)
    from airflow_provider_plgd.operators.spark_submit import PlgdSparkSubmitOperator

    return PlgdSparkSubmitOperator(
        task_id=app, name=name, conn_id=etl.spark_conn_id, py_files="{{ interval_plan(ti).py_files }}",
        conf=etl.spark_conf, spark_ui_url_template=etl.spark_ui_url_template,
        **lineage.spark_submit_kwargs(),  # OpenLineage: the task's run is the Spark application's parent
        **common,
    )


def _summary(etl: _EtlSettings) -> Any:
    """``summary``: reconcile the interval ledger's chain, report metrics; with the "Tables" link."""
    # lazy: the lineage report loads when a DAG is built, not when the etl package is imported
    from airflow_provider_plgd.operators import lineage

    stream = etl.author.stream
    retention_s = None if etl.staging_retention is None else etl.staging_retention.total_seconds()

    # none_failed: runs after skipped Spark tasks (an empty interval) and reconciles 0 = 0.
    @task(trigger_rule="none_failed", task_display_name="Summary: reconcile the interval")
    def summary(**context) -> dict[str, Any]:
        """Check the interval ledger's whole chain (fails the run when it does not add up), log it,
        and return its numbers (bounded XCom: no per-owner lists)."""
        # the work: summarize_interval; here only plan's XCom and the lineage report
        planned = interval_plan_of(context["ti"])
        PlgdTablesLink.persist(context, planned.layout)  # before a LedgerError
        lineage.report_task_lineage(context, lineage.summary_lineage, stream, planned.layout)
        result = summarize_interval(planned.layout, stream, planned.interval_id, context["params"],
                                    staging_retention_seconds=retention_s).as_dict()  # the XCom edge
        try:  # the interval reconciled: its counts through Airflow's metrics (docs/metrics.md)
            emit_interval_metrics(result, dag_id=etl.dag_id, stream=stream)
        except Exception:  # a metrics backend's error never fails the interval
            _log.warning("Could not send the metrics of interval %s", planned.interval_id, exc_info=True)
        return result

    summarize = summary()
    # a TaskFlow task: its operator gets the link here (the DAG serializes the instance's links)
    summarize.operator.operator_extra_links = (PlgdTablesLink(),)  # type: ignore[attr-defined]  # PlainXComArg
    return summarize
