"""Spark application: committed staging batches of one interval -> ``events`` + ``quarantine``.

Usage (``--py-files`` from ``airflow_provider_plgd.spark_deps.build_py_files_zip``)::

    spark-submit --master local[2] --py-files plgd_py_files.zip spark_apps/decode_events.py \\
        --staging-root /data/plgd --stream EVENTS --interval-id 20260101T000000Z_20260101T010000Z \\
        --output-root /data/plgd [--owners o1,o2] [--event-types resourcechanged,...] \\
        [--max-content-bytes 4194304] [--summary-path /data/plgd/_runs/decode/interval=....json]

``--max-content-bytes`` (default 4 MiB, ``codec.DEFAULT_MAX_DECODED_BYTES``) caps the decoded
(snappy-decompressed) size of each event and so of its resource content; a payload over it is
quarantined as ``content_too_large`` before anything is decompressed (decode bombs).

Steps:

1. With ``--ledger`` (the ETL DAG): exactly the batches the interval ledger names
   (:func:`ledger_manifests`; a missing or changed batch fails the run before anything is
   written). Without it: ``airflow_provider_plgd.staging.list_committed`` lists the committed
   batch folders of the interval (those with ``_manifest.json``). Only the files the manifests
   list are read.
   ``--reader arrow`` (default): the driver reads the footers and packs the row groups into a few
   tasks of decreasing size (:func:`common.plan_tasks`); each task reads its row groups with pyarrow.
   ``--reader spark``: Spark's Parquet scan, a few partitions per core (``headers`` as JSON text).
2. One pass (``RDD.mapPartitions`` with :func:`make_rdd_task` for ``--reader arrow``,
   ``mapInArrow`` with :func:`make_task` for ``--reader spark``): each task decodes its staging
   batches once (``airflow_provider_plgd.spark.decode_batch``) and writes the decoded rows and the quarantined
   rows itself with pyarrow (``common.ArrowPartitionedWriter``) into two hidden temp folders; it
   returns one small record per written file. Bad payloads never fail the job and are never
   dropped. (Why not
   ``persist`` + two Spark writes: caching the wide union and Spark's Parquet writer for the ~180
   leaf columns together cost more JVM CPU per row than the decode itself, each several times
   pyarrow's write; figures: docs/performance.md, "Measurements behind design choices", M9.)
3. The driver checks ``fetched`` (sum of manifest counts) ``== decoded + quarantined`` (sums of
   the written files) and fails before committing if not; deletes files no successful task
   reported (leftovers of failed attempts); writes ``_manifest.json`` and ``_SUCCESS`` into each
   temp folder and swaps them in (``common.commit_dir``: Hadoop FileSystem delete + rename):
   ``{output_root}/events/interval={interval_id}/owner_id=../event_type=../date=../part-*.parquet``
   and ``{output_root}/quarantine/interval={interval_id}/part-*.parquet``. A rerun replaces both
   folders with the same rows (same file names too).
4. The run summary (JSON) is written last: ``fetched``, ``decoded``, ``quarantined``,
   ``per_event_type``, ``per_reason``, ...

Column reference: ``docs/events.md``; schemas: ``spark_apps/schemas.py``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any, Sequence

try:  # a plain ``spark-submit spark_apps/decode_events.py`` puts only spark_apps/ on sys.path
    from airflow_provider_plgd.spark import common, schemas
    from airflow_provider_plgd.spark.common import plan_tasks
    from airflow_provider_plgd.spark.decode_batch import DEFAULT_MAX_CONTENT_BYTES, decode_batches
except ImportError:  # pragma: no cover - running from the folder without --py-files
    import os

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from airflow_provider_plgd.spark import common, schemas
    from airflow_provider_plgd.spark.common import plan_tasks
    from airflow_provider_plgd.spark.decode_batch import DEFAULT_MAX_CONTENT_BYTES, decode_batches

APP = "decode"
log = logging.getLogger("plgd.spark.decode")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="decode_events", description="Decode committed plgd staging batches into events + quarantine."
    )
    parser.add_argument("--staging-root", required=True,
                        help="storage root that holds staging/{stream}/... (path or URL)")
    parser.add_argument("--stream", default="EVENTS", help="JetStream stream name (default EVENTS)")
    parser.add_argument("--output-root", required=True,
                        help="root for events/, quarantine/ and _runs/ (path or URL)")
    parser.add_argument("--owners", type=common.name_list, action="append", default=None,
                        help="only these owner_id partitions (comma-separated; repeatable)")
    parser.add_argument("--event-types", type=common.name_list, action="append", default=None,
                        help="only these event_type partitions (comma-separated; repeatable)")
    parser.add_argument("--ledger", action="store_true",
                        help="read exactly the batches that the interval ledger under --staging-root names "
                             "(airflow_provider_plgd.ledger; the ETL DAG passes it): a batch that is missing, "
                             "uncommitted or holds another count fails the run before anything is written")
    parser.add_argument("--reader", choices=("arrow", "spark"), default="arrow",
                        help="how the staging files are read: 'arrow' = each task reads its Parquet row "
                             "groups with pyarrow (default, faster), 'spark' = Spark's Parquet scan")
    parser.add_argument("--partitions-per-core", type=int, default=3,
                        help="--reader spark: input partitions per core (default 3)")
    parser.add_argument("--max-content-bytes", type=_positive_bytes, default=DEFAULT_MAX_CONTENT_BYTES,
                        help="cap on the decoded (snappy-decompressed) size of one event, and so of its "
                             "resource content, in bytes; over it the row is quarantined as "
                             f"content_too_large (default {DEFAULT_MAX_CONTENT_BYTES} = 4 MiB)")
    common.add_interval_args(parser)
    args = parser.parse_args(argv)
    args.owners = common.flatten_lists(args.owners)
    args.event_types = common.flatten_lists(args.event_types)
    return args


def _positive_bytes(value: str) -> int:
    """argparse type of ``--max-content-bytes``: a positive integer number of bytes."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of bytes, got {value!r}")
    return number


