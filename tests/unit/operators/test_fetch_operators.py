"""The two fetch operators without a server: the ETL's ``LedgerRangeFetchOperator`` and the users'
``JetStreamToStagingOperator`` (its deprecated ledger-range arguments), and the ETL DAG's wiring of
them (task graph, the plan passed to the fetch tasks, the Spark tasks' plan macro).

The plan record is written by ``etl.plan_interval`` with the fake hook of ``test_plan_summary`` (the
one fake); the connection points at TEST-NET-1, so a test that got as far as NATS would fail differently.
"""

from __future__ import annotations

import inspect
import json
import warnings
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from airflow.exceptions import AirflowException

from airflow_provider_plgd import spark_deps
from airflow_provider_plgd.compat import AirflowProviderDeprecationWarning
from airflow_provider_plgd.etl import build_etl_dag
from airflow_provider_plgd.etl.dag import interval_plan_of
from airflow_provider_plgd.etl.plan import IntervalPlan
from airflow_provider_plgd.exceptions import LedgerError
from airflow_provider_plgd.operators.jetstream_to_staging import JetStreamToStagingOperator
from airflow_provider_plgd.operators.ledger_range_fetch import LedgerRangeFetchOperator
from airflow_provider_plgd.tables.layout import Layout
from tests.unit.etl.test_plan_summary import FakeHook, plan

#: The ETL DAG's tasks and their upstream tasks (the graph ``build_etl_dag`` built before the split).
ETL_GRAPH = {
    "wait_for_interval": set(), "plan": {"wait_for_interval"}, "fetch_ranges": {"plan"}, "fetch": {"fetch_ranges"},
    "spark_needed": {"fetch"}, "decode": {"spark_needed"}, "dedupe": {"decode"}, "rebuild": {"dedupe"},
    "summary": {"rebuild"},
}


@pytest.fixture
def unreachable_conn(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT",
                       json.dumps({"conn_type": "plgd_jetstream", "host": "192.0.2.1", "port": 4222}))


@pytest.fixture
def planned(tmp_path, monkeypatch) -> dict:
    """The ``plan`` XCom of an interval of 9 messages in two ranges, its ledger written under ``tmp_path``."""
    monkeypatch.setenv(spark_deps.PY_FILES_DIR_ENV, str(tmp_path / "py_files"))
    (tmp_path / "root").mkdir()
    return plan(str(tmp_path / "root"), FakeHook("EVENTS", [(1, 6, 5), (6, 10, 4)]))


class FakeTI:
    def __init__(self, xcom):
        self.xcom = xcom

    def xcom_pull(self, task_ids):
        assert task_ids == "plan"
        return self.xcom


# -- LedgerRangeFetchOperator ----------------------------------------------------------------------
def test_range_operator_is_keyword_only_and_templates_the_plan_and_range():
    # Python's TypeError (Airflow 3), or Airflow 2's BaseOperator metaclass refusing positional arguments first
    with pytest.raises((TypeError, AirflowException)):
        LedgerRangeFetchOperator("fetch", {}, 0)  # type: ignore[misc]
    assert {"plan", "ledger_range", "stream", "settle_seconds"} <= set(LedgerRangeFetchOperator.template_fields)
    params = inspect.signature(LedgerRangeFetchOperator.__init__).parameters
    assert all(p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD) for n, p in params.items() if n != "self")


def test_range_operator_refuses_what_is_not_a_plan_before_any_connection(unreachable_conn):
    for bad in ("{{ ti.xcom_pull('plan') }}", ["a"], {"storage_root": "/x"}):
        with pytest.raises(ValueError, match="plan"):
            LedgerRangeFetchOperator(task_id="f", plan=bad, ledger_range=0).execute({"params": {}})


def test_range_operator_refuses_a_range_the_plan_does_not_have(planned, unreachable_conn):
    assert len(planned["fetch_ranges"]) == 2
    with pytest.raises(ValueError, match="2"):
        LedgerRangeFetchOperator(task_id="f", plan=planned, ledger_range=2).execute({"params": {}})


