"""Scheduled runs, then a backfill of the same intervals, through the real Airflow 3 components.

Simulated plgd hub traffic (two short data intervals: the second's dedupe and snapshot build on the
first's, with publisher duplicates across the boundary) is published into a real nats-server.
A temporary ``AIRFLOW_HOME`` runs the real components as subprocesses (``api-server`` for the
task Execution API, ``scheduler`` with the ``LocalExecutor``, ``dag-processor``, ``triggerer``) on
a fresh PostgreSQL metadata database (a real server that the harness starts: fixture
``airflow_postgres_db``), as in production: the components and the CLI write concurrently, which
SQLite (one writer at a time) does not bear on a loaded machine. The scheduler itself creates the
two catchup runs of ``plgd_events_etl`` (``PLGD_ETL_START_DATE`` / ``PLGD_ETL_END_DATE`` bound
them to exactly two intervals), their Spark tasks on the session's real Spark Connect server
(``PLGD_ETL_SPARK_CONNECT_CONN_ID``; ``local[2]``, its Python workers without the provider); two are
the fewest that hold the chain (a third interval added six Spark runs and proved nothing more).
This test proves the scheduler, the backfill and the tables, not ``spark-submit``: the scheduler's
``spark-submit`` path is ``test_chain_scheduler.py``'s (docs/testing.md, "Which test proves what").
Then every output is read into a canonical form, the storage root is wiped, and the same intervals
are reprocessed, with the scheduler and the other components running, by

    airflow backfill create --dag-id plgd_events_etl --from-date <first interval start>
        --to-date <last interval start> --reprocess-behavior completed --max-active-runs 1

The test asserts that the backfill rebuilt identical tables (staging, events, quarantine,
events_deduped, msgid_index, every snapshot version), that the final snapshot equals the
simulator's ground truth, and that counts reconcile with what was published.
Airflow 3 only (``airflow backfill create``); the Airflow 2.11 command is in docs/operations.md.
"""

from __future__ import annotations

import base64
import json
import shutil
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_plgd.tables.layout import Layout

pytestmark = [pytest.mark.spark, pytest.mark.airflow]

INTERVALS = 2  # the chain: the second interval's dedupe and snapshot build on the first's
INTERVAL_SECONDS = 6.0
#: Output tables compared between the scheduled runs and the backfill (folders under the root).
TABLE_DIRS = ("staging", "events", "quarantine", "events_deduped", "msgid_index")

airflow3 = pytest.importorskip("airflow.sdk", reason="airflow backfill create needs Airflow 3")

from tests.integration.airflow_stack import DAG_ID, REPO, AirflowStack, airflow_env  # noqa: E402

# -- canonical form of the outputs -------------------------------------------------------------------

def _canonical_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return "b64:" + base64.b64encode(value).decode()
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _canonical_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical_value(v) for v in value]
    return value


def _canonical_rows(rows: list[dict]) -> list[str]:
    return sorted(json.dumps(_canonical_value(row), sort_keys=True, default=str) for row in rows)


def read_outputs(root: Path) -> dict[str, list[str]]:
    """Every committed output under ``root`` as ``{table: sorted canonical JSON rows}``.

    Staging is read file by file (hidden ``_``/``.`` paths skipped) with its ``k=v`` folder names
    as columns; the Delta tables with ``deltalake`` (their latest version); the snapshot tables per
    snapshot version, at the Delta versions its record names.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_provider_plgd.tables import snapshot_store
    from plgd_devtools.snapshot_compare import TABLES
    from tests.integration.delta_read import delta_rows, delta_table

    out: dict[str, list[str]] = {}
    for table in TABLE_DIRS:
        if table != "staging":
            out[table] = _canonical_rows(delta_rows(str(root / table)))
            continue
        rows: list[dict] = []
        for path in sorted((root / table).rglob("*.parquet")):
            rel = path.relative_to(root / table)
            if any(part.startswith(("_", ".")) for part in rel.parts):
                continue
            partitions = dict(part.split("=", 1) for part in rel.parts[:-1] if "=" in part)
            rows.extend({**row, **partitions} for row in pq.read_table(path).to_pylist())
        out[table] = _canonical_rows(rows)
    latest = snapshot_store.latest(Layout.of(str(root)))
    version = latest["version"]
    while version is not None:
        record = snapshot_store.snapshot(Layout.of(str(root)), version)
        assert record is not None, f"snapshot version {version} has no record"
        for table in TABLES:
            got = pa.table(delta_table(str(root / "snapshots" / table), record["delta_versions"][table])
                           .to_pyarrow_table())
            out[f"snapshots/v={version}/{table}"] = _canonical_rows(got.drop_columns(["bucket"]).to_pylist())
        version = record.get("parent")
    out["snapshots/_latest"] = [json.dumps(latest["version"])]
    return out


def read_counts(root: Path, interval_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The deterministic counts of the Spark run summaries per interval."""
    from airflow_provider_plgd.tables.run_summary import read_app_summary

    keys = {"decode": ("fetched", "decoded", "quarantined", "per_reason"),
            "dedupe": ("input", "output", "duplicates", "within_batch_duplicates", "cross_batch_duplicates"),
            "rebuild": ("rows", "events", "version")}
    counts: dict[str, dict[str, Any]] = {}
    for interval_id in interval_ids:
        for app, wanted in keys.items():
            summary = read_app_summary(Layout.of(str(root)), app, interval_id)
            assert summary is not None, f"no {app} summary for {interval_id}"
            counts[f"{app}/{interval_id}"] = {k: summary.get(k) for k in wanted}
    return counts


