"""``PlgdSparkConnectOperator`` with a real child process: a stand-in application script (the one
fake) that prints what it got, and a real ``spark_connect`` connection from the environment.
The ETL DAG on a real Connect server: ``tests/integration/test_etl_dag_connect.py``."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest

from airflow_provider_plgd.operators.links import SPARK_APP_XCOM_KEY
from airflow_provider_plgd.operators.spark_connect import (
    PlgdSparkConnectOperator,
    SparkConnectApplicationError,
    connect_url_and_token,
)

TOKEN = "unit-token-7d1b"
APP = textwrap.dedent('''
    import json, os, sys
    print(json.dumps({"argv": sys.argv[1:], "remote": os.environ.get("SPARK_REMOTE"),
                      "token": os.environ.get("SPARK_CONNECT_AUTHENTICATE_TOKEN")}))
    print("careless line with the token " + str(os.environ.get("SPARK_CONNECT_AUTHENTICATE_TOKEN")))
    print("x plgd spark application: app_id=app-42 ui_web_url=None")
    sys.exit(int(os.environ.get("APP_EXIT", "0")))
''')


class FakeTI:
    def __init__(self) -> None:
        self.pushed: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


@pytest.fixture
def connection(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_PLGD_CONNECT_UNIT", json.dumps({
        "conn_type": "spark_connect", "host": "spark.example", "port": 15003, "login": "alice",
        "password": TOKEN, "extra": {"use_ssl": True}}))
    monkeypatch.setenv("SPARK_REMOTE", "sc://elsewhere:1")  # the worker's own: must not reach the child
    return "plgd_connect_unit"


def test_url_without_token_and_the_token_apart(connection):
    remote, token = connect_url_and_token(connection)
    assert remote == "sc://spark.example:15003/;user_id=alice;use_ssl=True"
    assert token == TOKEN


def test_the_child_gets_the_server_and_token_in_its_environment_only(connection, tmp_path, capfd, monkeypatch):
    app = tmp_path / "app.py"
    app.write_text(APP)
    op = PlgdSparkConnectOperator(task_id="decode", conn_id=connection, application=str(app),
                                  application_args=["--root", "/r", "--interval-id", "i"], name="plgd-decode")
    ti = FakeTI()
    op.execute({"params": {"spark_conf": {}}, "ti": ti})
    logged = "".join(capfd.readouterr())  # the task log (Airflow writes it to the console here)
    line = next(x for x in logged.splitlines() if '{"argv"' in x)
    got = json.loads(line[line.index('{"argv"'):line.index("}") + 1])
    # the child got the token in its environment (it printed it: the log line shows *** instead)
    assert got == {"argv": ["--root", "/r", "--interval-id", "i"],
                   "remote": "sc://spark.example:15003/;user_id=alice;use_ssl=True", "token": "***"}
    assert TOKEN not in logged and "careless line with the token ***" in logged
    assert ti.pushed[SPARK_APP_XCOM_KEY]["app_id"] == "app-42"
    assert TOKEN not in repr(ti.pushed)

    monkeypatch.setenv("APP_EXIT", "3")
    with pytest.raises(SparkConnectApplicationError, match="exited with status 3") as err:
        op.execute({"params": {}, "ti": FakeTI()})
    assert "careless line with the token ***" in str(err.value) and TOKEN not in str(err.value)


def test_a_run_may_set_no_spark_setting_on_connect(connection, tmp_path):
    from airflow_provider_plgd.run_params import UntrustedRunParamError

    marker = tmp_path / "ran"
    app = tmp_path / "app.py"
    app.write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    op = PlgdSparkConnectOperator(task_id="decode", conn_id=connection, application=str(app),
                                  run_conf_param="spark_conf", run_conf_keys={"spark.executor.memory": None})
    with pytest.raises(UntrustedRunParamError, match="server's settings apply"):
        op.execute({"params": {"spark_conf": {"spark.executor.memory": "4g"}}, "ti": FakeTI()})
    assert not marker.exists()


def test_build_etl_dag_refuses_spark_settings_with_connect():
    from datetime import datetime, timezone

    from airflow_provider_plgd.etl import build_etl_dag

    with pytest.raises(ValueError, match="apply to spark-submit only"):
        build_etl_dag(dag_id="plgd_unit_connect", start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
                      spark_connect_conn_id="x", spark_conf={"spark.executor.memory": "4g"})
    dag = build_etl_dag(dag_id="plgd_unit_connect", start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
                        spark_connect_conn_id="x")
    assert type(dag.get_task("rebuild")).__name__ == "PlgdSparkConnectOperator"
