"""The Spark tasks' settings and time limit (``PlgdSparkSubmitOperator``), without Spark.

The one fake is ``spark-submit``: a script that records its arguments (and, for the timeout
case, sleeps until it is killed). The operator, ``SparkSubmitHook`` and Airflow's task timeout
(``airflow.sdk.execution_time.timeout``) are the real ones. Cases of docs/operations.md, "Run on
a Spark cluster": the run's ``spark_conf`` param over the DAG's settings, the driver's Python
when only ``spark.pyspark.python`` is set, and a task that exceeds its ``execution_timeout``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from airflow_provider_plgd.exceptions import SparkConfError
from airflow_provider_plgd.operators.spark_submit import (
    PYSPARK_DRIVER_PYTHON,
    PYSPARK_PYTHON,
    with_driver_python,
)
from airflow_provider_plgd.spark_conf import merge_spark_conf

FAKE_SPARK_SUBMIT = """#!{python}
import json, os, sys, time
with open(os.environ["PLGD_TEST_SUBMITTED"], "w") as fh:
    json.dump({{"argv": sys.argv[1:], "pid": os.getpid()}}, fh)
time.sleep(float(os.environ.get("PLGD_TEST_SUBMIT_SLEEP", "0")))
"""


def test_merge_spark_conf_overrides_removes_and_names_bad_values():
    base = {"a": "1", "b": "2"}
    assert merge_spark_conf(base, {"a": "9", "b": None, "c": True, "d": 4}, source="x") == {"a": "9", "c": "true",
                                                                                           "d": "4"}
    assert merge_spark_conf(base, '{"a": "7"}', source="x") == {"a": "7", "b": "2"}
    assert merge_spark_conf(base, None, source="x") == base == merge_spark_conf(base, {}, source="x")
    for bad, named in (("not json", "'not json'"), ([["a", "1"]], "[['a', '1']]"), ({"a": {"nested": 1}}, "{'nested': 1}"),
                       ({"": "1"}, "entry ''")):
        with pytest.raises(ValueError, match="DAG param 'spark_conf'") as err:
            merge_spark_conf(base, bad, source="DAG param 'spark_conf'")
        assert named in str(err.value)
        assert isinstance(err.value, SparkConfError) and isinstance(err.value, TypeError)  # one error type


def test_driver_python_defaults_to_this_interpreter_only_when_executors_python_is_set_alone():
    assert with_driver_python({}) == {}
    assert with_driver_python({PYSPARK_PYTHON: "/opt/x/bin/python"}) == {
        PYSPARK_PYTHON: "/opt/x/bin/python", PYSPARK_DRIVER_PYTHON: sys.executable}
    both = {PYSPARK_PYTHON: "/opt/x/bin/python", PYSPARK_DRIVER_PYTHON: "/usr/bin/python3"}
    assert with_driver_python(both) == both


@pytest.fixture()
def spark_task(tmp_path, monkeypatch):
    """A ``decode`` task of the ETL DAG with the fake ``spark-submit``; returns ``(task, run)``,
    where ``run(params)`` executes it with those DAG params and returns what spark-submit got."""
    from airflow_provider_plgd import spark_deps
    from airflow_provider_plgd.etl import DEFAULT_PARAMS, build_etl_dag

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "spark-submit"
    fake.write_text(FAKE_SPARK_SUBMIT.format(python=sys.executable))
    fake.chmod(0o755)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(spark_deps.PY_FILES_DIR_ENV, raising=False)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PLGD_TEST_SUBMITTED", str(tmp_path / "submitted.json"))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "spark://127.0.0.1:7077"}))
    dag = build_etl_dag(dag_id="conf_test", start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
                        spark_conf={PYSPARK_PYTHON: "/opt/plgd-executor/bin/python", "spark.executor.cores": "1"},
                        spark_execution_timeout=timedelta(seconds=1))
    task = dag.get_task("decode")
    task.py_files = spark_deps.build_private_py_files_zip(storage_root=str(tmp_path / "root"))

    def run(params: dict) -> dict:
        task.execute({"params": {**DEFAULT_PARAMS, **params}})
        return json.loads((tmp_path / "submitted.json").read_text())

    return task, run


def confs(argv: list[str]) -> dict[str, str]:
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--conf")


def test_dag_settings_the_runs_spark_conf_param_and_the_drivers_python(spark_task):
    """The DAG's settings, then the run's ``spark_conf`` param over them (null removes one); the
    driver gets this interpreter because only ``spark.pyspark.python`` is set."""
    from airflow_provider_plgd.etl import DEFAULT_SPARK_CONF, SPARK_CONF_PARAM_DESCRIPTION

    task, run = spark_task
    assert task.execution_timeout == timedelta(seconds=1)
    assert task.dag.params.get_param("spark_conf").description == SPARK_CONF_PARAM_DESCRIPTION
    got = confs(run({"spark_conf": {"spark.executor.memory": "3g", "spark.executor.cores": None}})["argv"])
    assert got == {**DEFAULT_SPARK_CONF, PYSPARK_PYTHON: "/opt/plgd-executor/bin/python",
                   PYSPARK_DRIVER_PYTHON: sys.executable, "spark.executor.memory": "3g"}
    got = confs(run({"spark_conf": '{"spark.sql.shuffle.partitions": 8}'})["argv"])  # a JSON string too
    assert got["spark.sql.shuffle.partitions"] == "8" and got["spark.executor.cores"] == "1"
    with pytest.raises(ValueError, match=r"run param 'spark_conf'.*nested"):
        run({"spark_conf": {"spark.executor.memory": {"nested": 1}}})


#: Settings a user who may only trigger the DAG must not reach: each runs code or reads files in the
#: Airflow worker (client mode: the driver runs there, with the worker's connections) or the executors.
DANGEROUS = [
    ("spark.driver.extraJavaOptions", "-XX:MaxMetaspaceSize=12m -XX:OnOutOfMemoryError='env > /tmp/x'"),
    ("spark.executor.extraJavaOptions", "-XX:OnOutOfMemoryError=sh"),
    ("spark.driver.extraClassPath", "/tmp/evil.jar"),  # class path
    ("spark.jars", "file:///tmp/evil.jar"),
    (PYSPARK_PYTHON, "/tmp/evil/python"),  # Python interpreter
    (PYSPARK_DRIVER_PYTHON, "/tmp/evil/python"),
    ("spark.executorEnv.LD_PRELOAD", "/tmp/evil.so"),  # executor environment
    ("spark.submit.pyFiles", "/tmp/evil.zip"),
    ("spark.python.daemon.module", "evil"),
]


@pytest.mark.parametrize("key,value", DANGEROUS, ids=[k for k, _ in DANGEROUS])
def test_a_run_cannot_set_settings_outside_the_dags_allowlist(spark_task, tmp_path, key, value):
    """Refused in ``execute`` before spark-submit starts (the fake never ran), without retries,
    naming the setting and how the DAG author allows it."""
    from airflow_provider_plgd.run_params import UntrustedRunParamError

    try:  # Airflow 3.x
        from airflow.sdk.exceptions import AirflowFailException
    except ImportError:  # Airflow 2.11
        from airflow.exceptions import AirflowFailException

    _, run = spark_task
    with pytest.raises(UntrustedRunParamError) as err:
        run({"spark_conf": {"spark.executor.memory": "2g", key: value}})
    assert isinstance(err.value, AirflowFailException)
    assert repr(key) in str(err.value) and "run_spark_conf_keys" in str(err.value)
    assert not (tmp_path / "submitted.json").exists()
    with pytest.raises(UntrustedRunParamError):  # removing a DAG author's setting is a change too
        run({"spark_conf": {key: None}})


@pytest.mark.parametrize("key,value", [("spark.executor.memory", "4g -XX:OnOutOfMemoryError=sh"),
                                       ("spark.executor.cores", "0"), ("spark.sql.shuffle.partitions", "8;id")])
def test_allowed_settings_need_values_of_their_form(spark_task, tmp_path, key, value):
    from airflow_provider_plgd.run_params import UntrustedRunParamError

    _, run = spark_task
    with pytest.raises(UntrustedRunParamError, match=f"{key}={value!r} does not match"):
        run({"spark_conf": {key: value}})
    assert not (tmp_path / "submitted.json").exists()


def test_the_dag_author_extends_the_allowlist(spark_task, tmp_path):
    """``build_etl_dag(run_spark_conf_keys=...)``: the author's names (our patterns for ours)."""
    from airflow_provider_plgd.etl import build_etl_dag
    from airflow_provider_plgd.run_params import UntrustedRunParamError

    task, _ = spark_task
    dag = build_etl_dag(dag_id="conf_test_author", start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
                        run_spark_conf_keys=["spark.executor.memory", PYSPARK_DRIVER_PYTHON])
    decode = dag.get_task("decode")
    decode.py_files = task.py_files
    decode.execute({"params": {"spark_conf": {PYSPARK_DRIVER_PYTHON: "/usr/bin/python3",
                                              "spark.executor.memory": "1g"}}})
    got = confs(json.loads((tmp_path / "submitted.json").read_text())["argv"])
    assert got[PYSPARK_DRIVER_PYTHON] == "/usr/bin/python3" and got["spark.executor.memory"] == "1g"
    with pytest.raises(UntrustedRunParamError, match=re.escape("spark.executor.cores")):  # not in this DAG's list
        decode.execute({"params": {"spark_conf": {"spark.executor.cores": "2"}}})


