"""The rebuild job: previous snapshot + new deduplicated events -> new snapshot (incremental).

The command line is ``airflow_provider_plgd/spark_apps/rebuild_snapshots.py``; its module
docstring gives the steps. Here: the base (:func:`choose_base`), the intervals to fold
(:func:`intervals_to_fold`) and :func:`run` (fold the touched buckets with
:mod:`airflow_provider_plgd.spark.rebuild_input`, then one Delta commit per snapshot table,
``_device_state`` last, then ``vacuum`` and the summary).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from airflow_provider_plgd import times
from airflow_provider_plgd.spark import executor_tasks, rebuild_input, snapshot_buckets
from airflow_provider_plgd.spark.app_args import RebuildArgs
from airflow_provider_plgd.spark.summary import finish_run
from airflow_provider_plgd.tables import chain, delta_tables, file_records, identity, snapshot_store
from airflow_provider_plgd.tables.layout import Layout
from airflow_provider_plgd.times import IntervalId

APP = "rebuild"
log = logging.getLogger("plgd.spark.rebuild")


def input_fingerprint(layout: Layout, interval_id: str) -> dict[str, Any]:
    """What a snapshot folded of one interval, by content: ``{"rows", "ids", "digest"}`` of its
    ``events_deduped`` rows (``chain.input_fingerprint``: the digest dedupe computed where it wrote
    the rows and recorded in its commit, ``tables.content``), so the same rows in other files
    (a compaction, another fetch split or cluster size) compare equal, and a changed row does not."""
    return chain.input_fingerprint(layout, interval_id)


def deduped(layout: Layout, interval_id: str) -> bool:
    """True when one dedupe run committed both ``msgid_index`` and ``events_deduped`` of the
    interval (``delta_tables.run_committed``)."""
    return delta_tables.run_committed(layout, "dedupe", (delta_tables.MSGID_INDEX, delta_tables.EVENTS_DEDUPED),
                                      interval_id)


def check_older_interval(layout: Layout, snapshots: Layout, latest: Mapping[str, Any],
                         interval_id: str) -> tuple[dict[str, Any], bool]:
    """A rerun of an interval older than the latest snapshot (a cleared past run): the snapshot that
    folded it and every later one include the interval. When its deduplicated events are what that
    snapshot folded (``chain.folded_input``, by content), nothing is rebuilt: the latest snapshot
    stays the latest (no snapshot goes back in time, no event is folded twice). When they changed,
    the interval is rebuilt on the snapshot before it (repair in place: the later intervals are
    then not in the latest snapshot until each is rebuilt again, oldest first).

    :return: ``(record, changed)``: the record of the snapshot that folded it, and whether its
        events changed since.
    :raises ChainRepairError: no snapshot in the log folded it (so the two cannot be compared), or
        the snapshot before it is gone from the log; nothing was changed.
    """
    record, changed = chain.folded_input(layout, snapshots, interval_id)
    where = snapshot_store.snapshot_table_uri(snapshots, snapshot_store.STATE_TABLE)
    if record is None or changed is None:
        raise chain.ChainRepairError(
            f"interval {interval_id} is older than the latest snapshot {latest['version']}, and no snapshot in "
            f"the Delta log of {where} records folding it, so this rerun cannot check that the later snapshots "
            "hold its events; nothing was changed. Rebuild from an older snapshot: "
            "snapshot_store.roll_back(root, <version>) makes it the latest again (docs/operations.md, \"Rerun an "
            "interval\"), then rerun every interval after it, oldest first", interval_id=interval_id)
    parent = record.get("parent")
    if changed and parent and snapshot_store.snapshot(snapshots, parent) is None:
        raise chain.ChainRepairError(
            f"interval {interval_id}: its deduplicated events changed since snapshot {record['version']} folded "
            f"them, and the snapshot before it ({parent}) is no longer in the Delta log of {where}, so it cannot be "
            "rebuilt in place; nothing was changed (docs/operations.md, \"Rerun an interval\")",
            interval_id=interval_id)
    return record, bool(changed)


def choose_base(snapshots: Layout, latest: Mapping[str, Any] | None, version: str,
                interval_id: str) -> dict[str, Any] | None:
    """The snapshot record to build on (step 1 of the module docstring); None for the first
    snapshot. A latest snapshot newer than ``version`` is handled by :func:`check_older_interval` first.

    :raises RuntimeError: the base already covers ``interval_id``, or a rerun's parent is gone from the log.
    """
    if latest is None:
        return None
    base: dict[str, Any] | None = dict(latest)
    if latest["version"] == version:  # rerun of the same interval: build on its parent again
        parent = latest.get("parent")
        base = snapshot_store.snapshot(snapshots, parent) if parent else None
        if parent and base is None:
            raise RuntimeError(f"rerun of {version} needs its parent snapshot {parent}, which is no longer in the "
                               "Delta log")
    if base is not None and base.get("interval_id") and base["interval_id"] >= interval_id:
        raise RuntimeError(
            f"snapshot {base['version']} already includes interval {base['interval_id']}, which is not before "
            f"--interval-id {interval_id}"
        )
    return base


def intervals_to_fold(layout: Layout, interval_id: str, base: Mapping[str, Any] | None) -> list[str]:
    """``events_deduped`` intervals with rows after the base's and up to ``interval_id`` (oldest first).

    :raises FileNotFoundError: ``interval_id`` itself is not committed.
    """
    if not deduped(layout, interval_id):
        raise FileNotFoundError(
            f"deduplicated events of interval {interval_id} are not committed (no dedupe run committed both "
            f"{delta_tables.interval_table_uri(layout, delta_tables.EVENTS_DEDUPED)} and msgid_index); run dedupe_events first"
        )
    done = delta_tables.committed_intervals(delta_tables.interval_table_uri(layout, delta_tables.EVENTS_DEDUPED))
    this = IntervalId.parse(interval_id)
    after = IntervalId.parse(base["interval_id"], "base snapshot's interval ID") \
        if base and base.get("interval_id") else None
    fold = sorted(i for i in map(IntervalId.parse_or_none, done)
                  if i is not None and i.same_kind(this) and i <= this and (after is None or i > after))
    return [str(i) for i in fold]


def diverged_buckets(layout: Layout, base: Mapping[str, Any] | None) -> set[int]:
    """Buckets whose files in the latest version of some snapshot table differ from the base's: what
    an earlier run of this snapshot, or a killed rebuild between its commits, committed after the
    base. A rebuild rewrites them too, so every table equals base + the folded events."""
    changed: set[int] = set()
    for table in snapshot_store.ALL_TABLES:
        uri = snapshot_store.snapshot_table_uri(layout, table)
        dt = delta_tables.open_table(uri)
        if dt is None:
            continue
        then = (base or {}).get("delta_versions", {}).get(table) if table != snapshot_store.STATE_TABLE \
            else (base or {}).get("delta_version")
        if then is not None and int(then) == dt.version():
            continue
        now = snapshot_store.bucket_files(layout, table, dt.version())
        old = snapshot_store.bucket_files(layout, table, then)
        changed |= {b for b in set(now) | set(old) if sorted(now.get(b, [])) != sorted(old.get(b, []))}
    return changed


def run(spark, args: RebuildArgs) -> dict[str, Any]:
    """Build and commit the snapshot of ``args.interval`` (its end is the snapshot time); return the run summary.

    :param args: the parsed command line (``rebuild_snapshots.parse_args``: ``args.interval`` is the
        checked :class:`~airflow_provider_plgd.times.Interval` of ``--interval-id``).

    :raises RuntimeError: see :func:`choose_base`.
    :raises ChainRepairError: see :func:`check_older_interval`; or an interval to fold is stale
        (``chain.stale_intervals``: deduplicated before an earlier interval changed).
    :raises PipelineIdentityError: the root differs from the identity recorded there (``identity.check_app``).
    :raises ChainHoleError: an earlier planned interval with messages is not deduplicated (``chain``).
    :raises FileNotFoundError: the interval's deduplicated events are not committed.
    :raises TableCommitError: another rebuild committed to a snapshot table meanwhile.
    """
    started = time.time()
    run_version = time.time_ns() // 1_000_000
    window: times.Interval = args.interval  # checked once by parse_args (app_args.time_interval)
    interval_id = window.id
    layout = args.layout
    snapshots = args.snapshots
    recorded = identity.check_app(layout)
    delta_tables.check_layout(layout)
    delta_tables.check_layout(snapshots)
    if recorded is not None:  # the chain, from the data: every earlier interval with messages is deduplicated
        chain.check_no_hole(layout, recorded["stream"], interval_id, stage="rebuild")
    t_ns = window.end_ns  # the snapshot time is the interval end
    version = snapshot_store.version_id(t_ns)
    latest = snapshot_store.latest(snapshots)
    repairing: str | None = None
    if latest is not None and latest["version"] > version:  # a cleared past interval
        included, changed = check_older_interval(layout, snapshots, latest, interval_id)
        if changed:
            repairing = latest["version"]
    if latest is not None and latest["version"] > version and not repairing:
        log.info("interval %s: its events are unchanged since snapshot %s folded them; the latest snapshot %s "
                 "includes them, nothing to rebuild", interval_id, included["version"], latest["version"])
        summary = {
            "app": APP, "interval_id": interval_id, "version": version, "snapshot_time": times.ns_to_rfc3339(t_ns),
            "snapshot_time_ns": t_ns, "unchanged": True, "latest": latest["version"], "intervals": [], "events": 0,
            "rows": {t: latest["rows"][t] for t in snapshot_store.PUBLIC_TABLES},
            "delta_versions": latest.get("delta_versions", {}),
            "seconds": round(time.time() - started, 3),
        }
        return finish_run(summary, layout=args.snapshots, app=APP, interval_id=interval_id,
                          explicit_path=args.summary_path)
    if repairing:  # rebuild on the snapshot before the interval (check_older_interval)
        base = snapshot_store.snapshot(snapshots, included["parent"]) if included.get("parent") else None
        log.warning("interval %s: its deduplicated events changed since snapshot %s folded them; rebuilding it on "
                    "%s (the snapshots after it, up to %s, are no longer the latest: rerun their intervals, oldest "
                    "first)", interval_id, included["version"], base["version"] if base else "nothing", repairing)
    else:
        base = choose_base(snapshots, latest, version, interval_id)
    intervals = intervals_to_fold(layout, interval_id, base)
    stale = {str(s.interval_id): str(s.because) for s in chain.stale_intervals(layout)}
    if any(i in stale for i in intervals):
        named = ", ".join(f"{i} (after {stale[i]} was deduplicated again)" for i in intervals if i in stale)
        raise chain.ChainRepairError(
            f"interval {interval_id}: rebuild refused: the deduplicated events of {named} are stale; nothing was "
            "written. Rerun those intervals' dedupe first, oldest first (docs/operations.md, \"Rerun an interval\")",
            interval_id=interval_id)
    buckets = int(base["buckets"]) if base else args.buckets
    if base and buckets != args.buckets:
        log.info("keeping the base snapshot's %d buckets (--buckets %d applies to a first snapshot only)",
                 buckets, args.buckets)
    diverged = diverged_buckets(snapshots, base)
    expiring = sorted({int(b) for b, ns in (base or {}).get("next_expiry_ns", {}).items()
                       if ns is not None and ns < t_ns} | ({b for b in diverged if b < buckets} if base else set()))
    log.info("snapshot %s: base %s, folding %d interval(s) %s; %d buckets with expiring pendings or changed "
             "since the base (%d)", version, base["version"] if base else None, len(intervals), intervals,
             len(expiring), len(diverged))

    table_schemas = {name: snapshot_store.table_schema(name) for name in snapshot_store.ALL_TABLES}
    run_id = snapshot_buckets.new_run_id()
    base_files = {t: snapshot_store.bucket_files(
        snapshots, t, (base.get("delta_versions", {}).get(t) if t != snapshot_store.STATE_TABLE
                      else base.get("delta_version"))) for t in snapshot_store.ALL_TABLES} if base else {}
    old_by_bucket = {b: {t: base_files[t].get(b, []) for t in snapshot_store.ALL_TABLES}
                     for b in range(buckets)} if base else {}
    fold_kwargs = dict(snapshots=snapshots, run_id=run_id, old_files_by_bucket=old_by_bucket,
                       table_schemas=table_schemas, snapshot_time_ns=t_ns)
    # A few tasks per core, each folding several whole buckets one after the other: one task per
    # bucket made the per-task cost (Python worker round trip, closure) grow with the bucket count.
    partitions = max(1, min(buckets, 200, 4 * executor_tasks.default_parallelism(spark)))
    timings: dict[str, float] = {"plan": round(time.time() - started, 3)}
    phase = time.time()
    results = rebuild_input.fold_touched_buckets(spark, layout, intervals, buckets=buckets, partitions=partitions,
                                                 expiring=expiring, fold_kwargs=fold_kwargs, timings=timings)
    timings["fold_and_write"] = round(time.time() - phase, 3)

    # ---- commit: one Delta transaction per table, _device_state last ---------------------------
    phase = time.time()
    touched = sorted({r["bucket"] for r in results})
    stats: dict[str, int] = {}
    n_events = 0
    expiries = {b: ns for b, ns in (base or {}).get("next_expiry_ns", {}).items() if int(b) not in set(touched)}
    files: dict[str, list[dict[str, Any]]] = {t: [] for t in snapshot_store.ALL_TABLES}
    for r in results:
        if r["table"] == "_stats":
            n_events += r["events"] or 0
            for key, value in json.loads(r["stats_json"] or "{}").items():
                stats[key] = stats.get(key, 0) + value
            continue
        if r["file"] is not None:
            files[r["table"]].append(file_records.file_record(
                r["file"], rows=r["rows"], size=r["size"], partition={delta_tables.BUCKET_COLUMN: r["bucket"]},
                stats=json.loads(r["stats"])))
        if r["table"] == snapshot_store.STATE_TABLE and r["next_expiry_ns"] is not None:
            expiries[str(r["bucket"])] = r["next_expiry_ns"]
    stats = {k: v for k, v in sorted(stats.items()) if v}
    # the first snapshot replaces whatever a killed first run left; later ones their rewritten buckets
    replace = [] if base is None else [(delta_tables.BUCKET_COLUMN, "in", [str(b) for b in touched])]         if touched else None
    record: dict[str, Any] = {
        "snapshot": version,
        "snapshot_time_ns": t_ns,
        "snapshot_time": times.ns_to_rfc3339(t_ns),
        "parent": base["version"] if base else None,
        "run_id": run_id,
        "run_version": run_version,
        "interval_id": interval_id,
        "pipeline": recorded,
        "supersedes": repairing,  # the latest snapshot before a repair in place (None otherwise)
    }
    delta_versions: dict[str, int] = {}
    rows: dict[str, int] = {}
    for table in snapshot_store.ALL_TABLES:
        uri = snapshot_store.snapshot_table_uri(snapshots, table)
        if table == snapshot_store.STATE_TABLE:  # the snapshot's commit: the whole record
            record.update({
                "intervals": intervals,
                # what was folded of each interval: a later rerun of one checks it (check_older_interval)
                "inputs": {i: input_fingerprint(layout, i) for i in sorted(set(intervals) | {interval_id})},
                "buckets": buckets,
                "bucket_expr": snapshot_buckets.BUCKET_EXPR.format(buckets=buckets),
                "next_expiry_ns": dict(sorted(expiries.items(), key=lambda kv: int(kv[0]))),
                "rows": dict(rows),
                "delta_versions": dict(delta_versions),
                "touched_buckets": touched,
                "stats": stats,
            })
        commit = delta_tables.commit_files(
            uri, files[table], schema=snapshot_store.delta_schema(table), partition_by=(delta_tables.BUCKET_COLUMN,),
            replace=replace, metadata=record, app_id=f"plgd.{APP}.{table}/{version}", run_version=run_version)
        delta_versions[table] = commit.version if commit.version is not None else \
            delta_tables.open_table(uri).version()
        if table != snapshot_store.STATE_TABLE:
            rows[table] = sum(f.rows for f in delta_tables.table_files(uri, version=delta_versions[table]))
    timings["commit"] = round(time.time() - phase, 3)
    log.info("committed snapshot %s (Delta versions %s); %d events, %d of %d buckets touched; rows %s",
             version, delta_versions, n_events, len(touched), buckets, rows)
    vacuumed = {t: delta_tables.vacuum(snapshot_store.snapshot_table_uri(snapshots, t), args.vacuum_retention_hours)
                for t in snapshot_store.ALL_TABLES}

    summary = {
        "app": APP,
        "interval_id": interval_id,
        "version": version,
        "snapshot_time": record["snapshot_time"],
        "snapshot_time_ns": t_ns,
        "parent": record["parent"],
        "supersedes": repairing,
        "run_id": run_id,
        "run_version": run_version,
        "intervals": intervals,
        "events": n_events,
        "buckets": buckets,
        "touched_buckets": len(touched),
        "carried_buckets": buckets - len(touched),
        "devices_refolded": stats.get("devices", 0),
        "rows": {t: rows[t] for t in snapshot_store.PUBLIC_TABLES},
        "fold": stats,
        "delta_versions": delta_versions,
        "tables": {t: snapshot_store.snapshot_table_uri(snapshots, t) for t in snapshot_store.PUBLIC_TABLES},
        "vacuumed_files": sum(vacuumed.values()),
        "seconds": round(time.time() - started, 3),
        "phase_seconds": timings,
    }
    return finish_run(summary, layout=args.snapshots, app=APP, interval_id=interval_id,
                      explicit_path=args.summary_path)