def _staging_spark_schema():
    from airflow_provider_plgd import staging

    return schemas.to_spark_schema(staging.SCHEMA)


#: What each task returns to the driver: one row per written file (per reason for quarantine).
WRITTEN_FILES_SCHEMA_DDL = (
    "table string, path string, owner_id string, event_type string, date string, reason string, rows bigint"
)


def staging_units(files: list[str]) -> list[tuple[str, int, int]]:
    """``[(url, row_group, rows)]`` of the staging files (footers read with pyarrow + fsspec).

    Ordered by rows (largest first), then url and row group, so the order is deterministic.
    Cost: one footer read per file (docs/performance.md, M10).
    """
    import fsspec
    import pyarrow.parquet as pq

    units = []
    for url in files:
        fs, path = fsspec.core.url_to_fs(url)
        with fs.open(path, "rb") as fh:
            meta = pq.ParquetFile(fh).metadata
        for i in range(meta.num_row_groups):
            units.append((url, i, meta.row_group(i).num_rows))
    units.sort(key=lambda u: (-u[2], u[0], u[1]))
    return units


def _decode_task(batches, task_id: int, interval_id: str, events_tmp: str, quarantine_tmp: str,
                 row_group_rows: int, max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES) -> list[tuple]:
    """Decode staging Arrow batches and write both tables; return one record per written file.

    Records are tuples in the column order of :data:`WRITTEN_FILES_SCHEMA_DDL`: decoded rows go to
    ``events_tmp`` (partitioned by ``owner_id/event_type/date``), quarantined rows to
    ``quarantine_tmp`` (:class:`common.ArrowPartitionedWriter`, pyarrow; file names depend only
    on ``task_id``, so a retried task overwrites its own files).
    """
    import pyarrow.compute as pc

    from airflow_provider_plgd.spark.decode_batch import decode_batch_parts

    events_cols = list(schemas.EVENTS_COLUMNS)
    quarantine_cols = list(schemas.QUARANTINE_COLUMNS)
    events = common.ArrowPartitionedWriter(
        events_tmp, task_id, schemas.EVENTS_SCHEMA, schemas.EVENTS_PARTITION_COLUMNS, row_group_rows=row_group_rows)
    quarantine = common.ArrowPartitionedWriter(
        quarantine_tmp, task_id, schemas.QUARANTINE_SCHEMA, (), row_group_rows=row_group_rows)
    reasons: dict[str, int] = {}
    for batch in batches:
        for part in decode_batch_parts(batch, interval_id, max_content_bytes=max_content_bytes):
            nulls = part.column("reason").null_count
            if nulls == part.num_rows:
                events.write(part.select(events_cols))
            elif nulls == 0:
                quarantine.write(part.select(quarantine_cols))
                for r in part.column("reason").to_pylist():
                    reasons[r] = reasons.get(r, 0) + 1
            else:  # decode_batch_parts never mixes, but do not rely on it
                mask = part.column("reason").is_null()
                events.write(part.filter(mask).select(events_cols))
                q = part.filter(pc.invert(mask)).select(quarantine_cols)
                quarantine.write(q)
                for r in q.column("reason").to_pylist():
                    reasons[r] = reasons.get(r, 0) + 1
    records = []
    for f in events.close():
        p = f["partition"]
        records.append(("events", f["path"], p["owner_id"], p["event_type"], p["date"], None, f["rows"]))
    for f in quarantine.close():
        for reason, n in sorted(reasons.items()):
            records.append(("quarantine", f["path"], None, None, None, reason, n))
    return records


