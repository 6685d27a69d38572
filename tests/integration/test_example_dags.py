"""The example DAGs in ``dags/`` run through Airflow itself (``dag.test()``) against a real nats-server.

* ``example_plgd_snapshot_consumer``: scheduled on the ETL DAG's ``snapshots`` asset (the same
  object the ETL's ``rebuild`` task has as outlet); a run reads a committed snapshot and its XCom
  equals the device counts computed from the simulator's ground truth. The snapshot is written
  here in the documented layout (``docs/snapshots.md``) from ``expected_state``, so no Spark runs.
* ``example_plgd_fetch_by_sequence``: explicit stream-sequence bounds from the run conf stage
  exactly the messages in that range (compared with the publish acks of simulated hub traffic).
* ``example_plgd_fetch_durable``: a durable consumer stages each message once across runs.
"""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_provider_plgd import times
from airflow_provider_plgd.simulator import SimulationConfig, expected_state, generate
from airflow_provider_plgd.tables.layout import Layout
from tests.integration.conftest import load_dag, publish_messages, xcom_value
from tests.integration.delta_read import staging_rows

pytestmark = pytest.mark.airflow

REPO = Path(__file__).resolve().parents[2]
START_NS = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z


def _install_dag(dags_folder: Path, name: str, dag_id: str):
    """Copy ``dags/<name>`` into the session's dags folder (the DAG bundle) and load ``dag_id`` from it."""
    target = dags_folder / name
    shutil.copyfile(REPO / "dags" / name, target)
    return load_dag(target, dag_id)


def _succeeded(dag_run) -> bool:
    return str(dag_run.state) in ("success", "DagRunState.SUCCESS")


def _simulation(seed: int, owners: int = 2, devices: int = 3, intervals: int = 1):
    return generate(SimulationConfig(seed=seed, owners=owners, devices_per_owner=devices, resources_per_device=2,
                                     intervals=intervals, steps_per_interval=12, interval_seconds=20.0,
                                     start_time_ns=START_NS))


def write_snapshot(root: Path, tables: dict[str, list[dict]], snapshot_time_ns: int, interval_id: str,
                   next_expiry_ns: dict[str, int] | None = None) -> str:
    """Commit ``tables`` as one snapshot version (bucket 0 of each table) as ``rebuild_snapshots``
    does: one Delta commit per table, then ``_device_state``'s commit with the snapshot record."""
    from airflow_provider_plgd.spark import snapshot_buckets
    from airflow_provider_plgd.spark.parquet_io import write_parquet_file
    from airflow_provider_plgd.tables import delta_tables, file_records
    from airflow_provider_plgd.tables import snapshot_store as ss
    from airflow_provider_plgd.tables.storage import to_fs

    version = ss.version_id(snapshot_time_ns)
    run_id = snapshot_buckets.new_run_id()
    record = {"snapshot": version, "snapshot_time_ns": snapshot_time_ns,
              "snapshot_time": times.ns_to_rfc3339(snapshot_time_ns), "parent": None, "run_id": run_id,
              "interval_id": interval_id}
    versions = {}
    for table in ss.ALL_TABLES:
        rows = tables.get(table, [])
        records = []
        uri = ss.snapshot_table_uri(Layout.of(str(root)), table)
        if rows:
            fs, base = to_fs(uri)
            rel = f"bucket=0/part-{run_id}.parquet"
            size, meta = write_parquet_file(fs, f"{base}/{rel}", pa.Table.from_pylist(rows, schema=ss.table_schema(table)))
            records.append(file_records.file_record(rel, rows=len(rows), size=size, partition={"bucket": 0},
                                                    stats=file_records.parquet_stats(meta)))
        if table == ss.STATE_TABLE:
            record.update(intervals=[interval_id], buckets=1, bucket_expr=snapshot_buckets.BUCKET_EXPR.format(buckets=1),
                          next_expiry_ns=next_expiry_ns or {}, rows={t: len(r) for t, r in tables.items()},
                          delta_versions=dict(versions))
        commit = delta_tables.commit_files(uri, records, schema=ss.delta_schema(table), partition_by=("bucket",),
                                           replace=[], metadata=record, app_id=f"test.{table}/{version}",
                                           run_version=time.time_ns())
        versions[table] = commit.version
    return version


@pytest.fixture(autouse=True)
def _runs_may_choose_their_root_below_tmp(tmp_path, monkeypatch):
    """The deployment's allowlist of the examples' ``storage_root`` param (read when a DAG file is
    parsed): this test's temp folder, where its runs put their roots."""
    monkeypatch.setenv("PLGD_ETL_STORAGE_ROOTS", json.dumps([str(tmp_path)]))


