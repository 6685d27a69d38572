"""The ETL's assets are per DAG: a second ETL DAG (``build_etl_dag(dag_id=...)``) gets its own."""

from __future__ import annotations

from airflow_provider_plgd.etl import ASSET_NAMES, etl_assets


def test_two_etl_dags_get_distinct_asset_names_and_uris():
    one, two = etl_assets("plgd_events_etl"), etl_assets("plgd_events_etl_eu")
    assert list(one) == list(two) == list(ASSET_NAMES)
    for name in ASSET_NAMES:
        assert one[name].uri == f"plgd://plgd_events_etl/{name}"
        if hasattr(one[name], "name"):  # Airflow 3 Asset (Airflow 2 Datasets have only the URI)
            assert one[name].name == f"plgd_events_etl.{name}"
            assert one[name].name != two[name].name
        assert one[name].uri != two[name].uri


def test_interval_asset_events_carry_the_interval_as_partition_key():
    """Airflow >= 3.3: the events of staging, events and events_deduped carry ``partition_key`` =
    the interval ID (as the task runner sends them to the API server); snapshots' do not (its
    consumers are not partitioned), and ``partition_key=None`` leaves an event unpartitioned."""
    import pytest

    from airflow_provider_plgd.compat import ASSET_EVENT_PARTITIONS
    from airflow_provider_plgd.etl import set_asset_extra
    from airflow_provider_plgd.etl.assets import PARTITIONED_ASSETS

    if not ASSET_EVENT_PARTITIONS:
        pytest.skip("partition keys of a task's asset events need Airflow >= 3.3")
    from airflow.sdk.execution_time.context import OutletEventAccessors
    from airflow.sdk.execution_time.task_runner import _serialize_outlet_events

    assets = etl_assets("plgd_events_etl")
    interval = "20260101T000000Z_20260101T010000Z"
    events = OutletEventAccessors()
    context = {"outlet_events": events}
    set_asset_extra(context, assets["events_deduped"], {"interval_id": interval, "kept": 7}, partition_key=interval)
    set_asset_extra(context, assets["snapshots"], {"interval_id": interval}, partition_key=None)
    sent = {e["dest_asset_key"]["name"]: e for e in _serialize_outlet_events(events)}
    assert sent["plgd_events_etl.events_deduped"]["partition_key"] == interval
    assert sent["plgd_events_etl.events_deduped"]["extra"] == {"interval_id": interval, "kept": 7}
    assert "partition_key" not in sent["plgd_events_etl.snapshots"]
    assert set(PARTITIONED_ASSETS) == {"staging", "events", "events_deduped"}