def test_execution_timeout_fails_clearly_and_kills_spark_submit(spark_task, monkeypatch):
    """A spark-submit that never ends (an application without executors) is stopped by the task's
    ``execution_timeout`` the way Airflow runs it: the timeout raises in ``execute``, the task
    raises ``SparkApplicationTimeoutError`` (an ``AirflowTaskTimeout``) naming the likely causes, and
    ``on_kill`` kills spark-submit."""
    try:  # Airflow 3.x
        from airflow.sdk.exceptions import AirflowTaskTimeout
        from airflow.sdk.execution_time.timeout import timeout
    except ImportError:  # Airflow 2.11 (make test-airflow2)
        from airflow.exceptions import AirflowTaskTimeout
        from airflow.utils.timeout import timeout

    from airflow_provider_plgd.operators.spark_submit import SparkApplicationTimeoutError

    task, run = spark_task
    monkeypatch.setenv("PLGD_TEST_SUBMIT_SLEEP", "60")
    t0 = time.monotonic()
    with pytest.raises(SparkApplicationTimeoutError) as err:
        try:  # what Airflow's task runner does around execute (task_runner._execute_task)
            with timeout(task.execution_timeout.total_seconds()):
                run({})
        except AirflowTaskTimeout:
            task.on_kill()
            raise
    assert time.monotonic() - t0 < 15
    assert isinstance(err.value, AirflowTaskTimeout)
    message = str(err.value)
    assert "plgd-decode-events" in message and "0:00:01" in message and "spark.driver.host" in message
    assert "spark.executor.memory" in message
    pid = json.loads(Path(os.environ["PLGD_TEST_SUBMITTED"]).read_text())["pid"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{pid}/stat") as fh:
            if fh.read().split()[2] == "Z":  # killed, not yet reaped
                break
        time.sleep(0.1)
    else:
        pytest.fail(f"spark-submit (pid {pid}) still runs after the timeout")
