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
  ``events`` rows (same columns, ``spark_apps.schemas.EVENTS_SCHEMA``) with exactly one row per
  ``msg_id``. Committed second; a folder with ``_SUCCESS`` is complete.
* the run summary ``{root}/_runs/dedupe/interval={id}.json``.

How: the keep/drop decision is made on the narrow key columns (``msg_id``, ``stream``,
``stream_seq``, ``subject``, ``event_type``; one small shuffle by ``msg_id``), the index and the
counts come from that, and the full rows are written once, minus the dropped keys (an
anti-join, broadcast when the drop list is small): the wide rows are never shuffled. If two rows
share the whole key (the same stored message staged twice) or a key has a null ``stream`` /
``stream_seq``, the app falls back to ranking the full rows (same rule, one wide shuffle).
Shuffle partitions: one per 64 MiB of input (2..200) instead of Spark's 200.

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
``null_msg_id``, ``per_event_type`` (``{event_type: {"input", "output", "within_batch",
"cross_batch"}}``), ``previous_intervals``, ``seconds``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any, Sequence

try:  # a plain ``spark-submit spark_apps/dedupe_events.py`` puts only spark_apps/ on sys.path
    from spark_apps import common, schemas, snapshot_store
except ImportError:  # pragma: no cover - running from the folder without --py-files
    import os

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from spark_apps import common, schemas, snapshot_store

APP = "dedupe"
#: Row classes: kept, dropped as a copy within the interval, dropped as seen in an earlier one.
CLASSES = ("kept", "within_batch", "cross_batch")
#: Columns that identify one staged message row: its ID and where the stream stored it.
ROW_KEY = ("msg_id", "stream", "stream_seq")
#: Up to this many dropped rows, their keys (~100 bytes each) are broadcast to the anti-join.
BROADCAST_DROPS = 500_000
EVENTS_DIR = "events"
DEDUPED_DIR = "events_deduped"
INDEX_DIR = "msgid_index"
DEFAULT_LOOKBACK = 24
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
    common.add_interval_args(parser)
    args = parser.parse_args(argv)
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


