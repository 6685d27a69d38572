"""The plgd ETL DAG factory: JetStream → staging → decode → dedupe → rebuild snapshots.

``dags/plgd_events_etl.py`` calls :func:`build_etl_dag`; other deployments can call it with their
own ``dag_id``, schedule and defaults. Source of the task order: ``docs/architecture.md``.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

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
    "event_types": [],  # [] = all live event types (plgd.event_types.LIVE_EVENT_TYPES)
    "storage_root": "",  # "" = the connection's storage_root extra, else $AIRFLOW_HOME/plgd
    "settle_seconds": 60,
    "max_fetch_tasks": 16,
    "lookback_intervals": 24,
}

_SPARK_APPS = Path(__file__).resolve().parent.parent / "spark_apps"


def spark_app_path(name: str) -> str:
    """Return the path of a Spark application file (``spark_apps/<name>.py``) as a string.

    :param name: ``decode_events``, ``dedupe_events`` or ``rebuild_snapshots``.
    :raises FileNotFoundError: if the application is not installed next to the provider.
    """
    try:
        import spark_apps

        base = Path(spark_apps.__file__).resolve().parent
    except ImportError:  # pragma: no cover - source checkout without install
        base = _SPARK_APPS
    path = base / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"Spark application {name!r} not found at {path}")
    return str(path)


def chunk(items: list, groups: int) -> list[list]:
    """Split ``items`` into at most ``groups`` contiguous, non-empty, near-equal chunks (order kept)."""
    if not items:
        return []
    groups = max(1, min(groups, len(items)))
    size, extra = divmod(len(items), groups)
    out, start = [], 0
    for i in range(groups):
        end = start + size + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return out


def build_etl_dag(
    *,
    dag_id: str = "plgd_events_etl",
    schedule: timedelta | str = timedelta(hours=1),
    start_date: datetime,
    params: dict[str, Any] | None = None,
    jetstream_conn_id: str = "plgd_jetstream_default",
    spark_conn_id: str = "spark_default",
    default_args: dict[str, Any] | None = None,
    tags: list[str] | None = None,
):
    """Build the plgd ETL DAG.

    :param dag_id: the DAG ID.
    :param schedule: a ``timedelta`` or cron string; each run handles its data interval.
    :param start_date: the start of the first data interval (timezone-aware).
    :param params: overrides of :data:`DEFAULT_PARAMS`.
    :param jetstream_conn_id: the ``plgd_jetstream`` connection (connection IDs are not templated).
    :param spark_conn_id: the ``spark`` connection used by the three ``SparkSubmitOperator`` tasks.
    :param default_args: extra default args (retries, …).
    :param tags: DAG tags.
    :return: the ``DAG``. Its assets are ``plgd://<dag_id>/{staging,events,quarantine,events_deduped,snapshots}``.
    """
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from airflow_provider_plgd.operators.jetstream_to_staging import JetStreamToStagingOperator
    from airflow_provider_plgd.sensors.interval_complete import JetStreamIntervalCompleteSensor

    if AIRFLOW_V_3:
        from airflow.sdk import DAG, task
    else:  # pragma: no cover
        from airflow import DAG
        from airflow.decorators import task

    merged_params = {**DEFAULT_PARAMS, **(params or {})}
    args = {"retries": 2, "retry_delay": timedelta(seconds=30), **(default_args or {})}
    assets = {name: Asset(name=f"plgd_{name}", uri=f"plgd://{dag_id}/{name}") for name in (
        "staging", "events", "quarantine", "events_deduped", "snapshots")}

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
        catchup=False,
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
        )

        @task
        def plan(**context) -> dict[str, Any]:
            """Resolve the storage root, discover owners, group fetches and build the --py-files zip."""
            from airflow_provider_plgd import staging
            from airflow_provider_plgd.hooks.jetstream import JetStreamHook
            from airflow_provider_plgd.plgd.event_types import LIVE_EVENT_TYPES
            from airflow_provider_plgd.spark_deps import build_py_files_zip

            p = context["params"]
            start, end = context.get("data_interval_start"), context.get("data_interval_end")
            if start is None or end is None:
                raise ValueError(
                    "plgd_events_etl needs a data interval; this run has none (a manual or asset-triggered "
                    "run on Airflow 3). Run it for an interval with a backfill (`airflow backfill create`), "
                    "`airflow dags test plgd_events_etl <interval end>`, or a REST API run with a logical date."
                )
            root = resolve_storage_root(p["storage_root"], jetstream_conn_id)
            owners = list(p["owners"]) or sorted(
                JetStreamHook(jetstream_conn_id=jetstream_conn_id, stream=p["stream"]).list_owners()
            )
            event_types = list(p["event_types"]) or list(LIVE_EVENT_TYPES)
            # The zip goes under a local storage root (shared by all workers in a cluster setup);
            # with a remote root it stays on this worker's disk (see docs/operations.md).
            local_root = root.removeprefix("file://") if "://" not in root.removeprefix("file://") else None
            home = os.environ.get("AIRFLOW_HOME", str(Path.home() / "airflow"))
            py_files = build_py_files_zip(Path(local_root or home) / "_deps")
            return {
                "storage_root": root,
                "interval_id": staging.interval_id(start, end),
                "snapshot_time": end.isoformat(),
                "owners": owners,
                "event_types": event_types,
                "fetch_groups": [
                    {"owner_ids": group, "event_types": event_types}
                    for group in chunk(owners, int(p["max_fetch_tasks"]))
                ],
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
            outlets=[assets["staging"]],
        ).expand_kwargs(fetch_groups(planned))

        x = "ti.xcom_pull(task_ids='plan')"
        common = {
            "conn_id": spark_conn_id,
            "py_files": "{{ " + x + "['py_files'] }}",
            "conf": {
                "spark.sql.session.timeZone": "UTC",
                "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
                "spark.ui.enabled": "false",
            },
        }
        root_arg = "{{ " + x + "['storage_root'] }}"
        interval_arg = "{{ " + x + "['interval_id'] }}"
        decode = SparkSubmitOperator(
            task_id="decode",
            name="plgd-decode-events",
            application=spark_app_path("decode_events"),
            application_args=[
                "--staging-root", root_arg, "--stream", "{{ params.stream }}",
                "--interval-id", interval_arg, "--output-root", root_arg,
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
            """Log counts per owner and event type, duplicates, quarantined rows and lag; return them."""
            from airflow_provider_plgd.run_summary import collect_run_summary

            planned_value = context["ti"].xcom_pull(task_ids="plan")
            fetched = context["ti"].xcom_pull(task_ids="fetch") or []
            result = collect_run_summary(planned_value["storage_root"], planned_value["interval_id"], fetched)
            print(json.dumps(result, indent=2, sort_keys=True, default=str))
            return result

        wait >> planned
        fetch >> decode >> dedupe >> rebuild >> summary()

    return dag
