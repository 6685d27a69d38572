"""The dedupe job: the ``events`` of one interval -> the Delta tables ``msgid_index`` + ``events_deduped``.

The command line is ``airflow_provider_plgd/spark_apps/dedupe_events.py``; its module docstring
gives the rules. Here, all on the executors (the driver holds the file lists and the counts, never
rows):

1. **Keys** (:func:`make_key_task`): Python tasks read the key and content columns of the
   interval's ``events`` files with pyarrow, keep the key columns plus each row's content digest
   (:mod:`content_digest`), file number and position, and send each row to its msg-ID
   bucket (:func:`msgid_bucket`, Spark's ``pmod(xxhash64(msg_id), MSGID_BUCKETS)``) through a
   Python RDD shuffle.
2. **Decide** (:func:`make_decide_task`): each task takes whole buckets (:func:`decide_partitions`
   tasks); per bucket it reads the bucket's files of the lookback intervals' ``msgid_index`` (the
   index is partitioned by the same bucket), decides with
   :func:`dedupe_decision.decide`, writes the bucket's index file and emits its counts and the
   positions of its dropped rows.
3. **Copy** (:func:`make_copy_task`): the dropped positions are shuffled to the task that copies
   their file; each ``events`` file is copied minus its dropped rows (byte for byte without drops),
   and the task computes the content digest of the rows it wrote (``tables.content``). The driver
   adds the per-file digests, checks a rerun against the chain (``chain.check_rerun``) and commits
   the interval's digest in the commit metadata.
"""

from __future__ import annotations

import logging
import posixpath
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from airflow_provider_plgd.spark import dedupe_decision, executor_tasks, schemas, snapshot_buckets
from airflow_provider_plgd.spark.app_args import DedupeArgs
from airflow_provider_plgd.spark.content_digest import content_digests
from airflow_provider_plgd.spark.parquet_io import data_file_name, ipc_bytes, write_parquet_file
from airflow_provider_plgd.spark.summary import finish_run
from airflow_provider_plgd.spark.task_plan import plan_tasks
from airflow_provider_plgd.tables import chain, content, delta_tables, file_records, identity, storage
from airflow_provider_plgd.tables.layout import Layout
from airflow_provider_plgd.tables.staging import new_write_id
from airflow_provider_plgd.times import IntervalId

APP = "dedupe"
DEFAULT_LOOKBACK = 24
#: Buckets of the msg-ID hash. The decision runs bucket by bucket in executor tasks
#: (:func:`decide_partitions`), and ``msgid_index`` is partitioned by the same bucket (its
#: ``bucket`` column), so a bucket's lookback reads only its own index files. Part of the table
#: layout: a ``msgid_index`` written with another count is refused.
MSGID_BUCKETS = 16
BUCKET_COLUMN = delta_tables.BUCKET_COLUMN
DIGEST_COLUMN = dedupe_decision.DIGEST
#: The internal ``msgid_index`` table: the distinct ``(msg_id, content_digest)`` pairs of each
#: interval, per bucket. Files written before ``content_digest`` existed lack the column: their IDs
#: count as "every content" (``dedupe_decision.seen_entries``).
MSGID_INDEX_SCHEMA = pa.schema([("msg_id", pa.string()), (DIGEST_COLUMN, pa.int64()),
                                (delta_tables.INTERVAL_COLUMN, pa.string()), (BUCKET_COLUMN, pa.int32())])
#: The key columns read from the ``events`` files (``event_type`` comes from the partition values),
#: and the content columns their digest is taken over (``content_digest.content_digests``).
_READ_COLUMNS = ["msg_id", "stream", "stream_seq", "subject"]
_DIGEST_COLUMNS = [c for c in schemas.CONTENT_COLUMNS if c not in _READ_COLUMNS and c != "event_type"]
_KEY_SCHEMA = pa.schema([("msg_id", pa.string()), ("stream", pa.string()), ("stream_seq", pa.int64()),
                         ("subject", pa.string()), ("event_type", pa.string()), (DIGEST_COLUMN, pa.int64()),
                         ("_file", pa.int32()), ("_row", pa.int64()), ("_bucket", pa.int32())])
log = logging.getLogger("plgd.spark.dedupe")


