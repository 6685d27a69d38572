"""# plgd_table_maintenance

Keeps the tables of `plgd_events_etl` fast for years (built by
`airflow_provider_plgd.etl.build_maintenance_dag`): each run compacts the partitions of `events`,
`events_deduped`, `quarantine` and `msgid_index` whose interval is older than the latest
snapshot's interval (the same rows in fewer files), vacuums files removed longer ago than the
retention, writes a checkpoint and removes expired log entries of every table, snapshot tables
included, then logs the status view (`plgd-etl status`). It runs beside the ETL without a lock:
it never touches the intervals the ETL writes next.

**Environment variables** of this DAG file (read when it is parsed):

* `PLGD_MAINTENANCE_SCHEDULE`: cron or preset (default `@daily`);
* `PLGD_MAINTENANCE_STORAGE_ROOT`: the ETL's storage root (default: the `plgd_jetstream_default`
  connection's `storage_root` extra, else `$AIRFLOW_HOME/plgd`, as the ETL);
* `PLGD_MAINTENANCE_VACUUM_RETENTION_HOURS`: vacuum retention in hours (default 168; -1: no vacuum).

It also expires the staging of reconciled intervals older than the ETL's staging retention
(7 days, `build_maintenance_dag(staging_retention=…)`).

More: docs/operations.md, "Table maintenance".
"""

from __future__ import annotations

import os
from datetime import datetime, timezone

from airflow_provider_plgd.etl import build_maintenance_dag
from airflow_provider_plgd.tables.maintenance import MaintenanceSettings

dag = build_maintenance_dag(
    dag_id="plgd_table_maintenance",
    schedule=os.environ.get("PLGD_MAINTENANCE_SCHEDULE", "").strip() or "@daily",
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    storage_root=os.environ.get("PLGD_MAINTENANCE_STORAGE_ROOT", "").strip() or None,
    settings=MaintenanceSettings(
        vacuum_retention_hours=int(os.environ.get("PLGD_MAINTENANCE_VACUUM_RETENTION_HOURS", "168"))),
    doc_md=__doc__,
)
