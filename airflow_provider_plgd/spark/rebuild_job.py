"""The rebuild job: previous snapshot + new deduplicated events -> new snapshot (incremental).

The command line is ``airflow_provider_plgd/spark_apps/rebuild_snapshots.py``; its module
docstring gives the steps. Here: the base (:func:`choose_base`), the intervals to fold
(:func:`intervals_to_fold`) and :func:`run` (fold the touched buckets with
:mod:`airflow_provider_plgd.spark.rebuild_input`, then the manifest and the ``_latest.json``
pointer, then garbage collection and the summary).
"""

from __future__ import annotations

import argparse
import json
import logging
import posixpath
import time
from typing import Any

from airflow_provider_plgd import storage
from airflow_provider_plgd.spark import folders, rebuild_input, snapshot_store
from airflow_provider_plgd.spark.summary import finish_run

APP = "rebuild"
DEDUPED_DIR = "events_deduped"
DEFAULT_KEEP_VERSIONS = 5
log = logging.getLogger("plgd.spark.rebuild")


def input_fingerprint(root: str, interval_id: str) -> dict[str, Any]:
    """What a snapshot folded of one interval: ``{"rows", "sha256"}`` of the committed
    ``events_deduped`` folder's manifest (each file's partition folder, rows and bytes; not its
    run-unique name), so a rerun that commits the same rows in the same files compares equal.

    :raises FileNotFoundError: the interval is not committed.
    """
    import hashlib

    folder = storage.join_path(root, DEDUPED_DIR, f"interval={interval_id}")
    manifest = folders.read_manifest(folder)
    if manifest is None:
        raise FileNotFoundError(f"{folder} is not committed")
    entries = sorted((posixpath.dirname(f["path"]), int(f["rows"]), int(f["bytes"])) for f in manifest["files"])
    return {"rows": int(manifest["rows"]), "sha256": hashlib.sha256(json.dumps(entries).encode()).hexdigest()}


def check_older_interval(root: str, out_root: str, latest: dict[str, Any], version: str,
                         interval_id: str) -> dict[str, Any]:
    """A rerun of an interval older than the latest snapshot (a cleared past run): the snapshot of
    ``version`` and every later one already include the interval. When its deduplicated events are
    what that snapshot folded (:func:`input_fingerprint`), nothing is rebuilt: the latest snapshot
    stays the latest (no snapshot goes back in time, no event is folded twice).

    :return: that snapshot's manifest.
    :raises RuntimeError: the interval's events changed since (the later snapshots were built on the
        old ones), or its snapshot is no longer kept, so the two cannot be compared; the message names
        the snapshots and what to do.
    """
    manifest = snapshot_store.read_manifest(out_root, version)
    recorded = ((manifest or {}).get("inputs") or {}).get(interval_id)
    where = snapshot_store.snapshots_root(out_root)
    if recorded is None:
        raise RuntimeError(
            f"interval {interval_id} is older than the latest snapshot {latest['version']}, and the snapshot "
            f"{version} that folded it is not kept any more (or has no input record), so this rerun cannot check "
            "that the later snapshots hold its events; nothing was changed. Rebuild from an older snapshot: "
            f"remove the snapshots after the one to start from ({where}/v=...), point _latest.json at it, and "
            "rerun every interval after it, oldest first"
        )
    current = input_fingerprint(root, interval_id)
    if current != recorded:
        raise RuntimeError(
            f"interval {interval_id}: its deduplicated events changed since snapshot {version} folded them "
            f"({recorded['rows']} rows then, {current['rows']} now), and the later snapshots up to "
            f"{latest['version']} were built on the old ones; nothing was changed. Rerun every later interval "
            f"too, oldest first, after removing the snapshots after {manifest.get('parent') or 'the first'} "
            f"({where}/v=...) and pointing _latest.json at it"
        )
    return manifest


def choose_base(out_root: str, version: str, interval_id: str) -> dict[str, Any] | None:
    """The manifest to build on (see step 1 of the module docstring); None for the first snapshot.
    A latest snapshot newer than ``version`` is handled by :func:`check_older_interval` first.

    :raises RuntimeError: the base already covers ``interval_id``.
    """
    latest = snapshot_store.read_latest(out_root)
    if latest is None:
        return None
    base = latest
    if latest["version"] == version:  # rerun of the same interval: build on its parent again
        parent = latest.get("parent")
        base = snapshot_store.read_manifest(out_root, parent) if parent else None
        if parent and base is None:
            raise RuntimeError(f"rerun of {version} needs its parent snapshot {parent}, which was deleted")
    if base is not None and base.get("interval_id") and base["interval_id"] >= interval_id:
        raise RuntimeError(
            f"snapshot {base['version']} already includes interval {base['interval_id']}, which is not before "
            f"--interval-id {interval_id}; check --snapshot-time"
        )
    return base


