"""``airflow_provider_plgd.tables.delta_tables`` on real Delta tables in a temp folder, read back with
``deltalake`` and ``polars``: one commit replaces exactly an interval's rows, a retried commit is a
no-op and an older run's is refused, a new column evolves the schema (old files read as null), the
file statistics, and the refusal of a storage root in the layout before Delta Lake."""

from __future__ import annotations

import json
from datetime import date

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_provider_plgd.exceptions import OldLayoutError, TableCommitError
from airflow_provider_plgd.spark import schemas
from airflow_provider_plgd.spark.parquet_io import write_parquet_file
from airflow_provider_plgd.tables import delta_tables, file_records
from airflow_provider_plgd.tables.layout import Layout
from airflow_provider_plgd.tables.storage import to_fs

PARTITIONS = delta_tables.INTERVAL_TABLES[delta_tables.EVENTS]


def events(msg_ids: list[str], extra: dict[str, list] | None = None) -> pa.Table:
    """``events`` rows (file columns only: no partition columns) with these message IDs."""
    n = len(msg_ids)
    cols = {name: pa.nulls(n, schemas.EVENTS_SCHEMA.field(name).type) for name in schemas.EVENTS_SCHEMA.names
            if name not in PARTITIONS}
    cols["msg_id"] = pa.array(msg_ids, pa.string())
    cols["owner_id"] = pa.array(["o1"] * n, pa.string())
    cols["stream_seq"] = pa.array(range(1, n + 1), pa.int64())
    cols["date"] = pa.array([date(2026, 1, 1)] * n, pa.date32())
    table = pa.table(cols)
    for name, values in (extra or {}).items():
        table = table.append_column(name, pa.array(values))
    return table


def commit(uri: str, interval: str, msg_ids: list[str], run_version: int, *, name: str = "a",
           schema: pa.Schema = schemas.EVENTS_SCHEMA, extra: dict[str, list] | None = None):
    fs, base = to_fs(uri)
    rel = f"interval_id={interval}/event_type=resourcechanged/part-{name}.parquet"
    size, meta = write_parquet_file(fs, f"{base}/{rel}", events(msg_ids, extra))
    record = file_records.file_record(rel, rows=len(msg_ids), size=size,
                                      partition={"interval_id": interval, "event_type": "resourcechanged"},
                                      stats=file_records.parquet_stats(meta))
    return delta_tables.commit_files(uri, [record], schema=schema, partition_by=PARTITIONS,
                                     replace=delta_tables.interval_filter(interval),
                                     metadata={"interval_id": interval, "run_version": run_version},
                                     app_id=f"test.events/{interval}", run_version=run_version)


def msg_ids(uri: str, interval: str) -> list[str]:
    frame = pl.read_delta(uri).filter(pl.col("interval_id") == interval)
    return sorted(frame.get_column("msg_id").to_list())


def test_a_commit_replaces_exactly_its_intervals_rows(tmp_path):
    uri = str(tmp_path / "events")
    assert commit(uri, "A", ["a1", "a2"], 1).version == 1
    commit(uri, "B", ["b1"], 2, name="b")
    assert commit(uri, "A", ["a3"], 3, name="a-rerun").version == 3
    assert msg_ids(uri, "A") == ["a3"] and msg_ids(uri, "B") == ["b1"]
    # time travel: version 2 still holds the first run of A
    old = pa.table(DeltaTable(uri, version=2).to_pyarrow_table())
    assert sorted(old.column("msg_id").to_pylist()) == ["a1", "a2", "b1"]
    assert delta_tables.committed_intervals(uri) == ["A", "B"]
    files = delta_tables.table_files(uri, where={"interval_id": ["A"]})
    assert [(f.path, f.rows) for f in files] == [("interval_id=A/event_type=resourcechanged/part-a-rerun.parquet", 1)]
    assert [c["interval_id"] for c in delta_tables.commits(uri)] == ["A", "B", "A"]


def test_a_retried_commit_is_a_no_op_and_an_older_run_is_refused(tmp_path):
    uri = str(tmp_path / "events")
    commit(uri, "A", ["a1"], 5)
    again = commit(uri, "A", ["a1"], 5)
    assert again.version is None and DeltaTable(uri).version() == 1
    with pytest.raises(TableCommitError, match="a newer run of the same interval committed first"):
        commit(uri, "A", ["x"], 4, name="older")
    assert msg_ids(uri, "A") == ["a1"]


def test_a_new_column_evolves_the_schema_and_old_files_read_it_as_null(tmp_path):
    uri = str(tmp_path / "events")
    commit(uri, "A", ["a1", "a2"], 1)
    wider = schemas.EVENTS_SCHEMA.append(pa.field("new_plgd_field", pa.string()))
    commit(uri, "B", ["b1"], 2, name="b", schema=wider, extra={"new_plgd_field": ["x"]})
    frame = pl.read_delta(uri).sort("msg_id")
    assert "new_plgd_field" in frame.columns
    assert frame.select("msg_id", "new_plgd_field").rows() == [("a1", None), ("a2", None), ("b1", "x")]
    table = pa.table(DeltaTable(uri).to_pyarrow_table())
    assert table.schema.field("new_plgd_field").type in (pa.string(), pa.large_string(), pa.string_view())
    # the other columns keep their types
    assert pa.types.is_timestamp(table.schema.field("published_at").type)
    assert pa.types.is_date32(table.schema.field("date").type)


