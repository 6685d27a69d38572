"""example_partitioned_consumer: one run per interval of ``plgd_events_etl``, reading exactly that interval.

On Airflow >= 3.3 the ETL's asset events of ``staging``, ``events`` and ``events_deduped`` carry
``partition_key`` = the interval ID (``build_etl_dag(partitioned_asset_events=True)``, the
default). This DAG is scheduled with ``PartitionedAssetTimetable`` on the ``events_deduped``
asset: each event queues one run whose ``partition_key`` is that interval ID (the identity
mapper), and the run reads exactly that interval's rows of ``{storage_root}/events_deduped`` with
``polars.scan_delta`` (the filter on the partition column ``interval_id`` prunes every other
file; no Spark). A rerun or backfill of an interval emits its event again and queues a new run.

XCom of ``interval_rows`` (JSON)::

    {"interval_id": "20260101T000000Z_20260101T010000Z", "rows": 231,
     "event_types": {"resourcechanged": 180, ...}, "owners": 3, "devices": 12, "table": "<root>/events_deduped"}

Params: ``storage_root`` (as ``example_plgd_snapshot_consumer``: default ``""``, the
``plgd_jetstream_default`` connection's ``storage_root`` extra, else ``$AIRFLOW_HOME/plgd``; a
root the deployment allows, ``PLGD_ETL_STORAGE_ROOTS``). A partition key that is not an interval
ID fails the run (``ValueError`` naming it). On Airflow before 3.2 this file defines no DAG.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from airflow_provider_plgd.compat import DAG, Param, PartitionedAssetTimetable, task
from airflow_provider_plgd.etl import etl_assets

#: The ETL DAG whose ``events_deduped`` asset schedules this DAG.
ETL_DAG_ID = "plgd_events_etl"
JETSTREAM_CONN_ID = "plgd_jetstream_default"

if PartitionedAssetTimetable is not None:
    with DAG(
        dag_id="example_partitioned_consumer",
        schedule=PartitionedAssetTimetable(assets=etl_assets(ETL_DAG_ID)["events_deduped"]),
        start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
        catchup=False,
        params={"storage_root": Param("", type="string",
                                      description="Root of the ETL's tables (as the ETL DAG's storage_root). Empty: "
                                                  "the plgd_jetstream_default connection's storage_root extra, else "
                                                  "$AIRFLOW_HOME/plgd; otherwise a root the deployment allows "
                                                  "(PLGD_ETL_STORAGE_ROOTS).")},
        description="One run per ETL interval (partitioned asset events): that interval's deduplicated events",
        tags=["plgd", "example"],
        doc_md=__doc__,
    ) as dag:

        @task
        def interval_rows(**context: Any) -> dict[str, Any]:
            """Read the run's interval (its partition key) of ``events_deduped`` (module docstring)."""
            # lazy: in the task, so that parsing this DAG file stays light (Airflow's best practice)
            import logging

            import polars as pl

            from airflow_provider_plgd import times
            from airflow_provider_plgd.hooks.base import resolve_layout
            from airflow_provider_plgd.run_params import check_run_storage_root, env_storage_roots
            from airflow_provider_plgd.tables import delta_tables, staging

            log = logging.getLogger("airflow.task")
            key = context.get("partition_key")
            try:  # an asset event may come from the REST API: check the key before using it
                times.parse_interval_id(str(key))
                interval_id = staging.validate_partition_value(str(key), "partition_key")
            except ValueError as exc:
                raise ValueError(f"partition_key {key!r} is not an interval ID of the ETL "
                                 f"(<start>_<end>, seq-<first>-<last> or durable-<first>-<last>): {exc}") from None
            params = context.get("params") or {}
            root = check_run_storage_root(params.get("storage_root"), env_storage_roots(), JETSTREAM_CONN_ID)
            layout = resolve_layout(root, JETSTREAM_CONN_ID)
            uri = delta_tables.interval_table_uri(layout, delta_tables.EVENTS_DEDUPED)
            frame = (pl.scan_delta(uri, storage_options=delta_tables.storage_options(uri) or None)
                     .filter(pl.col(delta_tables.INTERVAL_COLUMN) == interval_id)
                     .select("event_type", "owner_id", "device_id").collect())
            per_type = frame.group_by("event_type").len().sort("event_type")
            result = {"interval_id": interval_id, "rows": frame.height,
                      "event_types": dict(zip(per_type.get_column("event_type").to_list(),
                                              per_type.get_column("len").to_list(), strict=True)),
                      "owners": frame.get_column("owner_id").drop_nulls().n_unique(),
                      "devices": frame.get_column("device_id").drop_nulls().n_unique(), "table": uri}
            log.info("interval %s of %s: %s rows, %s owners, %s devices", interval_id, uri, result["rows"],
                     result["owners"], result["devices"])
            return result

        interval_rows()
