"""The chain through the real Airflow 3 scheduler: a Spark outage, an empty interval, and an interval
older than the chain's head (cases 5 and 6 of "No silent loss, round 4").

Real components (``AirflowStack`` of ``test_backfill.py``: api-server, scheduler with the
``LocalExecutor``, dag-processor, triggerer, on PostgreSQL), a real nats-server with simulated plgd
traffic, real ``spark-submit`` (``local[2]``). Three catchup intervals: A (devices registered),
B (no message), C (other devices registered). This is the test of the scheduler's ``spark-submit``
path (``test_backfill.py`` runs its Spark tasks on Spark Connect; docs/testing.md, "Which test
proves what"): keep it on ``spark-submit``.

1. **Spark outage during A.** ``spark-submit`` fails while a flag file exists (a wrapper first on
   the PATH of the Airflow components): A's ``decode`` fails; then the outage ends. B holds no message, so its Spark tasks
   skip (Airflow 3.3's scheduler skips ``dedupe`` by its trigger rule although
   ``wait_for_past_depends_before_skipping`` is set), and ``depends_on_past`` lets C's run. The
   chain, read from the data, stops it: B's ``summary`` does not reconcile (a hole before it), C's
   ``dedupe`` refuses (``ChainHoleError`` naming A) and commits nothing. (Before: both succeeded,
   and C's snapshot lacked A's devices.)
2. **Fixed.** The failed tasks of A and B are cleared, then C's (the documented
   recovery): the latest snapshot holds A's and C's devices, and every message ID is kept once.
3. **An interval older than the head.** The DAG author moves ``start_date`` one interval back,
   has the file parsed again and backfills the interval (``POST /api/v2/backfills``, the UI's
   Backfill form): its ``plan`` refuses it (``OutOfOrderIntervalError``), and nothing is written.

About 3-4 minutes on a busy 2-core machine. Airflow 3 only.
"""

from __future__ import annotations

import shutil
import stat
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from airflow_provider_plgd.tables.layout import Layout
from tests.integration.airflow_stack import DAG_ID, REPO, AirflowStack, airflow_env

pytestmark = [pytest.mark.spark, pytest.mark.airflow]

airflow3 = pytest.importorskip("airflow.sdk", reason="airflow backfill create needs Airflow 3")

STEP = 6.0

DAG_FILE = """\
from datetime import datetime, timedelta

from airflow_provider_plgd.etl import build_etl_dag
from plgd_devtools.spark import FAST_LOCAL_SPARK_CONF

dag = build_etl_dag(
    dag_id={dag_id!r},
    schedule=timedelta(seconds={step}),
    start_date=datetime.fromisoformat({start!r}),
    end_date=datetime.fromisoformat({end!r}),
    params={{"settle_seconds": 1}},
    spark_conf=FAST_LOCAL_SPARK_CONF,
    default_args={{"retries": 0}},
)
"""

OUTAGE_WRAPPER = """#!/bin/sh
# a Spark outage for the test: spark-submit fails while the flag file exists
if [ -e {flag} ]; then echo "spark-submit: the Spark cluster is unreachable (test outage)" >&2; exit 1; fi
exec {real} "$@"
"""


def _devices(root: Path) -> set[str]:
    import polars as pl

    return set(pl.read_delta(str(root / "snapshots" / "owner_devices"))["device_id"].to_list())