def msgid_bucket(msg_id: str | None, buckets: int = MSGID_BUCKETS) -> int:
    """The bucket of a message ID: ``pmod(xxhash64(msg_id), buckets)`` (Spark SQL's, through
    ``snapshot_buckets.device_bucket``); a null ID is in bucket 0."""
    return 0 if msg_id is None else snapshot_buckets.device_bucket(msg_id, buckets)


def previous_intervals(done: Sequence[IntervalId | str], interval_id: IntervalId | str, lookback: int) -> list[str]:
    """The last ``lookback`` intervals of ``done`` (those with rows in ``msgid_index``, sorted:
    ``chain.DedupeLog.with_ids``) of the same kind as ``interval_id`` that sort before it (oldest first)."""
    this = IntervalId.parse(interval_id)
    before = sorted(i for i in map(IntervalId.parse_or_none, done) if i is not None and i.same_kind(this) and i < this)
    return [str(i) for i in before[-lookback:]] if lookback else []


def previous_index_files(layout: Layout, previous: Sequence[str]) -> dict[int, list[str]]:
    """``{bucket: [file URL, ...]}`` of the ``msgid_index`` files of the ``previous`` intervals
    (named by the Delta log; at most ``len(previous) * MSGID_BUCKETS`` files).

    :raises ValueError: a file without a bucket in ``[0, MSGID_BUCKETS)`` (another layout).
    """
    by_bucket: dict[int, list[str]] = {}
    if not previous:
        return by_bucket
    index = delta_tables.interval_table_uri(layout, delta_tables.MSGID_INDEX)
    for f in delta_tables.table_files(index, where={delta_tables.INTERVAL_COLUMN: list(previous)}):
        raw = f.partition.get(BUCKET_COLUMN)
        bucket = int(raw) if raw is not None and str(raw).isdigit() else -1
        if not 0 <= bucket < MSGID_BUCKETS:
            raise ValueError(
                f"{index}: file {f.path} has bucket {raw!r}; expected 0..{MSGID_BUCKETS - 1} (a msgid_index "
                f"of another layout: write this root's intervals again, or start a new storage root)")
        by_bucket.setdefault(bucket, []).append(f.url)
    return by_bucket


#: Rows of an ``events`` file whose content digests are computed at once (their content columns
#: are held as Python values meanwhile: some tens of MB).
DIGEST_BATCH_ROWS = 10_000
#: Key rows per task below which more tasks cost more than they save (a Python task's start and
#: shuffle are ~0.1 s; one core reads and hashes ~600k key rows per second).
ROWS_PER_TASK = 250_000


