"""The ETL DAG on Spark Connect: ``build_etl_dag(spark_connect_conn_id=...)`` end to end.

Real parts: nats-server with simulated plgd hub traffic (one interval), Airflow ``dag.test()``,
the shared Spark Connect server (``spark_connect_server``: its Python workers have no provider,
the clients ship it), and ``deltalake`` (``plgd_devtools.snapshot_compare``) to read the tables.
The connection is of the Spark provider's type ``spark_connect`` with a token: a marker string
that must reach the application's process through its environment only, never its command line,
the task logs or XCom (docs/spark-connect.md, "The ETL DAG on Spark Connect").
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from airflow_provider_plgd.operators.links import SPARK_APP_XCOM_KEY
from tests.integration.conftest import load_test_dag

pytestmark = [pytest.mark.spark, pytest.mark.airflow]

UTC = timezone.utc
INTERVAL = 6.0
TOKEN = "plgd-connect-token-3f9c1e"  # the marker: must not appear in argv, logs or XCom
CONN_ID = "plgd_spark_connect_test"
APPS = ("decode_events", "dedupe_events", "rebuild_snapshots")
DAG_FILE = """
from datetime import datetime, timedelta, timezone
from airflow_provider_plgd.etl import build_etl_dag

dag = build_etl_dag(dag_id="plgd_test_connect", schedule=timedelta(seconds=INTERVAL),
                    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc), catchup=False,
                    spark_connect_conn_id=CONN_ID, default_args={"retries": 0},
                    params={"settle_seconds": 0, "storage_root": ROOT})
"""


class ChildWatch(threading.Thread):
    """Records the command line and environment of every process below this one running a
    ``spark_apps`` script (the Connect clients the Spark tasks start), polling ``/proc``."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: dict[int, tuple[list[str], dict[str, str]]] = {}
        self.stopped = threading.Event()

    @staticmethod
    def _descends_from_us(pid: int) -> bool:
        me = os.getpid()
        while pid > 1:
            status = Path(f"/proc/{pid}/status").read_text()
            pid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
            if pid == me:
                return True
        return False

    def run(self) -> None:
        while not self.stopped.is_set():
            for pid in (p for p in os.listdir("/proc") if p.isdigit()):
                if int(pid) in self.seen:
                    continue
                try:
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
                    if not any(f"spark_apps/{app}.py" in a for a in argv for app in APPS):
                        continue
                    if not self._descends_from_us(int(pid)):  # other tests may run the same scripts
                        continue
                    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
                except OSError:
                    continue
                env = dict(item.split("=", 1) for item in raw if "=" in item)
                self.seen[int(pid)] = ([a for a in argv if a], env)
            time.sleep(0.1)