# -- the test ----------------------------------------------------------------------------------------

def test_scheduled_runs_then_backfill_rebuild_identical_tables(jetstream, airflow_postgres_db, spark_connect_server,
                                                               tmp_path: Path) -> None:
    from airflow_provider_plgd import times
    from airflow_provider_plgd.simulator import SimulationConfig, expected_state, generate, publish
    from plgd_devtools.ground_truth import GroundTruth
    from plgd_devtools.snapshot_compare import compare_snapshot

    t_start = time.monotonic()
    home, dags, root = tmp_path / "airflow", tmp_path / "dags", tmp_path / "data"
    for path in (home, dags, root):
        path.mkdir()
    shutil.copy(REPO / "dags" / "plgd_events_etl.py", dags / "plgd_events_etl.py")

    # The intervals start at the next boundary: the metadata database is migrated already (a copy of the
    # session's template), and the scheduler catches up on an interval that ended before it started.
    step = INTERVAL_SECONDS
    start_s = (int(time.time() // step) + 1) * step
    start = datetime.fromtimestamp(start_s, tz=timezone.utc)
    sim = generate(SimulationConfig(
        seed=11, owners=2, devices_per_owner=2, resources_per_device=2, intervals=INTERVALS,
        steps_per_interval=30, interval_seconds=step, start_time_ns=int(start_s * 1e9),
        duplicates=0.05, corrupt=2, unregister=True,
    ))
    env = airflow_env(home=home, dags=dags, root=root, nats_server=jetstream, start=start,
                      database=airflow_postgres_db.airflow_env(), schedule_seconds=INTERVAL_SECONDS,
                      intervals=INTERVALS, spark_connect=spark_connect_server)
    stack = AirflowStack(home=home, env=env, db_url=airflow_postgres_db.url, api_apps="core,execution")

    published: dict[str, Any] = {}

    def _publish() -> None:
        try:
            published["truth"] = GroundTruth.of(
                sim, publish(sim, servers=[jetstream.url], stream="EVENTS", wait_for_intervals=True))
        except BaseException as exc:  # re-raised in the test thread
            published["error"] = exc

    publisher = threading.Thread(target=_publish, name="plgd-publish")
    publisher.start()
    timings: dict[str, float] = {}
    try:
        stack.start()
        publisher.join(timeout=120)
        assert not publisher.is_alive(), "publishing did not finish"
        if "error" in published:
            raise published["error"]
        summary = published["truth"].summary()
        timings["setup"] = time.monotonic() - t_start

        # 1. The scheduler creates and runs the catchup runs, oldest first.
        t0 = time.monotonic()
        runs = stack.wait_for_runs(
            count=INTERVALS, what="scheduled runs",
            done=lambda rs: len(rs) == INTERVALS and all(r[1] == "success" for r in rs),
        )
        timings["scheduled_runs"] = time.monotonic() - t0
        assert [r[2] for r in runs] == ["scheduled"] * INTERVALS, runs
        interval_ids = [
            times.interval_id(start + timedelta(seconds=step * k), start + timedelta(seconds=step * (k + 1)))
            for k in range(INTERVALS)
        ]
        scheduled = read_outputs(root)
        scheduled_counts = read_counts(root, interval_ids)

        # Content: every published message fetched and decoded or quarantined; corrupt ones quarantined.
        decode = [scheduled_counts[f"decode/{i}"] for i in interval_ids]
        assert sum(d["fetched"] for d in decode) == summary["messages"]
        assert all(d["fetched"] == d["decoded"] + d["quarantined"] for d in decode)
        assert sum(d["quarantined"] for d in decode) == summary["corrupt"]["total"] == 2
        assert len(scheduled["staging"]) == summary["messages"]
        assert len(scheduled["quarantine"]) == 2
        assert sum(c["dedupe/" + i]["duplicates"] for c in [scheduled_counts] for i in interval_ids) \
            == summary["duplicates"]["total"] > 0
        # the chain across intervals: the second interval drops duplicates of the first's messages
        assert scheduled_counts[f"dedupe/{interval_ids[-1]}"]["cross_batch_duplicates"] > 0, scheduled_counts
        assert len(scheduled["events_deduped"]) == len(scheduled["events"]) - summary["duplicates"]["total"]
        assert len([k for k in scheduled if k.startswith("snapshots/v=")]) == 4 * INTERVALS
        expected = expected_state(sim, through_interval=INTERVALS - 1)
        assert compare_snapshot(root, expected) == []

        # 2. Wipe the outputs and backfill the same intervals.
        shutil.rmtree(root)
        root.mkdir()
        first, last = start, start + timedelta(seconds=step * (INTERVALS - 1))
        t0 = time.monotonic()
        created = datetime.now(timezone.utc)
        # The CLI clears and creates the runs while the scheduler, triggerer and dag-processor run
        # and write to the same metadata database (PostgreSQL: concurrent writers).
        stack.cli("backfill", "create", "--dag-id", DAG_ID, "--from-date", first.isoformat(),
                  "--to-date", last.isoformat(), "--reprocess-behavior", "completed", "--max-active-runs", "1")
        backfills = stack.query("SELECT id, completed_at FROM backfill WHERE dag_id = %s", DAG_ID)
        assert len(backfills) == 1, backfills

        def rerun(rs: list[tuple]) -> bool:
            # end_date: timestamptz, read as an aware datetime
            return all(r[1] == "success" and r[5] == backfills[0][0] and r[4] is not None and r[4] > created
                       for r in rs)

        runs = stack.wait_for_runs(count=INTERVALS, what="backfill runs", done=rerun)
        timings["backfill_runs"] = time.monotonic() - t0
        assert len(runs) == INTERVALS and [r[2] for r in runs] == ["backfill"] * INTERVALS, runs
        backfilled = read_outputs(root)

        # 3. Identical tables, identical counts, and the final snapshot is the ground truth.
        assert sorted(backfilled) == sorted(scheduled)
        for table in scheduled:
            assert backfilled[table] == scheduled[table], f"{table} differs after the backfill"
        assert read_counts(root, interval_ids) == scheduled_counts
        assert compare_snapshot(root, expected) == []

        # 4. A manual run without a logical date has no data interval: it fails at once in the
        #    first task, without retries, with the documented error, and touches no output.
        t0 = time.monotonic()
        manual_run_id = "manual__plgd_without_logical_date"
        status, body = stack.api("POST", f"/api/v2/dags/{DAG_ID}/dagRuns",
                                 {"dag_run_id": manual_run_id, "logical_date": None})  # the UI's Trigger
        assert status == 200, (status, body)
        assert stack.query("SELECT logical_date FROM dag_run WHERE run_id = %s", manual_run_id) == [(None,)]
        state = stack.wait_for_run_end(manual_run_id, timeout=120)
        timings["manual_run"] = time.monotonic() - t0
        assert state == [("failed",)], state
        tis = dict((t, (st, n)) for t, st, n in stack.query(
            "SELECT task_id, state, try_number FROM task_instance WHERE dag_id = %s AND run_id = %s AND map_index = -1",
            DAG_ID, manual_run_id))
        assert tis["wait_for_interval"] == ("failed", 1), tis
        assert tis["plan"][0] == "upstream_failed", tis
        log = stack.task_log(manual_run_id, "wait_for_interval")
        assert "MissingDataIntervalError" in log and "has no data interval" in log, log[-2000:]
        assert read_outputs(root) == backfilled
    finally:
        stack.stop()
        publisher.join(timeout=60)
        timings["total"] = time.monotonic() - t_start
        print(f"[test_backfill] timings (s): { {k: round(v, 1) for k, v in timings.items()} }")


# -- the factory's helpers, in-process (no Spark, no scheduler) ---------------------------------------

def test_require_data_interval_fails_without_retry_and_names_the_fix() -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_plgd.etl import MissingDataIntervalError, require_data_interval

    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    end = start + timedelta(hours=1)
    assert require_data_interval({"data_interval_start": start, "data_interval_end": end}) == (start, end)
    with pytest.raises(MissingDataIntervalError) as info:
        require_data_interval({"data_interval_start": None, "data_interval_end": None,
                               "dag_run": type("Run", (), {"run_id": "manual__x"})()})
    assert isinstance(info.value, AirflowFailException) and isinstance(info.value, ValueError)
    assert "'manual__x'" in str(info.value) and "airflow backfill create" in str(info.value)
    with pytest.raises(MissingDataIntervalError, match="empty data interval"):
        require_data_interval({"data_interval_start": end, "data_interval_end": end})


def test_spark_conf_merges_overrides_and_removals() -> None:
    from airflow_provider_plgd.etl import DEFAULT_SPARK_CONF, build_etl_dag
    from plgd_devtools.spark import FAST_LOCAL_SPARK_CONF

    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    dag = build_etl_dag(dag_id="plgd_conf_test", start_date=start, spark_conf={
        **FAST_LOCAL_SPARK_CONF, "spark.executor.memory": "4g", "spark.ui.enabled": None})
    for task_id in ("decode", "dedupe", "rebuild"):
        conf = dag.get_task(task_id).conf
        assert conf["spark.driver.extraJavaOptions"] == "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
        assert conf["spark.executor.memory"] == "4g" and "spark.ui.enabled" not in conf
        assert conf["spark.sql.session.timeZone"] == DEFAULT_SPARK_CONF["spark.sql.session.timeZone"]
    assert dag.catchup is True and dag.max_active_runs == 1
    assert [t.task_id for t in dag.tasks if t.depends_on_past] == ["dedupe", "rebuild"]
    with pytest.raises(TypeError, match="spark_conf"):
        build_etl_dag(dag_id="plgd_conf_bad", start_date=start, spark_conf=["spark.ui.enabled=false"])


def test_log_run_summary_logs_counts_duplicates_quarantine_and_lag(caplog) -> None:
    import logging

    from airflow_provider_plgd.etl import log_run_summary
    from airflow_provider_plgd.plgd.event_types import EVENT_TYPES

    result = {
        "interval_id": "20260101T000000Z_20260101T010000Z", "fetched_total": 7, "fetched_bytes": 700,
        "fetched": {"resourcechanged": 5, "devicesregistered": 2},
        "decode": {"decoded": 6, "quarantined": 1, "per_reason": {"bad_snappy": 1}},
        "dedupe": {"duplicates": 2, "within_batch_duplicates": 1, "cross_batch_duplicates": 1, "output": 4},
        "rebuild": {"version": "20260101T010000Z", "rows": {"resources": 3}},
        "reconciled": True, "lag_seconds": 12.5,
    }
    with caplog.at_level(logging.INFO, logger="airflow_provider_plgd.etl"):
        log_run_summary(result)
    text = caplog.text
    assert "fetched event_type=resourcechanged count=5" in text
    assert "fetched event_type=devicesregistered count=2" in text and "resourcecreated" not in text
    assert "quarantined 1 (by reason: {'bad_snappy': 1})" in text
    assert "Duplicates dropped 2 (within the interval 1, seen in earlier intervals 1)" in text
    assert "lag 12.5 s" in text
    # an empty interval whose Spark tasks were skipped says so, instead of "Decoded None ... rows: None"
    caplog.clear()
    empty = {"interval_id": result["interval_id"], "fetched": {}, "fetched_total": 0, "reconciled": True,
             "lag_seconds": 1.0,
             "chain": {"stream_total": 0, "owners_per_range": [], "unrouted": 0, "not_requested_owners_messages": 0,
                       "skipped": {}, "spark_skipped": "the stream holds no message for the interval and there is no snapshot yet",
                       "selection": {"owners": "all 2 discovered", "event_types": f"all {len(EVENT_TYPES)}"}},
             "params": {"storage_root": "/data/plgd", "stream": "EVENTS", "settle_seconds": 60, "spark_conf": {}}}
    with caplog.at_level(logging.INFO, logger="airflow_provider_plgd.etl"):
        log_run_summary(empty)
    assert "Decode, dedupe and rebuild skipped: the stream holds no message" in caplog.text
    assert "None" not in caplog.text and f"Covered owners: all 2 discovered; event types: all {len(EVENT_TYPES)}" in caplog.text
    assert ("Params of this run: storage_root='/data/plgd', stream='EVENTS', settle_seconds=60, spark_conf={}"
            in caplog.text)