def test_a_failed_interval_stops_the_chain_across_an_empty_one_and_an_older_interval_is_refused(
        jetstream, airflow_postgres_db, tmp_path: Path) -> None:
    from airflow_provider_plgd import times
    from airflow_provider_plgd.simulator import SimulationConfig, expected_state, generate, publish
    from plgd_devtools.spark import spark_lock

    t_start = time.monotonic()
    home, dags, root, bin_dir = (tmp_path / n for n in ("airflow", "dags", "data", "bin"))
    for path in (home, dags, root, bin_dir):
        path.mkdir()
    # the next boundary: the publisher publishes A and C inside their windows
    start_s = (int(time.time() // STEP) + 1) * STEP
    starts = [datetime.fromtimestamp(start_s + STEP * k, tz=timezone.utc) for k in range(3)]  # A, B, C
    ids = [times.interval_id(s, s + timedelta(seconds=STEP)) for s in starts]
    iso = [s.isoformat() for s in starts]
    (dags / f"{DAG_ID}.py").write_text(DAG_FILE.format(dag_id=DAG_ID, step=STEP, start=iso[0], end=iso[2]))
    flag = tmp_path / "spark-outage"
    flag.touch()
    wrapper = bin_dir / "spark-submit"
    real = shutil.which("spark-submit", path=str(Path(REPO, ".venv", "bin"))) or shutil.which("spark-submit")
    wrapper.write_text(OUTAGE_WRAPPER.format(flag=flag, real=real))
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    env = airflow_env(home=home, dags=dags, root=root, nats_server=jetstream, start=starts[0],
                       database=airflow_postgres_db.airflow_env())
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    stack = AirflowStack(home=home, env=env, db_url=airflow_postgres_db.url, api_apps="core,execution")

    # A registers 2 devices, C 2 others (another seed); B holds no message
    sims = [generate(SimulationConfig(seed=seed, owners=1, devices_per_owner=2, resources_per_device=1, intervals=1,
                                      steps_per_interval=2, interval_seconds=STEP,
                                      start_time_ns=int((start_s + STEP * k) * 1e9)))
            for seed, k in ((41, 0), (42, 2))]
    errors: list[BaseException] = []

    def _publish() -> None:
        try:
            for sim in sims:
                publish(sim, servers=[jetstream.url], stream="EVENTS", wait_for_intervals=True)
        except BaseException as exc:  # re-raised in the test thread
            errors.append(exc)

    publisher = threading.Thread(target=_publish, name="plgd-publish")
    publisher.start()

    def runs() -> dict[datetime, tuple]:
        return {r[3]: r for r in stack.runs()}

    def states(start: datetime) -> dict[str, str | None]:
        run_id = runs()[start][0]
        return dict(stack.query("SELECT task_id, state FROM task_instance WHERE dag_id = %s AND run_id = %s "
                                "AND map_index = -1", DAG_ID, run_id))

    timings: dict[str, float] = {}
    try:
        with spark_lock():
            timings["lock"] = time.monotonic() - t_start
            # The components start while A and C are published (their start overlaps the windows): the
            # scheduler runs A when it ended, B and C after it (one active run); each run's sensor waits
            # until its interval is complete. No real spark-submit runs before the outage ends (below).
            stack.start()
            publisher.join(timeout=120)
            assert not publisher.is_alive() and not errors, errors
            timings["published"] = time.monotonic() - t_start
            # 1. A's decode fails (the outage)
            stack.poll("A's run failed", lambda: starts[0] in runs() and runs()[starts[0]][1] == "failed")
            got = states(starts[0])
            assert got["decode"] == "failed" and got["dedupe"] == "upstream_failed", got
            assert "test outage" in stack.task_log(runs()[starts[0]][0], "decode")
            flag.unlink()  # the outage ends
            # 2. B holds no message: its Spark tasks skip (Airflow 3.3's scheduler skips dedupe by its trigger
            #    rule without waiting for the past), and its summary does not reconcile: the chain has a hole
            stack.poll("B's and C's runs ended", lambda: len(runs()) == 3
                  and all(r[1] in ("failed", "success") for r in runs().values()))
            timings["outage"] = time.monotonic() - t_start
            got = states(starts[1])
            assert got["decode"] == "skipped" and got["summary"] == "failed", got
            assert runs()[starts[1]][1] == "failed", stack.runs()
            assert f"the chain has a hole before this interval: interval {ids[0]}" in \
                stack.task_log(runs()[starts[1]][0], "summary")
            # 3. C: decode committed, dedupe refused with the hole (before: it ran, and the snapshot lacked A)
            got = states(starts[2])
            assert got["decode"] == "success" and got["dedupe"] == "failed" and got["rebuild"] == "upstream_failed", got
            log = stack.task_log(runs()[starts[2]][0], "dedupe")
            assert "ChainHoleError" in log and f"{ids[0]} (" in log, log[-3000:]
            assert not (root / "events_deduped").exists() and not (root / "snapshots").exists()

            # 4. A and B are cleared, then C (docs/operations.md, "Holes in the interval chain")
            stack.cli("tasks", "clear", DAG_ID, "--start-date", iso[0], "--end-date", iso[1], "--only-failed", "--yes")
            stack.poll("A and B succeeded", lambda: runs()[starts[0]][1] == "success"
                  and runs()[starts[1]][1] == "success")
            stack.cli("tasks", "clear", DAG_ID, "--start-date", iso[2], "--end-date", iso[2], "--only-failed", "--yes")
            stack.poll("C succeeded", lambda: runs()[starts[2]][1] == "success")
            timings["recovered"] = time.monotonic() - t_start
        expected = set()
        for sim in sims:
            expected |= {r["device_id"] for r in expected_state(sim, through_interval=0)["owner_devices"]}
        assert len(expected) == 4 and _devices(root) == expected
        import polars as pl

        kept = pl.read_delta(str(root / "events_deduped"))
        assert kept.height == kept["msg_id"].n_unique() == sum(len(s.messages) for s in sims)

        # 3. An interval older than the chain's head: the DAG's start moves one interval back
        before = starts[0] - timedelta(seconds=STEP)
        (dags / f"{DAG_ID}.py").write_text(DAG_FILE.format(dag_id=DAG_ID, step=STEP, start=before.isoformat(),
                                                           end=iso[2]))
        stack.reparse()  # the dag-processor parses the new start date now (the UI's "Reparse Dag")
        # the backfill, as the UI's Backfill form sends it (POST /api/v2/backfills)
        status, body = stack.api("POST", "/api/v2/backfills", {
            "dag_id": DAG_ID, "from_date": before.isoformat(), "to_date": before.isoformat(),
            "reprocess_behavior": "failed", "max_active_runs": 1})
        assert status == 200, (status, body)
        stack.poll("the backfill's run of the interval before A", lambda: before in runs())
        stack.poll("its run ended", lambda: runs()[before][1] in ("failed", "success"))
        got = states(before)
        assert runs()[before][1] == "failed" and got["plan"] == "failed", (stack.runs(), got)
        log = stack.task_log(runs()[before][0], "plan")
        assert "OutOfOrderIntervalError" in log and f"older than the chain's head {ids[2]}" in log, log[-3000:]
        old_id = times.interval_id(before, starts[0])
        assert not Path(Layout.of(str(root)).ledger_interval_dir("EVENTS", old_id)).exists()
        assert _devices(root) == expected
    finally:
        stack.stop()
        publisher.join(timeout=60)
        timings["total"] = time.monotonic() - t_start
        print(f"[test_chain_scheduler] seconds since the start: { {k: round(v, 1) for k, v in timings.items()} }")
