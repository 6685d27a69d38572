"""The decode job: committed staging batches of one interval -> the Delta tables ``events`` + ``quarantine``.

The command line is ``airflow_provider_plgd/spark_apps/decode_events.py``; its module docstring
describes the steps. Here: the planning (:func:`staging_units`, :func:`ledger_manifests`), the
task (:func:`make_rdd_task`: read row groups with pyarrow, decode once, write both tables with
pyarrow) and :func:`run` (plan -> one pass -> reconcile -> commit -> summary).
"""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

from airflow_provider_plgd import delta_tables, pipeline
from airflow_provider_plgd.spark import schemas
from airflow_provider_plgd.spark.decode_batch import DEFAULT_MAX_CONTENT_BYTES
from airflow_provider_plgd.spark.parquet_io import ArrowPartitionedWriter, new_write_id
from airflow_provider_plgd.spark.summary import finish_run
from airflow_provider_plgd.spark.task_plan import plan_tasks

APP = "decode"
log = logging.getLogger("plgd.spark.decode")

#: Partition columns of the two tables (``delta_tables.INTERVAL_TABLES``).
EVENTS_PARTITIONS = delta_tables.INTERVAL_TABLES[delta_tables.EVENTS]
QUARANTINE_PARTITIONS = delta_tables.INTERVAL_TABLES[delta_tables.QUARANTINE]


def staging_units(files: list[str]) -> list[tuple[str, int, int]]:
    """``[(url, row_group, rows)]`` of the staging files (footers read with pyarrow + fsspec).

    Ordered by rows (largest first), then url and row group, so the order is deterministic.
    Cost: one footer read per file (docs/performance.md, M10), ``storage.IO_THREADS`` at once.
    """
    import pyarrow.parquet as pq

    from airflow_provider_plgd.storage import map_io, to_fs

    def row_groups(url: str) -> list[tuple[str, int, int]]:
        fs, path = to_fs(url)
        with fs.open(path, "rb") as fh:
            meta = pq.ParquetFile(fh).metadata
        return [(url, i, meta.row_group(i).num_rows) for i in range(meta.num_row_groups)]

    units = [unit for per_file in map_io(row_groups, files) for unit in per_file]
    units.sort(key=lambda u: (-u[2], u[0], u[1]))
    return units


def _decode_task(batches, task_id: int, interval_id: str, events_dir: str, quarantine_dir: str, write_id: str,
                 row_group_rows: int, max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES) -> list[dict[str, Any]]:
    """Decode staging Arrow batches and write the data files of both tables; return one record per file.

    Records: ``{"table": "events" | "quarantine", "file": delta_tables.file_record, "reasons":
    {reason: rows}}`` (quarantine only). Decoded rows go below the ``events`` table folder
    ``events_dir`` (partitioned by ``interval_id/event_type``), quarantined rows below
    ``quarantine_dir`` (:class:`parquet_io.ArrowPartitionedWriter`, pyarrow; file names depend only
    on ``write_id`` and ``task_id``, so a retried task overwrites its own files).
    """
    import pyarrow.compute as pc

    from airflow_provider_plgd.spark.decode_batch import decode_batch_parts

    events_cols = list(schemas.EVENTS_COLUMNS)
    quarantine_cols = list(schemas.QUARANTINE_COLUMNS)
    events = ArrowPartitionedWriter(events_dir, task_id, schemas.EVENTS_SCHEMA, EVENTS_PARTITIONS,
                                    write_id=write_id, row_group_rows=row_group_rows)
    quarantine = ArrowPartitionedWriter(quarantine_dir, task_id, schemas.QUARANTINE_SCHEMA, QUARANTINE_PARTITIONS,
                                        write_id=write_id, row_group_rows=row_group_rows)
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
    records: list[dict[str, Any]] = [{"table": "events", "file": f} for f in events.close()]
    for f in quarantine.close():  # one file per task (one interval)
        records.append({"table": "quarantine", "file": f, "reasons": dict(sorted(reasons.items()))})
    return records


def make_rdd_task(interval_id: str, events_dir: str, quarantine_dir: str, write_id: str, *,
                  batch_rows: int = 10_000, row_group_rows: int = 65_536,
                  max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES):
    """Build the ``RDD.mapPartitions`` function of the decode pass.

    Input: the partition's elements, each a list of units (:func:`task_plan.plan_tasks`); the task reads
    those row groups with pyarrow (``batch_rows`` rows per batch), runs :func:`_decode_task`
    and yields its records (dicts, see :func:`_decode_task`). A plain Python RDD
    task needs no SQL planning, no Arrow stream between JVM and worker and no second Python
    worker, which is cheaper than ``spark.range(...).mapInArrow``, both for the first job and per
    warm task (figures: docs/performance.md, "Measurements behind design choices", M11).
    """

    def task(unit_lists):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        task_id = ctx.partitionId() if ctx is not None else 0
        yield from _decode_task(_read_units(unit_lists, batch_rows), task_id, interval_id,
                                events_dir, quarantine_dir, write_id, row_group_rows, max_content_bytes)

    return task


def _read_units(unit_lists, batch_rows: int):
    """Yield staging Arrow batches (``batch_rows`` rows) of the row groups of each list of units."""
    import pyarrow.parquet as pq

    from airflow_provider_plgd import staging
    from airflow_provider_plgd.storage import to_fs

    for units in unit_lists:
        for url, row_group, _rows in units:
            fs, path = to_fs(url)
            with fs.open(path, "rb") as fh:
                pf = pq.ParquetFile(fh)
                for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[row_group],
                                             columns=staging.SCHEMA.names):
                    yield batch


