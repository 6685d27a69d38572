"""Operator extra links (``airflow_provider_plgd.operators.links``): the URLs, ``get_link`` over a fake XCom,
the Spark operator's XCom pushes from the ``spark-submit`` output, the ``summary`` task's link,
and their registration (provider info ``extra-links``, ProvidersManager, the serialized DAG)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, ClassVar

import pytest

from airflow_provider_plgd.operators import links
from airflow_provider_plgd.operators.links import (
    SPARK_APP_XCOM_KEY,
    TABLES_XCOM_KEY,
    PlgdSparkApplicationLink,
    PlgdTablesLink,
)
from airflow_provider_plgd.tables.layout import Layout
from tests.unit.operators.fakes import FakeTI

TI_KEY = object()  # what Airflow passes as ti_key; the fake XCom only compares it


class FakeXCom:
    """``XCom.get_value(ti_key=..., key=...)`` over a dict ``{key: value}`` of one task instance."""

    values: ClassVar[dict[str, Any]] = {}

    @classmethod
    def get_value(cls, *, ti_key: Any, key: str) -> Any:
        assert ti_key is TI_KEY
        return cls.values.get(key)


@pytest.fixture
def xcom(monkeypatch):
    monkeypatch.setattr(links, "XCom", FakeXCom)
    monkeypatch.setattr(FakeXCom, "values", {})
    return FakeXCom.values


# --- URLs --------------------------------------------------------------------------------------

def test_strip_userinfo_drops_credentials_only():
    assert links.strip_userinfo("https://user:pw@history.example:18080/x?y=1") == "https://history.example:18080/x?y=1"
    assert links.strip_userinfo("http://driver:4040") == "http://driver:4040"
    # a password with "/" (urlsplit would end the authority there and keep it)
    assert links.strip_userinfo("https://u:p/ss@history.example:18080/x") == "https://history.example:18080/x"


def test_tables_location_of_s3_roots_only():
    assert links.tables_location(Layout.of("s3://bucket/plgd/prod"), environ={}) == {"bucket": "bucket", "prefix": "plgd/prod"}
    assert links.tables_location(Layout.of("s3a://bucket/plgd/"), environ={}) == {"bucket": "bucket", "prefix": "plgd"}
    assert links.tables_location(Layout.of("s3://bucket"), environ={}) == {"bucket": "bucket", "prefix": ""}
    # never a credential: Layout.of refuses a root with one, and a secret with a "/" is dropped
    with pytest.raises(ValueError, match="credentials in the URL"):
        Layout.of("s3://KEY:SECRET@bucket/p")
    assert links.tables_location(Layout.of("s3://KEY:SE/CRET@bucket/p"), environ={}) == {"bucket": "bucket", "prefix": "p"}
    assert links.tables_location(Layout.of("/var/lib/plgd"), environ={}) is None
    assert links.tables_location(Layout.of("file:///var/lib/plgd"), environ={}) is None
    assert links.tables_location(Layout.of("gs://bucket/p"), environ={}) is None
    # an S3-compatible store (MinIO) is not in the AWS console
    assert links.tables_location(Layout.of("s3://bucket/p"), environ={"AWS_ENDPOINT_URL": "http://minio:9000"}) is None
    assert links.tables_location(Layout.of("s3://bucket/p"), environ={"AWS_ENDPOINT_URL_S3": "https://s3.eu-west-1.amazonaws.com"}) == {
        "bucket": "bucket", "prefix": "p"}


def test_tables_url_is_the_s3_console_at_the_prefix():
    assert links.tables_url({"bucket": "b", "prefix": "plgd/prod"}) == (
        "https://s3.console.aws.amazon.com/s3/buckets/b?prefix=plgd/prod/")
    assert links.tables_url({"bucket": "b", "prefix": ""}) == "https://s3.console.aws.amazon.com/s3/buckets/b?prefix="
    assert links.tables_url({"bucket": "b", "prefix": "a b&c"}) == (
        "https://s3.console.aws.amazon.com/s3/buckets/b?prefix=a%20b%26c/")
    assert links.tables_url(None) == ""


def test_parse_spark_application_line():
    line = "2026-11-27 12:00:00,000 INFO plgd.spark: plgd spark application: app_id=app-20261127-0001 ui_web_url=http://w1:4040"
    assert links.parse_spark_application_line(line) == {"app_id": "app-20261127-0001", "ui_web_url": "http://w1:4040"}
    assert links.parse_spark_application_line("plgd spark application: app_id=local-1 ui_web_url=None") == {
        "app_id": "local-1", "ui_web_url": None}
    assert links.parse_spark_application_line("INFO SparkContext: Running Spark version 4.0.0") is None


def test_history_url_template():
    template = "https://spark-history.example:18080/history/{app_id}/"
    assert links.history_url(template, "app-1") == "https://spark-history.example:18080/history/app-1/"
    assert links.history_url(template, None) == ""
    assert links.history_url(None, "app-1") == ""
    assert links.history_url("https://u:p@h/{app_id}", "a") == "https://h/a"
    with pytest.raises(ValueError, match="app_id"):
        links.history_url("https://h/{appId}", "a")


# --- get_link over a fake XCom ----------------------------------------------------------------

def test_spark_link_is_the_driver_ui_while_running_then_the_history_server(xcom):
    link = PlgdSparkApplicationLink()
    assert link.name == "Spark application"
    assert link.get_link(None, ti_key=TI_KEY) == ""  # nothing pushed: no link
    xcom[SPARK_APP_XCOM_KEY] = {"app_id": "app-1", "ui_web_url": "http://w1:4040", "finished": False,
                                "history_url": "https://hs/history/app-1/"}
    assert link.get_link(None, ti_key=TI_KEY) == "http://w1:4040"
    xcom[SPARK_APP_XCOM_KEY] = {**xcom[SPARK_APP_XCOM_KEY], "finished": True}
    assert link.get_link(None, ti_key=TI_KEY) == "https://hs/history/app-1/"
    xcom[SPARK_APP_XCOM_KEY] = {**xcom[SPARK_APP_XCOM_KEY], "history_url": ""}
    assert link.get_link(None, ti_key=TI_KEY) == ""  # ended, no History Server: the driver UI is gone


def test_tables_link(xcom):
    link = PlgdTablesLink()
    assert link.name == "Tables"
    assert link.get_link(None, ti_key=TI_KEY) == ""
    xcom[TABLES_XCOM_KEY] = {"bucket": "b", "prefix": "plgd"}
    assert link.get_link(None, ti_key=TI_KEY) == "https://s3.console.aws.amazon.com/s3/buckets/b?prefix=plgd/"


def test_tables_link_persist_pushes_s3_roots_only(monkeypatch):
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    ti = FakeTI()
    assert PlgdTablesLink.persist({"ti": ti}, Layout.of("/data/plgd")) is None
    assert ti.pushed == {}
    PlgdTablesLink.persist({"ti": ti}, Layout.of("s3://bucket/plgd"))
    assert ti.pushed == {TABLES_XCOM_KEY: {"bucket": "bucket", "prefix": "plgd"}}


# --- the operator ------------------------------------------------------------------------------

def _operator(**kwargs):
    from airflow_provider_plgd.operators.spark_submit import PlgdSparkSubmitOperator

    return PlgdSparkSubmitOperator(task_id="decode", application="app.py", **kwargs)


def test_operator_has_the_link_and_checks_the_template():
    op = _operator(spark_ui_url_template="https://hs/history/{app_id}/")
    assert [type(link) for link in op.operator_extra_links] == [PlgdSparkApplicationLink]
    with pytest.raises(ValueError, match="app_id"):
        _operator(spark_ui_url_template="https://hs/{application}")


def test_operator_pushes_the_application_from_the_submit_output(xcom):
    op = _operator(spark_ui_url_template="https://hs/history/{app_id}/")
    ti = FakeTI()
    op._link_context = {"ti": ti}
    lines = ["INFO SparkContext: Running Spark version 4.0.0\n",
             "INFO plgd.spark: plgd spark application: app_id=app-7 ui_web_url=http://w1:4040\n",
             "INFO plgd.spark: plgd spark application: app_id=app-8 ui_web_url=http://w2:4040\n"]
    assert list(op._watch_submit_log(iter(lines))) == lines  # the hook still sees every line
    running = {"app_id": "app-7", "ui_web_url": "http://w1:4040", "finished": False,
               "history_url": "https://hs/history/app-7/"}
    # while it runs: the application, and the link itself (the Airflow 3 UI reads the link's key)
    link_key = getattr(PlgdSparkApplicationLink(), "xcom_key", None)  # Airflow 3; 2.11 calls get_link
    assert ti.pushed == {SPARK_APP_XCOM_KEY: running, **({link_key: "http://w1:4040"} if link_key else {})}
    op._finish_spark_application()
    assert ti.pushed[SPARK_APP_XCOM_KEY] == {**running, "finished": True}
    xcom.update(ti.pushed)
    assert PlgdSparkApplicationLink().get_link(op, ti_key=TI_KEY) == "https://hs/history/app-7/"


def test_operator_takes_the_hooks_cluster_application_id():
    class Hook:
        _yarn_application_id = "application_1_0001"

    op = _operator()
    ti = FakeTI()
    op._link_context, op._hook = {"ti": ti}, Hook()
    op._finish_spark_application()
    assert ti.pushed == {SPARK_APP_XCOM_KEY: {"app_id": "application_1_0001", "ui_web_url": None,
                                              "finished": True, "history_url": ""}}


def test_operator_hook_output_goes_through_the_watch(monkeypatch):
    op = _operator()
    ti = FakeTI()
    op._link_context = {"ti": ti}
    hook = op._get_hook()
    seen: list[str] = []
    monkeypatch.setattr(type(hook), "_process_spark_submit_log", lambda self, itr: seen.extend(itr))
    hook = op._get_hook()  # wraps the (patched) class method
    hook._process_spark_submit_log(iter(["plgd spark application: app_id=local-1 ui_web_url=http://h:4040"]))
    assert seen and ti.pushed[SPARK_APP_XCOM_KEY]["app_id"] == "local-1"


def test_the_installed_spark_provider_has_the_log_method_that_the_live_link_wraps():
    """The live link wraps a private method of the apache-spark provider's hook: a provider
    release that renames it fails here, not silently in users' runs."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    assert callable(getattr(SparkSubmitHook, "_process_spark_submit_log", None))