# ---------------------------------------------------------------------------------------------
def test_snapshot_consumer_is_scheduled_on_the_etl_snapshot_asset(dags_folder):
    from airflow_provider_plgd.etl import build_etl_dag, etl_assets

    dag = _install_dag(dags_folder, "example_plgd_snapshot_consumer.py", "example_plgd_snapshot_consumer")
    snapshots = etl_assets("plgd_events_etl")["snapshots"]
    etl = build_etl_dag(dag_id="plgd_events_etl", start_date=datetime(2026, 1, 1, tzinfo=timezone.utc))
    assert snapshots in etl.get_task("rebuild").outlets
    condition = getattr(dag.timetable, "asset_condition", None) or dag.timetable.dataset_condition
    assert list(condition.objects) == [snapshots]


def test_snapshot_consumer_counts_devices_online_per_owner(dags_folder, tmp_path):
    sim = _simulation(seed=11, owners=2, devices=3)
    tables = expected_state(sim, through_interval=0)
    snapshot_ns = START_NS + 20 * 10**9
    root = tmp_path / "root"
    version = write_snapshot(root, tables, snapshot_ns, "20260101T000000Z_20260101T000020Z")

    # Ground truth: the owner's devices and their connection status, straight from the simulator.
    status: dict[tuple[str, str], str | None] = {(r["owner_id"], r["device_id"]): None
                                                 for r in tables["owner_devices"]}
    for row in tables["device_metadata"]:
        status[(row["owner_id"], row["device_id"])] = row["connection_status"]
    expected: dict[str, dict[str, int]] = {}
    for (owner_id, _device), value in status.items():
        c = expected.setdefault(owner_id, {"devices": 0, "online": 0, "offline": 0, "unknown": 0})
        c["devices"] += 1
        c[{"ONLINE": "online", "OFFLINE": "offline"}.get(value or "", "unknown")] += 1
    assert len(expected) == 2 and sum(c["online"] for c in expected.values()) > 0

    dag = _install_dag(dags_folder, "example_plgd_snapshot_consumer.py", "example_plgd_snapshot_consumer")
    dr = dag.test(logical_date=None, run_conf={"storage_root": str(root)})  # like an asset-triggered run
    assert _succeeded(dr), dr.state
    result = xcom_value(dr, "devices_online")
    assert result == {
        "snapshot_version": version,
        "snapshot_time": "2026-01-01T00:00:20Z",
        "interval_id": "20260101T000000Z_20260101T000020Z",
        "owners": expected,
        "devices": len(status),
        "online": sum(1 for v in status.values() if v == "ONLINE"),
    }


def test_snapshot_consumer_fails_without_a_snapshot(dags_folder, tmp_path):
    dag = _install_dag(dags_folder, "example_plgd_snapshot_consumer.py", "example_plgd_snapshot_consumer")
    dr = dag.test(logical_date=None, run_conf={"storage_root": str(tmp_path / "empty")})
    assert not _succeeded(dr)


def test_the_examples_storage_root_param_is_an_allowed_root_only(jetstream, dags_folder, tmp_path, monkeypatch):
    """Run params are untrusted: a root outside ``PLGD_ETL_STORAGE_ROOTS`` (and not the connection's)
    is refused before anything is read or written, in the fetch operator and in the consumer."""
    from airflow_provider_plgd.run_params import UntrustedRunParamError

    monkeypatch.setenv("PLGD_ETL_STORAGE_ROOTS", json.dumps([str(tmp_path / "allowed")]))
    publish_messages(jetstream.url, [(m.subject, m.data, None) for m in _simulation(seed=5).messages[:5]])
    elsewhere = tmp_path / "elsewhere"
    dag = _install_dag(dags_folder, "example_plgd_fetch_by_sequence.py", "example_plgd_fetch_by_sequence")
    fetch = dag.get_task("fetch")
    with pytest.raises(UntrustedRunParamError, match="is not a root this DAG allows"):
        fetch._layout({"params": {"storage_root": str(elsewhere)}})
    assert fetch._layout({"params": {"storage_root": str(tmp_path / "allowed" / "x")}}).root == \
        str(tmp_path / "allowed" / "x")
    dr = dag.test(logical_date=None, run_conf={"start_seq": 1, "end_seq": 5, "storage_root": str(elsewhere)})
    assert not _succeeded(dr) and not elsewhere.exists()
    consumer = _install_dag(dags_folder, "example_plgd_snapshot_consumer.py", "example_plgd_snapshot_consumer")
    dr = consumer.test(logical_date=None, run_conf={"storage_root": "/etc"})
    assert not _succeeded(dr)


