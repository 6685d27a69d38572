"""The ETL's output datasets as Airflow Assets, and the extras of the asset events its tasks emit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_provider_plgd.compat import ASSET_EVENT_EXTRAS, ASSET_EVENT_PARTITIONS, Asset, AssetAlias
from airflow_provider_plgd.etl.plan import IntervalPlan
from airflow_provider_plgd.tables import delta_tables
from airflow_provider_plgd.tables.layout import Layout
from airflow_provider_plgd.tables.run_summary import read_app_summary

#: The ETL's output datasets, in task order; each is an Airflow Asset (see :func:`etl_assets`).
ASSET_NAMES = ("staging", "events", "quarantine", "events_deduped", "snapshots")

#: The datasets whose asset events carry ``partition_key`` = the interval ID on Airflow >= 3.3
#: (:data:`~airflow_provider_plgd.compat.ASSET_EVENT_PARTITIONS`): each event is exactly one
#: interval's rows. Not ``snapshots`` (a snapshot is the whole state, and a partitioned event would
#: no longer schedule the DAGs that wait for every new snapshot, which are not partitioned) nor
#: ``quarantine`` (emitted through an asset alias, whose events carry only the run's partition key).
PARTITIONED_ASSETS = ("staging", "events", "events_deduped")


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


# -- asset events ----------------------------------------------------------------------------------
def quarantine_outlets(dag_id: str) -> list[Any]:
    """The outlets of ``decode`` for the quarantine dataset.

    Airflow 3: an ``AssetAlias`` (``<dag_id>.quarantine.nonempty``) through which
    :func:`emit_app_asset_events` emits the quarantine asset's event only when rows were
    quarantined (a declared asset outlet always gets an event). Airflow 2.11: the Dataset itself.
    """
    quarantine = etl_assets(dag_id)["quarantine"]
    if AssetAlias is None:  # pragma: no cover - Airflow 2.11
        return [quarantine]
    return [AssetAlias(name=f"{quarantine.name}.nonempty")]


def set_asset_extra(context: Mapping[str, Any], asset: Any, extra: Mapping[str, Any], *,
                    partition_key: str | None = None) -> None:
    """Attach ``extra`` (JSON values) to this task's event of the outlet ``asset`` (Airflow 3;
    a no-op on Airflow 2.11, whose dataset events are emitted without it).

    :param partition_key: the event's partition key (e.g. the interval ID) on Airflow >= 3.3
        (``add_partitions``); ignored before. An event with a partition key schedules only DAGs
        with a ``PartitionedAssetTimetable`` (Airflow's rule), others wait for unpartitioned ones.
    """
    events = context.get("outlet_events")
    if events is not None and ASSET_EVENT_EXTRAS:
        events[asset].extra.update(extra)
        if partition_key and ASSET_EVENT_PARTITIONS:
            events[asset].add_partitions(partition_key)


def staging_extra(planned: IntervalPlan) -> dict[str, Any]:
    """``extra`` of the staging asset event: ``{"interval_id", "messages" (the stream holds for the
    selection), "owners" ("all" or the number selected), "fetch_ranges"}``."""
    return {"interval_id": planned.interval_id, "messages": planned.messages, "owners": planned.owners_json,
            "fetch_ranges": planned.fetch_ranges}


def app_asset_extras(app: str, summary: Mapping[str, Any], interval_id: str) -> dict[str, dict[str, Any]]:
    """``extra`` of the asset events of one Spark application, by dataset name (see :data:`ASSET_NAMES`).

    Each names its Delta table (``table``: the table's URI; snapshots: ``tables``) and the Delta
    version the run committed (``delta_version``; snapshots: ``delta_versions`` per table):
    ``decode``: ``events`` ``{interval_id, decoded, table, delta_version}``, and ``quarantine``
    ``{interval_id, quarantined, per_reason, table, delta_version}`` only when rows were quarantined;
    ``dedupe``: ``events_deduped`` ``{interval_id, kept, duplicates, table, delta_version}``;
    ``rebuild``: ``snapshots`` ``{interval_id, snapshot_version, rows, tables, delta_versions}``.
    """
    versions = summary.get("delta_versions") or {}
    if app == "decode":
        layout = Layout.of(summary["output_root"])  # decode's run summary names its root
        events, quarantine = delta_tables.EVENTS, delta_tables.QUARANTINE
        out = {events: {"interval_id": interval_id, "decoded": summary.get("decoded"),
                        "table": delta_tables.interval_table_uri(layout, events), "delta_version": versions.get(events)}}
        if int(summary.get("quarantined") or 0):
            out[quarantine] = {"interval_id": interval_id, "quarantined": summary.get("quarantined"),
                               "per_reason": summary.get("per_reason") or {},
                               "table": delta_tables.interval_table_uri(layout, quarantine),
                               "delta_version": versions.get(quarantine)}
        return out
    if app == "dedupe":
        return {delta_tables.EVENTS_DEDUPED: {"interval_id": interval_id, "kept": summary.get("output"),
                                              "duplicates": summary.get("duplicates"),
                                              "table": summary.get("events_deduped_path"),
                                              "delta_version": versions.get(delta_tables.EVENTS_DEDUPED)}}
    if app == "rebuild":
        return {"snapshots": {"interval_id": interval_id, "snapshot_version": summary.get("version"),
                              "rows": summary.get("rows") or {}, "tables": summary.get("tables") or {},
                              "delta_versions": {t: v for t, v in versions.items() if not t.startswith("_")}}}
    raise ValueError(f"unknown Spark application {app!r}, expected decode, dedupe or rebuild")


def emit_app_asset_events(context: Mapping[str, Any], app: str, assets: Mapping[str, Any], *,
                          partitioned: bool = True) -> None:
    """``post_execute`` of a Spark task: put the application's run summary into its asset events.

    :param partitioned: the events of :data:`PARTITIONED_ASSETS` carry ``partition_key`` = the
        interval ID (Airflow >= 3.3).
    :raises ValueError: the application wrote no run summary (``{root}/_runs/{app}/...``).
    """
    planned = IntervalPlan.from_dict(context["ti"].xcom_pull(task_ids="plan"))
    summary = read_app_summary(planned.layout, app, planned.interval_id)
    if summary is None:
        raise ValueError(f"{app} wrote no run summary for interval {planned.interval_id} under "
                         f"{planned.layout.runs_dir()}/{app}/")
    for name, extra in app_asset_extras(app, summary, planned.interval_id).items():
        if name == "quarantine" and AssetAlias is not None:
            alias = AssetAlias(name=f"{assets[name].name}.nonempty")
            context["outlet_events"][alias].add(assets[name], extra=extra)
        else:
            key = planned.interval_id if partitioned and name in PARTITIONED_ASSETS else None
            set_asset_extra(context, assets[name], extra, partition_key=key)

