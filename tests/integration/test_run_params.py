"""Run params are untrusted input: a user who may only trigger the ETL DAG reaches no command line,
Spark setting, path or subject beyond what the DAG author allows (docs/operations.md, "Who may set
what"; docs/reliability.md, "Untrusted run params").

Real nats-server, real Airflow ``dag.test()`` with run conf, real ``spark-submit`` in local mode
(which is what the injection below would reach without the check: on the code before it, the
driver JVM ran the shell command of ``-XX:OnOutOfMemoryError`` and wrote the marker file).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from airflow_provider_plgd.plgd.subjects import registrations_subject
from tests.integration.conftest import load_test_dag, publish_messages, use_local_spark

pytestmark = pytest.mark.airflow

UTC = timezone.utc
OWNER = "6ba7b811-9dad-11d1-80b4-00c04fd430c8"
INTERVAL = 4
DAG_FILE = """
from datetime import datetime, timedelta, timezone
from airflow_provider_plgd.etl import build_etl_dag
from plgd_devtools.spark import FAST_LOCAL_SPARK_CONF

dag = build_etl_dag(dag_id="DAG_ID", schedule=timedelta(seconds=INTERVAL),
                    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc), catchup=False,
                    spark_conf=FAST_LOCAL_SPARK_CONF, default_args={"retries": 0},
                    params={"settle_seconds": 0, "storage_root": ROOT})