def test_a_failed_push_does_not_fail_the_task():
    class BrokenTI:
        def xcom_push(self, key, value):
            raise RuntimeError("no API server")

    op = _operator()
    op._link_context, op._spark_app = {"ti": BrokenTI()}, {"app_id": "a", "ui_web_url": None}
    op._finish_spark_application()  # logged, not raised


# --- registration ------------------------------------------------------------------------------

def test_provider_info_lists_the_extra_links():
    from airflow_provider_plgd.get_provider_info import get_provider_info

    assert get_provider_info()["extra-links"] == ["airflow_provider_plgd.operators.links.PlgdSparkApplicationLink",
                                                  "airflow_provider_plgd.operators.links.PlgdTablesLink"]


def test_providers_manager_accepts_the_extra_links():
    from airflow.providers_manager import ProvidersManager

    names = set(ProvidersManager().extra_links_class_names)
    assert {"airflow_provider_plgd.operators.links.PlgdSparkApplicationLink",
            "airflow_provider_plgd.operators.links.PlgdTablesLink"} <= names


def test_the_etl_dag_serializes_its_links(monkeypatch):
    """The API server knows a task's links from the serialized DAG: name -> XCom key of the link."""
    from airflow_provider_plgd.etl import build_etl_dag

    dag = build_etl_dag(dag_id="plgd_links", start_date=datetime(2026, 1, 1, tzinfo=timezone.utc))
    try:
        from airflow.serialization.serialized_objects import DagSerialization as serializer
    except ImportError:  # pragma: no cover - Airflow 2.11
        from airflow.serialization.serialized_objects import SerializedDAG as serializer  # type: ignore[no-redef]
    serialized = serializer.to_dict(dag)
    tasks = {t["__var"]["task_id"] if "__var" in t else t["task_id"]: t.get("__var", t)
             for t in serialized["dag"]["tasks"]}
    assert tasks["summary"]["_operator_extra_links"] in (
        {"Tables": "_link_PlgdTablesLink"}, [{"airflow_provider_plgd.operators.links.PlgdTablesLink": {}}])
    for app in ("decode", "dedupe", "rebuild"):
        assert tasks[app]["_operator_extra_links"] in (
            {"Spark application": "_link_PlgdSparkApplicationLink"},
            [{"airflow_provider_plgd.operators.links.PlgdSparkApplicationLink": {}}])
    # and back (Airflow 2.11 imports the classes listed in the provider info's extra-links), with the
    # links loaded as the API server's DAG bag loads them (load_op_links=True): the flag is class
    # state, and an earlier dag.test() of this process (its DAG bag: load_op_links=False) leaves it off
    monkeypatch.setattr(serializer, "_load_operator_extra_links", True)
    loaded = serializer.from_dict(serialized)
    assert loaded.get_task("summary").extra_links == ["Tables"]
    assert loaded.get_task("rebuild").extra_links == ["Spark application"]
    assert loaded.get_task("plan").extra_links == []


