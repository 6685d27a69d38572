"""A real ``airflow dags backfill`` (Airflow 2.11 CLI, SQLite, SequentialExecutor) against nats-server.

Simulated plgd hub traffic is published into two short wall-clock intervals (JetStream stamps
messages with the server clock), then a small DAG with our sensor (poke mode) and fetch operator
(owner x event type batches bounded by the data interval) is backfilled over both intervals.
Each committed staging batch must hold exactly the stream sequences of that owner, event type and
interval (ground truth: the simulator's messages and their publish sequences). Skipped on Airflow 3.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import pytest

from airflow_provider_plgd import times
from airflow_provider_plgd.compat import AIRFLOW_V_3
from airflow_provider_plgd.tables import staging
from airflow_provider_plgd.tables.layout import Layout

pytestmark = [pytest.mark.airflow2, pytest.mark.skipif(AIRFLOW_V_3, reason="Airflow 2.x only (make test-airflow2)")]

DAG_ID = "plgd_airflow2_backfill"
DAG_FILE = '''
import os
from datetime import datetime, timedelta, timezone

from airflow_provider_plgd.compat import DAG
from airflow_provider_plgd.operators.jetstream_to_staging import JetStreamToStagingOperator
from airflow_provider_plgd.sensors.interval_complete import JetStreamIntervalCompleteSensor

with DAG(
    "plgd_airflow2_backfill",
    schedule=timedelta(seconds=int(os.environ["PLGD_A2_INTERVAL"])),
    start_date=datetime.fromtimestamp(int(os.environ["PLGD_A2_START"]), tz=timezone.utc),
    catchup=False,
    max_active_runs=1,
    render_template_as_native_obj=True,
    params={"owners": [], "event_types": []},
    default_args={"retries": 0},
) as dag:
    wait = JetStreamIntervalCompleteSensor(task_id="wait_for_interval", settle_seconds=1, deferrable=False,
                                           poke_interval=1, timeout=60)
    fetch = JetStreamToStagingOperator(task_id="fetch", owner_ids="{{ params.owners }}",
                                       event_types="{{ params.event_types }}",
                                       storage_root=os.environ["PLGD_A2_ROOT"])
    wait >> fetch
'''


def _airflow(args: list[str], env: dict[str, str], timeout: float = 300) -> str:
    proc = subprocess.run([sys.executable, "-m", "airflow", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"airflow {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout


def test_cli_backfill_stages_exact_batches_per_owner_event_type_and_interval(jetstream, tmp_path):
    from airflow_provider_plgd.simulator import SimulationConfig, generate, publish

    interval = 3  # seconds of wall clock per data interval
    start = (int(time.time()) // interval + 2) * interval  # a boundary at least one interval ahead
    sim = generate(SimulationConfig(seed=3, owners=2, devices_per_owner=2, resources_per_device=2, intervals=2,
                                    steps_per_interval=15, interval_seconds=float(interval),
                                    start_time_ns=start * 10**9))
    truth = publish(sim, servers=[jetstream.url], stream="EVENTS", wait_for_intervals=True)
    expected: dict[tuple[int, str, str], list[int]] = defaultdict(list)
    for i, m in enumerate(sim.messages):
        expected[(m.interval, m.owner_id, m.event_type)].append(truth.first_seq + i)
    owners = sorted({m.owner_id for m in sim.messages})
    event_types = sorted({m.event_type for m in sim.messages})
    assert len(owners) == 2 and {k[0] for k in expected} == {0, 1}

    dags, root, home = tmp_path / "dags", tmp_path / "root", tmp_path / "airflow"
    dags.mkdir()
    (dags / f"{DAG_ID}.py").write_text(DAG_FILE)
    env = dict(os.environ)
    env.update({
        "PATH": str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        "PLGD_A2_INTERVAL": str(interval),
        "PLGD_A2_START": str(start),
        "PLGD_A2_ROOT": str(root),
    })
    _airflow(["db", "migrate"], env)
    first, second = (datetime.fromtimestamp(start + k * interval, tz=timezone.utc).isoformat() for k in (0, 1))
    conf = json.dumps({"owners": owners, "event_types": event_types})
    _airflow(["dags", "backfill", "-s", first, "-e", second, "-c", conf, DAG_ID], env)

    # The runs and task instances in the backfill's metadata DB (the CLI's `dags state`/`list-runs`
    # need the DAG in the `dag` table, which only a scheduler/dag processor fills).
    with sqlite3.connect(home / "airflow.db") as db:
        runs = db.execute("SELECT run_type, state, conf IS NOT NULL FROM dag_run WHERE dag_id = ?", (DAG_ID,)).fetchall()
        tis = db.execute("SELECT task_id, state, COUNT(*) FROM task_instance WHERE dag_id = ? GROUP BY task_id, state",
                         (DAG_ID,)).fetchall()
    assert sorted(runs) == [("backfill", "success", 1)] * 2
    assert sorted(tis) == [("fetch", "success", 2), ("wait_for_interval", "success", 2)]

    from deltalake import DeltaTable

    rows = DeltaTable(staging.table_uri(Layout.of(str(root)), "EVENTS")).to_pyarrow_table().to_pylist()  # any Delta reader
    for k in (0, 1):
        interval_id = times.interval_id((start + k * interval) * 10**9, (start + (k + 1) * interval) * 10**9)
        batches: dict[tuple[str, str], list[int]] = {}
        for r in rows:
            if r["interval_id"] == interval_id:
                batches.setdefault((r["owner_id"], r["event_type"]), []).append(r["stream_seq"])
        # every (owner, event type) with messages; the `_unknown` batches (event types we do not know) hold none
        assert sorted(batches) == [(o, e) for o in owners for e in sorted(event_types)
                                   if expected.get((k, o, e))]
        for (owner, event_type), seqs in batches.items():
            assert sorted(seqs) == expected[(k, owner, event_type)], (k, event_type)
    assert len(rows) == len(sim.messages)
