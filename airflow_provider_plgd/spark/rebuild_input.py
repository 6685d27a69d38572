"""The rebuild's input without the JVM: ``events_deduped`` files -> events keyed by device and
bucket, gathered per bucket by a shuffle of Python tasks (``executor_tasks``), folded by ``snapshot_store``.

``rebuild_snapshots`` runs :func:`fold_touched_buckets`:

1. **Files**: the Parquet files of the intervals to fold (``delta_tables.table_files``: the files
   the ``events_deduped`` Delta log names), packed into a few tasks (``task_plan.plan_tasks``).
2. **Map**: each task reads its files' ``fold.FOLD_INPUT_COLUMNS`` with pyarrow (``event_type``
   and ``interval_id`` from the files' partition values in the log), gives each row its device (identity-store rows: one
   row per entry of ``device_ids``) and bucket (``snapshot_buckets.device_bucket``: Spark's
   ``pmod(xxhash64(device_id), buckets)`` with the ``xxhash`` wheel, so the buckets are the ones of
   every earlier snapshot, without a Spark SQL job), and emits one Arrow IPC stream per target
   partition (``bucket % partitions``).
3. **Reduce** (``executor_tasks.Shuffle``: ``RDD.partitionBy`` or ``repartitionById``): each
   partition gathers its buckets' events and runs ``snapshot_buckets.rebuild_partition`` (fold, carry over, write), also for the buckets of the
   partition whose pendings expire without new events. Returns the
   ``snapshot_buckets.BUCKET_RESULT_SCHEMA`` rows as dicts.

The wide rows never become JVM rows, so no Spark work comes before the first fold (figures:
docs/performance.md, "Measurements behind design choices", M13). tests/integration/
test_dedupe_rebuild.py compares the tables with a Spark oracle (Spark's Parquet scan, a
``repartition`` by bucket and ``mapInArrow``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_plgd.spark import executor_tasks, fold, snapshot_buckets
from airflow_provider_plgd.spark.parquet_io import ipc_bytes, read_events_files
from airflow_provider_plgd.spark.task_plan import plan_tasks
from airflow_provider_plgd.tables import delta_tables
from airflow_provider_plgd.tables.layout import Layout

BUCKET_COLUMN = "_bucket"
DEVICE_COLUMN = "_device"


def interval_files(layout: Layout, intervals: Sequence[str]) -> list[tuple[str, int, int, dict[str, str | None]]]:
    """``(file URL, -1, rows, partition values)`` of the ``events_deduped`` files of ``intervals``
    (the latest Delta version), sorted by path; ``task_plan.plan_tasks`` units."""
    if not intervals:
        return []
    uri = delta_tables.interval_table_uri(layout, delta_tables.EVENTS_DEDUPED)
    return [(f.url, -1, f.rows, f.partition)
            for f in delta_tables.table_files(uri, where={delta_tables.INTERVAL_COLUMN: list(intervals)})]


def _devices_of(table):
    """``(row indices, device IDs)`` Arrow arrays: one entry per (row, device) of ``table``
    (``device_id`` else ``group_id``; identity-store rows: each of ``device_ids``); rows without a
    device are left out."""
    n = table.num_rows
    is_reg = pc.fill_null(pc.is_in(table.column("event_type"),
                                   value_set=pa.array([fold.DEVICES_REGISTERED, fold.DEVICES_UNREGISTERED])), False)
    single = pc.coalesce(table.column("device_id"), table.column("group_id")) if "group_id" in table.column_names \
        else table.column("device_id")
    rows = pa.array(range(n), pa.int64())
    keep = pc.and_(pc.invert(is_reg), pc.is_valid(single))
    idx = [pc.filter(rows, keep)]
    dev = [pc.filter(single, keep).combine_chunks().cast(pa.string())]
    if "device_ids" in table.column_names and pc.any(is_reg).as_py():
        lists = pc.filter(table.column("device_ids"), is_reg).combine_chunks()
        reg_rows = pc.filter(rows, is_reg)
        parents = pc.list_parent_indices(lists)
        values = pc.list_flatten(lists)
        valid = pc.is_valid(values)
        idx.append(pc.filter(pc.take(reg_rows, parents), valid))
        dev.append(pc.filter(values, valid).cast(pa.string()))
    indices = pa.concat_arrays([i.combine_chunks() if isinstance(i, pa.ChunkedArray) else i for i in idx])
    devices = pa.concat_arrays([d.combine_chunks() if isinstance(d, pa.ChunkedArray) else d for d in dev])
    return indices, devices


def make_map_task(buckets: int, partitions: int):
    """Map step function (``executor_tasks.run_stages``): file lists -> ``(partition, Arrow IPC stream bytes)``.

    Each row of the files (``fold.FOLD_INPUT_COLUMNS``), once per device it applies to, with two
    more columns: ``_device`` (string) and ``_bucket`` (int32, ``pmod(xxhash64(_device),
    buckets)``: :func:`snapshot_buckets.device_bucket`, the ``snapshot_buckets.BUCKET_EXPR`` of every
    snapshot); rows go to partition ``_bucket % partitions``.
    """

    def task(file_lists: Any) -> Any:
        memo: dict[str, int] = {}

        def bucket_of(device: str) -> int:
            b = memo.get(device)
            if b is None:
                b = memo[device] = snapshot_buckets.device_bucket(device, buckets)
            return b

        for files in file_lists:
            table = read_events_files([(u[0], u[3]) for u in files], fold.FOLD_INPUT_COLUMNS)
            if table is None or not table.num_rows:
                continue
            indices, devices = _devices_of(table)
            rows = table.take(indices)
            bucket = pa.array([bucket_of(d) for d in devices.to_pylist()], pa.int32())
            rows = rows.append_column(DEVICE_COLUMN, devices).append_column(BUCKET_COLUMN, bucket)
            target = pc.remainder(bucket, partitions) if partitions > 1 else pa.array([0] * len(bucket), pa.int32())
            for p in pc.unique(target).to_pylist():
                yield int(p), ipc_bytes(rows.filter(pc.equal(target, p)))

    return task


def make_reduce_task(partitions: int, expiring: Sequence[int], fold_kwargs: Mapping[str, Any]):
    """Reduce step function (``executor_tasks.Shuffle``): ``(partition, IPC bytes)`` pairs of one partition ->
    ``snapshot_buckets.BUCKET_RESULT_SCHEMA`` rows (dicts) of every bucket it folds.

    :param expiring: buckets whose pendings expire by the snapshot time; the partition
        ``b % partitions`` folds each of them even without new events.
    :param fold_kwargs: keyword arguments of ``snapshot_buckets.rebuild_partition`` (``snapshots``,
        ``run_id``, ``old_files_by_bucket``, ``table_schemas``, ``snapshot_time_ns``).
    """

    def task(pairs):
        # lazy: pyspark only in the Spark task (this module imports without it)
        from pyspark import TaskContext

        ctx = TaskContext.get()
        me = ctx.partitionId() if ctx is not None else 0
        tables = [pa.ipc.open_stream(data).read_all() for _, data in pairs]
        tables = [t for t in tables if t.num_rows]
        events = pa.concat_tables(tables, promote_options="permissive") if tables else None
        extra = [b for b in expiring if b % partitions == me]
        for result in snapshot_buckets.rebuild_partition(
                [] if events is None else events.to_batches(), extra_buckets=extra,
                bucket_column=BUCKET_COLUMN, device_column=DEVICE_COLUMN, **dict(fold_kwargs)):
            yield from result.to_pylist()

    return task


def fold_touched_buckets(spark, layout: Layout, intervals: Sequence[str], *, buckets: int, partitions: int,
                         expiring: Sequence[int], fold_kwargs: Mapping[str, Any],
                         timings: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """Run steps 1-3 of the module docstring; return the ``BUCKET_RESULT_SCHEMA`` rows (dicts).

    :param layout: the storage root of ``events_deduped``.
    :param intervals: the intervals to fold (oldest first).
    :param buckets: the snapshot's bucket count.
    :param partitions: reduce partitions (each folds whole buckets one after the other).
    :param timings: if given, gets ``list`` (step 1) and ``fold`` (2-4) in seconds.
    """
    started = time.time()
    tasks = plan_tasks(interval_files(layout, intervals), executor_tasks.default_parallelism(spark))
    if timings is not None:
        timings["list"] = round(time.time() - started, 3)
    if not tasks and not expiring:
        return []
    started = time.time()
    results = executor_tasks.run_stages(spark, tasks, make_map_task(buckets, partitions), executor_tasks.Shuffle(
        partitions, make_reduce_task(partitions, expiring, fold_kwargs)))
    if timings is not None:
        timings["fold"] = round(time.time() - started, 3)
    return results