def make_task(interval_id: str, events_tmp: str, quarantine_tmp: str, *, row_group_rows: int = 65_536,
              max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES):
    """Build the ``mapInArrow`` function of the decode pass for ``--reader spark``.

    Input: staging rows from Spark's Parquet scan (``headers`` as ``headers_json``). Per Spark
    task: :func:`_decode_task` (decode once, write both tables with pyarrow), then one Arrow
    batch of small records (:data:`WRITTEN_FILES_SCHEMA_DDL`, one per written file).
    """

    def task(batches):
        import pyarrow as pa
        from pyspark import TaskContext

        ctx = TaskContext.get()
        task_id = ctx.partitionId() if ctx is not None else 0
        records = _decode_task(batches, task_id, interval_id, events_tmp, quarantine_tmp, row_group_rows,
                               max_content_bytes)
        if records:
            cols = list(zip(*records))
            yield pa.RecordBatch.from_arrays(
                [pa.array(cols[i], pa.string()) for i in range(6)] + [pa.array(cols[6], pa.int64())],
                names=["table", "path", "owner_id", "event_type", "date", "reason", "rows"],
            )

    return task


def make_rdd_task(interval_id: str, events_tmp: str, quarantine_tmp: str, *,
                  batch_rows: int = 10_000, row_group_rows: int = 65_536,
                  max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES):
    """Build the ``RDD.mapPartitions`` function of the decode pass for ``--reader arrow``.

    Input: the partition's elements, each a list of units (:func:`common.plan_tasks`); the task reads
    those row groups with pyarrow (``batch_rows`` rows per batch), runs :func:`_decode_task`
    and yields its records (tuples, :data:`WRITTEN_FILES_SCHEMA_DDL` order). A plain Python RDD
    task needs no SQL planning, no Arrow stream between JVM and worker and no second Python
    worker, which is cheaper than ``spark.range(...).mapInArrow``, both for the first job and per
    warm task (figures: docs/performance.md, "Measurements behind design choices", M11).
    """

    def task(unit_lists):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        task_id = ctx.partitionId() if ctx is not None else 0
        yield from _decode_task(_read_units(unit_lists, batch_rows), task_id, interval_id,
                                events_tmp, quarantine_tmp, row_group_rows, max_content_bytes)

    return task


def _read_units(unit_lists, batch_rows: int):
    """Yield staging Arrow batches (``batch_rows`` rows) of the row groups of each list of units."""
    import fsspec
    import pyarrow.parquet as pq

    from airflow_provider_plgd import staging

    for units in unit_lists:
        for url, row_group, _rows in units:
            fs, path = fsspec.core.url_to_fs(url)
            with fs.open(path, "rb") as fh:
                pf = pq.ParquetFile(fh)
                for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[row_group],
                                             columns=staging.SCHEMA.names):
                    yield batch


