"""example_plgd_snapshot_consumer: a DAG scheduled on the snapshot asset of ``plgd_events_etl``.

Each output dataset of the ETL DAG is an Airflow Asset (``airflow_provider_plgd.etl.etl_assets``;
URIs ``plgd://plgd_events_etl/{staging,events,quarantine,events_deduped,snapshots}``). Whenever
the ETL's ``rebuild`` task succeeds, Airflow records an event on the ``snapshots`` asset and
queues a run of this DAG (Airflow 3 "assets", Airflow 2.11 "datasets").

An asset-triggered run has no data interval; it reads the **latest committed** snapshot (the Delta
tables ``{storage_root}/snapshots/*``, see ``docs/snapshots.md``) with the provider's public
``read_snapshot`` (a thin wrapper over ``deltalake``; no Spark) and logs, per owner, the devices
and how many of them are online.

XCom of ``devices_online`` (JSON)::

    {"snapshot_version": "20260101T010000Z", "snapshot_time": "2026-01-01T01:00:00Z",
     "interval_id": "<newest interval folded>",
     "owners": {"<owner_id>": {"devices": 3, "online": 2, "offline": 1, "unknown": 0}, ...},
     "devices": 6, "online": 4}

``devices`` counts the owner's devices in ``owner_devices`` and ``device_metadata``;
``online``/``offline`` count ``device_metadata.connection_status`` ``ONLINE``/``OFFLINE``;
``unknown`` = devices without a metadata row or status.

Params: ``storage_root`` (default ``""``: the ``plgd_jetstream_default`` connection's
``storage_root`` extra, else ``$AIRFLOW_HOME/plgd`` -- the same rule as the ETL DAG, so both read
and write the same place). Fails with ``FileNotFoundError`` when no snapshot is committed there.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from airflow_provider_plgd.compat import DAG, Param, task
from airflow_provider_plgd.etl import etl_assets

#: The ETL DAG whose snapshot asset schedules this DAG.
ETL_DAG_ID = "plgd_events_etl"
JETSTREAM_CONN_ID = "plgd_jetstream_default"

with DAG(
    dag_id="example_plgd_snapshot_consumer",
    schedule=[etl_assets(ETL_DAG_ID)["snapshots"]],
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    max_active_runs=1,
    params={"storage_root": Param("", type="string",
                                  description="Root of the ETL's tables (as the ETL DAG's storage_root). Empty: "
                                              "the plgd_jetstream_default connection's storage_root extra, else "
                                              "$AIRFLOW_HOME/plgd; otherwise a root the deployment allows "
                                              "(PLGD_ETL_STORAGE_ROOTS).")},
    description="Runs after each new plgd snapshot: devices and online devices per owner",
    tags=["plgd", "example"],
    doc_md=__doc__,
) as dag:

    @task
    def devices_online(params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Count devices and online devices per owner in the latest snapshot (see the module docstring)."""
        # lazy: in the task, so that parsing this DAG file stays light (Airflow's best practice)
        import logging

        from airflow_provider_plgd import latest_snapshot, read_snapshot
        from airflow_provider_plgd.hooks.base import resolve_layout
        from airflow_provider_plgd.run_params import check_run_storage_root, env_storage_roots
        from airflow_provider_plgd.times import ns_to_rfc3339 as ns_to_iso

        log = logging.getLogger("airflow.task")
        # a run param is untrusted input: only "", the connection's root or a root the deployment
        # allows (PLGD_ETL_STORAGE_ROOTS, as for the ETL DAG)
        root = check_run_storage_root((params or {}).get("storage_root"), env_storage_roots(), JETSTREAM_CONN_ID)
        layout = resolve_layout(root, JETSTREAM_CONN_ID)
        snapshot = latest_snapshot(layout)
        if snapshot is None:
            raise FileNotFoundError(f"no committed snapshot under {layout.snapshots_dir()}")
        status: dict[tuple[str, str], str | None] = {}
        for table, column in (("owner_devices", None), ("device_metadata", "connection_status")):
            columns = ["owner_id", "device_id"] + ([column] if column else [])
            rows = read_snapshot(layout, table, snapshot["version"]).select(columns).to_pylist()
            for row in rows:
                key = (row["owner_id"], row["device_id"])
                status[key] = row.get(column) if column else status.get(key)
        owners: dict[str, dict[str, int]] = {}
        for (owner_id, _device_id), value in sorted(status.items()):
            counts = owners.setdefault(owner_id, {"devices": 0, "online": 0, "offline": 0, "unknown": 0})
            counts["devices"] += 1
            counts[{"ONLINE": "online", "OFFLINE": "offline"}.get(value or "", "unknown")] += 1
        result = {
            "snapshot_version": snapshot["version"],
            "snapshot_time": ns_to_iso(snapshot["snapshot_time_ns"]),
            "interval_id": snapshot.get("interval_id"),
            "owners": owners,
            "devices": sum(c["devices"] for c in owners.values()),
            "online": sum(c["online"] for c in owners.values()),
        }
        log.info("Snapshot %s (%s) under %s: %s devices, %s online", result["snapshot_version"],
                 result["snapshot_time"], layout.root, result["devices"], result["online"])
        for owner_id, counts in owners.items():
            log.info("owner %s: %s devices, %s online, %s offline, %s unknown", owner_id, counts["devices"],
                     counts["online"], counts["offline"], counts["unknown"])
        return result

    devices_online()
