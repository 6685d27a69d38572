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
from tests.unit.operators.fakes import FakeTI

TOKEN = "unit-token-7d1b"
APP = textwrap.dedent('''
    import json, os, sys
    print(json.dumps({"argv": sys.argv[1:], "remote": os.environ.get("SPARK_REMOTE"),
                      "token": os.environ.get("SPARK_CONNECT_AUTHENTICATE_TOKEN")}))
    print("careless line with the token " + str(os.environ.get("SPARK_CONNECT_AUTHENTICATE_TOKEN")))
    print("x plgd spark application: app_id=app-42 ui_web_url=None")
    sys.exit(int(os.environ.get("APP_EXIT", "0")))
''')


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
    start = line.index('{"argv"')  # Airflow 2's log format puts "{file.py:line}" before the message
    got = json.loads(line[start:line.index("}", start) + 1])
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


def test_a_timeout_kills_the_client_process(connection, tmp_path):
    """Airflow's ``execution_timeout`` raises ``AirflowTaskTimeout`` in the task (from SIGALRM): the
    child is stopped by its process group and the task fails with ``SparkApplicationTimeoutError``."""
    import os
    import signal
    import time

    from airflow_provider_plgd.compat import AirflowTaskTimeout
    from airflow_provider_plgd.exceptions import SparkApplicationTimeoutError

    pid_file = tmp_path / "pid"
    app = tmp_path / "app.py"
    app.write_text(f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\nprint('started', flush=True)\n"
                   "time.sleep(120)\n")
    op = PlgdSparkConnectOperator(task_id="decode", conn_id=connection, application=str(app))

    def timeout(*_: Any) -> None:
        raise AirflowTaskTimeout("Timeout")

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(3)
    t0 = time.monotonic()
    try:
        with pytest.raises(SparkApplicationTimeoutError, match="did not finish within"):
            op.execute({"params": {}, "ti": FakeTI()})
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - t0 < 30
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