def run(spark, args: argparse.Namespace) -> dict[str, Any]:
    """Deduplicate one interval and commit ``msgid_index``, ``events_deduped`` and the summary.

    :return: the run summary dict (also written as JSON).
    :raises FileNotFoundError: the interval's ``events`` folder is not committed.
    """
    from pyspark import StorageLevel
    from pyspark.sql import Window
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
    partitions = shuffle_partitions(spark, source)
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    log.info("interval %s: looking back at %d previous intervals%s; %d shuffle partitions", interval_id,
             len(previous), f" ({previous[0]} .. {previous[-1]})" if previous else "", partitions)

    events = (spark.read.schema(schemas.events_read_schema())
              .option("basePath", common.join(root, EVENTS_DIR))
              .parquet(source)
              .select(*schemas.EVENTS_COLUMNS))
    # Decide on the narrow key columns only (one small shuffle), then drop the losers from the
    # full rows with an anti-join (broadcast when the drop list is small), so the wide rows are
    # never shuffled.
    narrow = events.select(*ROW_KEY, "subject", "event_type")
    order = Window.partitionBy("msg_id").orderBy(
        F.col("stream_seq").asc_nulls_last(), F.col("stream").asc_nulls_last(), F.col("subject").asc_nulls_last()
    )
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
    try:
        rows = marked.groupBy("event_type", "_class").agg(
            F.count(F.lit(1)).alias("n"),
            F.sum(F.col("msg_id").isNull().cast("long")).alias("nulls"),
            # > 1: some row's key does not single it out (an exact repeat, or a null stream /
            # stream_seq, which an equi-join never matches)
            F.max(F.when(F.col("msg_id").isNotNull(),
                         F.when(F.col("stream").isNull() | F.col("stream_seq").isNull(), F.lit(2))
                         .otherwise(F.col("_copies")))).alias("copies"),
        ).collect()
        per_type: dict[str, dict[str, int]] = {}
        null_ids = 0
        exact_copies = False
        for row in rows:
            event_type = row["event_type"] if row["event_type"] is not None else "_none"  # sortable key
            entry = per_type.setdefault(event_type, {"input": 0, "output": 0, "within_batch": 0, "cross_batch": 0})
            entry["input"] += row["n"]
            entry["output" if row["_class"] == "kept" else row["_class"]] += row["n"]
            null_ids += row["nulls"] or 0
            exact_copies = exact_copies or (row["copies"] or 0) > 1
        totals = {k: sum(v[k] for v in per_type.values()) for k in ("input", "output", "within_batch", "cross_batch")}

        index_final = common.join(root, INDEX_DIR, f"interval={interval_id}")
        deduped_final = common.join(root, DEDUPED_DIR, f"interval={interval_id}")
        for final in (index_final, deduped_final):
            parent, name = final.rsplit("/", 1)
            common.cleanup_temp_dirs(spark, parent, name)
        index_tmp = common.temp_dir_for(index_final)
        deduped_tmp = common.temp_dir_for(deduped_final)

        (marked.where(F.col("msg_id").isNotNull()).select("msg_id").distinct()
            .coalesce(1).sortWithinPartitions("msg_id")
            .write.mode("overwrite").parquet(index_tmp))
        if exact_copies:
            # Some rows repeat (msg_id, stream, stream_seq) exactly (the same stored message staged
            # twice) or lack stream / stream_seq; the key cannot tell them apart, so rank the full
            # rows instead (one shuffle of the wide rows; same output rule).
            log.warning("interval %s: (msg_id, stream, stream_seq) does not identify every row (repeated or "
                        "null); deduplicating the full rows", interval_id)
            full = events.withColumn("_rank", F.row_number().over(order))
            if seen is not None:
                full = full.join(seen, "msg_id", "left_anti")
            kept = full.where((F.col("_rank") == 1) | F.col("msg_id").isNull()).select(*schemas.EVENTS_COLUMNS)
        else:
            drops = marked.where(F.col("_class") != "kept").select(*ROW_KEY)
            if totals["within_batch"] + totals["cross_batch"] <= BROADCAST_DROPS:
                drops = F.broadcast(drops)  # Spark cannot size a cached, filtered frame itself
            kept = events.join(drops, list(ROW_KEY), "left_anti").select(*schemas.EVENTS_COLUMNS)
        (kept.sortWithinPartitions(*schemas.EVENTS_PARTITION_COLUMNS, "stream_seq")
            .write.mode("overwrite")
            .partitionBy(*schemas.EVENTS_PARTITION_COLUMNS)
            .parquet(deduped_tmp))
    finally:
        marked.unpersist()
    common.commit_dir(spark, index_tmp, index_final)
    common.commit_dir(spark, deduped_tmp, deduped_final)
    log.info("committed %s (%d rows; %d within-batch and %d cross-batch duplicates dropped)",
             deduped_final, totals["output"], totals["within_batch"], totals["cross_batch"])

    summary = {
        "app": APP,
        "interval_id": interval_id,
        "root": root,
        "input": totals["input"],
        "output": totals["output"],
        "within_batch_duplicates": totals["within_batch"],
        "cross_batch_duplicates": totals["cross_batch"],
        "duplicates": totals["within_batch"] + totals["cross_batch"],
        "null_msg_id": null_ids,
        "per_event_type": dict(sorted(per_type.items())),
        "lookback_intervals": args.lookback_intervals,
        "previous_intervals": previous,
        "events_deduped_path": deduped_final,
        "msgid_index_path": index_final,
        "seconds": round(time.time() - started, 3),
    }
    return common.finish_run(spark, summary, output_root=root, app=APP, interval_id=interval_id,
                             explicit_path=args.summary_path)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Entry point (``common.run_app``): parse ``argv`` (default ``sys.argv[1:]``), run, stop
    Spark; return the summary. Exceptions propagate (spark-submit exits non-zero)."""
    return common.run_app("plgd-dedupe-events", parse_args, run, argv)


if __name__ == "__main__":
    main()
