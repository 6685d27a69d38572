"""Partitioned asset events through the real Airflow 3 scheduler (Airflow >= 3.3).

A producer DAG emits the ETL's ``events_deduped`` asset event with the ETL's own helper
(``etl.set_asset_extra(..., partition_key=<interval ID>)``, what the ``dedupe`` task does) for
two intervals; the scheduler (``LocalExecutor``, api-server, dag-processor on PostgreSQL:
``AirflowStack`` of ``test_backfill.py``) queues one run of ``dags/example_partitioned_consumer.py``
(``PartitionedAssetTimetable``) per partition key, and each run reads exactly its interval's rows
of ``events_deduped``. The tables are built without Spark (``plgd_devtools.interval_tables``) and
the expected rows are read with ``polars`` here.
"""

from __future__ import annotations

import json
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path

import polars as pl
import pytest

from tests.integration.airflow_stack import POLL_S, AirflowStack, airflow_env

pytestmark = [pytest.mark.airflow]

REPO = Path(__file__).resolve().parents[2]
CONSUMER = "example_partitioned_consumer"
PRODUCER = "plgd_partition_producer"

PRODUCER_DAG = '''\
from datetime import datetime, timezone

from airflow.sdk import DAG, task

from airflow_provider_plgd.etl import etl_assets, set_asset_extra

asset = etl_assets("plgd_events_etl")["events_deduped"]

with DAG(dag_id="plgd_partition_producer", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
         catchup=False):

    @task(outlets=[asset])
    def emit(**context):
        for interval_id in context["dag_run"].conf["intervals"]:
            set_asset_extra(context, asset, {"interval_id": interval_id}, partition_key=interval_id)

    emit()
'''


def test_each_partition_event_runs_the_consumer_on_exactly_its_interval(nats_server, airflow_postgres_db, tmp_path):
    from airflow_provider_plgd.compat import ASSET_EVENT_PARTITIONS
    from airflow_provider_plgd.simulator import SimulationConfig, generate
    from plgd_devtools import interval_tables

    if not ASSET_EVENT_PARTITIONS:
        pytest.skip("a task's partition keys need Airflow >= 3.3")
    home, dags, root = tmp_path / "airflow", tmp_path / "dags", tmp_path / "data"
    for path in (home, dags, root):
        path.mkdir()
    sim = generate(SimulationConfig(seed=3, owners=2, devices_per_owner=2, resources_per_device=2, intervals=3,
                                    steps_per_interval=15, interval_seconds=3600.0))
    ids = interval_tables.build_chain(str(root), sim)
    shutil.copy(REPO / "dags" / f"{CONSUMER}.py", dags / f"{CONSUMER}.py")
    (dags / f"{PRODUCER}.py").write_text(PRODUCER_DAG)
    env = airflow_env(home=home, dags=dags, root=root, nats_server=nats_server, start=datetime.now(timezone.utc),
                      database=airflow_postgres_db.airflow_env())
    stack = AirflowStack(home=home, env=env, db_url=airflow_postgres_db.url, api_apps="core,execution")
    emitted = [ids[2], ids[0]]
    try:
        stack.start(("api-server", "scheduler", "dag-processor"))
        deadline = time.monotonic() + 180
        while len(stack.query("SELECT dag_id FROM dag WHERE dag_id IN (%s, %s)", CONSUMER, PRODUCER)) < 2:
            stack.check_alive()
            assert time.monotonic() < deadline, stack.log_tail("dag-processor")
            time.sleep(POLL_S)
        status, body = stack.api("POST", f"/api/v2/dags/{PRODUCER}/dagRuns",
                                 {"logical_date": None, "conf": {"intervals": emitted}})
        assert status == 200, (status, body)

        runs: list[tuple] = []
        while time.monotonic() < deadline + 120:
            stack.check_alive()
            runs = stack.query("SELECT partition_key, state FROM dag_run WHERE dag_id = %s ORDER BY partition_key",
                               CONSUMER)
            if len(runs) == 2 and all(r[1] in ("success", "failed") for r in runs):
                break
            time.sleep(POLL_S)
        assert runs == sorted((k, "success") for k in emitted), f"{runs}\n{stack.log_tail('scheduler')}"
        events = stack.query("SELECT partition_key FROM asset_event ORDER BY partition_key")
        assert [e[0] for e in events] == sorted(emitted)
        values = dict(stack.query(
            "SELECT r.partition_key, x.value FROM xcom x JOIN dag_run r ON r.id = x.dag_run_id "
            "WHERE x.dag_id = %s AND x.task_id = 'interval_rows' AND x.key = 'return_value'", CONSUMER))
    finally:
        stack.stop()

    table = pl.read_delta(str(root / "events_deduped"))
    counts = [table.filter(pl.col("interval_id") == i).height for i in ids]
    assert len(set(counts)) == 3  # intervals differ, so reading the wrong one would show
    for interval_id in emitted:
        got = values[interval_id]
        got = json.loads(got) if isinstance(got, str) else got
        mine = table.filter(pl.col("interval_id") == interval_id)
        per_type = mine.group_by("event_type").len()
        assert got == {"interval_id": interval_id, "rows": mine.height,
                       "event_types": dict(zip(per_type.get_column("event_type"), per_type.get_column("len"),
                                               strict=True)),
                       "owners": mine.get_column("owner_id").n_unique(),
                       "devices": mine.get_column("device_id").drop_nulls().n_unique(),
                       "table": str(root / "events_deduped")}
