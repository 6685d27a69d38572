"""Unit tests of the decode app's helpers that run without Spark: Hive partition names, the
partitioned Parquet writer, the ``--py-files`` zip, the task plan over row groups, and one RDD
task reading its row groups and writing both tables.
"""

from __future__ import annotations

import collections
import json
from datetime import date
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet

from airflow_provider_plgd.plgd.event_types import EVENT_TYPES
from airflow_provider_plgd.spark import schemas
from airflow_provider_plgd.spark.decode_batch import decode_batch
from airflow_provider_plgd.spark.decode_job import EVENTS_PARTITIONS
from airflow_provider_plgd.tables import staging
from tests.unit.spark.decode_cases import INTERVAL, all_cases, staging_batch

# ---- helpers of the Spark app that run without Spark -------------------------------------------

def test_hive_escape_matches_spark():
    from airflow_provider_plgd.spark.parquet_io import HIVE_DEFAULT_PARTITION, hive_escape, partition_dir

    assert hive_escape("e1407479-3136-56c0-9908-bb02fb0339e2") == "e1407479-3136-56c0-9908-bb02fb0339e2"
    assert hive_escape("urn:uuid:{A}") == "urn%3Auuid%3A%7BA}"
    assert hive_escape("a/b=c%d") == "a%2Fb%3Dc%25d"
    assert hive_escape(None) == hive_escape("") == HIVE_DEFAULT_PARTITION
    assert partition_dir(["owner_id", "date"], ["o", date(2026, 1, 2)]) == "owner_id=o/date=2026-01-02"


def test_partitioned_writer_deterministic_files(tmp_path):
    import pyarrow.dataset as ds

    from airflow_provider_plgd.spark.parquet_io import ArrowPartitionedWriter

    cases = all_cases()
    batch = staging_batch([(s, d) for _, s, d, _ in cases])
    out = decode_batch(batch, INTERVAL).select(list(schemas.EVENTS_COLUMNS))
    files = []
    for _attempt in range(2):  # a retried task attempt rewrites the same names with the same content
        w = ArrowPartitionedWriter(str(tmp_path / "ev"), 7, schemas.EVENTS_SCHEMA, EVENTS_PARTITIONS,
                                   write_id="w1", row_group_rows=4)
        w.write(out.slice(0, 10))
        w.write(out.slice(10))
        files.append(w.close())
    assert files[0] == files[1]
    assert sum(f["rows"] for f in files[0]) == out.num_rows
    assert {f["partition"]["event_type"] for f in files[0]} == set(EVENT_TYPES)
    assert all(f["path"].endswith("/part-00007-w1.parquet") and f["path"].startswith(f"interval_id={INTERVAL}/")
               for f in files[0])
    assert all(f["size"] == (tmp_path / "ev" / f["path"]).stat().st_size for f in files[0])
    assert all(json.loads(f["stats"])["numRecords"] == f["rows"] for f in files[0])
    on_disk = sorted(str(p.relative_to(tmp_path / "ev")) for p in (tmp_path / "ev").rglob("*.parquet"))
    assert on_disk == sorted(f["path"] for f in files[0])
    part = ds.partitioning(pa.schema([(c, pa.string()) for c in EVENTS_PARTITIONS]), flavor="hive")
    back = ds.dataset(str(tmp_path / "ev"), format="parquet", partitioning=part).to_table()
    assert back.num_rows == out.num_rows
    assert sorted(back.column("msg_id").to_pylist()) == sorted(out.column("msg_id").to_pylist())
    empty = ArrowPartitionedWriter(str(tmp_path / "q"), 0, schemas.QUARANTINE_SCHEMA, (), write_id="w1",
                                   always_write=True).close()
    assert [(e["path"], e["rows"], e["partition"]) for e in empty] == [("part-00000-w1.parquet", 0, {})]
    assert pa.parquet.read_table(tmp_path / "q" / "part-00000-w1.parquet").num_rows == 0


def test_py_files_zip(tmp_path):
    import zipfile

    from airflow_provider_plgd.spark_deps import ZIP_NAME, build_py_files_zip

    path = build_py_files_zip(tmp_path / "deps")
    assert path.endswith(ZIP_NAME)
    first = Path(path).read_bytes()
    assert build_py_files_zip(tmp_path / "deps") == path and Path(path).read_bytes() == first  # deterministic
    names = zipfile.ZipFile(path).namelist()
    for needed in ("airflow_provider_plgd/__init__.py", "airflow_provider_plgd/tables/staging.py",
                   "airflow_provider_plgd/tables/run_summary.py", "airflow_provider_plgd/plgd/codec.py",
                   "airflow_provider_plgd/plgd/pb/resourceaggregate_pb2.py", "airflow_provider_plgd/spark_apps/decode_events.py",
                   "airflow_provider_plgd/spark/decode_batch.py", "airflow_provider_plgd/spark/schemas.py",
                   "airflow_provider_plgd/spark/session.py", "airflow_provider_plgd/tables/delta_tables.py", "airflow_provider_plgd/tables/storage.py"):
        assert needed in names
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    assert "airflow_provider_plgd/hooks/jetstream.py" in names  # the package, whole
    assert build_py_files_zip(tmp_path / "x.zip").endswith("x.zip")


