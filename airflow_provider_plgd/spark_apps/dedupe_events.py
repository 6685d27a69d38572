"""Spark application: the decoded ``events`` of one interval -> ``events_deduped`` (one row per message ID).

Usage (``--py-files`` from ``airflow_provider_plgd.spark_deps.build_py_files_zip``)::

    spark-submit --master local[2] --py-files plgd_py_files.zip spark_apps/dedupe_events.py \\
        --root /data/plgd --interval-id 20260101T000000Z_20260101T010000Z \\
        [--lookback-intervals 24] [--previous-intervals ID,ID,...] [--summary-path ...]

Input: ``{root}/events/interval={id}/`` (committed by ``decode_events``; ``_SUCCESS`` present).
Output, each written to a hidden temp folder and swapped in (``common.commit_dir``):

* ``{root}/msgid_index/interval={id}/part-*.parquet``: one column ``msg_id``, every distinct
  message ID of the interval (kept or dropped), sorted. The compact index that later intervals
  look back at. Committed first.
* ``{root}/events_deduped/interval={id}/owner_id=../event_type=../date=../part-*.parquet``: the
  ``events`` rows (same columns, ``airflow_provider_plgd.spark.schemas.EVENTS_SCHEMA``) with exactly one row per
  ``msg_id``, plus ``_manifest.json`` (files and rows; not on the Spark fallback path).
  Committed second; a folder with ``_SUCCESS`` is complete.
* the run summary ``{root}/_runs/dedupe/interval={id}.json``.

How: the keep/drop decision is made on the key columns (``msg_id``, ``stream``,
``stream_seq``, ``subject``, ``event_type``): on the driver with pyarrow
(:mod:`airflow_provider_plgd.spark.dedupe_decision`) for intervals of up to ``--driver-decide-rows`` rows (the
``events`` folder's ``_manifest.json`` gives the count), else with Spark windows (shuffle
partitions: one per 64 MiB of input, 2..200). The index and the counts come from the decision;
the rows are written by Python tasks that copy each decoded file, minus its dropped rows
(:func:`make_filter_task`; a file without drops is copied byte for byte): the wide rows never
become JVM rows. If two rows share the whole key (the same stored message staged twice), a key
has a null ``stream`` / ``stream_seq``, or the folder's files differ from its manifest, the app
falls back to Spark (ranking the full rows: same rule, one wide shuffle). ``docs/snapshots.md``
has the measurements.

The message ID is the ``msg_id`` column that decode computed with
``airflow_provider_plgd.plgd.msgid.message_id`` (the one home of the ARCHITECTURE.md rule: the
``Nats-Msg-Id`` header when present, else derived). Rows without a ``msg_id`` (none are expected)
are all kept and counted.

Rules
-----
* **Within the batch**, of the rows sharing a ``msg_id`` the one with the lowest ``stream_seq``
  is kept (ties: ``stream``, then ``subject``): a ``row_number()`` window, deterministic, unlike
  ``dropDuplicates``.
* **Across batches**, a ``msg_id`` that appears in the index of one of the previous
  ``--lookback-intervals`` intervals (default 24, i.e. a day of hourly runs: covers JetStream
  redelivery and publisher retries) is dropped here, all its copies. Only the ``msg_id`` indexes
  of those intervals are read, never the history of events.
* **Previous intervals** are, by default, the committed ``events_deduped`` intervals that sort
  before this one (interval IDs sort by start time: ``YYYYMMDDTHHMMSSZ_...``; sequence-range IDs
  ``seq-``/``durable-`` sort by sequence and are only compared with IDs of the same kind), the
  last N of them. ``--previous-intervals`` names them explicitly instead (comma-separated). An
  interval without an index (written before the index existed) is looked up through the
  ``msg_id`` column of its ``events_deduped`` folder.
* **Reruns**: the interval itself is never part of its lookback, and both outputs are replaced,
  so a rerun produces the same rows. Intervals must be deduplicated in order (the DAG runs with
  ``max_active_runs=1``): an interval deduplicated before an earlier one cannot see the earlier
  one's messages.

Summary keys: ``input``, ``output``, ``within_batch_duplicates``, ``cross_batch_duplicates``,
``null_msg_id``, ``decided_on`` (``driver``/``spark``), ``method`` (``files``/``spark``),
``phase_seconds``, ``per_event_type`` (``{event_type: {"input", "output", "within_batch",
"cross_batch"}}``), ``previous_intervals``, ``seconds``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any, Sequence

try:  # a plain ``spark-submit spark_apps/dedupe_events.py`` puts only spark_apps/ on sys.path
    from airflow_provider_plgd.spark import common, schemas, snapshot_store
except ImportError:  # pragma: no cover - running from the folder without --py-files
    import os

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from airflow_provider_plgd.spark import common, schemas, snapshot_store

APP = "dedupe"
#: Columns that identify one staged message row: its ID and where the stream stored it.
ROW_KEY = ("msg_id", "stream", "stream_seq")
#: Up to this many dropped rows, their keys (~100 bytes each) are broadcast to the anti-join.
BROADCAST_DROPS = 500_000
EVENTS_DIR = "events"
DEDUPED_DIR = "events_deduped"
INDEX_DIR = "msgid_index"
DEFAULT_LOOKBACK = 24
#: Intervals up to this many rows are decided on the driver (``--driver-decide-rows``).
DEFAULT_DRIVER_DECIDE_ROWS = 2_000_000
log = logging.getLogger("plgd.spark.dedupe")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line (see the module docstring).

    :raises SystemExit: bad arguments (argparse), including a negative lookback.
    """
    parser = argparse.ArgumentParser(
        prog="dedupe_events", description="Deduplicate one interval of plgd events by message ID."
    )
    parser.add_argument("--root", required=True,
                        help="storage root holding events/, events_deduped/, msgid_index/, _runs/ (path or URL)")
    parser.add_argument("--lookback-intervals", type=int, default=DEFAULT_LOOKBACK,
                        help=f"previous intervals whose message IDs are dropped here (default {DEFAULT_LOOKBACK})")
    parser.add_argument("--previous-intervals", type=common.name_list, default=None,
                        help="explicit comma-separated previous interval IDs (default: the last "
                             "--lookback-intervals committed events_deduped intervals before this one)")
    parser.add_argument("--driver-decide-rows", type=int, default=DEFAULT_DRIVER_DECIDE_ROWS,
                        help="intervals with up to this many rows are decided on the driver with pyarrow "
                             "(~250 bytes of driver memory per row), larger ones with Spark "
                             f"(default {DEFAULT_DRIVER_DECIDE_ROWS:,}; 0 = always Spark)")
    common.add_interval_args(parser)
    args = parser.parse_args(argv)
    if args.driver_decide_rows < 0:
        parser.error(f"--driver-decide-rows must be >= 0, got {args.driver_decide_rows}")
    if args.lookback_intervals < 0:
        parser.error(f"--lookback-intervals must be >= 0, got {args.lookback_intervals}")
    return args


