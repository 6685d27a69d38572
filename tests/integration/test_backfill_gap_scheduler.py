"""A backfill of one past interval with "Unpause on trigger", through the real Airflow 3 scheduler.

What the issue reported: the DAG is paused (Airflow pauses new DAGs), the user backfills one past
interval from the UI, whose Backfill form has "Unpause on trigger" ticked: it sends
``PATCH /api/v2/dags/{dag_id}`` ``{"is_paused": false}`` and ``POST /api/v2/backfills``. Here the
same two requests go to a real api-server (public REST API and execution API), with a real
scheduler (``LocalExecutor``), dag-processor and triggerer on PostgreSQL (``AirflowStack``); the
backfill that fills the hole is the ``airflow backfill create`` command the error names.

The DAG is ``build_etl_dag`` with a 30 s data-interval schedule: four intervals I0..I3, all in the
past, bounded by ``end_date``; the stream holds no message, so ``spark_needed`` skips the Spark
tasks and no ``spark-submit`` runs. The user backfills I2. What Airflow 3 does (docs/operations.md,
"Holes in the interval chain"):

1. On unpause the scheduler creates the scheduled run of I0, the ``next_dagrun`` the dag-processor
   stored when it parsed the paused DAG, and sets ``next_dagrun`` to I1.
2. The backfill creates the run of I2.
3. While I0 runs (``max_active_runs=1``: no other scheduled run is created), the dag-processor
   parses the file again and sets ``next_dagrun`` after the latest run *of type scheduled or
   backfill*: I3. ``catchup=True`` does not go back; I1 never gets a run.
4. The ETL reports the hole: the ``plan`` of I3 fails (retried once here, then failed) with
   ``IntervalGapError`` naming I1's start and the backfill that fills the hole; the ``plan`` of I2
   fails the same way when it runs after I0's (else I2 runs, and I3's ``plan`` finds the hole
   between I0 and I2: ``ledger_guards.check_no_hole_before``). Nothing is written for a refused interval.
5. The backfill the message names (I1 to I3) fills the hole: every interval then has a successful run.

The test unpauses first and waits for I0's run before it creates the backfill (the UI sends both
requests at once; the scheduler creates I0 within a second, the dag-processor parses only every
30 s), then asks the dag-processor for that parse (the UI's "Reparse Dag") instead of letting it
parse every few seconds; I0's run (six task starts) outlasts that parse. About 2 minutes on a busy
2-core machine. Airflow 3 only.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from airflow_provider_plgd.tables.layout import Layout
from tests.integration.airflow_stack import DAG_ID, AirflowStack, airflow_env

pytestmark = [pytest.mark.airflow]

airflow3 = pytest.importorskip("airflow.sdk", reason="airflow backfill create needs Airflow 3")

STEP = 30  # seconds per interval

DAG_FILE = """\
from datetime import datetime, timedelta

from airflow_provider_plgd.etl import build_etl_dag

