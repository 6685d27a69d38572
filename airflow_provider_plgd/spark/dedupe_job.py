"""The dedupe job: the ``events`` of one interval -> ``msgid_index`` + ``events_deduped``.

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
from urllib.parse import unquote

from airflow_provider_plgd import storage
from airflow_provider_plgd.spark import folders, snapshot_store
from airflow_provider_plgd.spark.summary import finish_run
from airflow_provider_plgd.spark.task_plan import plan_tasks

APP = "dedupe"
EVENTS_DIR = "events"
DEDUPED_DIR = "events_deduped"
INDEX_DIR = "msgid_index"
DEFAULT_LOOKBACK = 24
log = logging.getLogger("plgd.spark.dedupe")


def previous_intervals(root: str, interval_id: str, lookback: int) -> list[str]:
    """The last ``lookback`` committed ``events_deduped`` intervals of the same kind as
    ``interval_id`` that sort before it (oldest first)."""
    kind = snapshot_store.interval_kind(interval_id)
    done = folders.committed_intervals(storage.join_path(root, DEDUPED_DIR))
    before = [i for i in done if i < interval_id and snapshot_store.interval_kind(i) == kind]
    return before[-lookback:] if lookback else []


def _partition_value(rel: str, column: str) -> str | None:
    """The Hive partition value of ``column`` in the relative path ``rel`` (unescaped), or None."""
    for part in rel.split("/")[:-1]:
        name, sep, value = part.partition("=")
        if sep and name == column:
            return unquote(value)
    return None


def read_key_columns(source: str, files: list[tuple[str, int, int]]):
    """The :data:`dedupe_decision.KEY_COLUMNS` of the listed ``events`` files (in list order, rows
    in file order), with pyarrow; ``event_type`` from the Hive folder names. Row ``i`` of the
    result is row ``i - offset[f]`` of file ``f``.

    :return: ``(table, offsets)``: ``offsets[f]`` = position of file ``f``'s first row.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("msg_id", pa.string()), ("stream", pa.string()), ("stream_seq", pa.int64()),
                        ("subject", pa.string()), ("event_type", pa.string())])
    fs, base = storage.to_fs(source)
    base = base.rstrip("/")
    parts, offsets, offset = [], [], 0
    for rel, _, _ in files:
        with fs.open(f"{base}/{rel}", "rb") as fh:
            table = pq.read_table(fh, columns=["msg_id", "stream", "stream_seq", "subject"])
        event_type = pa.array([_partition_value(rel, "event_type")] * table.num_rows, pa.string())
        parts.append(table.append_column("event_type", event_type).cast(schema))
        offsets.append(offset)
        offset += table.num_rows
    return (pa.concat_tables(parts) if parts else schema.empty_table()), offsets


def _previous_id_arrays(root: str, intervals: Iterable[str]):
    """Yield, one interval at a time, the ``msg_id`` arrays of the previous intervals: their
    ``msgid_index`` files, else the ``msg_id`` column of their ``events_deduped`` files (both from
    the folder's manifest), with pyarrow."""
    import pyarrow.parquet as pq

    indexed = set(folders.committed_intervals(storage.join_path(root, INDEX_DIR)))
    for interval in intervals:
        folder = storage.join_path(root, INDEX_DIR if interval in indexed else DEDUPED_DIR, f"interval={interval}")
        if folders.read_manifest(folder) is None:
            continue
        fs, base = storage.to_fs(folder)
        for rel, _, _ in folders.folder_files(folder):
            with fs.open(f"{base.rstrip('/')}/{rel}", "rb") as fh:
                yield pq.read_table(fh, columns=["msg_id"]).column("msg_id")


def decide_on_driver(root: str, source: str, files: list[tuple[str, int, int]], previous: list[str]):
    """Decide with :func:`dedupe_decision.decide` in this (driver) process.

    :return: ``(Decision, drops)``: ``drops`` = ``{relative file path: [row positions to drop]}``.
    """
    import pyarrow.compute as pc

    from airflow_provider_plgd.spark import dedupe_decision

    keys, offsets = read_key_columns(source, files)
    current = pc.unique(keys.column("msg_id").drop_null())
    seen = dedupe_decision.seen_ids(current, _previous_id_arrays(root, previous)) if previous else None
    decision = dedupe_decision.decide(keys, seen)
    drops: dict[str, list[int]] = {}
    f = 0
    for row in decision.dropped_rows.to_pylist():  # ascending, like the offsets
        while f + 1 < len(offsets) and offsets[f + 1] <= row:
            f += 1
        drops.setdefault(files[f][0], []).append(row - offsets[f])
    return decision, drops


