"""Table maintenance (``airflow_provider_plgd.tables.maintenance``) on real Delta tables, read back with
``deltalake`` and ``polars`` only.

The tables are built without Spark (``plgd_devtools.interval_tables``: simulated plgd traffic
decoded by the decode application's batch decoder, committed with ``delta_tables.commit_interval``
in the Spark applications' layout, two files per partition), with the chain's head recorded as
``rebuild_snapshots`` records it. Checked: compaction rewrites only the intervals older than the
head and keeps every row; an ETL-style commit of the next interval lands while maintenance runs in
a thread; a rerun of a compacted interval replaces exactly that interval, also when the compaction
committed between the rerun's read and its commit.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_provider_plgd.simulator import SimulationConfig, generate
from airflow_provider_plgd.tables import delta_tables, maintenance
from airflow_provider_plgd.tables.layout import Layout
from plgd_devtools import interval_tables

INTERVAL_TABLES = ("events", "events_deduped", "msgid_index")


@pytest.fixture(scope="module")
def sim():
    return generate(SimulationConfig(seed=5, owners=2, devices_per_owner=3, resources_per_device=2, intervals=6,
                                     steps_per_interval=25, interval_seconds=3600.0))


@pytest.fixture(scope="module")
def decoded(sim):
    return interval_tables.decoded_intervals(sim)


def build(root: Path, sim, decoded, intervals: range, head: int) -> list[str]:
    ids = interval_tables.interval_ids(sim)
    for k in intervals:
        interval_tables.commit_interval_tables(str(root), ids[k], *decoded[k])
    interval_tables.commit_snapshot_record(str(root), ids[head], ids[: head + 1])
    return ids


def rows(root: Path, table: str) -> list[str]:
    """Every row of the table (polars), canonical and sorted."""
    frame = pl.read_delta(str(root / table))
    return sorted(json.dumps(r, sort_keys=True, default=repr) for r in frame.to_dicts())


def files_per_interval(root: Path, table: str) -> dict[str, set[str]]:
    """``{interval_id: file paths}`` as deltalake's log names them."""
    actions = pa.table(DeltaTable(str(root / table)).get_add_actions(flatten=True)).to_pydict()
    found: dict[str, set[str]] = {}
    for path, interval in zip(actions["path"], actions["partition.interval_id"], strict=True):
        found.setdefault(interval, set()).add(path)
    return found


def partitions_with_many_files(root: Path, table: str, interval: str) -> int:
    actions = pa.table(DeltaTable(str(root / table)).get_add_actions(flatten=True)).to_pydict()
    keys = [tuple(actions[c][i] for c in sorted(actions) if c.startswith("partition."))
            for i in range(len(actions["path"])) if actions["partition.interval_id"][i] == interval]
    return sum(1 for k in set(keys) if keys.count(k) > 1)


def test_maintenance_compacts_only_passed_intervals_and_keeps_every_row(tmp_path, sim, decoded):
    root = tmp_path / "root"
    ids = build(root, sim, decoded, range(5), head=3)  # head: interval 3; passed: 0, 1, 2
    before = {t: rows(root, t) for t in INTERVAL_TABLES}
    files_before = {t: files_per_interval(root, t) for t in INTERVAL_TABLES}
    assert partitions_with_many_files(root, "events", ids[0]) > 0  # two files per (interval, event type)

    report = maintenance.maintain_tables(str(root), settings=maintenance.MaintenanceSettings(
        vacuum_retention_hours=0, intervals_per_commit=2))

    assert report.head_interval == ids[3]
    by_table = {t.table: t for t in report.tables}
    for table in ("events", "events_deduped"):
        assert by_table[table].compacted == tuple(ids[:3])
        assert rows(root, table) == before[table], table
        after = files_per_interval(root, table)
        for interval in ids[:3]:
            assert partitions_with_many_files(root, table, interval) == 0
            assert len(after[interval]) < len(files_before[table][interval])  # partitions of 2 files: 1
        for interval in ids[3:5]:  # the head and after: the same files
            assert after[interval] == files_before[table][interval]
        assert by_table[table].files_after < by_table[table].files_before
        # vacuum with retention 0 deleted the replaced files; the latest version reads without them
        assert by_table[table].vacuumed == sum(len(files_before[table][i] - after[i]) for i in ids[:3])
        history = DeltaTable(str(root / table)).history()
        assert [h["operation"] for h in history].count("OPTIMIZE") == 2  # 3 intervals, 2 per commit
        assert list((root / table / "_delta_log").glob("*.checkpoint.parquet"))
    # msgid_index: one file per (interval, bucket) partition already: nothing to compact
    assert by_table["msgid_index"].compacted == () and rows(root, "msgid_index") == before["msgid_index"]

    again = maintenance.maintain_tables(str(root))  # nothing left to do: no new commit
    assert all(t.compacted == () for t in again.tables)
    assert DeltaTable(str(root / "events")).history(limit=1)[0]["operation"] != "OPTIMIZE"


