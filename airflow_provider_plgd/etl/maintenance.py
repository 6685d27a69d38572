"""The table-maintenance DAG of an ETL pipeline: :func:`build_maintenance_dag`.

A second DAG beside the ETL DAG (``dags/plgd_table_maintenance.py``), on a schedule of the DAG
author's: compaction of the interval partitions the chain has passed, vacuum, checkpoints and log
cleanup (``airflow_provider_plgd.tables.maintenance``), then the status view in the task log. It needs
no lock against the ETL: it touches only intervals older than the latest snapshot's interval, and
a rerun of one of those still replaces exactly that interval (docs/operations.md, "Table maintenance").
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from airflow_provider_plgd.compat import DAG, task
from airflow_provider_plgd.etl.summary import DEFAULT_STAGING_RETENTION
from airflow_provider_plgd.hooks.base import resolve_layout
from airflow_provider_plgd.status import chain_status, format_status
from airflow_provider_plgd.tables.maintenance import MaintenanceSettings, maintain_tables

_log = logging.getLogger(__package__)

#: Task docs (Markdown) of the maintenance DAG's task.
MAINTAIN_DOC = (
    "Compacts the partitions of `events`, `events_deduped`, `quarantine` and `msgid_index` whose interval is "
    "older than the latest snapshot's (`optimize.compact`: the same rows, fewer files), vacuums files removed "
    "longer ago than the retention, writes a checkpoint and removes expired log entries of every table, "
    "snapshot tables included; then logs the status view. docs/operations.md, \"Table maintenance\".")


def build_maintenance_dag(
    *,
    dag_id: str = "plgd_table_maintenance",
    schedule: timedelta | str = "@daily",
    start_date: datetime,
    storage_root: str | None = None,
    stream: str = "EVENTS",
    jetstream_conn_id: str = "plgd_jetstream_default",
    settings: MaintenanceSettings | None = None,
    staging_retention: timedelta | None = DEFAULT_STAGING_RETENTION,
    default_args: Mapping[str, Any] | None = None,
    tags: list[str] | None = None,
    doc_md: str | None = None,
):
    """Build the table-maintenance DAG of one pipeline (one storage root and stream).

    :param dag_id: the DAG ID.
    :param schedule: a cron string, preset or ``timedelta`` (default daily).
    :param start_date: timezone-aware; no catchup (a maintenance run covers everything passed so far).
    :param storage_root: the pipeline's root (path or fsspec URL); default as the ETL's: the
        connection's ``storage_root`` extra, else ``$AIRFLOW_HOME/plgd`` (resolved when the task runs).
    :param stream: the pipeline's stream (the ledger's and the staging table's folder).
    :param jetstream_conn_id: the connection of the default root (not contacted otherwise).
    :param settings: :class:`~airflow_provider_plgd.tables.maintenance.MaintenanceSettings` (retention,
        bounds, target file size); default settings when None.
    :param staging_retention: after the tables, expire the staging of reconciled intervals staged
        longer ago than this (``reconcile.expire_staging``: one Delta commit, then vacuum); the
        ETL's own setting, default 7 days; ``None``: staging is not touched. Its summary goes into
        the XCom (``staging``).
    :param default_args: extra default args (retries, …).
    :param tags: DAG tags.
    :param doc_md: the DAG docs (Markdown; default this module's docstring).
    :return: the ``DAG``: one task, ``maintain`` (XCom: ``MaintenanceReport.as_dict()`` plus ``status``).
    :raises ValueError: ``settings`` of another type; a negative ``staging_retention``.
    """
    if settings is not None and not isinstance(settings, MaintenanceSettings):
        raise ValueError(f"settings must be a MaintenanceSettings, got {type(settings).__name__}")
    if staging_retention is not None and staging_retention.total_seconds() < 0:
        raise ValueError(f"staging_retention must be >= 0, got {staging_retention!r}")
    retention_s = None if staging_retention is None else staging_retention.total_seconds()
    chosen = settings or MaintenanceSettings()
    args = {"retries": 1, "retry_delay": timedelta(minutes=5), **(default_args or {})}
    with DAG(
        dag_id=dag_id,
        schedule=schedule,
        start_date=start_date,
        catchup=False,
        max_active_runs=1,
        default_args=args,
        tags=tags or ["plgd", "delta", "maintenance"],
        description="plgd tables: compact passed intervals, vacuum, checkpoints, log cleanup",
        doc_md=doc_md or __doc__,
    ) as dag:

        @task(task_display_name="Compact, vacuum, checkpoint", doc_md=MAINTAIN_DOC)
        def maintain() -> dict[str, Any]:
            """Run :func:`airflow_provider_plgd.tables.maintenance.maintain_tables` and log the status view."""
            layout = resolve_layout(storage_root, jetstream_conn_id)
            report = maintain_tables(layout, settings=chosen, stream=stream, staging_retention_seconds=retention_s)
            status = chain_status(layout, stream)
            for line in format_status(status).splitlines():
                _log.info("%s", line)
            return {**report.as_dict(), "status": status.as_dict(brief=True)}

        maintain()
    return dag