dag = build_etl_dag(
    dag_id={dag_id!r},
    schedule=timedelta(seconds={step}),
    start_date=datetime.fromisoformat({start!r}),
    end_date=datetime.fromisoformat({end!r}),
    params={{"settle_seconds": 1}},
    default_args={{"retries": 1, "retry_delay": timedelta(seconds=2)}},
)
"""


def test_backfill_of_one_interval_with_unpause_skips_the_one_before_and_plan_reports_the_hole(
        jetstream, airflow_postgres_db, tmp_path: Path) -> None:
    from airflow_provider_plgd import times

    t_start = time.monotonic()
    home, dags, root = tmp_path / "airflow", tmp_path / "dags", tmp_path / "data"
    for path in (home, dags, root):
        path.mkdir()
    now_s = int(time.time()) // STEP * STEP
    starts = [datetime.fromtimestamp(now_s - STEP * (5 - k), tz=timezone.utc) for k in range(4)]  # I0..I3
    iso = [s.isoformat() for s in starts]
    rfc = [times.ns_to_rfc3339(times.to_ns(s)) for s in starts]
    ids = [times.interval_id(s, s + timedelta(seconds=STEP)) for s in starts]
    (dags / "plgd_events_etl.py").write_text(DAG_FILE.format(dag_id=DAG_ID, step=STEP, start=iso[0], end=iso[3]))
    env = airflow_env(home=home, dags=dags, root=root, nats_server=jetstream, start=starts[0],
                       database=airflow_postgres_db.airflow_env())
    env.update({
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",  # Airflow's default
    })
    stack = AirflowStack(home=home, env=env, db_url=airflow_postgres_db.url, api_apps="core,execution")

    def dag_row() -> tuple | None:
        rows = stack.query("SELECT is_paused, next_dagrun FROM dag WHERE dag_id = %s", DAG_ID)
        return rows[0] if rows else None

    def runs_by_start() -> dict[datetime, tuple]:
        return {r[3]: r for r in stack.runs()}  # logical date = interval start

    def plan_ti(run_id: str) -> tuple:
        return stack.query("SELECT state, try_number FROM task_instance WHERE dag_id = %s AND run_id = %s "
                           "AND task_id = 'plan'", DAG_ID, run_id)[0]

    def planned(k: int) -> bool:
        return (Path(Layout.of(str(root)).ledger_interval_dir("EVENTS", ids[k])) / "stream.json").exists()

    try:
        stack.start()
        # the paused DAG as parsed: no run yet, so its next run is the first interval
        row = stack.poll("the DAG parsed", dag_row)
        assert row == (True, starts[0]), row

        # "Unpause on trigger": the scheduler at once creates the run of next_dagrun (I0) ...
        status, body = stack.api("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": False})
        assert (status, body["is_paused"]) == (200, False), (status, body)
        stack.poll("the scheduled run of I0", lambda: starts[0] in runs_by_start())
        # ... and the backfill of I2 creates its run
        status, body = stack.api("POST", "/api/v2/backfills", {
            "dag_id": DAG_ID, "from_date": iso[2], "to_date": iso[2], "reprocess_behavior": "failed",
            "max_active_runs": 1})
        assert status == 200, (status, body)
        # The dag-processor's next parse (asked for now, not waited for) moves next_dagrun past the
        # latest scheduled-or-backfill run (I2), while I0 still runs: I1 is skipped.
        stack.reparse()
        stack.poll("next_dagrun after the backfilled interval", lambda: dag_row()[1] == starts[3])
        assert starts[1] not in runs_by_start(), stack.runs()

        def all_ended() -> dict[datetime, tuple] | None:
            runs = runs_by_start()
            if set(runs) >= {starts[0], starts[2], starts[3]} and all(r[1] in ("success", "failed")
                                                                     for r in runs.values()):
                return runs
            return None

        runs = stack.poll("the runs of I0, I2 and I3 ended", all_ended)
        # No run of I1 was ever created: the hole is Airflow's (catchup does not go back)
        assert sorted(runs) == [starts[0], starts[2], starts[3]], stack.runs()
        assert [runs[s][2] for s in sorted(runs)] == ["scheduled", "backfill", "scheduled"], stack.runs()
        assert runs[starts[0]][1] == "success" and planned(0), stack.runs()

        # The hole is reported: I3's plan failed on both tries, naming I1 and the backfill that fills it.
        i3 = runs[starts[3]][0]
        assert runs[starts[3]][1] == "failed" and plan_ti(i3) == ("failed", 2), (stack.runs(), plan_ti(i3))
        log = stack.task_log(i3, "plan")
        assert "IntervalGapError" in log, log[-3000:]
        assert f"interval {ids[3]}:" in log and f"no interval of [{rfc[1]}, " in log, log[-3000:]
        assert f"airflow backfill create --dag-id {DAG_ID}" in log and f"--from-date {rfc[1]}" in log, log[-3000:]
        assert not planned(1) and not planned(3)  # nothing written for the refused interval
        states = dict(stack.query("SELECT task_id, state FROM task_instance WHERE dag_id = %s AND run_id = %s",
                                  DAG_ID, i3))
        assert states["wait_for_interval"] == "success" and states["summary"] == "upstream_failed", states

        # I2: refused the same way when its plan ran after I0's; else it ran (it was the first on the root)
        i2 = runs[starts[2]][0]
        print(f"[test_backfill_gap_scheduler] runs: {[(r[0], r[1], r[2]) for r in stack.runs()]}")
        if runs[starts[2]][1] == "failed":
            assert plan_ti(i2) == ("failed", 2) and not planned(2)
            log2 = stack.task_log(i2, "plan")
            assert "IntervalGapError" in log2 and f"no interval of [{rfc[1]}, {rfc[2]}) was ever planned" in log2, \
                log2[-3000:]
            assert f"no interval of [{rfc[1]}, {rfc[3]}) was ever planned" in log, log[-3000:]
        else:
            assert runs[starts[2]][1] == "success" and planned(2), stack.runs()
            # the latest planned interval (I2) ends where I3 starts: the hole between I0 and I2 is found
            assert f"no interval of [{rfc[1]}, {rfc[2]}) was ever planned" in log, log[-3000:]
            assert "--reprocess-behavior completed" in log, log[-3000:]

        # 5. The backfill the message names fills the hole: every interval then has a successful run.
        assert f"--to-date {rfc[3]}" in log, log[-3000:]
        behavior = re.search(r"--reprocess-behavior (completed|failed)", log)
        assert behavior, log[-3000:]
        stack.poll("the first backfill completed", lambda: stack.query(
            "SELECT count(*) FROM backfill WHERE dag_id = %s AND completed_at IS NULL", DAG_ID) == [(0,)])
        stack.cli("backfill", "create", "--dag-id", DAG_ID, "--from-date", rfc[1], "--to-date", rfc[3],
                  "--reprocess-behavior", behavior.group(1), "--max-active-runs", "1")

        def all_succeeded() -> dict[datetime, tuple] | None:
            runs = runs_by_start()
            return runs if len(runs) == 4 and all(r[1] == "success" for r in runs.values()) else None

        runs = stack.poll("every interval's run succeeded", all_succeeded)
        assert sorted(runs) == starts and all(planned(k) for k in range(4)), stack.runs()
        assert runs[starts[1]][2] == "backfill", stack.runs()
    finally:
        stack.stop()
        print(f"[test_backfill_gap_scheduler] {time.monotonic() - t_start:.1f} s")