def test_an_etl_commit_of_the_next_interval_lands_while_maintenance_runs(tmp_path, sim, decoded):
    root = tmp_path / "root"
    ids = build(root, sim, decoded, range(5), head=4)  # passed: 0..3
    before = {t: rows(root, t) for t in INTERVAL_TABLES}
    settings = maintenance.MaintenanceSettings(intervals_per_commit=1, vacuum_retention_hours=-1)
    result: dict = {}

    def run() -> None:
        try:
            result["report"] = maintenance.maintain_tables(str(root), settings=settings)
        except BaseException as exc:  # re-raised below
            result["error"] = exc

    # The one fake: a log handler holds the maintenance thread right after its first compaction
    # commit of events (its "compacted" line) until the ETL's commit of the next interval is in,
    # so the ETL's commit falls between two compaction commits on any machine's timing.
    committed, paused = threading.Event(), threading.Event()

    class HoldAfterFirstCompaction(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if not paused.is_set() and "/events: compacted" in record.getMessage():
                paused.set()
                committed.wait(120)

    hold, logger = HoldAfterFirstCompaction(), logging.getLogger(maintenance.log.name)
    level = logger.level
    logger.addHandler(hold)
    logger.setLevel(logging.INFO)
    try:
        thread = threading.Thread(target=run)
        thread.start()
        assert paused.wait(120), result
        versions = interval_tables.commit_interval_tables(str(root), ids[5], *decoded[5])
        committed.set()
        thread.join(timeout=120)
    finally:
        committed.set()
        logger.removeHandler(hold)
        logger.setLevel(level)
    assert "error" not in result, result.get("error")
    assert all(t.skipped is None for t in result["report"].tables)

    overlapped = False
    for table in ("events", "events_deduped"):
        history = DeltaTable(str(root / table)).history()
        optimize = [h["version"] for h in history if h["operation"] == "OPTIMIZE"]
        assert len(optimize) == 4, (table, optimize)  # intervals 0..3, one commit each
        overlapped |= min(optimize) < versions[table] < max(optimize)
        # every old row kept, the new interval's rows added, and the new interval not compacted
        new = pl.read_delta(str(root / table)).filter(pl.col("interval_id") == ids[5])
        assert sorted(set(rows(root, table)) - set(before[table])) == sorted(
            json.dumps(r, sort_keys=True, default=repr) for r in new.to_dicts())
        assert len(rows(root, table)) == len(before[table]) + new.height > len(before[table])
        assert partitions_with_many_files(root, table, ids[5]) > 0
    assert overlapped  # the ETL's commit fell between two compaction commits of one table


def test_a_rerun_of_a_compacted_interval_replaces_exactly_that_interval(tmp_path, sim, decoded):
    root = tmp_path / "root"
    ids = build(root, sim, decoded, range(4), head=3)
    maintenance.maintain_tables(str(root))
    assert partitions_with_many_files(root, "events", ids[1]) == 0
    others = pl.read_delta(str(root / "events")).filter(pl.col("interval_id") != ids[1])

    # the rerun of interval 1 holds interval 2's decoded rows relabelled: different content
    events, quarantine = decoded[2]

    relabelled = events.set_column(events.schema.get_field_index("interval_id"), "interval_id",
                                   pa.array([ids[1]] * events.num_rows, pa.string()))
    interval_tables.commit_interval_tables(str(root), ids[1], relabelled, quarantine)

    frame = pl.read_delta(str(root / "events"))
    assert frame.filter(pl.col("interval_id") == ids[1]).height == events.num_rows
    assert sorted(frame.filter(pl.col("interval_id") == ids[1]).get_column("msg_id").to_list()) == \
        sorted(events.column("msg_id").to_pylist())
    assert frame.filter(pl.col("interval_id") != ids[1]).sort("stream_seq", "msg_id").equals(
        others.sort("stream_seq", "msg_id"))


def test_a_rerun_whose_read_predates_a_compaction_still_replaces_exactly_its_interval(tmp_path, sim, decoded,
                                                                                        monkeypatch):
    """delta-rs commits an overwrite whose read of the log predates a compaction of the same
    partitions without a conflict and keeps the compacted file; commit_files removes it."""
    root = tmp_path / "root"
    ids = build(root, sim, decoded, range(3), head=2)
    uri = str(root / "events")
    stale = DeltaTable(uri)  # the rerun read the log here ...
    maintenance.maintain_tables(str(root))  # ... then maintenance compacted interval 0 and 1
    assert "OPTIMIZE" in [h["operation"] for h in DeltaTable(uri).history()]
    real_ensure = delta_tables.ensure_table
    monkeypatch.setattr(delta_tables, "ensure_table",
                        lambda u, *a, **k: stale if u == uri else real_ensure(u, *a, **k))
    events, quarantine = decoded[0]
    interval_tables.commit_interval_tables(str(root), ids[0], events, quarantine)

    frame = pl.read_delta(uri).filter(pl.col("interval_id") == ids[0])
    assert frame.height == events.num_rows  # not twice
    assert sorted(frame.get_column("msg_id").to_list()) == sorted(events.column("msg_id").to_pylist())
    assert DeltaTable(uri).history(limit=1)[0]["operation"] == "WRITE"  # the repair commit


def test_settings_refuse_values_out_of_range():
    with pytest.raises(ValueError, match="vacuum_retention_hours must be >= 0"):
        maintenance.MaintenanceSettings(vacuum_retention_hours=-2)
    with pytest.raises(ValueError, match="max_intervals and intervals_per_commit must be >= 1"):
        maintenance.MaintenanceSettings(max_intervals=0)
    with pytest.raises(ValueError, match="at least 1 MiB"):
        maintenance.MaintenanceSettings(target_file_bytes=1000)


def test_passed_intervals_are_older_than_the_head_and_of_its_kind():
    a, b, c = ("20260101T000000Z_20260101T010000Z", "20260101T010000Z_20260101T020000Z",
               "20260101T020000Z_20260101T030000Z")
    assert maintenance.passed_intervals([c, a, b, "seq-000000000001-000000000009", "junk"], c) == [a, b]
    assert maintenance.passed_intervals([a], None) == []
    assert maintenance.passed_intervals(["seq-000000000001-000000000009", "seq-000000000010-000000000019"],
                                        "seq-000000000010-000000000019") == ["seq-000000000001-000000000009"]


@pytest.mark.airflow
def test_the_maintenance_dag_compacts_through_airflow(tmp_path, sim, decoded, dags_folder, monkeypatch):
    """``dags/plgd_table_maintenance.py`` run by Airflow (``dag.test()``): its XCom reports what it
    compacted and the status view; the tables hold the same rows in fewer files."""
    import shutil

    from tests.integration.conftest import load_dag, xcom_value

    root = tmp_path / "root"
    ids = build(root, sim, decoded, range(4), head=3)
    before = rows(root, "events_deduped")
    monkeypatch.setenv("PLGD_MAINTENANCE_STORAGE_ROOT", str(root))
    monkeypatch.setenv("PLGD_MAINTENANCE_VACUUM_RETENTION_HOURS", "0")
    target = dags_folder / "plgd_table_maintenance.py"
    shutil.copyfile(Path(__file__).resolve().parents[2] / "dags" / "plgd_table_maintenance.py", target)
    dag = load_dag(target, "plgd_table_maintenance")
    run = dag.test()
    assert str(run.state) in ("success", "DagRunState.SUCCESS"), run.state
    report = xcom_value(run, "maintain")
    assert report["head_interval"] == ids[3]
    assert report["tables"]["events_deduped"]["compacted"] == {"intervals": 3, "first": ids[0], "last": ids[2]}
    assert report["tables"]["events_deduped"]["vacuumed"] > 0
    assert report["status"]["chain"]["snapshot"]["interval_id"] == ids[3]
    assert report["status"]["tables"]["events_deduped"]["files"] == report["tables"]["events_deduped"]["files_after"]
    assert rows(root, "events_deduped") == before
    for interval in ids[:3]:
        assert partitions_with_many_files(root, "events_deduped", interval) == 0


def test_the_maintenance_dag_expires_the_staging_of_reconciled_intervals(tmp_path, sim, decoded, dags_folder):
    """``build_maintenance_dag(staging_retention=…)``: the staging of a reconciled interval older
    than the retention is removed (one Delta commit, read back with deltalake); an interval whose
    ledger does not say reconciled keeps its staging."""
    from airflow_provider_plgd.fetch.stager import Stager
    from airflow_provider_plgd.tables import ledger, staging, staging_commits
    from tests.integration.conftest import load_dag, xcom_value

    root = tmp_path / "root"
    ids = build(root, sim, decoded, range(2), head=1)
    owner = "e1407479-3136-56c0-9908-bb02fb0339e2"
    for iid in ids[:2]:
        stager = Stager(stream="EVENTS", spill_dir=None)
        stager.add(owner, "devicesregistered", [(1, "s", 1, None, b"x"), (2, "s", 2, None, b"y")])
        records = stager.write(staging.table_uri(Layout.of(str(root)), "EVENTS"), iid, staging.batch_file_prefix(owner, "w"))
        staging_commits.commit_batches(Layout.of(str(root)), "EVENTS", iid, owner, ["devicesregistered"], records, 1)
    ledger.write_ledger_file(f"{ledger.interval_dir(Layout.of(str(root)), 'EVENTS', ids[0])}/summary.json",
                      {"version": ledger.LEDGER_VERSION, "reconciled": True})
    ledger.write_ledger_file(f"{ledger.interval_dir(Layout.of(str(root)), 'EVENTS', ids[1])}/summary.json",
                      {"version": ledger.LEDGER_VERSION, "reconciled": False})
    target = dags_folder / "plgd_maintenance_staging.py"
    target.write_text("from datetime import datetime, timedelta, timezone\n"
                      "from airflow_provider_plgd.etl import build_maintenance_dag\n"
                      "dag = build_maintenance_dag(dag_id='plgd_maintenance_staging', "
                      "start_date=datetime(2026, 1, 1, tzinfo=timezone.utc), "
                      f"storage_root={str(root)!r}, staging_retention=timedelta(0))\n")
    run = load_dag(target, "plgd_maintenance_staging").test()
    assert str(run.state) in ("success", "DagRunState.SUCCESS"), run.state
    report = xcom_value(run, "maintain")
    assert report["staging"] == {"intervals": [ids[0]], "files": 1, "rows": 2, "vacuumed": 0}
    left = DeltaTable(staging.table_uri(Layout.of(str(root)), "EVENTS")).to_pyarrow_table().to_pylist()
    assert sorted({r["interval_id"] for r in left}) == [ids[1]] and len(left) == 2