def ledger_manifests(root: str, stream: str, interval_id: str) -> list[dict[str, Any]]:
    """The manifests of the batches that the interval ledger names (``ledger.staged_batches``).

    :raises LedgerError: no ledger, the fetch records do not account for every message, or a named
        batch is missing, uncommitted or holds another count than the fetch recorded (names the
        interval, owner, event type and numbers).
    """
    from airflow_provider_plgd import ledger, staging
    from airflow_provider_plgd.exceptions import LedgerError

    plan, records = ledger.read_records(root, stream, interval_id)
    if plan is None:
        raise LedgerError(f"interval {interval_id}: no ledger at {ledger.interval_dir(root, stream, interval_id)}",
                          interval_id=interval_id)
    manifests, problems = [], []
    for batch in ledger.staged_batches(plan, records):
        folder = staging.batch_path(root, stream, batch["owner_id"], batch["event_type"], interval_id)
        try:
            manifest = staging.read_manifest(folder)
        except FileNotFoundError:
            problems.append(f"owner {batch['owner_id']} event type {batch['event_type']}: the fetch staged "
                            f"{batch['count']} messages, but the batch is not committed ({folder})")
            continue
        if int(manifest["count"]) != batch["count"]:
            problems.append(f"owner {batch['owner_id']} event type {batch['event_type']}: the fetch staged "
                            f"{batch['count']} messages, the committed batch holds {manifest['count']} ({folder})")
        manifests.append(manifest)
    if problems:
        raise LedgerError(f"interval {interval_id}: staging does not hold what the ledger names (a fetch of the "
                          "interval was interrupted or changed afterwards; rerun the fetch): " + "; ".join(problems[:20]),
                          interval_id=interval_id, problems=problems)
    return manifests


