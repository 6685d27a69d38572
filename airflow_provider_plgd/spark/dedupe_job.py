"""The dedupe job: the ``events`` of one interval -> the Delta tables ``msgid_index`` + ``events_deduped``.

The command line is ``airflow_provider_plgd/spark_apps/dedupe_events.py``; its module docstring
gives the rules. Here: the lookback (:func:`previous_intervals`), the decision on the driver
(:func:`decide_on_driver`: the key columns of the interval's files with pyarrow,
:mod:`airflow_provider_plgd.spark.dedupe_decision`), the copy task (:func:`make_filter_task`:
each ``events`` file minus its dropped rows, with pyarrow in Python tasks) and :func:`run`.
"""

from __future__ import annotations

import argparse
import logging
import posixpath
import time
from typing import Any, Iterable

import pyarrow as pa

from airflow_provider_plgd import delta_tables, storage
from airflow_provider_plgd.spark import schemas, snapshot_store
from airflow_provider_plgd.spark.parquet_io import data_file_name, new_write_id, write_parquet_file
from airflow_provider_plgd.spark.summary import finish_run
from airflow_provider_plgd.spark.task_plan import plan_tasks

APP = "dedupe"
DEFAULT_LOOKBACK = 24
#: The internal ``msgid_index`` table: the message IDs each interval kept.
MSGID_INDEX_SCHEMA = pa.schema([("msg_id", pa.string()), (delta_tables.INTERVAL_COLUMN, pa.string())])
log = logging.getLogger("plgd.spark.dedupe")


def previous_intervals(root: str, interval_id: str, lookback: int) -> list[str]:
    """The last ``lookback`` intervals of the same kind as ``interval_id`` that sort before it and
    have rows in ``msgid_index`` (oldest first)."""
    kind = snapshot_store.interval_kind(interval_id)
    done = delta_tables.committed_intervals(delta_tables.table_uri(root, delta_tables.MSGID_INDEX))
    before = [i for i in done if i < interval_id and snapshot_store.interval_kind(i) == kind]
    return before[-lookback:] if lookback else []


def read_key_columns(files: list[delta_tables.DataFile]):
    """The :data:`dedupe_decision.KEY_COLUMNS` of the listed ``events`` files (in list order, rows
    in file order), with pyarrow; ``event_type`` from the files' partition values (the Delta log).
    Row ``i`` of the result is row ``i - offset[f]`` of file ``f``.

    :return: ``(table, offsets)``: ``offsets[f]`` = position of file ``f``'s first row.
    """
    import pyarrow.parquet as pq

    schema = pa.schema([("msg_id", pa.string()), ("stream", pa.string()), ("stream_seq", pa.int64()),
                        ("subject", pa.string()), ("event_type", pa.string())])
    parts, offsets, offset = [], [], 0
    for f in files:
        fs, path = storage.to_fs(f.url)
        with fs.open(path, "rb") as fh:
            table = pq.read_table(fh, columns=["msg_id", "stream", "stream_seq", "subject"])
        event_type = pa.array([f.partition.get("event_type")] * table.num_rows, pa.string())
        parts.append(table.append_column("event_type", event_type).cast(schema))
        offsets.append(offset)
        offset += table.num_rows
    return (pa.concat_tables(parts) if parts else schema.empty_table()), offsets


def _previous_id_arrays(root: str, intervals: Iterable[str]):
    """Yield, one file at a time, the ``msg_id`` arrays of the previous intervals' ``msgid_index``
    files (named by the Delta log), with pyarrow."""
    import pyarrow.parquet as pq

    wanted = list(intervals)
    if not wanted:
        return
    index = delta_tables.table_uri(root, delta_tables.MSGID_INDEX)
    for f in delta_tables.table_files(index, where={delta_tables.INTERVAL_COLUMN: wanted}):
        fs, path = storage.to_fs(f.url)
        with fs.open(path, "rb") as fh:
            yield pq.read_table(fh, columns=["msg_id"]).column("msg_id")


def decide_on_driver(root: str, files: list[delta_tables.DataFile], previous: list[str]):
    """Decide with :func:`dedupe_decision.decide` in this (driver) process.

    :return: ``(Decision, drops)``: ``drops`` = ``{relative file path: [row positions to drop]}``.
    """
    import pyarrow.compute as pc

    from airflow_provider_plgd.spark import dedupe_decision

    keys, offsets = read_key_columns(files)
    current = pc.unique(keys.column("msg_id").drop_null())
    seen = dedupe_decision.seen_ids(current, _previous_id_arrays(root, previous)) if previous else None
    decision = dedupe_decision.decide(keys, seen)
    drops: dict[str, list[int]] = {}
    f = 0
    for row in decision.dropped_rows.to_pylist():  # ascending, like the offsets
        while f + 1 < len(offsets) and offsets[f + 1] <= row:
            f += 1
        drops.setdefault(files[f].path, []).append(row - offsets[f])
    return decision, drops


