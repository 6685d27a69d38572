"""The UI's Trigger button, through a real Airflow 3 api-server: ``POST /api/v2/dags/{dag_id}/dagRuns``
with ``{"logical_date": now}`` (what the Trigger dialog sends by default).

Real components on PostgreSQL (``AirflowStack`` of ``test_backfill.py``; the api-server also serves
the public REST API here): the scheduler first runs the DAG's one scheduled interval, an hour
before now that the stream holds no message for, so its Spark tasks are skipped and its summary
reconciles 0 = 0. Then the POST creates a manual run whose data interval ends at now, off the
schedule: it fails in ``wait_for_interval`` at once, without retries, with
``OffScheduleIntervalError`` naming the schedule's interval and the backfill to use, and writes
nothing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.integration.test_backfill import DAG_ID, REPO, AirflowStack, _airflow_env

pytestmark = [pytest.mark.airflow]


def _request(method: str, url: str, body: dict | None = None, token: str | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def test_trigger_dialog_default_logical_date_is_refused_through_the_rest_api(jetstream, airflow_postgres_db,
                                                                              tmp_path: Path) -> None:
    t0 = time.monotonic()
    home, dags, root = tmp_path / "airflow", tmp_path / "dags", tmp_path / "data"
    for path in (home, dags, root):
        path.mkdir()
    shutil.copy(REPO / "dags" / "plgd_events_etl.py", dags / "plgd_events_etl.py")
    hour = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    env = _airflow_env(home=home, dags=dags, root=root, nats_server=jetstream, start=hour - timedelta(hours=1),
                       database=airflow_postgres_db.airflow_env())
    env.update({"PLGD_ETL_SCHEDULE_SECONDS": "3600", "PLGD_ETL_END_DATE": ""})
    stack = AirflowStack(home=home, env=env, db_url=airflow_postgres_db.url)
    url = env["AIRFLOW__API__BASE_URL"]
    try:
        stack.cli("db", "migrate", timeout=300)
        stack.start(("scheduler", "dag-processor"))
        log = (home / "api-server.log").open("ab")
        stack.procs["api-server"] = subprocess.Popen(
            [sys.executable, "-m", "airflow", "api-server", "--host", "127.0.0.1", "--port", env["_PLGD_API_PORT"],
             "--workers", "1", "--apps", "core,execution"],
            env=env, cwd=home, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

        # 1. The scheduled interval [hour - 1 h, hour): empty, so no Spark; the chain reconciles 0 = 0.
        runs = stack.wait_for_runs(count=1, what="the scheduled empty interval", timeout=300,
                                   done=lambda rs: rs[0][1] == "success")
        tis = dict(stack.query("SELECT task_id, state FROM task_instance WHERE dag_id = %s AND run_id = %s "
                               "AND map_index IN (-1, 0)", DAG_ID, runs[0][0]))
        # the stream holds no message at all: no owner, no fetch task (an empty mapping is skipped)
        assert {t: tis[t] for t in ("fetch", "spark_needed", "decode", "dedupe", "rebuild", "summary")} == {
            "fetch": "skipped", "spark_needed": "skipped", "decode": "skipped", "dedupe": "skipped",
            "rebuild": "skipped", "summary": "success"}, tis
        from airflow_provider_plgd import ledger, staging

        interval = staging.interval_id(hour - timedelta(hours=1), hour)
        summary = ledger.read_json(f"{ledger.interval_dir(str(root), 'EVENTS', interval)}/summary.json")
        assert summary["reconciled"] is True and summary["chain"]["stream_total"] == 0, summary
        assert summary["chain"]["spark_skipped"], summary
        before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))

        # 2. What the Trigger dialog sends: the logical date "now".
        deadline = time.monotonic() + 120
        token = None
        while token is None and time.monotonic() < deadline:
            try:
                status, body = _request("GET", f"{url}/auth/token")
                token = body.get("access_token") if status in (200, 201) else None
            except OSError:
                pass
            if token is None:
                time.sleep(1)
        assert token, f"no token from {url}/auth/token:\n{stack.log_tail('api-server')}"
        now = datetime.now(timezone.utc)
        status, body = _request("POST", f"{url}/api/v2/dags/{DAG_ID}/dagRuns", {"logical_date": now.isoformat()},
                                token)
        assert status == 200, (status, body)
        run_id = body["dag_run_id"]
        assert body["data_interval_end"].startswith(now.strftime("%Y-%m-%dT%H:%M:%S")), body
        state: list[tuple] = []
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            state = stack.query("SELECT state FROM dag_run WHERE dag_id = %s AND run_id = %s", DAG_ID, run_id)
            if state and state[0][0] in ("failed", "success"):
                break
            time.sleep(1)
        assert state == [("failed",)], (state, stack.log_tail("scheduler"))
        tis = dict((t, (s, n)) for t, s, n in stack.query(
            "SELECT task_id, state, try_number FROM task_instance WHERE dag_id = %s AND run_id = %s "
            "AND map_index = -1", DAG_ID, run_id))
        assert tis["wait_for_interval"] == ("failed", 1) and tis["plan"][0] == "upstream_failed", tis
        text = stack.task_log(run_id, "wait_for_interval")
        grid_end = now.replace(minute=0, second=0, microsecond=0)
        assert "OffScheduleIntervalError" in text and "not an interval of the schedule" in text, text[-2000:]
        assert f"--from-date {(grid_end - timedelta(hours=1)).isoformat()}" in text, text[-2000:]
        assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before  # nothing written
    finally:
        stack.stop()
        print(f"[test_manual_trigger_api] {time.monotonic() - t0:.1f} s")