"""


def one_message_interval(url: str) -> datetime:
    """Publish one plgd message into a fresh interval of the test schedule; return its (passed) end."""
    start_s = (int(time.time() // INTERVAL) + 1) * INTERVAL
    time.sleep(max(0.0, start_s + 0.05 - time.time()))
    publish_messages(url, [(registrations_subject(OWNER, "devicesregistered"), b"x", None)])
    end_s = start_s + INTERVAL
    time.sleep(max(0.0, end_s + 0.3 - time.time()))
    return datetime.fromtimestamp(end_s, tz=UTC)


def states(dag_run) -> dict[str, str]:
    return {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in dag_run.get_task_instances()
            if ti.map_index in (-1, 0)}


def etl_dag(dags_folder, name: str, root) -> object:
    text = DAG_FILE.replace("DAG_ID", name).replace("INTERVAL", str(INTERVAL)).replace("ROOT", repr(str(root)))
    return load_test_dag(dags_folder, name, text, name)


@pytest.mark.spark
def test_spark_conf_injection_through_run_conf_runs_nothing(jetstream, dags_folder, tmp_path, monkeypatch):
    """The attack: a Spark setting that makes the driver JVM (inside the Airflow worker) run a shell
    command. The run fails in its first task (``wait_for_interval``'s check of the params), before
    anything is read, written or started."""
    from plgd_devtools.spark import spark_lock

    use_local_spark(monkeypatch)
    root, marker = tmp_path / "root", tmp_path / "leaked-env"
    dag = etl_dag(dags_folder, "plgd_test_params_inject", root)
    end = one_message_interval(jetstream.url)
    attack = {"spark.driver.extraJavaOptions": f"-XX:MaxMetaspaceSize=12m -XX:OnOutOfMemoryError='env > {marker}'"}
    with spark_lock():
        dr = dag.test(logical_date=end, run_conf={"spark_conf": attack})
    got = states(dr)
    assert got["wait_for_interval"] == "failed" and got["plan"] == "upstream_failed", got
    assert all(got[t] == "upstream_failed" for t in ("fetch_ranges", "decode", "dedupe", "rebuild")), got
    assert not marker.exists(), "the driver JVM ran the injected command"
    assert not root.exists() or not any(root.rglob("*")), sorted(root.rglob("*"))  # nothing read or written


def test_storage_root_outside_the_allowed_roots_is_refused(jetstream, dags_folder, tmp_path):
    """A triggering user points the run at another folder: refused in the first task; nothing written anywhere."""
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    dag = etl_dag(dags_folder, "plgd_test_params_root", root)
    end = one_message_interval(jetstream.url)
    dr = dag.test(logical_date=end, run_conf={"storage_root": str(elsewhere)})
    got = states(dr)
    assert got["wait_for_interval"] == "failed" and got["plan"] == "upstream_failed", got
    assert not elsewhere.exists()
    assert not root.exists() or not any(root.rglob("*")), sorted(root.rglob("*"))


@pytest.mark.parametrize("conf", [
    {"stream": "KV_settings"}, {"max_content_bytes": 1}, {"owners": [OWNER]}, {"storage_root": "ROOT/%2e%2e/prod"},
], ids=["stream", "max_content_bytes", "owners", "root-escaped"])  # the others: unit tests (test_etl_plan_summary)
def test_a_run_that_changes_the_pipeline_identity_is_refused_before_any_io(jetstream, dags_folder, tmp_path,
                                                                           capfd, conf):
    """Cases 1-4 of "No silent loss, round 4": a triggering user's conf that would change what the
    tables mean (another stream, decode limit, lookback, a selection on the DAG's own root, a root
    that delta-rs resolves elsewhere) fails the first task, without retries, before the server or
    the storage root is touched."""
    root = tmp_path / "root"
    conf = {k: (v.replace("ROOT", str(root)) if isinstance(v, str) else v) for k, v in conf.items()}
    dag = etl_dag(dags_folder, "plgd_test_params_identity", root)
    end = datetime.fromtimestamp((int(time.time() // INTERVAL) - 1) * INTERVAL, tz=UTC)  # a past interval
    dr = dag.test(logical_date=end, run_conf=conf)
    logged = "".join(capfd.readouterr())  # the task's log (dag.test writes it to the console)
    got = states(dr)
    assert got["wait_for_interval"] == "failed" and got["plan"] == "upstream_failed", got
    assert not root.exists() and not (tmp_path / "prod").exists()
    name = next(iter(conf))
    expected = (f"\n  {name}: the DAG author's" if name != "storage_root"
                else "run param 'storage_root': the storage root")
    assert expected in logged, logged[-3000:]


def test_run_param_checks_name_the_value_and_the_way_to_allow_it(jetstream, tmp_path, monkeypatch):
    """The checks of ``plan`` (``run_params.check_run_params``), one param at a time."""
    import json

    from airflow_provider_plgd.etl import DEFAULT_PARAMS
    from airflow_provider_plgd.run_params import (
        DEFAULT_RUN_SPARK_CONF_KEYS,
        UntrustedRunParamError,
        check_run_params,
    )

    allowed = [str(tmp_path / "root"), "s3://bucket/plgd"]

    def check(**params):
        return check_run_params({**DEFAULT_PARAMS, **params}, spark_conf_policy=DEFAULT_RUN_SPARK_CONF_KEYS,
                                storage_roots=allowed, jetstream_conn_id="plgd_jetstream_default")

    ok = check(spark_conf={"spark.executor.memory": "4g"}, storage_root="s3a://bucket/plgd/",
               max_fetch_tasks="8", settle_seconds="1.5")
    assert ok.storage_root == "s3://bucket/plgd" and ok.spark_conf == {"spark.executor.memory": "4g"}
    assert ok.numbers["max_fetch_tasks"] == 8 and ok.numbers["settle_seconds"] == 1.5
    assert check().storage_root == ""  # empty: the connection's root, else $AIRFLOW_HOME/plgd
    for params, message in [
        ({"storage_root": "/etc"}, "run param 'storage_root' '/etc' is not a root this DAG allows"),
        ({"storage_root": "s3://KEY:SECRET@bucket"}, "credentials in the URL"),
        ({"stream": "EVENTS.>"}, "run param 'stream' 'EVENTS.>' is not a valid JetStream stream name"),
        ({"stream": "../x"}, "not a valid JetStream stream name"),
        ({"max_fetch_tasks": 10**9}, "'max_fetch_tasks' must be a number from 1 to 1024"),
        ({"lookback_intervals": "24 --conf x"}, "'lookback_intervals' must be a number"),
        ({"max_content_bytes": -1}, "'max_content_bytes' must be a number from 1"),
        ({"settle_seconds": "nan"}, "'settle_seconds' must be a number"),
        ({"accept_fewer_messages": "maybe"}, "accept_fewer_messages' must be true or false"),
        ({"spark_conf": {"spark.jars": "x.jar"}}, "the Spark setting 'spark.jars' may not be set by a run"),
    ]:
        with pytest.raises(UntrustedRunParamError) as err:
            check(**params)
        assert message in str(err.value), (params, str(err.value))
        assert "SECRET" not in str(err.value)
    # the connection's storage_root extra is allowed too
    conn = {"conn_type": "plgd_jetstream", "host": jetstream.host, "port": jetstream.port,
            "extra": {"stream": "EVENTS", "storage_root": str(tmp_path / "conn-root")}}
    monkeypatch.setenv("AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT", json.dumps(conn))
    assert check(storage_root=str(tmp_path / "conn-root") + "/").storage_root == str(tmp_path / "conn-root")