def decide_partitions(slots: int, rows: int) -> int:
    """Decide tasks: a power of two that divides :data:`MSGID_BUCKETS`, at most ``2 * slots`` and
    at most one per :data:`ROWS_PER_TASK` key rows (at least 1). Each task decides
    ``MSGID_BUCKETS / n`` buckets one after the other: few tasks for a small interval or cluster,
    one per bucket on a large one."""
    limit = min(MSGID_BUCKETS, 2 * max(1, int(slots)), max(1, int(rows) // ROWS_PER_TASK))
    n = 1
    while n * 2 <= limit:
        n *= 2
    return n


def make_key_task(buckets: int = MSGID_BUCKETS, partitions: int = MSGID_BUCKETS):
    """``RDD.mapPartitions`` function, step 1: lists of ``(file URL, file number, rows, partition
    values)`` units -> ``(decide partition, Arrow IPC stream bytes)`` pairs of :data:`_KEY_SCHEMA`
    rows (``content_digest`` = the row's ``content_digest.content_digests``, ``_file`` = file
    number, ``_row`` = position in the file, ``_bucket`` = msg-ID bucket; partition = bucket %
    ``partitions``)."""

    def task(unit_lists: Iterable[list[tuple[str, int, int, Mapping[str, Any]]]]) -> Iterator[tuple[int, bytes]]:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        for units in unit_lists:
            parts = []
            for url, number, _, partition in units:
                fs, path = storage.to_fs(url)
                keys, digests = [], []
                with fs.open(path, "rb") as fh:
                    pf = pq.ParquetFile(fh)
                    present = set(pf.schema_arrow.names)  # an older file may lack a content column
                    # in batches: the content columns become Python values only a batch at a time
                    for batch in pf.iter_batches(batch_size=DIGEST_BATCH_ROWS, columns=_READ_COLUMNS + [
                            c for c in _DIGEST_COLUMNS if c in present]):
                        rows = pa.Table.from_batches([batch])
                        digests.append(content_digests(rows, event_type=partition.get("event_type")))
                        keys.append(rows.select(_READ_COLUMNS))
                    table = pa.concat_tables(keys) if keys else pf.schema_arrow.empty_table().select(_READ_COLUMNS)
                n = table.num_rows
                digest = pa.concat_arrays(digests) if digests else pa.array([], pa.int64())
                bucket = pa.array([msgid_bucket(m, buckets) for m in table.column("msg_id").to_pylist()], pa.int32())
                table = table.append_column("event_type", pa.array([partition.get("event_type")] * n, pa.string())) \
                    .append_column(DIGEST_COLUMN, digest) \
                    .append_column("_file", pa.array([number] * n, pa.int32())) \
                    .append_column("_row", pa.array(range(n), pa.int64())) \
                    .append_column("_bucket", bucket)
                parts.append(table.cast(_KEY_SCHEMA))
            if not parts:
                continue
            keys = pa.concat_tables(parts)
            target = pc.remainder(keys.column("_bucket"), partitions)
            for p in pc.unique(target).to_pylist():
                # zstd: the key columns shrink ~4.5x, less to pickle, hand to the JVM and shuffle
                yield int(p), ipc_bytes(keys.filter(pc.equal(target, p)), compression="zstd")

    return task


def make_decide_task(*, interval_id: str, index_uri: str, write_id: str, previous: Mapping[int, Sequence[str]]):
    """``RDD.mapPartitions`` function, step 2: the ``(partition, IPC bytes)`` pairs of one decide
    partition -> for each of its buckets, one after the other, records ``(key, (kind, value))``:

    * ``(-1, ("counts", {"per_type", "null_ids", "id_conflicts", "exact_copies", "index_rows"}))``;
    * ``(-1, ("index", file record))``: the bucket's ``msgid_index`` file (its distinct
      ``(msg_id, content_digest)`` pairs, sorted), written here;
    * ``(file number, ("drop", [positions]))``: the dropped rows of one ``events`` file.

    Rows are sorted by file number and position first, so the tie rule of
    :func:`dedupe_decision.decide` (the row's place in the interval's files) does not depend on the
    order in which the shuffle delivers them.
    """

    def task(pairs: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, tuple[str, Any]]]:
        import pyarrow.compute as pc

        tables = [pa.ipc.open_stream(data).read_all() for _, data in pairs]
        if not tables:
            return
        gathered = pa.concat_tables(tables)
        for bucket in sorted(pc.unique(gathered.column("_bucket")).to_pylist()):
            keys = gathered.filter(pc.equal(gathered.column("_bucket"), bucket))
            yield from decide_bucket(int(bucket), keys.sort_by([("_file", "ascending"), ("_row", "ascending")]))

    def decide_bucket(bucket: int, keys: pa.Table) -> Iterator[tuple[int, tuple[str, Any]]]:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        def lookback() -> Iterator[pa.Table]:
            for url in previous.get(bucket, ()):
                fs, path = storage.to_fs(url)
                with fs.open(path, "rb") as fh:
                    pf = pq.ParquetFile(fh)  # files written before content_digest existed lack it
                    yield pf.read(columns=[c for c in ("msg_id", DIGEST_COLUMN) if c in pf.schema_arrow.names])

        seen = None
        if previous.get(bucket):
            seen = dedupe_decision.seen_entries(pc.unique(keys.column("msg_id").drop_null()), lookback())
        decision = dedupe_decision.decide(keys.select(list(dedupe_decision.KEY_COLUMNS)), seen)
        if len(decision.index):
            rel = (f"{delta_tables.INTERVAL_COLUMN}={interval_id}/{BUCKET_COLUMN}={bucket}/"
                   f"{data_file_name(bucket, write_id)}")
            fs, base = storage.to_fs(index_uri)
            size, metadata = write_parquet_file(fs, f"{base}/{rel}", decision.index, row_group_size=1 << 20)
            yield -1, ("index", file_records.file_record(
                rel, rows=len(decision.index), size=size, stats=file_records.parquet_stats(metadata),
                partition={delta_tables.INTERVAL_COLUMN: interval_id, BUCKET_COLUMN: str(bucket)}))
        yield -1, ("counts", {"per_type": decision.per_type, "null_ids": decision.null_ids,
                              "id_conflicts": decision.id_conflicts, "exact_copies": decision.exact_copies,
                              "index_rows": len(decision.index)})
        dropped = keys.select(["_file", "_row"]).take(decision.dropped_rows)
        if dropped.num_rows:
            grouped = dropped.group_by("_file").aggregate([("_row", "list")])
            for number, rows in zip(grouped.column("_file").to_pylist(), grouped.column("_row_list").to_pylist(),
                                    strict=True):
                yield int(number), ("drop", sorted(rows))

    return task


def make_copy_task(*, source: str, target: str, files: Sequence[delta_tables.DataFile], names: Sequence[str]):
    """``RDD.mapPartitions`` function, step 3: the records of one copy task (``(file number,
    ("file", None))`` for each file it copies, ``("drop", positions)`` records of those files, and,
    in task 0, the ``key -1`` records of step 2) -> the step-2 records it was given (passed on) and
    ``(-1, ("written", file_records.file_record))`` per file written.

    A file without dropped rows is copied byte for byte; any other is read and rewritten with
    pyarrow (``parquet_io.write_parquet_file``: snappy, ``TIMESTAMP_MICROS``), in row order, with
    the row-group size of its source. ``names[i]`` is file ``i``'s path in ``target``.
    """

    def task(records: Iterable[tuple[int, tuple[str, Any]]]) -> Iterator[tuple[int, tuple[str, Any]]]:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        mine: list[int] = []
        drops: dict[int, list[int]] = {}
        for key, (kind, value) in records:
            if kind == "file":
                mine.append(key)
            elif kind == "drop":
                drops.setdefault(key, []).extend(value)
            else:
                yield key, (kind, value)
        fs, src = storage.to_fs(source)
        _, dst = storage.to_fs(target)
        for number in sorted(mine):
            f, out = files[number], f"{dst}/{names[number]}"
            gone = drops.get(number)
            with fs.open(f"{src}/{f.path}", "rb") as fh:
                pf = pq.ParquetFile(fh)
                metadata = pf.metadata
                table = pf.read()
            if gone:
                row_group = max((metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)), default=1)
                keep = pc.invert(pc.is_in(pa.array(range(table.num_rows), pa.int64()),
                                          value_set=pa.array(gone, pa.int64())))
                table = table.filter(keep)
                size, metadata = write_parquet_file(fs, out, table, row_group_size=row_group)
            else:
                fs.makedirs(posixpath.dirname(out), exist_ok=True)
                fs.copy(f"{src}/{f.path}", out)
                size = fs.size(out)
            record = file_records.file_record(names[number], rows=metadata.num_rows, size=size, partition=f.partition,
                                              stats=file_records.parquet_stats(metadata))
            # the content digest of the rows written, where they are (tables.content)
            record[content.CONTENT_KEY] = content.table_digest(table, f.partition).as_dict()
            yield -1, ("written", record)

    return task


