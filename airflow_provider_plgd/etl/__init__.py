"""The plgd ETL DAG: JetStream → staging → decode → dedupe → rebuild snapshots.

One concept per module: :mod:`.params` (the DAG params and their trigger-form schemas),
:mod:`.intervals` (a run's data interval and the schedule's grid), :mod:`.assets` (the output
Assets and their event extras), :mod:`.plan` (the ``plan`` step: ledger, empty intervals),
:mod:`.summary` (the ``summary`` step: reconcile and log), :mod:`.dag` (the factory
:func:`build_etl_dag` and its task docs), :mod:`.maintenance` (the table-maintenance DAG,
:func:`build_maintenance_dag`). The names below are the package's public face.
"""

from __future__ import annotations

from airflow_provider_plgd.etl.assets import (
    ASSET_NAMES,
    app_asset_extras,
    emit_app_asset_events,
    etl_assets,
    quarantine_outlets,
    set_asset_extra,
    staging_extra,
)
from airflow_provider_plgd.etl.dag import (
    DAG_DESCRIPTION,
    DEFAULT_DOC_MD,
    DEFAULT_SPARK_EXECUTION_TIMEOUT,
    TASK_DOCS,
    build_etl_dag,
    spark_app_path,
)
from airflow_provider_plgd.etl.intervals import require_data_interval, schedule_interval_ending_by
from airflow_provider_plgd.etl.maintenance import build_maintenance_dag
from airflow_provider_plgd.etl.params import (
    DEFAULT_PARAMS,
    OWNER_ID_PATTERN,
    SPARK_CONF_PARAM_DESCRIPTION,
    STREAM_NAME_PATTERN,
    SUMMARY_PARAMS,
    etl_params,
    param_schemas,
    run_params_used,
)
from airflow_provider_plgd.etl.plan import (
    DEFAULT_FETCH_RANGE_MESSAGES,
    plan_interval,
    spark_skip_reason,
    write_interval_ledger,
)
from airflow_provider_plgd.etl.summary import (
    DEFAULT_STAGING_RETENTION,
    log_run_summary,
    summarize_interval,
)
from airflow_provider_plgd.exceptions import MissingDataIntervalError, OffScheduleIntervalError
from airflow_provider_plgd.spark_conf import DEFAULT_SPARK_CONF

__all__ = [
    "ASSET_NAMES",
    "DAG_DESCRIPTION",
    "DEFAULT_DOC_MD",
    "DEFAULT_FETCH_RANGE_MESSAGES",
    "DEFAULT_PARAMS",
    "DEFAULT_SPARK_CONF",
    "DEFAULT_SPARK_EXECUTION_TIMEOUT",
    "DEFAULT_STAGING_RETENTION",
    "OWNER_ID_PATTERN",
    "SPARK_CONF_PARAM_DESCRIPTION",
    "STREAM_NAME_PATTERN",
    "SUMMARY_PARAMS",
    "TASK_DOCS",
    "MissingDataIntervalError",
    "OffScheduleIntervalError",
    "app_asset_extras",
    "build_etl_dag",
    "build_maintenance_dag",
    "emit_app_asset_events",
    "etl_assets",
    "etl_params",
    "log_run_summary",
    "param_schemas",
    "plan_interval",
    "quarantine_outlets",
    "require_data_interval",
    "run_params_used",
    "schedule_interval_ending_by",
    "set_asset_extra",
    "spark_app_path",
    "spark_skip_reason",
    "staging_extra",
    "summarize_interval",
    "write_interval_ledger",
]
