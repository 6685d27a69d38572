"""plgd_events_etl: hourly ETL of plgd hub events from NATS JetStream into snapshot tables.

Tasks per data interval ``[data_interval_start, data_interval_end)``:

1. ``wait_for_interval`` (deferrable sensor): the interval is complete in the stream. Runs
   without a data interval (Airflow 3 runs without a logical date) fail here at once.
2. ``plan``: resolves the storage root, discovers owners from the stream's subjects (or the
   ``owners`` param) and groups them into at most ``max_fetch_tasks`` fetch tasks.
3. ``fetch`` (mapped over owner groups): owner × event type batches into Parquet staging.
4. ``decode`` → ``dedupe`` → ``rebuild`` (``SparkSubmitOperator``): typed events, one row per
   message ID, and the latest state per resource, device and owner.
5. ``summary``: counts per owner and event type, duplicates, quarantined rows and lag.

``catchup=True``, ``max_active_runs=1`` and ``depends_on_past=True`` on ``dedupe`` and ``rebuild`` make
each snapshot build on the one before it; backfills run oldest first. Each output dataset is an
Airflow Asset (outlets). See docs/operations.md ("Backfill and reruns").

Environment overrides, read when the file is parsed (for the demo and the tests; production keeps
the defaults). Set them on every component that parses DAGs, workers included:

* ``PLGD_ETL_SCHEDULE_SECONDS``: interval length in seconds (default 3600);
* ``PLGD_ETL_START_DATE``: ISO date-time of the first interval (default 2026-01-01T00:00:00Z);
* ``PLGD_ETL_END_DATE``: ISO date-time; no interval starting after it is scheduled (default none);
* ``PLGD_ETL_CATCHUP``: ``true`` (default) or ``false``: schedule every interval since the start date
  (or the last run), or only the newest one;
* ``PLGD_ETL_PARAMS``: JSON object of param defaults (``etl.DEFAULT_PARAMS`` keys);
* ``PLGD_ETL_SPARK_CONF``: JSON object of Spark settings for the Spark tasks (``build_etl_dag(spark_conf=…)``);
  ``"fast-local"`` means ``etl.FAST_LOCAL_SPARK_CONF``.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone

from airflow_provider_plgd.etl import FAST_LOCAL_SPARK_CONF, build_etl_dag
from airflow_provider_plgd.operators.jetstream_to_staging import parse_bool


def _env_datetime(name: str, default: str | None) -> datetime | None:
    value = os.environ.get(name, default)
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an ISO-8601 date-time") from None
    if parsed.tzinfo is None:
        raise ValueError(f"{name}={value!r} needs a time zone (e.g. +00:00 or Z)")
    return parsed.astimezone(timezone.utc)


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip()
    return parse_bool(value, name) if value else default


def _env_json_object(name: str) -> dict | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    if name == "PLGD_ETL_SPARK_CONF" and value == "fast-local":
        return dict(FAST_LOCAL_SPARK_CONF)
    try:
        parsed = json.loads(value)
    except ValueError:
        raise ValueError(f"{name} must be a JSON object, got {value!r}") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"{name} must be a JSON object, got {value!r}")
    return parsed


dag = build_etl_dag(
    dag_id="plgd_events_etl",
    schedule=timedelta(seconds=float(os.environ.get("PLGD_ETL_SCHEDULE_SECONDS", "3600"))),
    start_date=_env_datetime("PLGD_ETL_START_DATE", "2026-01-01T00:00:00+00:00"),
    end_date=_env_datetime("PLGD_ETL_END_DATE", None),
    catchup=_env_bool("PLGD_ETL_CATCHUP", True),
    params=_env_json_object("PLGD_ETL_PARAMS"),
    spark_conf=_env_json_object("PLGD_ETL_SPARK_CONF"),
)