def intervals_to_fold(root: str, interval_id: str, base: dict[str, Any] | None) -> list[str]:
    """Committed ``events_deduped`` intervals after the base's and up to ``interval_id`` (oldest first).

    :raises FileNotFoundError: ``interval_id`` itself is not committed.
    """
    done = folders.committed_intervals(storage.join_path(root, DEDUPED_DIR))
    if interval_id not in done:
        raise FileNotFoundError(
            f"deduplicated events of interval {interval_id} are not committed "
            f"({storage.join_path(root, DEDUPED_DIR, f'interval={interval_id}')}/{folders.MANIFEST_NAME} missing); "
            "run dedupe_events first"
        )
    kind = snapshot_store.interval_kind(interval_id)
    after = base.get("interval_id") if base else None
    return [i for i in done if snapshot_store.interval_kind(i) == kind and i <= interval_id
            and (after is None or i > after)]


def run(spark, args: argparse.Namespace) -> dict[str, Any]:
    """Build and commit the snapshot of ``args.snapshot_time``; return the run summary.

    :raises RuntimeError: see :func:`choose_base`.
    :raises FileNotFoundError: the interval's deduplicated events are not committed.
    """
    from airflow_provider_plgd import staging, times

    started = time.time()
    interval_id = staging.validate_partition_value(args.interval_id, "interval_id")
    root = str(args.root).rstrip("/")
    out_root = str(args.snapshots_root or root).rstrip("/")
    t_ns = args.snapshot_time
    version = snapshot_store.version_id(t_ns)
    latest = snapshot_store.read_latest(out_root)
    if latest is not None and latest["version"] > version:  # a cleared past interval
        included = check_older_interval(root, out_root, latest, version, interval_id)
        log.info("interval %s: its events are unchanged since snapshot %s folded them; the latest snapshot %s "
                 "includes them, nothing to rebuild", interval_id, version, latest["version"])
        summary = {
            "app": APP, "interval_id": interval_id, "version": version, "snapshot_time": included["snapshot_time"],
            "snapshot_time_ns": t_ns, "unchanged": True, "latest": latest["version"], "intervals": [], "events": 0,
            "rows": {t: included["rows"][t] for t in snapshot_store.PUBLIC_TABLES},
            "seconds": round(time.time() - started, 3),
        }
        return finish_run(summary, output_root=out_root, app=APP, interval_id=interval_id,
                          explicit_path=args.summary_path)
    base = choose_base(out_root, version, interval_id)
    intervals = intervals_to_fold(root, interval_id, base)
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
    interval_folders = [storage.join_path(root, DEDUPED_DIR, f"interval={i}") for i in intervals]
    timings: dict[str, float] = {"plan": round(time.time() - started, 3)}
    phase = time.time()
    results = rebuild_input.fold_touched_buckets(spark, interval_folders, buckets=buckets, partitions=partitions,
                                                 expiring=expiring, fold_kwargs=fold_kwargs, timings=timings)
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
        "snapshot_time": times.ns_to_rfc3339(t_ns),
        "parent": base["version"] if base else None,
        "run_id": run_id,
        "created_at": times.ns_to_rfc3339(time.time_ns()),
        "interval_id": interval_id,
        "intervals": intervals,
        # what was folded of each interval: a later rerun of one checks it (check_older_interval)
        "inputs": {i: input_fingerprint(root, i) for i in intervals},
        "buckets": buckets,
        "bucket_expr": snapshot_store.BUCKET_EXPR.format(buckets=buckets),
        "tables": manifest_tables,
        "next_expiry_ns": dict(sorted(expiries.items(), key=lambda kv: int(kv[0]))),
        "rows": {t: sum(e["rows"] for e in manifest_tables[t].values()) for t in snapshot_store.ALL_TABLES},
        "touched_buckets": touched,
        "stats": stats,
    }
    manifest_file = snapshot_store.manifest_path(out_root, version)
    snapshot_store.write_json(manifest_file, manifest)
    pointer = {
        "version": version,
        "manifest": f"v={version}/{snapshot_store.MANIFEST_NAME}",
        "snapshot_time_ns": t_ns,
        "interval_id": interval_id,
        "updated_at": times.ns_to_rfc3339(time.time_ns()),
    }
    snapshot_store.write_json(snapshot_store.latest_path(out_root), pointer)
    log.info("committed snapshot %s (%s); %d events, %d of %d buckets touched; rows %s",
             version, manifest_file, n_events, len(touched), buckets, manifest["rows"])
    gc = snapshot_store.collect_garbage(out_root, args.keep_versions)

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
        "seconds": round(time.time() - started, 3),
        "phase_seconds": timings,
    }
    return finish_run(summary, output_root=out_root, app=APP, interval_id=interval_id,
                      explicit_path=args.summary_path)