def make_filter_task(source: str, target: str, names: dict[str, str], drops: dict[str, list[int]],
                     partitions: dict[str, dict[str, str | None]]):
    """Build the ``RDD.mapPartitions`` function that copies ``events`` files minus dropped rows.

    :param source: the ``events`` table folder (fsspec URL or path).
    :param target: the ``events_deduped`` table folder.
    :param names: ``{source relative path: target relative path}`` (same partition folders, file
        names of this run: ``parquet_io.data_file_name``).
    :param drops: ``{source relative path: [row positions]}``: the rows to leave out.
    :param partitions: ``{source relative path: partition values}`` (from the Delta log).
    :return: a function of an iterator of file lists (:func:`task_plan.plan_tasks` tasks of
        ``(relative path, -1, rows)`` units) that yields a ``delta_tables.file_record`` per written
        file. A file without dropped rows is copied byte for byte; any other is read and rewritten
        with pyarrow (``parquet_io.write_parquet_file``: snappy, ``TIMESTAMP_MICROS``), in row order.
    """

    def task(file_lists):
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        fs, src = storage.to_fs(source)
        _, dst = storage.to_fs(target)
        for files in file_lists:
            for rel, _, _ in files:
                out = f"{dst}/{names[rel]}"
                gone = drops.get(rel)
                with fs.open(f"{src}/{rel}", "rb") as fh:
                    pf = pq.ParquetFile(fh)
                    metadata = pf.metadata
                    table = pf.read() if gone else None
                if gone:
                    row_group = max((metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)),
                                    default=1)
                    keep = pc.invert(pc.is_in(pa.array(range(table.num_rows), pa.int64()),
                                              value_set=pa.array(gone, pa.int64())))
                    size, metadata = write_parquet_file(fs, out, table.filter(keep), row_group_size=row_group)
                else:
                    fs.makedirs(posixpath.dirname(out), exist_ok=True)
                    fs.copy(f"{src}/{rel}", out)
                    size = fs.size(out)
                yield delta_tables.file_record(names[rel], rows=metadata.num_rows, size=size,
                                               partition=partitions[rel],
                                               stats=delta_tables.parquet_stats(metadata))

    return task


def filter_files(spark, source: str, target: str, files: list[delta_tables.DataFile],
                 drops: dict[str, list[int]], write_id: str) -> list[dict[str, Any]]:
    """Write ``source``'s ``files`` minus the ``drops`` rows into ``target`` (:func:`make_filter_task`),
    in a few Spark tasks balanced by rows (:func:`task_plan.plan_tasks`).

    :return: ``delta_tables.file_record`` dicts, one per written file (files left empty are written too).
    """
    names = {f.path: posixpath.join(posixpath.dirname(f.path), data_file_name(i, write_id))
             for i, f in enumerate(files)}
    tasks = plan_tasks([(f.path, -1, f.rows) for f in files], spark.sparkContext.defaultParallelism)
    if not tasks:
        return []
    task = make_filter_task(source, target, names, drops, {f.path: f.partition for f in files})
    return spark.sparkContext.parallelize(tasks, len(tasks)).mapPartitions(task).collect()


def decoded(root: str, interval_id: str) -> bool:
    """True when one decode run committed both ``events`` and ``quarantine`` of the interval
    (``delta_tables.run_committed``)."""
    return delta_tables.run_committed(root, "decode", (delta_tables.EVENTS, delta_tables.QUARANTINE), interval_id)


