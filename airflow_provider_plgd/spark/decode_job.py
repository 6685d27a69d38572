"""The decode job: committed staging batches of one interval -> ``events`` + ``quarantine``.

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

from airflow_provider_plgd import storage
from airflow_provider_plgd.spark import folders, schemas
from airflow_provider_plgd.spark.decode_batch import DEFAULT_MAX_CONTENT_BYTES
from airflow_provider_plgd.spark.parquet_io import ArrowPartitionedWriter
from airflow_provider_plgd.spark.summary import finish_run
from airflow_provider_plgd.spark.task_plan import plan_tasks

APP = "decode"
log = logging.getLogger("plgd.spark.decode")

#: What each task returns to the driver: one record per written file (per reason for quarantine).
RECORD_FIELDS = ("table", "path", "owner_id", "event_type", "date", "reason", "rows")


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


def _decode_task(batches, task_id: int, interval_id: str, events_dir: str, quarantine_dir: str, write_id: str,
                 row_group_rows: int, max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES) -> list[tuple]:
    """Decode staging Arrow batches and write both tables; return one record per written file.

    Records are tuples in the column order of :data:`RECORD_FIELDS`: decoded rows go to
    ``events_dir`` (partitioned by ``owner_id/event_type/date``), quarantined rows to
    ``quarantine_dir`` (:class:`parquet_io.ArrowPartitionedWriter`, pyarrow; file names depend only
    on ``write_id`` and ``task_id``, so a retried task overwrites its own files).
    """
    import pyarrow.compute as pc

    from airflow_provider_plgd.spark.decode_batch import decode_batch_parts

    events_cols = list(schemas.EVENTS_COLUMNS)
    quarantine_cols = list(schemas.QUARANTINE_COLUMNS)
    events = ArrowPartitionedWriter(events_dir, task_id, schemas.EVENTS_SCHEMA, schemas.EVENTS_PARTITION_COLUMNS,
                                    write_id=write_id, row_group_rows=row_group_rows)
    quarantine = ArrowPartitionedWriter(quarantine_dir, task_id, schemas.QUARANTINE_SCHEMA, (),
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
    records = []
    for f in events.close():
        p = f["partition"]
        records.append(("events", f["path"], p["owner_id"], p["event_type"], p["date"], None, f["rows"]))
    for f in quarantine.close():
        for reason, n in sorted(reasons.items()):
            records.append(("quarantine", f["path"], None, None, None, reason, n))
    return records


def make_rdd_task(interval_id: str, events_dir: str, quarantine_dir: str, write_id: str, *,
                  batch_rows: int = 10_000, row_group_rows: int = 65_536,
                  max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES):
    """Build the ``RDD.mapPartitions`` function of the decode pass.

    Input: the partition's elements, each a list of units (:func:`task_plan.plan_tasks`); the task reads
    those row groups with pyarrow (``batch_rows`` rows per batch), runs :func:`_decode_task`
    and yields its records (tuples, :data:`RECORD_FIELDS` order). A plain Python RDD
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
    :raises OSError: another run of the interval committed meanwhile (``folders.commit_folder``).
    """
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

    # staging row groups (<= 50,000 rows) packed into a few tasks of decreasing size
    tasks = plan_tasks(staging_units(files), spark.sparkContext.defaultParallelism)
    events_dir = storage.join_path(args.output_root, "events", f"interval={interval_id}")
    quarantine_dir = storage.join_path(args.output_root, "quarantine", f"interval={interval_id}")
    write_id = folders.new_write_id()
    timings: dict[str, float] = {"plan": round(time.time() - started, 3)}

    phase = time.time()
    # one pass: every payload is decoded once, and both tables are written by the same tasks
    task = make_rdd_task(interval_id, events_dir, quarantine_dir, write_id, max_content_bytes=args.max_content_bytes)
    records = spark.sparkContext.parallelize(tasks, len(tasks)).mapPartitions(task).collect() if tasks else []
    written = [dict(zip(RECORD_FIELDS, rec)) for rec in records]
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
        raise RuntimeError(
            f"counts do not reconcile for interval {interval_id}: fetched {fetched} (manifests) != "
            f"decoded {decoded} + quarantined {quarantined}; nothing committed"
        )

    phase = time.time()
    if not quarantine_files:  # an empty file, so the folder always has the schema
        empty = ArrowPartitionedWriter(quarantine_dir, 0, schemas.QUARANTINE_SCHEMA, (), write_id=write_id,
                                       always_write=True).close()
        quarantine_files[empty[0]["path"]] = 0
    folders.commit_folder(events_dir, event_files, table="events", interval_id=interval_id,
                          write_id=write_id, started=started)
    folders.commit_folder(quarantine_dir, [{"path": p, "rows": n} for p, n in sorted(quarantine_files.items())],
                          table="quarantine", interval_id=interval_id, write_id=write_id, started=started)
    timings["commit"] = round(time.time() - phase, 3)
    log.info("committed %s and %s (phase seconds: %s)", events_dir, quarantine_dir, timings)

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
        "events_path": events_dir,
        "events_files": len(event_files),
        "quarantine_path": quarantine_dir,
        "seconds": round(time.time() - started, 3),
        "phase_seconds": timings,
        "max_content_bytes": args.max_content_bytes,
        "input_partitions": len(tasks),
    }
    return finish_run(summary, output_root=args.output_root, app=APP, interval_id=interval_id,
                      explicit_path=args.summary_path)
