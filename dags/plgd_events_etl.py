"""plgd_events_etl: hourly ETL of plgd hub events from NATS JetStream into snapshot tables.

Tasks per data interval ``[data_interval_start, data_interval_end)``:

1. ``wait_for_interval`` (deferrable sensor): the interval is complete in the stream.
2. ``plan``: resolves the storage root, discovers owners from the stream's subjects (or the
   ``owners`` param) and groups them into at most ``max_fetch_tasks`` fetch tasks.
3. ``fetch`` (mapped over owner groups): owner × event type batches into Parquet staging.
4. ``decode`` → ``dedupe`` → ``rebuild`` (``SparkSubmitOperator``): typed events, one row per
   message ID, and the latest state per resource, device and owner.
5. ``summary``: counts per owner and event type, duplicates, quarantined rows and lag.

``max_active_runs=1`` and ``depends_on_past=True`` on ``dedupe`` and ``rebuild`` make each snapshot build on the
one before it; backfills run oldest first. Each output dataset is an Airflow Asset (outlets).

Environment overrides (for the demo and tests; production keeps the defaults):
``PLGD_ETL_SCHEDULE_SECONDS`` (interval length, default 3600) and ``PLGD_ETL_START_DATE``
(ISO date-time of the first interval, default 2026-01-01T00:00:00Z).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

from airflow_provider_plgd.etl import build_etl_dag

dag = build_etl_dag(
    dag_id="plgd_events_etl",
    schedule=timedelta(seconds=float(os.environ.get("PLGD_ETL_SCHEDULE_SECONDS", "3600"))),
    start_date=datetime.fromisoformat(
        os.environ.get("PLGD_ETL_START_DATE", "2026-01-01T00:00:00+00:00").replace("Z", "+00:00")
    ).astimezone(timezone.utc),
)