# --- the Spark side: what the application logs and writes --------------------------------------

class FakeSpark:
    class sparkContext:  # stands in for SparkSession.sparkContext
        applicationId = "app-20261127120000-0003"
        uiWebUrl = "http://worker-1.example:4041"


def test_the_application_log_line_is_what_the_operator_parses(caplog):
    from airflow_provider_plgd.spark import session

    assert session.spark_application_info(FakeSpark()) == {"app_id": "app-20261127120000-0003",
                                                          "ui_web_url": "http://worker-1.example:4041"}
    with caplog.at_level("INFO", logger="plgd.spark"):
        session.log_spark_application(FakeSpark())
    (line,) = [r.getMessage() for r in caplog.records if session.SPARK_APP_LOG_MARKER in r.getMessage()]
    assert links.parse_spark_application_line(f"2026-11-27 12:00:00,000 INFO plgd.spark: {line}") == {
        "app_id": "app-20261127120000-0003", "ui_web_url": "http://worker-1.example:4041"}


def test_the_run_summary_records_the_spark_application(tmp_path, monkeypatch):
    from airflow_provider_plgd.spark import session, summary

    monkeypatch.setattr(session, "spark_application_info", lambda spark=None: {"app_id": "local-1", "ui_web_url": None})
    result = summary.finish_run({"rows": 1}, layout=Layout.of(tmp_path), app="rebuild", interval_id="i1")
    assert result["spark_application"] == {"app_id": "local-1", "ui_web_url": None}
    monkeypatch.setattr(session, "spark_application_info", lambda spark=None: None)  # no SparkSession
    assert "spark_application" not in summary.finish_run({"rows": 1}, layout=Layout.of(tmp_path), app="rebuild",
                                                         interval_id="i2")


def test_the_shipped_dag_takes_the_history_server_from_the_environment(monkeypatch):
    import importlib.util
    from pathlib import Path

    monkeypatch.setenv("PLGD_ETL_SPARK_HISTORY_URL", "https://spark-history.example:18080/history/{app_id}/")
    path = Path(__file__).resolve().parents[3] / "dags" / "plgd_events_etl.py"
    spec = importlib.util.spec_from_file_location("plgd_events_etl_links_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for app in ("decode", "dedupe", "rebuild"):
        assert module.dag.get_task(app).spark_ui_url_template == "https://spark-history.example:18080/history/{app_id}/"
