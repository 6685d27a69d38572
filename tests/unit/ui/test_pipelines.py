"""Which DAGs the plgd page shows (``ui.pipelines.etl_pipeline_of``): those ``build_etl_dag`` built,
found in their serialized form (what the api-server reads), with the author's stream, root and
connection; and the plugin's registration (``setup.cfg``'s ``airflow.plugins`` entry point)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
pytest.importorskip("airflow.sdk", reason="the page and its plugin are Airflow 3")


def serialized(dag):
    from airflow.serialization.serialized_objects import DagSerialization

    return DagSerialization.from_dict(DagSerialization.to_dict(dag))


def test_an_etl_dag_is_found_with_its_pipeline_and_another_dag_is_not(tmp_path):
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG

    from airflow_provider_plgd.etl import build_etl_dag
    from airflow_provider_plgd.ui.pipelines import EtlPipeline, etl_pipeline_of

    etl = build_etl_dag(dag_id="etl_x", start_date=datetime(2026, 1, 1, tzinfo=timezone.utc), schedule=timedelta(hours=1),
                        jetstream_conn_id="nats_x", params={"stream": "PLGD", "storage_root": str(tmp_path)},
                        tags=["mine"])
    assert etl_pipeline_of(serialized(etl)) == EtlPipeline("etl_x", "PLGD", str(tmp_path), "nats_x",
                                                           1_767_225_600 * 10**9)  # its start: 2026-01-01
    with DAG("lookalike", schedule=None) as other:  # the task IDs, not the fetch operator
        for task_id in ("plan", "fetch", "dedupe", "rebuild", "summary"):
            EmptyOperator(task_id=task_id)
    assert etl_pipeline_of(serialized(other)) is None


def test_the_plugin_is_an_airflow_plugins_entry_point_with_the_app_and_the_nav_view():
    from setuptools.config.setupcfg import read_configuration

    from airflow_provider_plgd.ui.plugin import PlgdPlugin

    points = read_configuration(str(REPO / "setup.cfg"))["options"]["entry_points"]["airflow.plugins"]
    assert points == ["plgd = airflow_provider_plgd.ui.plugin:PlgdPlugin"]
    assert [a["url_prefix"] for a in PlgdPlugin.fastapi_apps] == ["/plgd"]
    (view,) = PlgdPlugin.external_views
    assert (view["destination"], view["url_route"], view["href"]) == ("nav", "plgd", "/plgd/")