def _xcom_values(dag_run) -> list[tuple[str, str, object]]:
    """Every XCom of ``dag_run`` from the metadata DB: ``(task_id, key, value)``."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.scalars(XComModel.get_many(run_id=dag_run.run_id, dag_ids=dag_run.dag_id)).all()
        return [(row.task_id, row.key, XComModel.deserialize_value(row)) for row in rows]


def test_etl_dag_on_spark_connect_matches_ground_truth_and_keeps_the_token_out(
        jetstream, dags_folder, spark_connect_server, tmp_path, capfd, monkeypatch):
    from airflow_provider_plgd.simulator import SimulationConfig, expected_state, generate, publish
    from airflow_provider_plgd.tables.layout import Layout
    from airflow_provider_plgd.tables.run_summary import read_app_summary
    from plgd_devtools.snapshot_compare import compare_snapshot
    from plgd_devtools.spark import spark_lock

    root = tmp_path / "root"
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps({
        "conn_type": "spark_connect", "host": "localhost", "port": spark_connect_server.port,
        "login": "plgd-test", "password": TOKEN}))
    for key in ("SPARK_REMOTE", "SPARK_CONNECT_AUTHENTICATE_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    text = (DAG_FILE.replace("INTERVAL", repr(INTERVAL)).replace("CONN_ID", repr(CONN_ID))
            .replace("ROOT", repr(str(root))))
    dag = load_test_dag(dags_folder, "plgd_test_connect", text, "plgd_test_connect")
    assert {dag.get_task(t).__class__.__name__ for t in ("decode", "dedupe", "rebuild")} == {
        "PlgdSparkConnectOperator"}

    start_s = (int(time.time() // INTERVAL) + 1) * INTERVAL
    config = SimulationConfig(seed=11, owners=2, devices_per_owner=2, resources_per_device=2, intervals=1,
                              steps_per_interval=30, interval_seconds=INTERVAL, start_time_ns=int(start_s * 1e9),
                              duplicates=0.05, corrupt=2, unregister=True)
    sim = generate(config)
    publish(sim, servers=[jetstream.url], stream="EVENTS", wait_for_intervals=True)
    end_s = start_s + INTERVAL
    time.sleep(max(0.0, end_s + 0.3 - time.time()))
    end = datetime.fromtimestamp(end_s, tz=UTC)

    watch = ChildWatch()
    watch.start()
    try:
        with spark_lock():
            dr = dag.test(logical_date=end)
    finally:
        watch.stopped.set()
        watch.join(5)
    logged = "".join(capfd.readouterr())  # the task logs (dag.test writes them to the console)
    states = {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in dr.get_task_instances()
              if ti.map_index in (-1, 0)}
    assert all(states[t] == "success" for t in ("decode", "dedupe", "rebuild", "summary")), (
        states, logged[-6000:])

    # the tables: the snapshot equals the simulator's ground truth, every message accounted for
    assert compare_snapshot(root, expected_state(sim, through_interval=0)) == []
    planned = next(v for _, k, v in _xcom_values(dr) if k == "return_value" and isinstance(v, dict)
                   and "interval_id" in v and "fetch_ranges" in v)
    interval_id = planned["interval_id"]
    assert planned["py_files"] is None  # the clients ship their code: plan built no --py-files zip
    decode = read_app_summary(Layout.of(str(root)), "decode", interval_id)
    assert decode["fetched"] == len(sim.messages) == decode["decoded"] + decode["quarantined"]
    assert decode["quarantined"] == 2

    # the three applications ran as Connect clients: the token in their environment only
    seen = {next(app for app in APPS if any(f"spark_apps/{app}.py" in a for a in argv)): (argv, env)
            for argv, env in watch.seen.values()}
    assert set(seen) == set(APPS), sorted(seen)
    for app, (argv, env) in seen.items():
        assert not any(TOKEN in a for a in argv), (app, argv)
        assert env.get("SPARK_CONNECT_AUTHENTICATE_TOKEN") == TOKEN, app
        assert env["SPARK_REMOTE"] == f"sc://localhost:{spark_connect_server.port}/;user_id=plgd-test", app
    assert "SPARK_REMOTE" not in os.environ and "SPARK_CONNECT_AUTHENTICATE_TOKEN" not in os.environ
    # ... and nowhere in the task logs or XCom
    assert "plgd spark application:" in logged and "Spark Connect application plgd-decode-events" in logged
    assert TOKEN not in logged
    xcoms = _xcom_values(dr)
    apps = {t: v for t, k, v in xcoms if k == SPARK_APP_XCOM_KEY}
    assert set(apps) == {"decode", "dedupe", "rebuild"} and all(v["app_id"] for v in apps.values()), xcoms
    assert TOKEN not in repr(xcoms)


def test_a_run_may_set_no_spark_setting_on_connect(jetstream, dags_folder, tmp_path, capfd, monkeypatch):
    """Who may set what: on Connect the server's settings apply, so the run's ``spark_conf`` may hold
    nothing, not even a setting the spark-submit DAG allows (``spark.executor.memory``); the run
    fails in its first task, before anything is read or written or a client starts."""
    root = tmp_path / "root"
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(
        {"conn_type": "spark_connect", "host": "localhost", "port": 9, "password": TOKEN}))
    text = (DAG_FILE.replace("plgd_test_connect", "plgd_test_connect_conf").replace("INTERVAL", repr(INTERVAL))
            .replace("CONN_ID", repr(CONN_ID)).replace("ROOT", repr(str(root))))
    dag = load_test_dag(dags_folder, "plgd_test_connect_conf", text, "plgd_test_connect_conf")
    end = datetime.fromtimestamp((int(time.time() // INTERVAL) - 1) * INTERVAL, tz=UTC)  # a past interval
    dr = dag.test(logical_date=end, run_conf={"spark_conf": {"spark.executor.memory": "4g"}})
    logged = "".join(capfd.readouterr())
    states = {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in dr.get_task_instances()
              if ti.map_index in (-1, 0)}
    assert states["wait_for_interval"] == "failed" and states["decode"] == "upstream_failed", states
    assert "the Spark setting 'spark.executor.memory' may not be set by a run" in logged, logged[-3000:]
    assert not root.exists() or not any(root.rglob("*"))
    assert TOKEN not in logged