def ledger_manifests(root: str, stream: str, interval_id: str) -> list[dict[str, Any]]:
    """The batch fragments that the interval ledger names (``ledger.staged_batches``), as
    manifest-like dicts ``{"owner_id", "event_type", "fragment", "count", "folder", "files": [{"path"}]}``.

    The fetch records list each fragment's part files, so no manifest is read here: one small
    JSON file per fetch range, whatever the number of batches.

    :raises LedgerError: no ledger, or the fetch records do not account for every message (names
        the interval, ranges and numbers).
    """
    from airflow_provider_plgd import ledger, staging
    from airflow_provider_plgd.exceptions import LedgerError

    plan, records = ledger.read_records(root, stream, interval_id)
    if plan is None:
        raise LedgerError(f"interval {interval_id}: no ledger at {ledger.interval_dir(root, stream, interval_id)}",
                          interval_id=interval_id)
    return [{"owner_id": b["owner_id"], "event_type": b["event_type"], "fragment": b["fragment"],
             "count": b["count"], "files": [{"path": name} for name in b["files"]],
             "folder": staging.batch_path(root, stream, b["owner_id"], b["event_type"], interval_id)}
            for b in ledger.staged_batches(plan, records)]


def run(spark, args: argparse.Namespace) -> dict[str, Any]:
    """Decode one interval and commit ``events``, ``quarantine`` (one Delta transaction each) and the summary.

    :return: the run summary dict (also written as JSON).
    :raises RuntimeError: the counts do not reconcile (nothing is committed then).
    :raises TableCommitError: another run of the interval committed meanwhile (``delta_tables.commit_files``).
    :raises OldLayoutError: the output root holds tables of the layout before Delta Lake.
    :raises PipelineIdentityError: ``--stream`` or ``--max-content-bytes`` differs from the identity
        recorded at the output root (``pipeline.check_app``); nothing read.
    """
    from airflow_provider_plgd import staging

    started = time.time()
    run_version = time.time_ns() // 1_000_000
    interval_id = args.interval_id
    staging.validate_partition_value(interval_id, "interval_id")
    identity = pipeline.check_app(args.output_root, stream=args.stream, max_content_bytes=args.max_content_bytes)
    delta_tables.check_layout(args.output_root)
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

    # staging row groups (<= 50,000 rows) packed into a few tasks of decreasing size
    tasks = plan_tasks(staging_units(files), spark.sparkContext.defaultParallelism)
    events_uri = delta_tables.table_uri(args.output_root, delta_tables.EVENTS)
    quarantine_uri = delta_tables.table_uri(args.output_root, delta_tables.QUARANTINE)
    write_id = new_write_id()
    timings: dict[str, float] = {"plan": round(time.time() - started, 3)}

    phase = time.time()
    # one pass: every payload is decoded once, and both tables are written by the same tasks
    task = make_rdd_task(interval_id, events_uri, quarantine_uri, write_id, max_content_bytes=args.max_content_bytes)
    written = spark.sparkContext.parallelize(tasks, len(tasks)).mapPartitions(task).collect() if tasks else []
    timings["decode_and_write"] = round(time.time() - phase, 3)

    per_event_type: dict[str, int] = {}
    per_reason: dict[str, int] = {}
    event_files = [rec["file"] for rec in written if rec["table"] == "events"]
    quarantine_files = [rec["file"] for rec in written if rec["table"] == "quarantine"]
    for f in event_files:
        event_type = f["partition"]["event_type"]
        per_event_type[event_type] = per_event_type.get(event_type, 0) + f["rows"]
    for rec in written:
        for reason, n in rec.get("reasons", {}).items():
            per_reason[reason] = per_reason.get(reason, 0) + n
    decoded = sum(per_event_type.values())
    quarantined = sum(per_reason.values())
    log.info("fetched=%d decoded=%d quarantined=%d (fetched == decoded + quarantined: %s)",
             fetched, decoded, quarantined, fetched == decoded + quarantined)
    if fetched != decoded + quarantined or quarantined != sum(f["rows"] for f in quarantine_files):
        raise RuntimeError(
            f"counts do not reconcile for interval {interval_id}: fetched {fetched} (manifests) != "
            f"decoded {decoded} + quarantined {quarantined}; nothing committed"
        )

    phase = time.time()
    meta = {"app": APP, "interval_id": interval_id, "run_version": run_version, "write_id": write_id,
            "pipeline": identity,
            "stream": args.stream}
    commits = delta_tables.commit_interval(APP, interval_id, (
        (delta_tables.EVENTS, events_uri, schemas.EVENTS_SCHEMA, event_files, decoded),
        (delta_tables.QUARANTINE, quarantine_uri, schemas.QUARANTINE_SCHEMA, quarantine_files, quarantined)),
        run_version=run_version, metadata=meta)
    timings["commit"] = round(time.time() - phase, 3)
    log.info("committed %s (version %s) and %s (version %s) (phase seconds: %s)", events_uri,
             commits[delta_tables.EVENTS].version, quarantine_uri, commits[delta_tables.QUARANTINE].version, timings)

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
        "events_path": events_uri,
        "events_files": len(event_files),
        "quarantine_path": quarantine_uri,
        "delta_versions": {name: c.version for name, c in commits.items()},
        "seconds": round(time.time() - started, 3),
        "phase_seconds": timings,
        "max_content_bytes": args.max_content_bytes,
        "input_partitions": len(tasks),
    }
    return finish_run(summary, output_root=args.output_root, app=APP, interval_id=interval_id,
                      explicit_path=args.summary_path)
