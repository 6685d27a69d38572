"""Spark application: previous snapshot + new deduplicated events -> new snapshot (incremental).

Usage (``--py-files`` from ``airflow_provider_plgd.spark_deps.build_py_files_zip``)::

    spark-submit --master local[2] --py-files plgd_py_files.zip spark_apps/rebuild_snapshots.py \\
        --root /data/plgd --interval-id 20260101T000000Z_20260101T010000Z \\
        --snapshot-time 2026-01-01T01:00:00Z [--buckets 32] [--keep-versions 5] \\
        [--snapshots-root /data/other] [--summary-path ...]

Semantics: docs/wire-format.md §4 and §4.9, implemented in :mod:`airflow_provider_plgd.spark.fold` (pure Python, one
device at a time); layout, manifests and the pointer: :mod:`airflow_provider_plgd.spark.snapshot_store`; the
columns of the four tables: ``docs/data-contracts.md`` "Snapshot tables". ``docs/snapshots.md``
explains the design.

Steps
-----
1. **Base.** ``_latest.json`` names the latest snapshot. If its version is older than this
   snapshot's (``--snapshot-time`` = the interval end), it is the base. If it *is* this version
   (a rerun), its parent is the base, so a rerun gives the same result. If it is newer, the run
   fails: rebuild later intervals again, or start from an older snapshot, instead.
2. **New events.** The committed ``events_deduped`` intervals after the base's last interval, up
   to and including ``--interval-id`` (normally just that one; after a missed run, or for the
   first snapshot, all of them, oldest first). ``--interval-id`` itself must be committed.
3. **Keys.** Every event row is assigned to a device (identity-store rows: one row per entry of
   ``device_ids``) and a bucket ``pmod(xxhash64(device_id), buckets)``. Buckets whose
   ``next_expiry_ns`` in the base manifest is before the snapshot time get a marker row, so
   pendings that expire by now leave the tables even without new events.
4. **Per touched bucket** (``repartition(n, bucket).mapInArrow``, n = min(buckets, 200,
   4 x ``defaultParallelism``), each task taking whole buckets one after the other ->
   :func:`airflow_provider_plgd.spark.snapshot_store.rebuild_bucket`, pyarrow + fsspec on the executor): read the
   base's files of that bucket, parse and fold only the states of the devices with new events or
   expiring pendings (:func:`airflow_provider_plgd.spark.fold.fold_bucket_arrow`), copy every other row with Arrow,
   and write one new file per table to ``v={version}/r-{run}/{table}/bucket={b}/``. Untouched
   buckets are not read or written: the new manifest names the base's files for them
   (copy-on-write by bucket). Nothing refers to the run folder until the manifest does.
5. **Commit.** ``v={version}/_manifest.json``, then ``_latest.json`` (each an atomic replace).
   A run that fails earlier leaves the previous snapshot current and intact. Then old versions
   beyond ``--keep-versions`` are garbage-collected (files still named by a retained manifest
   stay) and the run summary is written to ``{root}/_runs/rebuild/interval={id}.json``.

The cost grows with the new events, the devices they touch (Python) and the bytes of the touched
buckets (Arrow copy), not with the number of past events (``bench/bench_rebuild.py`` measures it).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any, Sequence

try:  # a plain ``spark-submit spark_apps/rebuild_snapshots.py`` puts only spark_apps/ on sys.path
    from airflow_provider_plgd.spark import common, fold, rebuild_input, schemas, snapshot_store
except ImportError:  # pragma: no cover - running from the folder without --py-files
    import os

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from airflow_provider_plgd.spark import common, fold, rebuild_input, schemas, snapshot_store

APP = "rebuild"
DEDUPED_DIR = "events_deduped"
DEFAULT_KEEP_VERSIONS = 5
log = logging.getLogger("plgd.spark.rebuild")

def parse_snapshot_time(value: str) -> int:
    """``--snapshot-time``: unix ns (digits) or an ISO-8601 date-time with a zone -> unix ns.

    :raises argparse.ArgumentTypeError: anything else.
    """
    from airflow_provider_plgd import staging

    text = str(value).strip()
    try:
        return int(text) if text.lstrip("-").isdigit() else staging.to_ns(text, "--snapshot-time")
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(
            f"--snapshot-time {value!r} is neither unix nanoseconds nor an ISO-8601 date-time with a zone ({exc})"
        ) from None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="rebuild_snapshots", description="Fold deduplicated plgd events onto the latest snapshot."
    )
    parser.add_argument("--root", required=True, help="storage root holding events_deduped/ (path or URL)")
    parser.add_argument("--snapshot-time", required=True, type=parse_snapshot_time,
                        help="snapshot time = data interval end (ISO-8601 with zone, or unix ns)")
    parser.add_argument("--snapshots-root", default=None,
                        help="root for snapshots/ and _runs/ (default --root)")
    parser.add_argument("--buckets", type=int, default=snapshot_store.DEFAULT_BUCKETS,
                        help="hash buckets per table for the first snapshot (later snapshots keep the "
                             f"base's count; default {snapshot_store.DEFAULT_BUCKETS})")
    parser.add_argument("--keep-versions", type=int, default=DEFAULT_KEEP_VERSIONS,
                        help=f"snapshot versions to keep (0 = never delete; default {DEFAULT_KEEP_VERSIONS})")
    parser.add_argument("--reader", choices=("arrow", "spark"), default="arrow",
                        help="how the new events are read: 'arrow' = Python tasks read the files with "
                             "pyarrow and a Python shuffle gathers each bucket (default, faster; "
                             "spark_apps/rebuild_input.py), 'spark' = Spark's Parquet scan + repartition")
    common.add_interval_args(parser)
    args = parser.parse_args(argv)
    if args.buckets < 1 or args.buckets > 65536:
        parser.error(f"--buckets must be in [1, 65536], got {args.buckets}")
    if args.keep_versions == 1:
        parser.error("--keep-versions must be 0 or >= 2 (a rerun needs the parent snapshot)")
    if args.keep_versions < 0:
        parser.error(f"--keep-versions must be >= 0, got {args.keep_versions}")
    return args


def choose_base(spark, out_root: str, version: str, interval_id: str) -> dict[str, Any] | None:
    """The manifest to build on (see step 1 of the module docstring); None for the first snapshot.

    :raises RuntimeError: the latest snapshot is newer than ``version``, or the base already
        covers ``interval_id``.
    """
    _, latest = snapshot_store.spark_latest(spark, out_root)
    if latest is None:
        return None
    if latest["version"] > version:
        raise RuntimeError(
            f"the latest snapshot {latest['version']} is newer than {version} (--snapshot-time); a snapshot "
            "builds on the one before it, so rebuild the later intervals after this one, or remove the newer "
            f"snapshots ({snapshot_store.snapshots_root(out_root)}/v=...) and point _latest.json at an older one"
        )
    base = latest
    if latest["version"] == version:  # rerun of the same interval: build on its parent again
        parent = latest.get("parent")
        base = snapshot_store.spark_manifest(spark, out_root, parent) if parent else None
        if parent and base is None:
            raise RuntimeError(f"rerun of {version} needs its parent snapshot {parent}, which was deleted")
    if base is not None and base.get("interval_id") and base["interval_id"] >= interval_id:
        raise RuntimeError(
            f"snapshot {base['version']} already includes interval {base['interval_id']}, which is not before "
            f"--interval-id {interval_id}; check --snapshot-time"
        )
    return base


def intervals_to_fold(spark, root: str, interval_id: str, base: dict[str, Any] | None) -> list[str]:
    """Committed ``events_deduped`` intervals after the base's and up to ``interval_id`` (oldest first).

    :raises FileNotFoundError: ``interval_id`` itself is not committed.
    """
    done = snapshot_store.list_committed_intervals(spark, common.join(root, DEDUPED_DIR))
    if interval_id not in done:
        raise FileNotFoundError(
            f"deduplicated events of interval {interval_id} are not committed "
            f"({common.join(root, DEDUPED_DIR, f'interval={interval_id}')}/_SUCCESS missing); run dedupe_events first"
        )
    kind = snapshot_store.interval_kind(interval_id)
    after = base.get("interval_id") if base else None
    return [i for i in done if snapshot_store.interval_kind(i) == kind and i <= interval_id
            and (after is None or i > after)]


def _fold_with_spark_reader(spark, root: str, folders: list[str], buckets: int, partitions: int,
                            expiring: list[int], fold_kwargs: dict[str, Any]) -> list[Any]:
    """``--reader spark``: Spark's Parquet scan of the new events, keyed by device and bucket,
    ``repartition(partitions, bucket)`` + ``mapInArrow`` (:func:`snapshot_store.rebuild_partition`).
    Returns the ``BUCKET_RESULT_SCHEMA`` rows."""
    from pyspark.sql import functions as F

    events = (spark.read.schema(schemas.events_read_schema())
              .option("basePath", common.join(root, DEDUPED_DIR))
              .parquet(*folders)
              .select(*fold.FOLD_INPUT_COLUMNS))
    is_registration = F.col("event_type").isin(fold.DEVICES_REGISTERED, fold.DEVICES_UNREGISTERED)
    events = (events
              .withColumn("_device", F.explode(F.when(is_registration, F.col("device_ids"))
                                               .otherwise(F.array(F.coalesce("device_id", "group_id")))))
              .where(F.col("_device").isNotNull())
              .withColumn("_bucket", F.expr(snapshot_store.BUCKET_EXPR.format(buckets=buckets)
                                            .replace("device_id", "_device")).cast("int")))
    # Python gets the content's MD5 (all the stale-skip rule needs), not the bytes, and the nested
    # columns as JSON text (null nested structs are costly to convert to Arrow, row by row).
    events = events.withColumn("content_md5", F.md5("content_data")).drop("content_data")
    for column in fold.JSON_COLUMNS:
        events = events.withColumn(column, F.to_json(column))
    if expiring:  # one marker row per bucket whose pendings expire, so the bucket is processed
        markers = spark.createDataFrame([(b,) for b in expiring], "_bucket int")
        events = events.unionByName(markers, allowMissingColumns=True)

    def partition_task(batches):
        return snapshot_store.rebuild_partition(batches, **fold_kwargs)

    return (events.repartition(partitions, "_bucket")
            .mapInArrow(partition_task, schemas.to_spark_schema(snapshot_store.BUCKET_RESULT_SCHEMA))
            .collect())


def run(spark, args: argparse.Namespace) -> dict[str, Any]:
    """Build and commit the snapshot of ``args.snapshot_time``; return the run summary.

    :raises RuntimeError: see :func:`choose_base`.
    :raises FileNotFoundError: the interval's deduplicated events are not committed.
    """
    from airflow_provider_plgd import staging

    started = time.time()
    interval_id = staging.validate_partition_value(args.interval_id, "interval_id")
    root = str(args.root).rstrip("/")
    out_root = str(args.snapshots_root or root).rstrip("/")
    t_ns = args.snapshot_time
    version = snapshot_store.version_id(t_ns)
    base = choose_base(spark, out_root, version, interval_id)
    intervals = intervals_to_fold(spark, root, interval_id, base)
    buckets = int(base["buckets"]) if base else args.buckets
    if base and buckets != args.buckets:
        log.info("keeping the base snapshot's %d buckets (--buckets %d applies to a first snapshot only)",
                 buckets, args.buckets)
    expiring = sorted(int(b) for b, ns in (base or {}).get("next_expiry_ns", {}).items()
                      if ns is not None and ns < t_ns)
    log.info("snapshot %s: base %s, folding %d interval(s) %s; %d buckets with expiring pendings",
             version, base["version"] if base else None, len(intervals), intervals, len(expiring))

    table_schemas = {name: snapshot_store.table_schema(name) for name in snapshot_store.ALL_TABLES}
    run_id = snapshot_store.new_run_id()
    run_rel = snapshot_store.run_dir(version, run_id)
    old_by_bucket = {
        b: {t: snapshot_store.bucket_files(out_root, base, t, [b]) for t in snapshot_store.ALL_TABLES}
        for b in range(buckets)
    } if base else {}
    fold_kwargs = dict(root=out_root, run_rel=run_rel, old_files_by_bucket=old_by_bucket,
                       table_schemas=table_schemas, snapshot_time_ns=t_ns)
    # A few tasks per core, each folding several whole buckets one after the other: one task per
    # bucket made the per-task cost (Python worker round trip, closure) grow with the bucket count.
    partitions = max(1, min(buckets, 200, 4 * spark.sparkContext.defaultParallelism))
    folders = [common.join(root, DEDUPED_DIR, f"interval={i}") for i in intervals]
    timings: dict[str, float] = {"plan": round(time.time() - started, 3)}
    phase = time.time()
    if args.reader == "arrow":
        results = rebuild_input.fold_touched_buckets(spark, folders, buckets=buckets, partitions=partitions,
                                                     expiring=expiring, fold_kwargs=fold_kwargs, timings=timings)
    else:
        results = _fold_with_spark_reader(spark, root, folders, buckets, partitions, expiring, fold_kwargs)
    timings["fold_and_write"] = round(time.time() - phase, 3)

    # ---- manifest: touched buckets from this run, the rest by reference -----------------------
    touched = sorted({r["bucket"] for r in results})
    touched_set = set(touched)
    stats: dict[str, int] = {}
    n_events = 0
    manifest_tables: dict[str, dict[str, Any]] = {
        t: {b: e for b, e in (base or {}).get("tables", {}).get(t, {}).items() if int(b) not in touched_set}
        for t in snapshot_store.ALL_TABLES
    }
    expiries = {b: ns for b, ns in (base or {}).get("next_expiry_ns", {}).items() if int(b) not in touched_set}
    for r in results:
        if r["table"] == "_stats":
            n_events += r["events"] or 0
            for key, value in json.loads(r["stats_json"] or "{}").items():
                stats[key] = stats.get(key, 0) + value
        elif r["file"] is not None:
            manifest_tables[r["table"]][str(r["bucket"])] = {"files": [r["file"]], "rows": r["rows"]}
            if r["table"] == snapshot_store.STATE_TABLE and r["next_expiry_ns"] is not None:
                expiries[str(r["bucket"])] = r["next_expiry_ns"]
    manifest_tables = {t: dict(sorted(e.items(), key=lambda kv: int(kv[0]))) for t, e in manifest_tables.items()}
    stats = {k: v for k, v in sorted(stats.items()) if v}
    manifest = {
        "format": snapshot_store.MANIFEST_FORMAT,
        "version": version,
        "snapshot_time_ns": t_ns,
        "snapshot_time": staging.ns_to_iso(t_ns),
        "parent": base["version"] if base else None,
        "run_id": run_id,
        "created_at": staging.ns_to_iso(time.time_ns()),
        "interval_id": interval_id,
        "intervals": intervals,
        "buckets": buckets,
        "bucket_expr": snapshot_store.BUCKET_EXPR.format(buckets=buckets),
        "tables": manifest_tables,
        "next_expiry_ns": dict(sorted(expiries.items(), key=lambda kv: int(kv[0]))),
        "rows": {t: sum(e["rows"] for e in manifest_tables[t].values()) for t in snapshot_store.ALL_TABLES},
        "touched_buckets": touched,
        "stats": stats,
    }
    manifest_file = snapshot_store.manifest_path(out_root, version)
    snapshot_store.atomic_write_text(spark, manifest_file, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    pointer = {
        "version": version,
        "manifest": f"v={version}/{snapshot_store.MANIFEST_NAME}",
        "snapshot_time_ns": t_ns,
        "interval_id": interval_id,
        "updated_at": staging.ns_to_iso(time.time_ns()),
    }
    snapshot_store.atomic_write_text(spark, snapshot_store.latest_path(out_root), json.dumps(pointer, indent=1) + "\n")
    log.info("committed snapshot %s (%s); %d events, %d of %d buckets touched; rows %s",
             version, manifest_file, n_events, len(touched), buckets, manifest["rows"])
    gc = snapshot_store.collect_garbage(spark, out_root, args.keep_versions)

    summary = {
        "app": APP,
        "interval_id": interval_id,
        "version": version,
        "snapshot_time": manifest["snapshot_time"],
        "snapshot_time_ns": t_ns,
        "parent": manifest["parent"],
        "run_id": run_id,
        "intervals": intervals,
        "events": n_events,
        "buckets": buckets,
        "touched_buckets": len(touched),
        "carried_buckets": buckets - len(touched),
        "devices_refolded": stats.get("devices", 0),
        "rows": {t: manifest["rows"][t] for t in snapshot_store.PUBLIC_TABLES},
        "fold": stats,
        "manifest": manifest_file,
        "gc": gc,
        "reader": args.reader,
        "seconds": round(time.time() - started, 3),
        "phase_seconds": timings,
    }
    return common.finish_run(spark, summary, output_root=out_root, app=APP, interval_id=interval_id,
                             explicit_path=args.summary_path)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Entry point (``common.run_app``): parse ``argv`` (default ``sys.argv[1:]``), run, stop
    Spark; return the summary. Exceptions propagate (spark-submit exits non-zero)."""
    return common.run_app("plgd-rebuild-snapshots", parse_args, run, argv)


if __name__ == "__main__":
    main()