# ---------------------------------------------------------------------------------------------
def _publish_sim(jetstream, sim) -> list[tuple[int, str, str]]:
    """Publish the simulation's messages; return ``(stream_seq, owner_id, event_type)`` per message."""
    seqs = publish_messages(jetstream.url, [(m.subject, m.data, None) for m in sim.messages])
    return [(seq, m.owner_id, m.event_type) for seq, m in zip(seqs, sim.messages, strict=True)]


def _per_owner(published, first: int, last: int) -> dict[str, dict[str, int]]:
    counts = Counter((o, e) for seq, o, e in published if first <= seq <= last)
    out: dict[str, dict[str, int]] = {}
    for (owner_id, event_type), n in sorted(counts.items()):
        out.setdefault(owner_id, {})[event_type] = n
    return out


def test_fetch_by_sequence_stages_exactly_the_range(jetstream, dags_folder, tmp_path):
    published = _publish_sim(jetstream, _simulation(seed=5))
    total = len(published)
    assert [p[0] for p in published] == list(range(1, total + 1)) and total > 60
    first, last = 11, total - 20
    root = str(tmp_path / "root")
    dag = _install_dag(dags_folder, "example_plgd_fetch_by_sequence.py", "example_plgd_fetch_by_sequence")

    dr = dag.test(logical_date=None, run_conf={"start_seq": first, "end_seq": last, "storage_root": root})
    assert _succeeded(dr), dr.state
    summary = xcom_value(dr, "staging_summary")
    assert summary == {
        "mode": "seq",
        "interval_ids": [times.seq_interval_id(first, last)],
        "count": last - first + 1,
        "bytes": xcom_value(dr, "fetch")["bytes"],
        "first_seq": first,
        "last_seq": last,
        "per_owner": _per_owner(published, first, last),
        "other_subjects": 0,
    }
    rows = staging_rows(root)
    assert sorted(r["stream_seq"] for r in rows) == list(range(first, last + 1))
    assert {(r["owner_id"], r["interval_id"]) for r in rows} == {("_filter", times.seq_interval_id(first, last))}

    # end_seq null: up to the stream's last sequence when the task starts
    dr = dag.test(logical_date=None, run_conf={"start_seq": last + 1, "end_seq": None, "storage_root": root})
    assert _succeeded(dr), dr.state
    summary = xcom_value(dr, "staging_summary")
    assert (summary["count"], summary["first_seq"], summary["last_seq"]) == (total - last, last + 1, total)
    assert summary["per_owner"] == _per_owner(published, last + 1, total)


def test_fetch_durable_stages_each_message_once_across_runs(jetstream, dags_folder, tmp_path):
    root = str(tmp_path / "root")
    conf = {"storage_root": root, "durable": "plgd_example_test"}
    dag = _install_dag(dags_folder, "example_plgd_fetch_by_sequence.py", "example_plgd_fetch_durable")
    first = _publish_sim(jetstream, _simulation(seed=6, owners=1))
    dr = dag.test(logical_date=None, run_conf=conf)
    assert _succeeded(dr), dr.state
    summary = xcom_value(dr, "staging_summary")
    n1 = len(first)
    assert (summary["mode"], summary["count"], summary["first_seq"], summary["last_seq"]) == ("durable", n1, 1, n1)
    assert summary["interval_ids"] == [times.durable_interval_id(1, n1)]
    assert summary["per_owner"] == _per_owner(first, 1, n1)

    second = _publish_sim(jetstream, _simulation(seed=7, owners=1))
    n2 = len(second)
    dr = dag.test(logical_date=None, run_conf=conf)
    summary = xcom_value(dr, "staging_summary")
    assert (summary["count"], summary["first_seq"], summary["last_seq"]) == (n2, n1 + 1, n1 + n2)
    assert summary["per_owner"] == _per_owner(second, n1 + 1, n1 + n2)

    dr = dag.test(logical_date=None, run_conf=conf)  # nothing new: no batch, count 0
    assert _succeeded(dr), dr.state
    summary = xcom_value(dr, "staging_summary")
    assert (summary["count"], summary["interval_ids"], summary["per_owner"]) == (0, [], {})
    staged = sorted(r["stream_seq"] for r in staging_rows(root))
    assert staged == list(range(1, n1 + n2 + 1))