def run(spark, args: argparse.Namespace) -> dict[str, Any]:
    """Deduplicate one interval and commit ``msgid_index``, ``events_deduped`` and the summary.

    :return: the run summary dict (also written as JSON).
    :raises FileNotFoundError: decode has not committed the interval's ``events``.
    :raises RuntimeError: the written rows do not match the decision (nothing is committed then).
    :raises TableCommitError: another run of the interval committed meanwhile.
    """
    from airflow_provider_plgd import staging

    started = time.time()
    run_version = time.time_ns() // 1_000_000
    interval_id = staging.validate_partition_value(args.interval_id, "interval_id")
    root = str(args.root).rstrip("/")
    delta_tables.check_layout(root)
    source = delta_tables.table_uri(root, delta_tables.EVENTS)
    if not decoded(root, interval_id):
        raise FileNotFoundError(
            f"events of interval {interval_id} are not committed (no decode run committed both {source} and its "
            "quarantine); run decode_events first"
        )
    if args.previous_intervals is not None:
        previous = [staging.validate_partition_value(i, "previous interval") for i in args.previous_intervals
                    if i != interval_id]
    else:
        previous = previous_intervals(root, interval_id, args.lookback_intervals)
    files = delta_tables.table_files(source, where={delta_tables.INTERVAL_COLUMN: [interval_id]})
    log.info("interval %s: %d rows in %d files; looking back at %d previous intervals%s",
             interval_id, sum(f.rows for f in files), len(files), len(previous),
             f" ({previous[0]} .. {previous[-1]})" if previous else "")

    index_uri = delta_tables.table_uri(root, delta_tables.MSGID_INDEX)
    deduped_uri = delta_tables.table_uri(root, delta_tables.EVENTS_DEDUPED)
    write_id = new_write_id()
    timings: dict[str, float] = {"plan": round(time.time() - started, 3)}

    phase = time.time()
    decision, drops = decide_on_driver(root, files, previous)
    totals = decision.totals()
    index_rel = f"{delta_tables.INTERVAL_COLUMN}={interval_id}/{data_file_name(0, write_id)}"
    index_records = []
    if len(decision.index):
        fs, index_path = storage.to_fs(index_uri)
        size, metadata = write_parquet_file(fs, f"{index_path}/{index_rel}", pa.table({"msg_id": decision.index}),
                                            row_group_size=1 << 20)
        index_records.append(delta_tables.file_record(
            index_rel, rows=len(decision.index), size=size, partition={delta_tables.INTERVAL_COLUMN: interval_id},
            stats=delta_tables.parquet_stats(metadata)))
    timings["decide"] = round(time.time() - phase, 3)

    phase = time.time()
    # copy the decoded files, minus the dropped rows, with pyarrow in Python tasks (the wide rows
    # never enter the JVM; a file without drops is copied byte for byte)
    written = filter_files(spark, source, deduped_uri, files, drops, write_id)
    kept_rows = sum(f["rows"] for f in written)
    if kept_rows != totals["output"]:
        raise RuntimeError(
            f"interval {interval_id}: the filtered files hold {kept_rows} rows, the decision kept "
            f"{totals['output']}; nothing committed"
        )
    timings["write"] = round(time.time() - phase, 3)
    meta = {"app": APP, "interval_id": interval_id, "run_version": run_version, "write_id": write_id}
    commits = {}
    for name, uri, schema, records, rows in (
            (delta_tables.MSGID_INDEX, index_uri, MSGID_INDEX_SCHEMA, index_records, len(decision.index)),
            (delta_tables.EVENTS_DEDUPED, deduped_uri, schemas.EVENTS_SCHEMA, written, kept_rows)):
        commits[name] = delta_tables.commit_files(
            uri, records, schema=schema, partition_by=delta_tables.INTERVAL_TABLES[name],
            replace=delta_tables.interval_filter(interval_id), metadata={**meta, "rows": rows},
            app_id=f"plgd.{APP}.{name}/{interval_id}", run_version=run_version)
    log.info("committed %s version %s (%d rows; %d within-batch and %d cross-batch duplicates dropped; "
             "phase seconds %s)", deduped_uri, commits[delta_tables.EVENTS_DEDUPED].version, totals["output"],
             totals["within_batch"], totals["cross_batch"], timings)

    summary = {
        "app": APP,
        "interval_id": interval_id,
        "root": root,
        "input": totals["input"],
        "output": totals["output"],
        "within_batch_duplicates": totals["within_batch"],
        "cross_batch_duplicates": totals["cross_batch"],
        "duplicates": totals["within_batch"] + totals["cross_batch"],
        "null_msg_id": decision.null_ids,
        "exact_copies": decision.exact_copies,
        "per_event_type": decision.per_type,
        "lookback_intervals": args.lookback_intervals,
        "previous_intervals": previous,
        "events_deduped_path": deduped_uri,
        "msgid_index_path": index_uri,
        "delta_versions": {name: c.version for name, c in commits.items()},
        "seconds": round(time.time() - started, 3),
        "phase_seconds": timings,
    }
    return finish_run(summary, output_root=root, app=APP, interval_id=interval_id,
                      explicit_path=args.summary_path)