def test_file_statistics_from_the_parquet_footer(tmp_path):
    fs, base = to_fs(str(tmp_path))
    table = pa.table({"n": pa.array([3, None, 1], pa.int64()), "s": ["b", "a", None],
                      "d": pa.array([date(2026, 1, 2), date(2026, 1, 1), None], pa.date32()),
                      "blob": pa.array([b"x", b"y", None]), "l": pa.array([[1], None, [2]])})
    _size, meta = write_parquet_file(fs, f"{base}/f.parquet", table, row_group_size=2)
    stats = file_records.parquet_stats(meta)
    assert stats == {"numRecords": 3, "minValues": {"n": 1, "s": "a", "d": "2026-01-01"},
                     "maxValues": {"n": 3, "s": "b", "d": "2026-01-02"}, "nullCount": {"n": 1, "s": 1, "d": 1}}
    json.dumps(stats)


def test_a_root_in_the_layout_before_delta_is_refused_naming_the_folder(tmp_path):
    delta_tables.check_layout(Layout.of(str(tmp_path)))  # empty: fine
    commit(str(tmp_path / "events"), "A", ["a1"], 1)
    delta_tables.check_layout(Layout.of(str(tmp_path)))  # Delta tables: fine
    old = tmp_path / "events_deduped" / "interval=20260101T000000Z_20260101T010000Z"
    old.mkdir(parents=True)
    (old / "_manifest.json").write_text("{}")
    with pytest.raises(OldLayoutError, match=r"events_deduped/interval=20260101T000000Z_20260101T010000Z belongs to "
                                             r"the storage layout before Delta Lake"):
        delta_tables.check_layout(Layout.of(str(tmp_path)))
    other = tmp_path / "other"
    (other / "snapshots").mkdir(parents=True)
    (other / "snapshots" / "_latest.json").write_text("{}")
    with pytest.raises(OldLayoutError, match=r"snapshots/_latest.json"):
        delta_tables.check_layout(Layout.of(str(other)))


def test_roll_back_makes_an_older_snapshot_the_latest(tmp_path):
    """``snapshot_store.roll_back``: two snapshots, roll back to the first; ``latest`` and every
    reader (deltalake, polars) see the first one's rows, the second stays readable by time travel."""
    from airflow_provider_plgd.tables import snapshot_store as ss

    root = str(tmp_path)

    def snapshot(version: str, devices: list[str], run_version: int) -> None:
        record = {"snapshot": version, "snapshot_time_ns": run_version, "interval_id": f"i{version}",
                  "parent": None, "buckets": 1}
        versions = {}
        for table in ss.ALL_TABLES:
            uri = ss.snapshot_table_uri(Layout.of(root), table)
            records = []
            if table == "owner_devices":
                fs, base = to_fs(uri)
                rows = pa.Table.from_pylist([{"owner_id": "o", "owner": "o", "device_id": d, "registered_at": 1} for d in devices],
                                            schema=ss.table_schema(table))
                size, meta = write_parquet_file(fs, f"{base}/bucket=0/part-{version}.parquet", rows)
                records.append(file_records.file_record(f"bucket=0/part-{version}.parquet", rows=len(devices),
                                                        size=size, partition={"bucket": 0},
                                                        stats=file_records.parquet_stats(meta)))
            if table == ss.STATE_TABLE:
                record["delta_versions"] = dict(versions)
            versions[table] = delta_tables.commit_files(
                uri, records, schema=ss.delta_schema(table), partition_by=("bucket",), replace=[], metadata=record,
                app_id=f"t.{table}/{version}", run_version=run_version).version

    snapshot("V1", ["d1"], 1)
    snapshot("V2", ["d1", "d2"], 2)
    assert ss.latest(Layout.of(root))["version"] == "V2"
    assert ss.roll_back(root, "V1")["version"] == "V1"
    assert ss.latest(Layout.of(root))["version"] == "V1"
    uri = ss.snapshot_table_uri(Layout.of(root), "owner_devices")
    assert pl.read_delta(uri).get_column("device_id").to_list() == ["d1"]
    assert [r["device_id"] for r in ss.read_snapshot(root, "owner_devices").to_pylist()] == ["d1"]
    assert [r["device_id"] for r in ss.read_snapshot(root, "owner_devices", "V2").to_pylist()] == ["d1", "d2"]
    with pytest.raises(ValueError, match="no snapshot version 'V9'"):
        ss.roll_back(root, "V9")


def test_a_stage_counts_as_committed_only_when_one_run_committed_all_its_tables(tmp_path):
    """``run_committed``: decode commits ``events`` then ``quarantine``; a run killed between the two
    leaves them at different run versions, and dedupe must wait for a rerun."""
    root = str(tmp_path)

    def decode_commit(table: str, run_version: int) -> None:
        schema = schemas.EVENTS_SCHEMA if table == "events" else schemas.QUARANTINE_SCHEMA
        delta_tables.commit_files(delta_tables.interval_table_uri(Layout.of(root), table), [], schema=schema,
                                  partition_by=delta_tables.INTERVAL_TABLES[table],
                                  replace=delta_tables.interval_filter("A"), metadata={"interval_id": "A"},
                                  app_id=f"plgd.decode.{table}/A", run_version=run_version)

    tables = (delta_tables.EVENTS, delta_tables.QUARANTINE)
    assert not delta_tables.run_committed(Layout.of(root), "decode", tables, "A")
    decode_commit("events", 1)
    assert not delta_tables.run_committed(Layout.of(root), "decode", tables, "A")  # killed between the commits
    decode_commit("quarantine", 1)
    assert delta_tables.run_committed(Layout.of(root), "decode", tables, "A")
    decode_commit("events", 2)  # a rerun killed between its commits
    assert not delta_tables.run_committed(Layout.of(root), "decode", tables, "A")
    assert not delta_tables.run_committed(Layout.of(root), "decode", tables, "B")
