"""The decode job: one interval of the staging Delta table -> the Delta tables ``events`` + ``quarantine``.

The command line is ``airflow_provider_plgd/spark_apps/decode_events.py``; its module docstring
describes the steps. Here: the planning (:func:`ledger_files`, :func:`staging_units`: from the
staging table's Delta log, no data file opened on the driver), the task (:func:`make_rdd_task`:
read row ranges of staging files with pyarrow, decode once, write both tables with pyarrow) and
:func:`run` (plan -> one pass -> reconcile -> commit -> summary).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_provider_plgd.exceptions import LedgerError
from airflow_provider_plgd.spark import executor_tasks, schemas
from airflow_provider_plgd.spark.app_args import DecodeArgs
from airflow_provider_plgd.spark.decode_batch import DEFAULT_MAX_CONTENT_BYTES, decode_batch_parts
from airflow_provider_plgd.spark.parquet_io import ArrowPartitionedWriter
from airflow_provider_plgd.spark.summary import finish_run
from airflow_provider_plgd.spark.task_plan import plan_tasks
from airflow_provider_plgd.tables import delta_tables, identity, ledger, staging
from airflow_provider_plgd.tables.layout import Layout
from airflow_provider_plgd.tables.staging import new_write_id
from airflow_provider_plgd.tables.storage import to_fs

APP = "decode"
log = logging.getLogger("plgd.spark.decode")

#: Partition columns of the two tables (``delta_tables.INTERVAL_TABLES``).
EVENTS_PARTITIONS = delta_tables.INTERVAL_TABLES[delta_tables.EVENTS]
QUARANTINE_PARTITIONS = delta_tables.INTERVAL_TABLES[delta_tables.QUARANTINE]


#: Rows per unit of work: a staging file is cut into row ranges of about this many rows (by its
#: row count in the Delta log), so the task plan can even out the last tasks whatever the files' sizes.
SLICE_ROWS = 10_000


def staging_units(files: Sequence[Any], slice_rows: int = SLICE_ROWS) -> list[tuple[str, int, int]]:
    """``[(url, first_row, rows)]``: each staging file (``staging.StagedFile``: ``url`` and ``rows``
    from the Delta log) cut into ``ceil(rows / slice_rows)`` row ranges of about equal size. Nothing
    is read here (the task reads the footer and the row groups the range overlaps).

    Ordered by rows (largest first), then url and first row, so the order is deterministic and a
    file's ranges follow each other (the packing keeps them together, the task reads them at once).
    """
    units = []
    for f in files:
        rows = max(int(f.rows), 0)
        slices = max(1, -(-rows // max(1, int(slice_rows))))
        bounds = [rows * i // slices for i in range(slices + 1)]
        units += [(f.url, bounds[i], bounds[i + 1] - bounds[i]) for i in range(slices)]
    units.sort(key=lambda u: (-u[2], u[0], u[1]))
    return units


def _decode_task(batches, task_id: int, interval_id: str, events_dir: str, quarantine_dir: str, write_id: str,
                 row_group_rows: int, max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES) -> list[dict[str, Any]]:
    """Decode staging Arrow batches and write the data files of both tables; return one record per file.

    Records: ``{"table": "events" | "quarantine", "file": file_records.file_record, "reasons":
    {reason: rows}}`` (quarantine only), and ``{"table": "input", "rows": staging rows read}``. Decoded rows go below the ``events`` table folder
    ``events_dir`` (partitioned by ``interval_id/event_type``), quarantined rows below
    ``quarantine_dir`` (:class:`parquet_io.ArrowPartitionedWriter`, pyarrow; file names depend only
    on ``write_id`` and ``task_id``, so a retried task overwrites its own files).
    """
    events_cols = list(schemas.EVENTS_COLUMNS)
    quarantine_cols = list(schemas.QUARANTINE_COLUMNS)
    events = ArrowPartitionedWriter(events_dir, task_id, schemas.EVENTS_SCHEMA, EVENTS_PARTITIONS,
                                    write_id=write_id, row_group_rows=row_group_rows)
    quarantine = ArrowPartitionedWriter(quarantine_dir, task_id, schemas.QUARANTINE_SCHEMA, QUARANTINE_PARTITIONS,
                                        write_id=write_id, row_group_rows=row_group_rows)
    reasons: dict[str, int] = {}
    read_rows = 0
    for batch in batches:
        read_rows += batch.num_rows
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
    records.append({"table": "input", "rows": read_rows})
    for f in quarantine.close():  # one file per task (one interval)
        records.append({"table": "quarantine", "file": f, "reasons": dict(sorted(reasons.items()))})
    return records


def make_rdd_task(interval_id: str, events_dir: str, quarantine_dir: str, write_id: str, *,
                  batch_rows: int = 10_000, row_group_rows: int = 65_536,
                  max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES, owners: Sequence[str] | None = None):
    """Build the task function of the decode pass (``executor_tasks.run_tasks``).

    Input: the partition's elements, each a list of units (:func:`staging_units` packed by
    :func:`task_plan.plan_tasks`); the task reads those slices with pyarrow (``batch_rows`` rows
    per batch; only the rows of ``owners`` when given), runs :func:`_decode_task` and yields its
    records (dicts, see :func:`_decode_task`). On classic Spark it runs as a plain Python RDD
    task, on Spark Connect in ``mapInArrow`` (figures: docs/performance.md, "Measurements behind
    design choices", M11).
    """

    def task(unit_lists):
        # lazy: pyspark only in the Spark task (this module imports without it)
        from pyspark import TaskContext

        ctx = TaskContext.get()
        task_id = ctx.partitionId() if ctx is not None else 0
        yield from _decode_task(_read_units(unit_lists, batch_rows, owners), task_id, interval_id,
                                events_dir, quarantine_dir, write_id, row_group_rows, max_content_bytes)

    return task


def _read_units(unit_lists, batch_rows: int, owners: Sequence[str] | None = None):
    """Yield staging Arrow batches (``batch_rows`` rows) of the row ranges ``(url, first_row,
    rows)`` of each list of units: the footer is read here, in the task; a file's adjacent ranges
    are read at once, each row group they overlap once, and cut to the ranges. With ``owners``,
    only their rows (row groups whose ``owner_id`` statistics exclude them are skipped)."""
    wanted = None if owners is None else pa_array(sorted(set(owners)))
    columns = staging.SCHEMA.names + ([staging.OWNER_COLUMN] if wanted is not None else [])
    for units in unit_lists:
        ranges: dict[str, list[list[int]]] = {}
        for url, first, rows, *_ in units:
            merged = ranges.setdefault(url, [])
            merged.append([first, first + rows])
        for url in sorted(ranges):
            spans = _merge_spans(ranges[url])
            fs, path = to_fs(url)
            with fs.open(path, "rb") as fh:
                pf = pq.ParquetFile(fh)
                meta = pf.metadata
                start = 0
                for g in range(meta.num_row_groups):
                    size = meta.row_group(g).num_rows
                    end = start + size
                    mine = [(max(a, start), min(b, end)) for a, b in spans if a < end and b > start]
                    if mine and (wanted is None or _may_hold(meta.row_group(g), wanted)):
                        offset = start
                        for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[g], columns=columns):
                            for a, b in mine:
                                lo, hi = max(a, offset), min(b, offset + batch.num_rows)
                                if lo < hi:
                                    part = batch.slice(lo - offset, hi - lo)
                                    if wanted is not None:
                                        part = part.filter(pc.is_in(part.column(staging.OWNER_COLUMN),
                                                                    value_set=wanted)).select(staging.SCHEMA.names)
                                    if part.num_rows:
                                        yield part
                            offset += batch.num_rows
                    start = end


def _merge_spans(spans: list[list[int]]) -> list[tuple[int, int]]:
    """Sorted, adjacent or overlapping ``[first, end)`` row ranges merged."""
    out: list[list[int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def pa_array(values: Sequence[str]):
    return pa.array(values, pa.string())


def _may_hold(row_group, owners) -> bool:
    """False when the row group's ``owner_id`` statistics exclude every owner of ``owners``."""
    for i in range(row_group.num_columns):
        column = row_group.column(i)
        if column.path_in_schema == staging.OWNER_COLUMN:
            stats = column.statistics
            if stats is None or not stats.has_min_max:
                return True
            return any(stats.min <= o <= stats.max for o in owners.to_pylist())
    return True


def ledger_files(layout: Layout, stream: str, interval_id: str) -> list[Any]:
    """The staging files decode reads with ``--ledger``: every file of the interval the staging
    table's Delta log names (``staging.staged_files``), checked against the interval ledger: the
    fetch records account for every message of the plan (``ledger.staged_counts``), and the files
    are exactly the plan's run's, with the recorded rows per range and event type
    (``ledger.check_staged_files``). Reads the plan, one small record per fetch range and the log:
    nothing per owner or per batch.

    :return: ``staging.StagedFile`` list.
    :raises LedgerError: no ledger, or the records or the files do not account for every message
        (names the interval, ranges, files and numbers).
    """
    plan, records = ledger.read_records(layout, stream, interval_id)
    if plan is None:
        raise LedgerError(f"interval {interval_id}: no ledger at {ledger.interval_dir(layout, stream, interval_id)}",
                          interval_id=interval_id)
    counts = ledger.staged_counts(plan, records)
    files = staging.staged_files(layout, stream, interval_id=interval_id)
    ledger.check_staged_files(plan, counts, files)
    return files


def run(spark, args: DecodeArgs) -> dict[str, Any]:
    """Decode one interval and commit ``events``, ``quarantine`` (one Delta transaction each) and the summary.

    :return: the run summary dict (also written as JSON).
    :raises RuntimeError: the counts do not reconcile (nothing is committed then).
    :raises TableCommitError: another run of the interval committed meanwhile (``delta_tables.commit_files``).
    :raises OldLayoutError: the output root holds tables of the layout before Delta Lake.
    :raises PipelineIdentityError: ``--stream`` or ``--max-content-bytes`` differs from the identity
        recorded at the output root (``identity.check_app``); nothing read.
    """
    started = time.time()
    run_version = time.time_ns() // 1_000_000
    interval_id = args.interval_id  # checked once by parse_args (app_args.common_args)
    layout = args.layout
    recorded = identity.check_app(layout, stream=args.stream, max_content_bytes=args.max_content_bytes)
    delta_tables.check_layout(layout)
    owners = None
    if args.ledger:
        files = ledger_files(layout, args.stream, interval_id)
    else:
        owners = sorted(set(args.owners)) if args.owners else None
        files = staging.staged_files(layout, args.stream, interval_id=interval_id,
                                     event_types=args.event_types, owners=owners)
    staged = sum(f.rows for f in files)
    log.info("interval %s: %d staging files, %d rows%s", interval_id, len(files), staged,
             f" (of them, the rows of {len(owners)} owner(s) are read)" if owners else "")

    # row ranges of the staging files (about SLICE_ROWS rows each) packed into a few tasks of decreasing size
    tasks = plan_tasks(staging_units(files), executor_tasks.default_parallelism(spark))
    events_uri = delta_tables.interval_table_uri(layout, delta_tables.EVENTS)
    quarantine_uri = delta_tables.interval_table_uri(layout, delta_tables.QUARANTINE)
    write_id = new_write_id()
    timings: dict[str, float] = {"plan": round(time.time() - started, 3)}

    phase = time.time()
    # one pass: every payload is decoded once, and both tables are written by the same tasks
    task = make_rdd_task(interval_id, events_uri, quarantine_uri, write_id, max_content_bytes=args.max_content_bytes,
                         owners=owners)
    written = executor_tasks.run_tasks(spark, tasks, task)
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
    read = sum(int(rec["rows"]) for rec in written if rec["table"] == "input")
    # every staged row of the files is read (with --owners: the selected owners' rows)
    fetched = read if owners else staged
    log.info("fetched=%d read=%d decoded=%d quarantined=%d (fetched == read == decoded + quarantined: %s)",
             fetched, read, decoded, quarantined, fetched == read == decoded + quarantined)
    if not (fetched == read == decoded + quarantined) or quarantined != sum(f["rows"] for f in quarantine_files):
        raise RuntimeError(
            f"counts do not reconcile for interval {interval_id}: fetched {fetched} (the staging table's log) "
            f"!= read {read} != decoded {decoded} + quarantined {quarantined}; nothing committed"
        )

    phase = time.time()
    meta = {"app": APP, "interval_id": interval_id, "run_version": run_version, "write_id": write_id,
            "pipeline": recorded,
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
        "staging_root": layout.root,  # the two keys of the run summary's format: one storage root
        "output_root": layout.root,
        "owners": None if args.owners is None else list(args.owners),  # JSON: None = every owner
        "event_types": None if args.event_types is None else list(args.event_types),
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
    return finish_run(summary, layout=layout, app=APP, interval_id=interval_id,
                      explicit_path=args.summary_path)
