"""Spark application: previous snapshot + new deduplicated events -> new snapshot (incremental).

Usage (``--py-files`` from ``airflow_provider_plgd.spark_deps.build_py_files_zip``)::

    spark-submit --master local[2] --py-files plgd_py_files.zip spark_apps/rebuild_snapshots.py \\
        --root /data/plgd --interval-id 20260101T000000Z_20260101T010000Z \\
        [--buckets 32] [--vacuum-retention-hours 168] \\
        [--snapshots-root /data/other] [--summary-path ...]

On Spark Connect (docs/spark-connect.md), the same arguments, as a plain Python program whose
``main`` ships the code with ``addArtifacts``::

    SPARK_REMOTE=sc://host:15002 python spark_apps/rebuild_snapshots.py --root ... --interval-id ...

Semantics: docs/wire-format.md §4 and §4.9, implemented in :mod:`airflow_provider_plgd.spark.fold` (pure Python, one
device at a time); the Delta tables and snapshot records: :mod:`airflow_provider_plgd.tables.snapshot_store`; the job:
:mod:`airflow_provider_plgd.spark.rebuild_job`; the
columns of the four tables: ``docs/data-contracts.md`` "Snapshot tables". ``docs/snapshots.md``
explains the design.

Steps
-----
1. **Base.** The latest snapshot record (the newest commit of ``snapshots/_device_state``). If its
   version is older than this snapshot's (the snapshot time is the end of ``--interval-id``), it is the base.
   If it *is* this version (a rerun), its parent is the base, so a rerun gives the same result. If
   it is newer (a cleared past interval), nothing is rebuilt when the interval's events are what
   its snapshot folded, and the run fails otherwise (``rebuild_job.check_older_interval``;
   docs/snapshots.md, "Reruns of old intervals"). The base's files are read at the Delta versions
   its record names.
2. **New events.** The ``events_deduped`` intervals after the base's last interval, up to and
   including ``--interval-id`` (normally just that one; after a missed run, or for the first
   snapshot, all of them, oldest first). ``--interval-id`` itself must be committed by dedupe.
3. **Keys.** Every event row is assigned to a device (identity-store rows: one row per entry of
   ``device_ids``) and a bucket ``pmod(xxhash64(device_id), buckets)``. Buckets whose
   ``next_expiry_ns`` in the base record is before the snapshot time, and buckets that differ from
   the base (an earlier or killed run of this snapshot), are folded even without new events.
4. **Per touched bucket** (a shuffle by bucket, :mod:`airflow_provider_plgd.spark.rebuild_input`;
   n = min(buckets, 200, 4 x ``defaultParallelism``) reduce tasks, each taking whole buckets one after the other ->
   :func:`airflow_provider_plgd.tables.snapshot_store.rebuild_bucket`, pyarrow + fsspec on the executor): read the
   base's files of that bucket, parse and fold only the states of the devices with new events or
   expiring pendings (:func:`airflow_provider_plgd.spark.fold.fold_bucket_arrow`), copy every other row with Arrow,
   and write one new file per table to ``snapshots/{table}/bucket={b}/part-{run}.parquet``.
   Untouched buckets are not read or written (copy-on-write by bucket).
5. **Commit.** One Delta transaction per table (overwrite of the rewritten buckets), the four public
   tables first and ``_device_state`` last, whose commit carries the snapshot record. A run that
   fails earlier leaves the previous snapshot current. Then ``vacuum`` deletes files removed more
   than ``--vacuum-retention-hours`` ago, and the run summary is written to
   ``{root}/_runs/rebuild/interval={id}.json``.

The cost grows with the new events, the devices they touch (Python) and the bytes of the touched
buckets (Arrow copy), not with the number of past events (``bench/bench_rebuild.py`` measures it).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from airflow_provider_plgd import times
from airflow_provider_plgd.spark import app_args, snapshot_buckets
from airflow_provider_plgd.spark.rebuild_job import run
from airflow_provider_plgd.spark.session import run_app
from airflow_provider_plgd.tables import delta_tables
from airflow_provider_plgd.tables.layout import Layout


def parse_snapshot_time(value: str) -> int:
    """``--snapshot-time``: unix ns (digits) or an ISO-8601 date-time with a zone -> unix ns
    (``times.to_ns``).

    :raises argparse.ArgumentTypeError: anything else.
    """
    try:
        return times.to_ns(str(value), "--snapshot-time")
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(
            f"--snapshot-time {value!r} is neither unix nanoseconds nor an ISO-8601 date-time with a zone ({exc})"
        ) from None


def parse_args(argv: Sequence[str] | None = None) -> app_args.RebuildArgs:
    """Parse the command line (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="rebuild_snapshots", description="Fold deduplicated plgd events onto the latest snapshot."
    )
    parser.add_argument("--snapshot-time", default=None, type=parse_snapshot_time,
                        help="optional check: the snapshot time is the end of --interval-id; when given "
                             "(ISO-8601 with zone, or unix ns) it must equal that end")
    parser.add_argument("--snapshots-root", default=None,
                        help="root for snapshots/ and _runs/ (default --root)")
    parser.add_argument("--buckets", type=int, default=snapshot_buckets.DEFAULT_BUCKETS,
                        help="hash buckets per table for the first snapshot (later snapshots keep the "
                             f"base's count; default {snapshot_buckets.DEFAULT_BUCKETS})")
    parser.add_argument("--vacuum-retention-hours", type=int, default=delta_tables.DEFAULT_VACUUM_RETENTION_HOURS,
                        help="DeltaTable.vacuum of the snapshot tables after the commit: delete files removed more "
                             "than this many hours ago (older snapshot versions stop being readable); -1 = no "
                             f"vacuum; default {delta_tables.DEFAULT_VACUUM_RETENTION_HOURS}")
    app_args.add_common_args(parser, "storage root holding events_deduped/ (path or URL)")
    args = parser.parse_args(argv)
    if args.buckets < 1 or args.buckets > 65536:
        parser.error(f"--buckets must be in [1, 65536], got {args.buckets}")
    if args.vacuum_retention_hours < -1:
        parser.error(f"--vacuum-retention-hours must be -1 (no vacuum) or >= 0, got {args.vacuum_retention_hours}")
    try:  # the snapshot time is the interval end: one value, from the interval ID
        interval = app_args.time_interval(args.interval_id)
    except ValueError as err:
        parser.error(f"--interval-id: {err}")
    if args.snapshot_time is not None and args.snapshot_time != interval.end_ns:
        parser.error(f"--snapshot-time {args.snapshot_time} is not the end of --interval-id {args.interval_id} "
                     f"({interval.end_ns}); leave --snapshot-time out (the end of the interval ID is the "
                     "snapshot time)")
    common = app_args.common_args(parser, args)
    try:
        snapshots = Layout.of(args.snapshots_root) if args.snapshots_root else common["layout"]
    except ValueError as err:
        parser.error(f"--snapshots-root: {err}")
    return app_args.RebuildArgs(**common, interval=interval, snapshots=snapshots,
                                buckets=args.buckets, vacuum_retention_hours=args.vacuum_retention_hours)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Entry point (``session.run_app``): parse ``argv`` (default ``sys.argv[1:]``), run, stop
    Spark; return the summary. Exceptions propagate (spark-submit exits non-zero)."""
    return run_app("plgd-rebuild-snapshots", parse_args, run, argv)


if __name__ == "__main__":
    main()
