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