def run(spark, args: argparse.Namespace) -> dict[str, Any]:
    """Decode one interval and commit ``events``, ``quarantine`` and the summary.

    :return: the run summary dict (also written as JSON).
    :raises RuntimeError: the counts do not reconcile (nothing is committed then).
    """
    from pyspark.sql import functions as F

    from airflow_provider_plgd import staging

    started = time.time()
    interval_id = args.interval_id
    staging.validate_partition_value(interval_id, "interval_id")
    if args.ledger:
        manifests = ledger_manifests(args.staging_root, args.stream, interval_id)
    else:
        manifests = staging.list_committed(
            args.staging_root, args.stream, interval_id=interval_id,
            owner_ids=args.owners, event_types=args.event_types,
        )
    files = [url for m in manifests for url in staging.manifest_file_urls(m)]
    fetched = sum(int(m["count"]) for m in manifests)
    log.info("interval %s: %d committed staging batches, %d files, %d messages",
             interval_id, len(manifests), len(files), fetched)

    timings: dict[str, float] = {}
    tasks = None
    if args.reader == "arrow":
        # staging row groups (<= 50,000 rows) packed into a few tasks of decreasing size
        tasks = plan_tasks(staging_units(files), spark.sparkContext.defaultParallelism)
        input_partitions = len(tasks)
    else:
        staging_schema = _staging_spark_schema()
        # Decoding is CPU-bound Python, so spread the (small, many) staging files over a few
        # partitions per core, balanced by bytes (Spark packs whole files/row groups into splits).
        parallelism = spark.sparkContext.defaultParallelism
        spark.conf.set("spark.sql.files.minPartitionNum", str(max(1, parallelism * args.partitions_per_core)))
        spark.conf.set("spark.sql.files.openCostInBytes", str(256 * 1024))
        if files:
            raw = spark.read.schema(staging_schema).parquet(*files)
        else:
            raw = spark.createDataFrame([], staging_schema)
        # headers go to Python as JSON text: a map column is costly to convert, a null string is not (M12,
        # docs/performance.md)
        raw = raw.select(
            "stream", "stream_seq", "subject", "published_at", "msg_id",
            F.to_json("headers").alias("headers_json"), "data",
        )
        input_partitions = raw.rdd.getNumPartitions()

    events_final = common.join(args.output_root, "events", f"interval={interval_id}")
    quarantine_final = common.join(args.output_root, "quarantine", f"interval={interval_id}")
    for final in (events_final, quarantine_final):
        parent, name = final.rsplit("/", 1)
        common.cleanup_temp_dirs(spark, parent, name)
    events_tmp = common.temp_dir_for(events_final)
    quarantine_tmp = common.temp_dir_for(quarantine_final)

    timings["plan"] = round(time.time() - started, 3)
    phase = time.time()
    # one pass: every payload is decoded once, and both tables are written by the same tasks
    if tasks is not None:
        task = make_rdd_task(interval_id, events_tmp, quarantine_tmp, max_content_bytes=args.max_content_bytes)
        records = (spark.sparkContext.parallelize(tasks, len(tasks)).mapPartitions(task).collect()
                   if tasks else [])
    else:
        task = make_task(interval_id, events_tmp, quarantine_tmp, max_content_bytes=args.max_content_bytes)
        records = [tuple(row) for row in raw.mapInArrow(task, WRITTEN_FILES_SCHEMA_DDL).collect()]
    names = ("table", "path", "owner_id", "event_type", "date", "reason", "rows")
    written = [dict(zip(names, rec)) for rec in records]
    timings["decode_and_write"] = round(time.time() - phase, 3)

    per_event_type: dict[str, int] = {}
    per_reason: dict[str, int] = {}
    event_files: list[dict[str, Any]] = []
    quarantine_files: dict[str, int] = {}
    for rec in written:
        if rec["table"] == "events":
            per_event_type[rec["event_type"]] = per_event_type.get(rec["event_type"], 0) + rec["rows"]
            event_files.append({"path": rec["path"], "rows": rec["rows"], "owner_id": rec["owner_id"],
                                "event_type": rec["event_type"], "date": rec["date"]})
        else:
            per_reason[rec["reason"]] = per_reason.get(rec["reason"], 0) + rec["rows"]
            quarantine_files[rec["path"]] = quarantine_files.get(rec["path"], 0) + rec["rows"]
    decoded = sum(per_event_type.values())
    quarantined = sum(per_reason.values())
    log.info("fetched=%d decoded=%d quarantined=%d (fetched == decoded + quarantined: %s)",
             fetched, decoded, quarantined, fetched == decoded + quarantined)
    if fetched != decoded + quarantined:
        common.delete_path(spark, events_tmp)
        common.delete_path(spark, quarantine_tmp)
        raise RuntimeError(
            f"counts do not reconcile for interval {interval_id}: fetched {fetched} (manifests) != "
            f"decoded {decoded} + quarantined {quarantined}; nothing committed"
        )

    phase = time.time()
    if not quarantine_files:  # an empty file, so the folder always has the schema
        common.ArrowPartitionedWriter(quarantine_tmp, 0, schemas.QUARANTINE_SCHEMA, (), always_write=True).close()
        quarantine_files["part-00000.parquet"] = 0
    common.finish_folder(spark, events_tmp, event_files, "events", interval_id)
    common.finish_folder(spark, quarantine_tmp, [{"path": p, "rows": n} for p, n in sorted(quarantine_files.items())],
                   "quarantine", interval_id)
    common.commit_dir(spark, events_tmp, events_final)
    common.commit_dir(spark, quarantine_tmp, quarantine_final)
    timings["commit"] = round(time.time() - phase, 3)
    log.info("committed %s and %s (phase seconds: %s)", events_final, quarantine_final, timings)

    summary = {
        "app": APP,
        "interval_id": interval_id,
        "stream": args.stream,
        "staging_root": str(args.staging_root),
        "output_root": str(args.output_root),
        "owners": args.owners,
        "event_types": args.event_types,
        "batches": len(manifests),
        "files": len(files),
        "fetched": fetched,
        "decoded": decoded,
        "quarantined": quarantined,
        "per_event_type": dict(sorted(per_event_type.items())),
        "per_reason": dict(sorted(per_reason.items())),
        "events_path": events_final,
        "events_files": len(event_files),
        "quarantine_path": quarantine_final,
        "seconds": round(time.time() - started, 3),
        "phase_seconds": timings,
        "reader": args.reader,
        "max_content_bytes": args.max_content_bytes,
        "input_partitions": input_partitions,
    }
    path = common.summary_path(args.output_root, APP, interval_id, args.summary_path)
    common.write_summary(spark, path, summary)
    summary["summary_path"] = path
    return summary


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Entry point (``common.run_app``): parse ``argv`` (default ``sys.argv[1:]``), run, stop
    Spark; return the summary. Exceptions propagate (spark-submit exits non-zero)."""
    return common.run_app("plgd-decode-events", parse_args, run, argv)


if __name__ == "__main__":
    main()