def test_plan_tasks_packs_row_groups_into_few_decreasing_tasks():
    """``task_plan.plan_tasks``: every row group once, few tasks, big first, even tail."""
    from airflow_provider_plgd.spark.task_plan import plan_tasks

    # the bench's shape: 10 x 50k, 5 x 28k, ..., 5 x 20 rows (75 row groups, 974k rows)
    sizes = [50_000] * 10 + [28_000] * 5 + [12_700] * 5 + [9_200] * 5 + [8_000] * 5 + [7_200] * 5 \
        + [5_800] * 5 + [5_200] * 5 + [4_800] * 10 + [3_500] * 10 + [2_500] * 5 + [20] * 5
    units = [(f"file://f{i}.parquet", i % 2, n) for i, n in enumerate(sizes)]
    tasks = plan_tasks(units, 2)
    assert sorted(u for t in tasks for u in t) == sorted(units)  # each unit exactly once
    assert all(t for t in tasks) and len(tasks) < len(units) // 2
    rows = [sum(u[2] for u in t) for t in tasks]
    assert rows[0] == max(rows) and rows[0] <= 0.25 * sum(sizes) / 2 + 50_000
    assert max(rows[-4:]) <= 20_000  # the tail is small (about min_rows), so slots end together
    # simulated schedule (tasks start in list order on the first free slot): even finish
    slots = [0, 0]
    for r in rows:
        slots[slots.index(min(slots))] += r
    assert abs(slots[0] - slots[1]) <= 10_000

    assert plan_tasks([], 2) == []
    assert plan_tasks([("f", 0, 5)], 2) == [[("f", 0, 5)]]
    one_slot = plan_tasks(units, 1, min_rows=1, share=1.0)
    assert len(one_slot) == 1 and len(one_slot[0]) == len(units)  # share 1 on one slot: one task


def test_rdd_task_reads_its_row_groups_and_writes_both_tables(tmp_path, monkeypatch):
    """``decode_job.make_rdd_task`` run in-process (no Spark): a staging file cut into slices by
    its row count alone (no footer read on the driver), each task reads its slices' row groups
    (footer read in the task), every row once; decoded rows land in ``events``, bad ones in
    ``quarantine``; with owners, only their rows are read."""
    import pyarrow.dataset as ds

    from airflow_provider_plgd.spark.decode_job import make_rdd_task, staging_units
    from airflow_provider_plgd.spark.task_plan import plan_tasks

    cases = all_cases()
    rows = [(s, d) for _, s, d, _ in cases] * 3 + [(cases[0][1], b"\x00bad")]
    batch = staging_batch(rows)
    path = tmp_path / "staging.parquet"
    owners = [f"o{i % 3}" for i in range(len(rows))]
    table = pa.Table.from_batches([batch]).cast(staging.SCHEMA).append_column("owner_id", pa.array(owners))
    pa.parquet.write_table(table, path, row_group_size=7)
    staged = staging.StagedFile("x.parquet", str(path), len(rows), path.stat().st_size, INTERVAL, "t",
                                "o0", "o2", 1, len(rows), 0)
    units = staging_units([staged], slice_rows=5)  # row ranges that do not follow the row groups (7 rows)
    assert sum(u[2] for u in units) == len(rows) and len(units) == -(-len(rows) // 5)
    starts = sorted(u[1] for u in units)
    assert starts[0] == 0 and all(b - a in (5, 4) for a, b in zip(starts, [*starts[1:], len(rows)], strict=True))
    tasks = plan_tasks(units, 2, min_rows=10)
    assert 1 < len(tasks) < len(units)
    ev, q = str(tmp_path / "ev"), str(tmp_path / "q")
    records = []
    import pyspark

    for task_id, task_units in enumerate(tasks):  # one Spark task (partition) per element
        ctx = type("Ctx", (), {"partitionId": lambda self, i=task_id: i})()
        monkeypatch.setattr(pyspark.TaskContext, "get", classmethod(lambda cls, c=ctx: c))
        records += list(make_rdd_task(INTERVAL, ev, q, "w1", batch_rows=5)(iter([task_units])))
    by_table = collections.Counter()
    for rec in records:
        by_table[rec["table"]] += rec["rows"] if rec["table"] == "input" else rec["file"]["rows"]
    assert by_table == {"events": len(rows) - 1, "quarantine": 1, "input": len(rows)}
    assert [rec["reasons"] for rec in records if rec["table"] == "quarantine" and rec["file"]["rows"]] == \
        [{"bad_protobuf": 1}]
    part = ds.partitioning(pa.schema([(c, pa.string()) for c in EVENTS_PARTITIONS]), flavor="hive")
    back = ds.dataset(ev, format="parquet", partitioning=part).to_table()
    expected = decode_batch(batch, INTERVAL)
    decoded = expected.filter(expected.column("reason").is_null())
    assert sorted(back.column("msg_id").to_pylist()) == sorted(decoded.column("msg_id").to_pylist())
    quarantined = ds.dataset(q, format="parquet").to_table()
    assert quarantined.column("reason").to_pylist() == ["bad_protobuf"]
    assert {rec["file"]["path"] for rec in records if "file" in rec} == {
        str(f.relative_to(tmp_path / t)) for t in ("ev", "q") for f in (tmp_path / t).rglob("*.parquet")}
    # only some owners' rows: the task filters them (and skips row groups whose statistics exclude them)
    only = list(make_rdd_task(INTERVAL, str(tmp_path / "ev2"), str(tmp_path / "q2"), "w2", batch_rows=5,
                              owners=["o1"])(iter([units])))
    assert sum(rec["rows"] for rec in only if rec["table"] == "input") == owners.count("o1")