def make_filter_task(source: str, target: str, names: dict[str, str], drops: dict[str, list[int]]):
    """Build the ``RDD.mapPartitions`` function that copies ``events`` files minus dropped rows.

    :param source: the committed ``events/interval=..`` folder (fsspec URL or path).
    :param target: the ``events_deduped/interval=..`` folder.
    :param names: ``{source relative path: target relative path}`` (same partition folders, file
        names of this run: ``folders.data_file_name``).
    :param drops: ``{source relative path: [row positions]}``: the rows to leave out.
    :return: a function of an iterator of file lists (:func:`task_plan.plan_tasks` tasks of
        ``folders.folder_files`` units) that yields ``{"path", "rows"}`` per written file. A file
        without dropped rows is copied byte for byte; any other is read and rewritten with
        pyarrow (``folders.write_parquet_file``: snappy, ``TIMESTAMP_MICROS``), in row order.
    """

    def task(file_lists):
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        fs, src = storage.to_fs(source)
        _, dst = storage.to_fs(target)
        src, dst = src.rstrip("/"), dst.rstrip("/")
        for files in file_lists:
            for rel, _, _ in files:
                out = f"{dst}/{names[rel]}"
                gone = drops.get(rel)
                if gone:
                    with fs.open(f"{src}/{rel}", "rb") as fh:
                        pf = pq.ParquetFile(fh)
                        table = pf.read()
                        row_group = max((pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)),
                                        default=1)
                    keep = pc.invert(pc.is_in(pa.array(range(table.num_rows), pa.int64()),
                                              value_set=pa.array(gone, pa.int64())))
                    table = table.filter(keep)
                    folders.write_parquet_file(fs, out, table, row_group_size=row_group)
                    yield {"path": names[rel], "rows": table.num_rows}
                    continue
                with fs.open(f"{src}/{rel}", "rb") as fh:
                    rows = pq.ParquetFile(fh).metadata.num_rows
                fs.makedirs(posixpath.dirname(out), exist_ok=True)
                fs.copy(f"{src}/{rel}", out)
                yield {"path": names[rel], "rows": rows}

    return task


def filter_files(spark, source: str, target: str, files: list[tuple[str, int, int]],
                 drops: dict[str, list[int]], write_id: str) -> list[dict[str, Any]]:
    """Write ``source``'s ``files`` minus the ``drops`` rows into ``target`` (:func:`make_filter_task`),
    in a few Spark tasks balanced by rows (:func:`task_plan.plan_tasks`).

    :return: ``[{"path" (relative), "rows"}]``, one per written file (files left empty are
        written too, so the folder keeps every partition's schema).
    """
    names = {rel: posixpath.join(posixpath.dirname(rel), folders.data_file_name(i, write_id))
             for i, (rel, _, _) in enumerate(files)}
    tasks = plan_tasks(files, spark.sparkContext.defaultParallelism)
    if not tasks:
        return []
    task = make_filter_task(source, target, names, drops)
    return spark.sparkContext.parallelize(tasks, len(tasks)).mapPartitions(task).collect()


def run(spark, args: argparse.Namespace) -> dict[str, Any]:
    """Deduplicate one interval and commit ``msgid_index``, ``events_deduped`` and the summary.

    :return: the run summary dict (also written as JSON).
    :raises FileNotFoundError: the interval's ``events`` folder is not committed.
    :raises RuntimeError: the written rows do not match the decision (nothing is committed then).
    :raises OSError: another run of the interval committed meanwhile (``folders.commit_folder``).
    """
    import pyarrow as pa

    from airflow_provider_plgd import staging

    started = time.time()
    interval_id = staging.validate_partition_value(args.interval_id, "interval_id")
    root = str(args.root).rstrip("/")
    source = storage.join_path(root, EVENTS_DIR, f"interval={interval_id}")
    if folders.read_manifest(source) is None:
        raise FileNotFoundError(
            f"events of interval {interval_id} are not committed ({source}/{folders.MANIFEST_NAME} missing); "
            "run decode_events first"
        )
    if args.previous_intervals is not None:
        previous = [staging.validate_partition_value(i, "previous interval") for i in args.previous_intervals
                    if i != interval_id]
    else:
        previous = previous_intervals(root, interval_id, args.lookback_intervals)
    files = folders.folder_files(source)
    log.info("interval %s: %d rows in %d files; looking back at %d previous intervals%s",
             interval_id, sum(f[2] for f in files), len(files), len(previous),
             f" ({previous[0]} .. {previous[-1]})" if previous else "")

    index_dir = storage.join_path(root, INDEX_DIR, f"interval={interval_id}")
    deduped_dir = storage.join_path(root, DEDUPED_DIR, f"interval={interval_id}")
    write_id = folders.new_write_id()
    timings: dict[str, float] = {"plan": round(time.time() - started, 3)}

    phase = time.time()
    decision, drops = decide_on_driver(root, source, files, previous)
    totals = decision.totals()
    index_name = folders.data_file_name(0, write_id)
    fs, index_path = storage.to_fs(index_dir)
    folders.write_parquet_file(fs, f"{index_path.rstrip('/')}/{index_name}", pa.table({"msg_id": decision.index}),
                               row_group_size=1 << 20)
    timings["decide"] = round(time.time() - phase, 3)

    phase = time.time()
    # copy the decoded files, minus the dropped rows, with pyarrow in Python tasks (the wide rows
    # never enter the JVM; a file without drops is copied byte for byte)
    written = filter_files(spark, source, deduped_dir, files, drops, write_id)
    kept_rows = sum(f["rows"] for f in written)
    if kept_rows != totals["output"]:
        raise RuntimeError(
            f"interval {interval_id}: the filtered files hold {kept_rows} rows, the decision kept "
            f"{totals['output']}; nothing committed"
        )
    timings["write"] = round(time.time() - phase, 3)
    folders.commit_folder(index_dir, [{"path": index_name, "rows": len(decision.index)}], table=INDEX_DIR,
                          interval_id=interval_id, write_id=write_id, started=started)
    folders.commit_folder(deduped_dir, written, table=DEDUPED_DIR, interval_id=interval_id,
                          write_id=write_id, started=started)
    log.info("committed %s (%d rows; %d within-batch and %d cross-batch duplicates dropped; phase seconds %s)",
             deduped_dir, totals["output"], totals["within_batch"], totals["cross_batch"], timings)

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
        "events_deduped_path": deduped_dir,
        "msgid_index_path": index_dir,
        "seconds": round(time.time() - started, 3),
        "phase_seconds": timings,
    }
    return finish_run(summary, output_root=root, app=APP, interval_id=interval_id,
                      explicit_path=args.summary_path)
