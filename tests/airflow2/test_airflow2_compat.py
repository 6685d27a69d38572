"""Airflow 2.11 compatibility (``make test-airflow2``; skipped on Airflow 3).

The provider installs without the Airflow-3-only ``messaging`` extra, registers with Airflow 2's
ProvidersManager, every DAG in ``dags/`` imports without errors, and ``compat.Asset`` gives the
same datasets the DAGs exchange (``Dataset(uri)``: Airflow 2 datasets have no name).
"""

from __future__ import annotations

import importlib.util
from datetime import timedelta
from pathlib import Path

import pytest

from airflow_provider_plgd.compat import AIRFLOW_V_3

pytestmark = [pytest.mark.airflow2, pytest.mark.skipif(AIRFLOW_V_3, reason="Airflow 2.x only (make test-airflow2)")]

REPO = Path(__file__).resolve().parents[2]
DAG_IDS = {"plgd_events_etl", "example_plgd_snapshot_consumer", "example_plgd_fetch_by_sequence",
           "example_plgd_fetch_durable"}


def test_runs_on_airflow_2_11_without_the_messaging_provider():
    import airflow

    assert airflow.__version__.startswith("2.11."), airflow.__version__
    assert importlib.util.find_spec("airflow.providers.common.messaging") is None
    # the event trigger module still imports (a plain trigger on 2.x; AssetWatcher needs Airflow 3)
    from airflow_provider_plgd.triggers.messages import JetStreamMessageTrigger

    assert JetStreamMessageTrigger(subject_filter="plgd.>").serialize()[1]["subject_filter"] == "plgd.>"


def test_asset_shim_returns_datasets():
    from airflow.datasets import Dataset

    from airflow_provider_plgd.compat import Asset

    assert Asset(name="plgd_events_etl.snapshots", uri="plgd://plgd_events_etl/snapshots") == Dataset(
        "plgd://plgd_events_etl/snapshots")
    assert Asset("plgd_registrations").uri == "plgd_registrations"
    assert Asset(name="n", uri="plgd://d/x", extra={"k": 1}).extra == {"k": 1}
    with pytest.raises(ValueError, match="name or a uri"):
        Asset()
    with pytest.raises(TypeError, match="need Airflow 3"):
        Asset(name="x", watchers=[object()])


def test_every_dag_imports_and_assets_connect_the_dags():
    from airflow.models.dagbag import DagBag
    from airflow.timetables.interval import DeltaDataIntervalTimetable

    from airflow_provider_plgd.etl import etl_assets

    bag = DagBag(str(REPO / "dags"), include_examples=False)
    assert bag.import_errors == {}
    assert set(bag.dag_ids) >= DAG_IDS
    etl = bag.dags["plgd_events_etl"]
    assert isinstance(etl.timetable, DeltaDataIntervalTimetable)
    assert etl.timetable._delta == timedelta(hours=1)
    snapshots = etl_assets("plgd_events_etl")["snapshots"]
    assert etl.get_task("rebuild").outlets == [snapshots]
    consumer = bag.dags["example_plgd_snapshot_consumer"]
    assert list(consumer.timetable.dataset_condition.objects) == [snapshots]
    assert [t.task_id for t in bag.dags["example_plgd_fetch_by_sequence"].topological_sort()] == [
        "fetch", "staging_summary"]


def test_provider_registers_hook_and_connection_form():
    from airflow.providers_manager import ProvidersManager

    pm = ProvidersManager()
    assert "airflow-provider-plgd" in pm.providers
    hook = pm.hooks["plgd_jetstream"]
    assert hook.hook_class_name == "airflow_provider_plgd.hooks.jetstream.JetStreamHook"
    assert {"extra__plgd_jetstream__servers", "extra__plgd_jetstream__stream",
            "extra__plgd_jetstream__storage_root"} <= set(pm.connection_form_widgets)
    assert pm.connection_form_widgets["extra__plgd_jetstream__token"].field.field_class.__name__ == "PasswordField"
    assert pm.connection_form_widgets["extra__plgd_jetstream__stream"].field.field_class.__name__ == "StringField"


def test_connection_form_field_behaviour():
    from airflow.providers_manager import ProvidersManager

    behaviour = ProvidersManager().field_behaviours["plgd_jetstream"]
    assert behaviour["hidden_fields"] == ["schema", "extra"]
    assert behaviour["relabeling"]["login"] == "User"