def previous_intervals(spark, root: str, interval_id: str, lookback: int) -> list[str]:
    """The last ``lookback`` committed ``events_deduped`` intervals of the same kind as
    ``interval_id`` that sort before it (oldest first)."""
    kind = snapshot_store.interval_kind(interval_id)
    done = snapshot_store.list_committed_intervals(spark, common.join(root, DEDUPED_DIR))
    before = [i for i in done if i < interval_id and snapshot_store.interval_kind(i) == kind]
    return before[-lookback:] if lookback else []


def shuffle_partitions(spark, path: str, *, bytes_per_partition: int = 64 * 1024 * 1024) -> int:
    """Shuffle partitions for an input of the size of ``path`` (Hadoop content summary): one per
    ``bytes_per_partition`` of Parquet, at least 2, at most 200 (Spark's default). Spark's default
    of 200 makes small hourly batches pay for hundreds of near-empty tasks."""
    fs, jpath = common.hadoop_path(spark, path)
    size = fs.getContentSummary(jpath).getLength() if fs.exists(jpath) else 0
    return max(2, min(200, -(-int(size) // bytes_per_partition)))


def make_filter_task(source: str, target: str, drops: dict[str, list[int]]):
    """Build the ``RDD.mapPartitions`` function that copies ``events`` files minus dropped rows.

    :param source: the committed ``events/interval=..`` folder (fsspec URL or path).
    :param target: the temp ``events_deduped`` folder; each file keeps its relative path
        (``owner_id=../event_type=../date=../part-*.parquet``) and its row order.
    :param drops: ``{stream: [stream_seq, ...]}``: the rows to leave out.
    :return: a function of an iterator of file lists (:func:`common.plan_tasks` tasks of
        :func:`common.folder_files` units) that yields ``{"path", "rows"}`` per written file. A file
        without dropped rows is copied byte for byte; any other is read and rewritten with
        pyarrow (``common.write_parquet_file``: snappy, ``TIMESTAMP_MICROS``).
    """

    def task(file_lists):
        import fsspec
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        fs, src = fsspec.core.url_to_fs(source)
        _, dst = fsspec.core.url_to_fs(target)
        src, dst = src.rstrip("/"), dst.rstrip("/")
        value_sets = {stream: pa.array(seqs, pa.int64()) for stream, seqs in drops.items()}
        for files in file_lists:
            for rel, _, _ in files:
                with fs.open(f"{src}/{rel}", "rb") as fh:
                    pf = pq.ParquetFile(fh)
                    if value_sets:
                        keys = pf.read(columns=["stream", "stream_seq"])
                        dropped = None
                        for stream, seqs in value_sets.items():
                            hit = pc.and_(pc.equal(keys.column("stream"), stream),
                                          pc.is_in(keys.column("stream_seq"), value_set=seqs))
                            dropped = hit if dropped is None else pc.or_(dropped, hit)
                        dropped = pc.fill_null(dropped, False)
                        n_dropped = pc.sum(dropped.cast(pa.int64())).as_py() or 0
                    else:
                        n_dropped = 0
                    if n_dropped:
                        table = pf.read().filter(pc.invert(dropped))
                        row_group = max((pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)),
                                        default=1)
                        common.write_parquet_file(fs, f"{dst}/{rel}", table, row_group_size=row_group)
                        yield {"path": rel, "rows": table.num_rows}
                        continue
                    rows = pf.metadata.num_rows
                fs.makedirs(f"{dst}/{rel}".rsplit("/", 1)[0], exist_ok=True)
                fs.copy(f"{src}/{rel}", f"{dst}/{rel}")
                yield {"path": rel, "rows": rows}

    return task


def filter_files(spark, source: str, target: str, files: list[tuple[str, int, int]],
                 drops: dict[str, list[int]]) -> list[dict[str, Any]]:
    """Write ``source``'s ``files`` (:func:`common.folder_files`) minus the ``drops`` rows into ``target``
    (:func:`make_filter_task`), in a few Spark tasks balanced by rows (:func:`common.plan_tasks`).

    :return: ``[{"path" (relative), "rows"}]``, one per written file (files left empty are
        written too, so the folder keeps every partition's schema).
    """
    tasks = common.plan_tasks(files, spark.sparkContext.defaultParallelism)
    if not tasks:
        return []
    task = make_filter_task(source, target, drops)
    return spark.sparkContext.parallelize(tasks, len(tasks)).mapPartitions(task).collect()


def _seen_ids(spark, root: str, intervals: list[str]):
    """DataFrame ``msg_id`` (distinct) of the given previous intervals, from their index (or their
    ``events_deduped`` ``msg_id`` column when the index is missing); None when there is none."""
    from pyspark.sql import functions as F

    index_root = common.join(root, INDEX_DIR)
    indexed = set(snapshot_store.list_committed_intervals(spark, index_root))
    index_paths = [common.join(index_root, f"interval={i}") for i in intervals if i in indexed]
    fallback = [common.join(root, DEDUPED_DIR, f"interval={i}") for i in intervals if i not in indexed]
    frames = []
    if index_paths:
        frames.append(spark.read.schema("msg_id string").parquet(*index_paths).select("msg_id"))
    existing = [p for p in fallback if common.path_exists(spark, p)]
    if existing:
        frames.append(spark.read.schema(schemas.events_read_schema())
                      .option("basePath", common.join(root, DEDUPED_DIR))
                      .parquet(*existing).select("msg_id"))
    if not frames:
        return None
    seen = frames[0]
    for frame in frames[1:]:
        seen = seen.unionByName(frame)
    return seen.where(F.col("msg_id").isNotNull()).distinct().withColumn("_seen", F.lit(True))


def _read_key_columns(source: str, files: list[tuple[str, int, int]]):
    """The :data:`dedupe_decision.KEY_COLUMNS` of the listed ``events`` files, with pyarrow
    (``event_type`` from the Hive folder names)."""
    import pyarrow as pa

    from airflow_provider_plgd.spark.dedupe_decision import KEY_COLUMNS

    keys = common.read_events_files([common.join(source, rel) for rel, _, _ in files], KEY_COLUMNS)
    schema = pa.schema([("msg_id", pa.string()), ("stream", pa.string()), ("stream_seq", pa.int64()),
                        ("subject", pa.string()), ("event_type", pa.string())])
    return keys.cast(schema) if keys is not None else schema.empty_table()


def _previous_id_arrays(spark, root: str, intervals: list[str]):
    """Yield, one interval at a time, the ``msg_id`` arrays of the previous intervals (their
    ``msgid_index``, else the ``msg_id`` column of their ``events_deduped`` folder), with pyarrow."""
    import fsspec
    import pyarrow.dataset as ds

    index_root = common.join(root, INDEX_DIR)
    indexed = set(snapshot_store.list_committed_intervals(spark, index_root))
    for interval in intervals:
        folder = (common.join(index_root, f"interval={interval}") if interval in indexed
                  else common.join(root, DEDUPED_DIR, f"interval={interval}"))
        fs, path = fsspec.core.url_to_fs(folder)
        if not fs.exists(path):
            continue
        dataset = ds.dataset(path, filesystem=fs, format="parquet", partitioning="hive")
        yield dataset.to_table(columns=["msg_id"]).column("msg_id")


def decide_on_driver(spark, root: str, source: str, files, previous: list[str], index_tmp: str):
    """Decide with :func:`airflow_provider_plgd.spark.dedupe_decision.decide` in this (driver) process and write the
    ``msgid_index`` temp folder (one sorted file, ``_SUCCESS``). Returns the ``Decision``."""
    import fsspec
    import pyarrow as pa
    import pyarrow.compute as pc

    from airflow_provider_plgd.spark import dedupe_decision

    keys = _read_key_columns(source, files)
    current = pc.unique(keys.column("msg_id").drop_null())  # an Array
    seen = dedupe_decision.seen_ids(current, _previous_id_arrays(spark, root, previous)) if previous else None
    decision = dedupe_decision.decide(keys, seen)
    fs, path = fsspec.core.url_to_fs(index_tmp)
    common.write_parquet_file(fs, f"{path.rstrip('/')}/part-00000.parquet",
                              pa.table({"msg_id": decision.index}), row_group_size=1 << 20)
    common.write_text(spark, common.join(index_tmp, "_SUCCESS"), "")
    return decision


def _keep_order():
    """The Spark window of the keep rule: per ``msg_id``, lowest ``stream_seq`` first (ties:
    ``stream``, then ``subject``; nulls last), as in :func:`airflow_provider_plgd.spark.dedupe_decision.decide`."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    return Window.partitionBy("msg_id").orderBy(
        F.col("stream_seq").asc_nulls_last(), F.col("stream").asc_nulls_last(), F.col("subject").asc_nulls_last())


def decide_with_spark(spark, root: str, events, previous: list[str], index_tmp: str):
    """Decide with Spark (windows over the key columns; for intervals too large for the driver) and
    write the ``msgid_index`` temp folder. Returns ``(Decision, marked)``: ``Decision.drops`` is
    filled only up to :data:`BROADCAST_DROPS` rows; ``marked`` (persisted; the caller unpersists
    it) has the key columns plus ``_class``."""
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from airflow_provider_plgd.spark import dedupe_decision

    narrow = events.select(*ROW_KEY, "subject", "event_type")
    order = _keep_order()
    marked = (narrow
              .withColumn("_rank", F.when(F.col("msg_id").isNull(), F.lit(1)).otherwise(F.row_number().over(order)))
              .withColumn("_copies", F.count(F.lit(1)).over(Window.partitionBy(*ROW_KEY))))
    seen = _seen_ids(spark, root, previous)
    if seen is not None:
        marked = marked.join(seen, "msg_id", "left")
    else:
        marked = marked.withColumn("_seen", F.lit(None).cast("boolean"))
    marked = marked.withColumn(
        "_class",
        F.when(F.col("_seen"), F.lit("cross_batch"))
        .when(F.col("_rank") > 1, F.lit("within_batch"))
        .otherwise(F.lit("kept")),
    ).persist(StorageLevel.MEMORY_AND_DISK)
    rows = marked.groupBy("event_type", "_class").agg(
        F.count(F.lit(1)).alias("n"),
        F.sum(F.col("msg_id").isNull().cast("long")).alias("nulls"),
        # > 1: some row's key does not single it out (an exact repeat, or a null stream /
        # stream_seq, which an equi-join never matches)
        F.max(F.when(F.col("msg_id").isNotNull(),
                     F.when(F.col("stream").isNull() | F.col("stream_seq").isNull(), F.lit(2))
                     .otherwise(F.col("_copies")))).alias("copies"),
    ).collect()
    decision = dedupe_decision.Decision()
    for row in rows:
        dedupe_decision.add_count(decision.per_type, row["event_type"], row["_class"], row["n"])
        decision.null_ids += row["nulls"] or 0
        decision.exact_copies = decision.exact_copies or (row["copies"] or 0) > 1
    decision.per_type = dict(sorted(decision.per_type.items()))
    (marked.where(F.col("msg_id").isNotNull()).select("msg_id").distinct()
        .coalesce(1).sortWithinPartitions("msg_id")
        .write.mode("overwrite").parquet(index_tmp))
    totals = decision.totals()
    if not decision.exact_copies and totals["within_batch"] + totals["cross_batch"] <= BROADCAST_DROPS:
        for row in marked.where(F.col("_class") != "kept").select("stream", "stream_seq").collect():
            decision.drops.setdefault(row["stream"], []).append(int(row["stream_seq"]))
    return decision, marked


def run(spark, args: argparse.Namespace) -> dict[str, Any]:
    """Deduplicate one interval and commit ``msgid_index``, ``events_deduped`` and the summary.

    :return: the run summary dict (also written as JSON).
    :raises FileNotFoundError: the interval's ``events`` folder is not committed.
    :raises RuntimeError: the written rows do not match the decision (nothing is committed then).
    """
    from pyspark.sql import functions as F

    from airflow_provider_plgd import staging

    started = time.time()
    interval_id = staging.validate_partition_value(args.interval_id, "interval_id")
    root = str(args.root).rstrip("/")
    source = common.join(root, EVENTS_DIR, f"interval={interval_id}")
    if not common.path_exists(spark, common.join(source, "_SUCCESS")):
        raise FileNotFoundError(
            f"events of interval {interval_id} are not committed ({source}/_SUCCESS missing); run decode_events first"
        )
    if args.previous_intervals is not None:
        previous = [staging.validate_partition_value(i, "previous interval") for i in args.previous_intervals
                    if i != interval_id]
    else:
        previous = previous_intervals(spark, root, interval_id, args.lookback_intervals)
    files, rows_known = common.folder_files(spark, source)
    total_rows = sum(f[2] for f in files)
    on_driver = rows_known and total_rows <= args.driver_decide_rows
    log.info("interval %s: %d rows in %d files; looking back at %d previous intervals%s; deciding %s",
             interval_id, total_rows if rows_known else -1, len(files), len(previous),
             f" ({previous[0]} .. {previous[-1]})" if previous else "",
             "on the driver (pyarrow)" if on_driver else "with Spark")

    index_final = common.join(root, INDEX_DIR, f"interval={interval_id}")
    deduped_final = common.join(root, DEDUPED_DIR, f"interval={interval_id}")
    for final in (index_final, deduped_final):
        parent, name = final.rsplit("/", 1)
        common.cleanup_temp_dirs(spark, parent, name)
    index_tmp = common.temp_dir_for(index_final)
    deduped_tmp = common.temp_dir_for(deduped_final)

    timings: dict[str, float] = {"plan": round(time.time() - started, 3)}
    phase = time.time()
    events = None

    def read_events():  # the decoded rows as a DataFrame: only the Spark paths need it
        nonlocal events
        if events is None:
            events = (spark.read.schema(schemas.events_read_schema())
                      .option("basePath", common.join(root, EVENTS_DIR))
                      .parquet(source)
                      .select(*schemas.EVENTS_COLUMNS))
        return events

    marked = None
    try:
        if on_driver:
            decision = decide_on_driver(spark, root, source, files, previous, index_tmp)
        else:
            partitions = shuffle_partitions(spark, source)
            spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
            decision, marked = decide_with_spark(spark, root, read_events(), previous, index_tmp)
        totals = decision.totals()
        timings["decide"] = round(time.time() - phase, 3)
        phase = time.time()
        drop_count = totals["within_batch"] + totals["cross_batch"]
        method = "files" if not decision.exact_copies and (on_driver or drop_count <= BROADCAST_DROPS) else "spark"
        if method == "files":
            # The common case: copy the decoded files, minus the dropped rows, with pyarrow in
            # Python tasks (the wide rows never enter the JVM; a file without drops is copied
            # byte for byte).
            written = filter_files(spark, source, deduped_tmp, files, decision.drops)
            kept_rows = sum(f["rows"] for f in written)
            if kept_rows != totals["output"]:
                common.delete_path(spark, deduped_tmp)
                raise RuntimeError(
                    f"interval {interval_id}: the filtered files hold {kept_rows} rows, the decision kept "
                    f"{totals['output']}; nothing committed"
                )
            common.finish_folder(spark, deduped_tmp, written, DEDUPED_DIR, interval_id)
        else:
            if decision.exact_copies:
                # Some rows repeat (msg_id, stream, stream_seq) exactly (the same stored message
                # staged twice) or lack stream / stream_seq; the key cannot tell them apart, so
                # rank the full rows instead (one shuffle of the wide rows; same output rule).
                log.warning("interval %s: (msg_id, stream, stream_seq) does not identify every row (repeated "
                            "or null); deduplicating the full rows", interval_id)
                full = read_events().withColumn("_rank", F.row_number().over(_keep_order()))
                seen = _seen_ids(spark, root, previous)
                if seen is not None:
                    full = full.join(seen, "msg_id", "left_anti")
                kept = full.where((F.col("_rank") == 1) | F.col("msg_id").isNull()).select(*schemas.EVENTS_COLUMNS)
            else:  # more drops than the tasks should hold in memory: a Spark anti-join
                kept = read_events().join(marked.where(F.col("_class") != "kept").select(*ROW_KEY), list(ROW_KEY),
                                   "left_anti").select(*schemas.EVENTS_COLUMNS)
            (kept.sortWithinPartitions(*schemas.EVENTS_PARTITION_COLUMNS, "stream_seq")
                .write.mode("overwrite")
                .partitionBy(*schemas.EVENTS_PARTITION_COLUMNS)
                .parquet(deduped_tmp))
        timings["write"] = round(time.time() - phase, 3)
    finally:
        if marked is not None:
            marked.unpersist()
    common.commit_dir(spark, index_tmp, index_final)
    common.commit_dir(spark, deduped_tmp, deduped_final)
    log.info("committed %s (%d rows; %d within-batch and %d cross-batch duplicates dropped; phase seconds %s)",
             deduped_final, totals["output"], totals["within_batch"], totals["cross_batch"], timings)

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
        "per_event_type": decision.per_type,
        "lookback_intervals": args.lookback_intervals,
        "previous_intervals": previous,
        "events_deduped_path": deduped_final,
        "msgid_index_path": index_final,
        "decided_on": "driver" if on_driver else "spark",
        "method": method,
        "seconds": round(time.time() - started, 3),
        "phase_seconds": timings,
    }
    return common.finish_run(spark, summary, output_root=root, app=APP, interval_id=interval_id,
                             explicit_path=args.summary_path)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Entry point (``common.run_app``): parse ``argv`` (default ``sys.argv[1:]``), run, stop
    Spark; return the summary. Exceptions propagate (spark-submit exits non-zero)."""
    return common.run_app("plgd-dedupe-events", parse_args, run, argv)


if __name__ == "__main__":
    main()