def dedupe_on_executors(spark, *, layout: Layout, interval_id: str, files: list[delta_tables.DataFile],
                        previous: Sequence[str], write_id: str) -> dict[str, Any]:
    """Run steps 1-3 of the module docstring in one Spark job.

    :return: ``{"decision": dedupe_decision.Decision (counts only: per_type, null_ids,
        id_conflicts, exact_copies), "index_rows", "index_records" [file_record], "written" [file_record]}``.
    """
    decision = dedupe_decision.Decision()
    result: dict[str, Any] = {"decision": decision, "index_rows": 0, "index_records": [], "written": []}
    if not files:
        return result
    index_uri = delta_tables.interval_table_uri(layout, delta_tables.MSGID_INDEX)
    source = delta_tables.interval_table_uri(layout, delta_tables.EVENTS)
    target = delta_tables.interval_table_uri(layout, delta_tables.EVENTS_DEDUPED)
    names = [posixpath.join(posixpath.dirname(f.path), data_file_name(i, write_id)) for i, f in enumerate(files)]
    units = [(f.url, i, f.rows, f.partition) for i, f in enumerate(files)]
    slots = executor_tasks.default_parallelism(spark)
    key_tasks = plan_tasks(units, slots, min_rows=ROWS_PER_TASK)
    copy_of = {u[1]: t for t, task in enumerate(plan_tasks(units, slots)) for u in task}
    copy_tasks = max(copy_of.values()) + 1
    partitions = decide_partitions(slots, sum(max(0, f.rows) for f in files))
    records = executor_tasks.run_stages(
        spark, key_tasks, make_key_task(partitions=partitions),
        executor_tasks.Shuffle(partitions, make_decide_task(interval_id=interval_id, index_uri=index_uri,
                                                            write_id=write_id,
                                                            previous=previous_index_files(layout, previous))),
        executor_tasks.Shuffle(copy_tasks, make_copy_task(source=source, target=target, files=files, names=names),
                               partition_of=lambda k: copy_of.get(k, 0),
                               extra=[(i, ("file", None)) for i in range(len(files))]))
    for _, (kind, value) in records:
        if kind == "counts":
            decision.merge(value)
            result["index_rows"] += value["index_rows"]
        elif kind == "index":
            result["index_records"].append(value)
        elif kind == "written":
            result["written"].append(value)
    decision.per_type = dict(sorted(decision.per_type.items()))
    result["index_records"].sort(key=lambda r: r["path"])
    result["written"].sort(key=lambda r: r["path"])
    return result


