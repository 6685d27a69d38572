"""Benchmark of table maintenance: files per table and a ``device_id`` query, before and after.

Usage::

    PATH=.venv/bin:$PATH .venv/bin/python -m bench.bench_maintenance [--intervals 48] [--json out.json]

1. Simulated demo traffic (``make demo``'s settings: 3 owners x 4 devices x 3 resources, 100
   activity steps per hourly interval) for ``--intervals`` intervals, decoded with the decode
   application's batch decoder and committed interval by interval with the project's commit
   functions in the Spark applications' layout (``plgd_devtools.interval_tables``:
   ``--files-per-partition`` files per (interval, event type), one per Spark task; one
   ``msgid_index`` file per msg-ID bucket), the latest snapshot at the last interval. Not timed.
2. Before: files per table, and the median of ``--repeat`` runs of the query
   ``polars.read_delta(events_deduped).filter(device_id == <one device>)`` (eager: reads every
   file) and of the same with ``polars.scan_delta(...).filter(...).collect()`` (lazy: the filter is
   pushed down to the Parquet reader).
3. ``maintain_tables`` (compaction of the intervals before the head, vacuum with retention 0,
   checkpoint, log cleanup): its time, and per interval compacted (the catch-up after 48
   intervals without maintenance).
4. After: files per table, the same queries.
5. Steady state, ``--steady`` times: one more interval committed, the head moved to it, maintenance
   again (one interval passes per run): time of that run.
6. For the choice of ``compact``: ``optimize.z_order(["device_id"])`` on a copy of the table of
   step 1 (time, files, the same queries).

The whole measurement holds ``flock --lock`` (default ``/tmp/spark.lock``) so no Spark job of the
suite runs on the two cores meanwhile; the load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from airflow_provider_plgd.tables.layout import Layout

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def files_per_table(root: str) -> dict[str, int]:
    from deltalake import DeltaTable

    from airflow_provider_plgd.tables import delta_tables

    return {name: len(DeltaTable(delta_tables.interval_table_uri(Layout.of(root), name)).file_uris())
            for name in delta_tables.INTERVAL_TABLES if (Path(root) / name / "_delta_log").exists()}


def query_times(uri: str, device_id: str, repeat: int) -> dict[str, float]:
    """Median seconds of the eager and the lazy polars query on one device; the rows found."""
    import polars as pl

    eager, lazy, found = [], [], set()
    for _ in range(repeat):
        t0 = time.perf_counter()
        frame = pl.read_delta(uri).filter(pl.col("device_id") == device_id)
        eager.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        lazy_frame = pl.scan_delta(uri).filter(pl.col("device_id") == device_id).collect()
        lazy.append(time.perf_counter() - t0)
        found |= {frame.height, lazy_frame.height}
    assert len(found) == 1, f"the queries found different row counts: {found}"
    return {"read_delta_s": round(statistics.median(eager), 4), "scan_delta_s": round(statistics.median(lazy), 4),
            "rows": found.pop()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--intervals", type=int, default=48)
    parser.add_argument("--owners", type=int, default=3)
    parser.add_argument("--devices", type=int, default=4, help="devices per owner")
    parser.add_argument("--resources", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100, help="activity steps per interval")
    parser.add_argument("--files-per-partition", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--steady", type=int, default=3, help="steady-state maintenance runs")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--lock", default="/tmp/spark.lock")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    import polars as pl
    from deltalake import DeltaTable

    from airflow_provider_plgd.simulator import SimulationConfig, generate
    from airflow_provider_plgd.tables import delta_tables, maintenance
    from plgd_devtools import interval_tables
    from plgd_devtools.spark import spark_lock

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-maintenance-"))
    root = str(work / "root")
    shutil.rmtree(root, ignore_errors=True)
    total = args.intervals + args.steady
    sim = generate(SimulationConfig(seed=args.seed, owners=args.owners, devices_per_owner=args.devices,
                                    resources_per_device=args.resources, intervals=total,
                                    steps_per_interval=args.steps, interval_seconds=3600.0))
    ids = interval_tables.interval_ids(sim)
    decoded = interval_tables.decoded_intervals(sim)
    t0 = time.perf_counter()
    for k in range(args.intervals):
        interval_tables.commit_interval_tables(root, ids[k], *decoded[k], files_per_partition=args.files_per_partition)
    interval_tables.commit_snapshot_record(root, ids[args.intervals - 1], ids[:args.intervals])
    build_s = time.perf_counter() - t0
    uri = delta_tables.interval_table_uri(Layout.of(root), delta_tables.EVENTS_DEDUPED)
    device = pl.read_delta(uri).get_column("device_id").drop_nulls().unique().sort()[0]
    copy = str(work / "zorder_events_deduped")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(uri, copy)
    out: dict = {"args": vars(args), "messages": sum(1 for m in sim.messages if m.interval < args.intervals),
                 "build_s": round(build_s, 1)}
    with spark_lock(args.lock):
        out["load_before"] = os.getloadavg()[0]
        out["before"] = {"files": files_per_table(root), "query": query_times(uri, device, args.repeat)}
        settings = maintenance.MaintenanceSettings(vacuum_retention_hours=0)
        t0 = time.perf_counter()
        report = maintenance.maintain_tables(root, settings=settings)
        catch_up = time.perf_counter() - t0
        compacted = max(len(t.compacted) for t in report.tables)
        out["catch_up"] = {"seconds": round(catch_up, 2), "intervals": compacted,
                           "per_interval_s": round(catch_up / max(1, compacted), 3),
                           "per_table_s": {t.table: round(t.seconds, 2) for t in report.tables}}
        out["after"] = {"files": files_per_table(root), "query": query_times(uri, device, args.repeat)}
        steady = []
        for k in range(args.intervals, total):
            interval_tables.commit_interval_tables(root, ids[k], *decoded[k],
                                                   files_per_partition=args.files_per_partition)
            interval_tables.commit_snapshot_record(root, ids[k], ids[:k + 1])
            t0 = time.perf_counter()
            run = maintenance.maintain_tables(root, settings=settings)
            steady.append(time.perf_counter() - t0)
            assert max(len(t.compacted) for t in run.tables) == 1
        out["steady_state_run_s"] = {"median": round(statistics.median(steady), 3) if steady else None,
                                     "runs": [round(s, 3) for s in steady]}
        out["after_steady_state"] = {"files": files_per_table(root)}
        passed = maintenance.passed_intervals(ids[:args.intervals], ids[args.intervals - 1])
        t0 = time.perf_counter()
        DeltaTable(copy).optimize.z_order(["device_id"], partition_filters=[("interval_id", "in", passed)])
        out["z_order_device_id"] = {"seconds": round(time.perf_counter() - t0, 2),
                                    "files": len(DeltaTable(copy).file_uris()),
                                    "query": query_times(copy, device, args.repeat)}
        out["load_after"] = os.getloadavg()[0]

    b, a, z = out["before"], out["after"], out["z_order_device_id"]
    print(f"table maintenance, {args.intervals} hourly intervals of demo traffic ({out['messages']} messages; "
          f"{args.files_per_partition} files per partition as written), load average {out['load_before']:.1f} "
          f"-> {out['load_after']:.1f} on {os.cpu_count()} cores")
    print(f"{'table':<16} {'files before':>12} {'after':>8}")
    for name in b["files"]:
        print(f"{name:<16} {b['files'][name]:>12} {a['files'].get(name, 0):>8}")
    print(f"query device_id = one device ({b['query']['rows']} rows of events_deduped):")
    print(f"  polars.read_delta + filter : {b['query']['read_delta_s']:.3f} s before, {a['query']['read_delta_s']:.3f} s "
          f"after compaction, {z['query']['read_delta_s']:.3f} s after z_order(device_id)")
    print(f"  polars.scan_delta (lazy)   : {b['query']['scan_delta_s']:.3f} s before, {a['query']['scan_delta_s']:.3f} s "
          f"after compaction, {z['query']['scan_delta_s']:.3f} s after z_order(device_id)")
    c = out["catch_up"]
    print(f"maintenance catch-up: {c['seconds']:.1f} s for {c['intervals']} intervals = {c['per_interval_s']:.3f} s per "
          f"interval (per table: {c['per_table_s']})")
    print(f"maintenance steady state (one new interval passed): median {out['steady_state_run_s']['median']} s per run "
          f"{out['steady_state_run_s']['runs']}; files then ({args.intervals + args.steady} intervals): "
          f"{out['after_steady_state']['files']}")
    print(f"z_order(device_id) of events_deduped's passed intervals instead: {z['seconds']:.1f} s, {z['files']} files")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