def test_range_operator_needs_the_ledger_the_plan_names(planned, tmp_path, unreachable_conn):
    moved = {**planned, "ledger": str(tmp_path / "elsewhere")}
    with pytest.raises(LedgerError, match="no ledger at"):
        LedgerRangeFetchOperator(task_id="f", plan=moved, ledger_range=0).execute({"params": {}})


def test_range_operator_checks_tuning_values_in_execute(planned, unreachable_conn):
    op = LedgerRangeFetchOperator(task_id="f", plan=IntervalPlan.from_xcom(planned), ledger_range="0",
                                  range_buffer_bytes=0)
    with pytest.raises(ValueError, match="range_buffer_bytes"):
        op.execute({"params": {}})


# -- JetStreamToStagingOperator: the ledger range moved ------------------------------------------------
def test_users_operator_has_no_ledger_parameters_and_the_old_ones_warn(tmp_path):
    params = inspect.signature(JetStreamToStagingOperator.__init__).parameters
    assert "ledger" not in params and "ledger_range" not in params
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        JetStreamToStagingOperator(task_id="plain", subject_filter="plgd.>", storage_root=str(tmp_path))
    with pytest.warns(AirflowProviderDeprecationWarning, match="LedgerRangeFetchOperator"):
        op = JetStreamToStagingOperator(task_id="old", ledger=str(tmp_path), ledger_range="0")
    assert (op.ledger, op.ledger_range) == (str(tmp_path), "0")


def test_users_operator_still_runs_a_ledger_range_and_refuses_other_targets(planned, unreachable_conn):
    with pytest.warns(AirflowProviderDeprecationWarning):
        both = JetStreamToStagingOperator(task_id="old", ledger=planned["ledger"], ledger_range=0,
                                          owner_id="OWNER", storage_root=planned["storage_root"])
    with pytest.raises(ValueError, match=r"got also \['owner_id'\]"):
        both.execute({"params": {}})
    with pytest.warns(AirflowProviderDeprecationWarning):
        out_of_range = JetStreamToStagingOperator(task_id="old", ledger=planned["ledger"], ledger_range=5,
                                                  storage_root=planned["storage_root"])
    with pytest.raises(ValueError, match="5"):
        out_of_range.execute({"params": {}})


# -- the ETL DAG ---------------------------------------------------------------------------------------
@pytest.fixture
def etl_dag(tmp_path):
    return build_etl_dag(dag_id="ops_graph", start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
                         schedule=timedelta(hours=1), params={"storage_root": str(tmp_path / "root")})


def test_etl_dag_keeps_its_task_graph_and_fetches_with_the_range_operator(etl_dag):
    assert {t.task_id: set(t.upstream_task_ids) for t in etl_dag.tasks} == ETL_GRAPH
    fetch = etl_dag.get_task("fetch")
    assert fetch.operator_class is LedgerRangeFetchOperator or fetch.task_type == "LedgerRangeFetchOperator"
    assert fetch.partial_kwargs["jetstream_conn_id"] == "plgd_jetstream_default"


def test_fetch_ranges_passes_the_plan_to_each_fetch_task(etl_dag, planned):
    fetch_ranges = etl_dag.get_task("fetch_ranges").python_callable
    kwargs = fetch_ranges(planned)
    assert [k["ledger_range"] for k in kwargs] == [0, 1]
    assert all(IntervalPlan.from_xcom(k["plan"]) == IntervalPlan.from_xcom(planned) for k in kwargs)


def test_spark_tasks_read_the_plan_through_the_macro(etl_dag, planned):
    decode = etl_dag.get_task("decode")
    env = etl_dag.get_template_env()
    context = {"ti": FakeTI(planned)}
    args = [env.from_string(a).render(**context) for a in decode.application_args]
    assert args[args.index("--root") + 1] == Layout.of(planned["storage_root"]).root
    assert args[args.index("--interval-id") + 1] == planned["interval_id"]
    assert env.from_string(decode.py_files).render(**context) == planned["py_files"]
    assert not any("xcom_pull" in a for a in decode.application_args)
    assert interval_plan_of(FakeTI(planned)).ledger == planned["ledger"]
    assert Path(planned["py_files"]).name.endswith(".zip")