def decoded(layout: Layout, interval_id: str) -> bool:
    """True when one decode run committed both ``events`` and ``quarantine`` of the interval
    (``delta_tables.run_committed``)."""
    return delta_tables.run_committed(layout, "decode", (delta_tables.EVENTS, delta_tables.QUARANTINE), interval_id)


def run(spark, args: DedupeArgs) -> dict[str, Any]:
    """Deduplicate one interval and commit ``msgid_index``, ``events_deduped`` and the summary.

    :return: the run summary dict (also written as JSON).
    :raises PipelineIdentityError: ``--lookback-intervals`` differs from the identity recorded at
        the root (``identity.check_app``; not checked with ``--previous-intervals``).
    :raises OutOfOrderIntervalError: a new interval older than the chain's head (``chain``).
    :raises ChainHoleError: an earlier planned interval with messages is not deduplicated (``chain``).
    :raises FileNotFoundError: decode has not committed the interval's ``events``.
    :raises RuntimeError: the written rows do not match the decision (nothing is committed then).
    :raises TableCommitError: another run of the interval committed meanwhile.
    """
    started = time.time()
    run_version = time.time_ns() // 1_000_000
    interval = args.interval_id  # parsed once by parse_args (app_args.common_args): the chain's checks take it
    interval_id = str(interval)  # its text names the rows, files and JSON below
    layout = args.layout
    recorded = identity.check_app(layout, **({} if args.previous_intervals is not None
                                           else {"lookback_intervals": args.lookback_intervals}))
    delta_tables.check_layout(layout)
    source = delta_tables.interval_table_uri(layout, delta_tables.EVENTS)
    if not decoded(layout, interval_id):
        raise FileNotFoundError(
            f"events of interval {interval_id} are not committed (no decode run committed both {source} and its "
            "quarantine); run decode_events first"
        )
    # the chain, from the data: no new interval behind the head, no hole before this one
    log_ = chain.dedupe_log(layout)
    chain.check_not_behind_head(interval, log_, processed_before=log_.started(interval), stage="dedupe")
    if recorded is not None:
        chain.check_no_hole(layout, recorded["stream"], interval, stage="dedupe", log=log_)
    if args.previous_intervals is not None:
        previous = [i for i in args.previous_intervals if i != interval_id]
    else:
        previous = previous_intervals(log_.with_ids, interval, args.lookback_intervals)
    files = delta_tables.table_files(source, where={delta_tables.INTERVAL_COLUMN: [interval_id]})
    log.info("interval %s: %d rows in %d files; looking back at %d previous intervals%s",
             interval_id, sum(f.rows for f in files), len(files), len(previous),
             f" ({previous[0]} .. {previous[-1]})" if previous else "")

    index_uri = delta_tables.interval_table_uri(layout, delta_tables.MSGID_INDEX)
    deduped_uri = delta_tables.interval_table_uri(layout, delta_tables.EVENTS_DEDUPED)
    write_id = new_write_id()
    timings: dict[str, float] = {"plan": round(time.time() - started, 3)}

    phase = time.time()
    # keys -> msg-ID buckets -> decision per bucket -> copies, all on the executors (module docstring)
    done = dedupe_on_executors(spark, layout=layout, interval_id=interval_id, files=files, previous=previous,
                               write_id=write_id)
    decision, index_records, written = done["decision"], done["index_records"], done["written"]
    totals = decision.totals()
    index_rows = sum(r["rows"] for r in index_records)
    kept_rows = sum(f["rows"] for f in written)
    staged_rows = sum(f.rows for f in files) if all(f.rows >= 0 for f in files) else totals["input"]
    if (kept_rows != totals["output"] or index_rows != done["index_rows"] or len(written) != len(files)
            or totals["input"] != staged_rows):
        raise RuntimeError(
            f"interval {interval_id}: the decision read {totals['input']} of the {staged_rows} events rows and kept "
            f"{totals['output']}; the filtered files hold {kept_rows} rows in {len(written)} of {len(files)} files; "
            f"the index files hold {index_rows} IDs, the decision "
            f"{done['index_rows']}; nothing committed"
        )
    timings["decide_and_write"] = round(time.time() - phase, 3)
    digest = content.merge_all(content.ContentDigest.from_dict(f[content.CONTENT_KEY]) for f in written)
    if digest.rows != kept_rows:
        raise RuntimeError(f"interval {interval_id}: the copy tasks' content digests count {digest.rows} rows, the "
                           f"files hold {kept_rows}; nothing committed")
    # a rerun of an interval that later ones built on: checked before the first commit (chain.check_rerun)
    change = chain.check_rerun(layout, interval, digest, log=log_)
    phase = time.time()
    meta = {"app": APP, "interval_id": interval_id, "run_version": run_version, "write_id": write_id,
            "pipeline": recorded, content.CONTENT_KEY: {interval_id: digest.as_dict()},
            chain.IDS_CHANGED_KEY: change.ids_changed}
    commits = delta_tables.commit_interval(APP, interval_id, (
        delta_tables.TableCommit(delta_tables.MSGID_INDEX, index_uri, MSGID_INDEX_SCHEMA, index_records, index_rows),
        delta_tables.TableCommit(delta_tables.EVENTS_DEDUPED, deduped_uri, schemas.EVENTS_SCHEMA, written, kept_rows)),
        run_version=run_version, metadata=meta)
    timings["commit"] = round(time.time() - phase, 3)
    log.info("committed %s version %s (%d rows, %d of them ID conflicts kept; %d within-batch and %d cross-batch "
             "duplicates dropped; phase seconds %s)", deduped_uri, commits[delta_tables.EVENTS_DEDUPED].version,
             totals["output"], decision.id_conflicts, totals["within_batch"], totals["cross_batch"], timings)

    summary = {
        "app": APP,
        "interval_id": interval_id,
        "root": layout.root,
        "input": totals["input"],
        "output": totals["output"],
        "within_batch_duplicates": totals["within_batch"],
        "cross_batch_duplicates": totals["cross_batch"],
        "duplicates": totals["within_batch"] + totals["cross_batch"],
        "null_msg_id": decision.null_ids,
        "id_conflicts": decision.id_conflicts,
        "buckets": MSGID_BUCKETS,
        "exact_copies": decision.exact_copies,
        "per_event_type": decision.per_type,
        "lookback_intervals": args.lookback_intervals,
        "previous_intervals": previous,
        "events_deduped_path": deduped_uri,
        "msgid_index_path": index_uri,
        "delta_versions": {name: c.version for name, c in commits.items()},
        "run_version": run_version,
        "content": digest.as_dict(),
        "stale_after": [str(i) for i in change.stale],
        "seconds": round(time.time() - started, 3),
        "phase_seconds": timings,
    }
    return finish_run(summary, layout=args.layout, app=APP, interval_id=interval_id,
                      explicit_path=args.summary_path)
