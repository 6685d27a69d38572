"""Benchmark of the dedupe and snapshot-rebuild stages (``spark-submit --master local[2]``).

Usage::

    PATH=.venv/bin:$PATH .venv/bin/python bench/bench_rebuild.py \\
        [--events 1000000] [--devices 10000] [--batch-devices 1000] [--buckets 32] [--json out.json]
        [--skip-throughput | --skip-history | --dedupe-only [--reuse-inputs]] [--master local[2]]

Input is synthetic decoded ``events`` rows (the ``airflow_provider_plgd.spark.schemas.EVENTS_SCHEMA`` columns,
realistic sizes: CBOR resource content with its JSON, links, connection and twin state, pendings
with confirmations), written with pyarrow in the layout of ``decode_events``. Generating them is
not timed. Figures (processing time as measured inside one Spark driver, JVM start excluded):

1. **Throughput**: ``dedupe_events`` on one interval of ``--events`` rows (5% of them
   duplicates, some of them of the previous interval; run twice: the second run shows a warm
   JVM), and ``rebuild_snapshots`` folding the deduplicated interval onto a small first
   snapshot. Events/s = input rows / seconds.
2. **History scaling**: the same new batch (``--batch-devices`` devices x ~20 events) rebuilt on
   top of three histories: *1x* (``--devices`` devices, 3 changes per resource), *10x events*
   (same devices, 10x more events per resource), *10x devices* (10x devices, 10x events). The
   ratio t(10x) / t(1x) is the growth (goal < 1.5). *10x devices* runs twice: with the same
   ``--buckets`` and with 10x as many buckets (to show what more, smaller buckets cost).

``--dedupe-only``: figure 1's dedupe runs alone, with the peak RSS of the driver's Python process
(``getrusage``) after the first run of the big interval: what ``docs/operations.md`` ("Sizing")
quotes for 1M and 4M rows.

The Spark part holds an exclusive ``flock`` on ``--lock`` (default ``/tmp/spark.lock``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.machine import exclusive_lock  # noqa: E402
from bench.rebuild_events import HOUR, START_NS, EventFactory, interval, write_events  # noqa: E402

# ------------------------------------------------------------------------------------------------
# the Spark driver (one JVM for every measurement)
# ------------------------------------------------------------------------------------------------

DRIVER = r'''
import json, resource, sys, time
from airflow_provider_plgd.spark import session
from airflow_provider_plgd.spark_apps import dedupe_events, rebuild_snapshots
cfg = json.load(open(sys.argv[1]))
spark = session.build_spark_session("plgd-bench-rebuild")
results = {}
def timed(name, fn):
    t = time.perf_counter(); summary = fn()
    # the driver's (this Python process's) peak RSS so far; Linux reports KiB
    results[name] = {"seconds": time.perf_counter() - t, "summary": summary,
                     "driver_peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    print("BENCH", name, round(results[name]["seconds"], 2), flush=True)
for step in cfg["steps"]:
    if step["app"] == "dedupe":
        args = dedupe_events.parse_args(["--root", step["root"], "--interval-id", step["interval"]])
        timed(step["name"], lambda: dedupe_events.run(spark, args))
    else:
        args = rebuild_snapshots.parse_args(["--root", step["root"], "--interval-id", step["interval"],
                                             "--snapshot-time", step["time"], "--buckets", str(step["buckets"]),
                                             "--vacuum-retention-hours", "-1"])
        timed(step["name"], lambda: rebuild_snapshots.run(spark, args))
spark.stop()
json.dump(results, open(cfg["out"], "w"), default=str)
'''


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000, help="rows of the throughput interval")
    parser.add_argument("--devices", type=int, default=10_000, help="devices of the 1x history")
    parser.add_argument("--batch-devices", type=int, default=1_000, help="devices the new batch touches")
    parser.add_argument("--buckets", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--lock", default="/tmp/spark.lock")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--skip-throughput", action="store_true", help="skip figure 1 (dedupe/rebuild events/s)")
    parser.add_argument("--skip-history", action="store_true", help="skip figure 2 (history scaling)")
    parser.add_argument("--dedupe-only", action="store_true",
                        help="figure 1 without the rebuild, and no figure 2: dedupe's time and the driver's peak RSS")
    parser.add_argument("--reuse-inputs", action="store_true",
                        help="with --dedupe-only: reuse the events table of an earlier run in --workdir")
    parser.add_argument("--master", default="local[2]", help="spark-submit --master (default local[2])")
    args = parser.parse_args(argv)
    if args.dedupe_only:
        args.skip_history = True

    from airflow_provider_plgd.spark_deps import build_py_files_zip

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_rebuild_"))
    work.mkdir(parents=True, exist_ok=True)
    steps = []
    sizes: dict[str, int] = {}
    t_gen = time.perf_counter()
    i0, t0 = interval(0)
    i1, t1 = interval(1)
    _i2, _t2 = interval(2)

    # 1. throughput: one interval of N rows over enough devices, 5% duplicates
    reuse = args.reuse_inputs and (work / "throughput" / "events" / "_delta_log").is_dir()
    if reuse:  # the same events table as an earlier run (e.g. of another checkout): outputs start fresh
        from airflow_provider_plgd.tables import delta_tables

        tp = work / "throughput"
        for name in ("events_deduped", "msgid_index", "snapshots", "_runs"):
            shutil.rmtree(tp / name, ignore_errors=True)
        sizes["throughput_rows"] = sum(
            f.rows for f in delta_tables.table_files(str(tp / "events"), where={"interval_id": [i1]}))
        steps += [
            {"app": "dedupe", "name": "dedupe_prev", "root": str(tp), "interval": i0},
            {"app": "dedupe", "name": "dedupe_1M", "root": str(tp), "interval": i1},
            {"app": "dedupe", "name": "dedupe_1M_rerun", "root": str(tp), "interval": i1},
        ]
    if not args.skip_throughput and not reuse:
        f = EventFactory(args.seed)
        per_device = 1 + 1 + 1 + 4 * 5  # registration, links, metadata, 5 changes per resource
        n_dev = max(1, int(args.events * 0.95) // per_device)
        prev = f.history(range(0, n_dev // 20), 1, START_NS)  # a small previous interval
        rows = f.history(range(n_dev // 20, n_dev + n_dev // 20), 5, START_NS + HOUR)
        rng = random.Random(args.seed)
        dups = [dict(r) for r in rng.sample(rows, int(len(rows) * 0.04))]
        dups += [dict(r) for r in rng.sample(prev, min(len(prev), int(len(rows) * 0.01)))]
        for d in dups:
            d["stream_seq"] += 10_000_000
        rows = rows + dups
        rng.shuffle(rows)
        tp = work / "throughput"
        write_events(tp, "events", i0, prev)
        write_events(tp, "events", i1, rows)
        sizes["throughput_rows"] = len(rows)
        steps += [
            {"app": "dedupe", "name": "dedupe_prev", "root": str(tp), "interval": i0},
            {"app": "dedupe", "name": "dedupe_1M", "root": str(tp), "interval": i1},
            {"app": "dedupe", "name": "dedupe_1M_rerun", "root": str(tp), "interval": i1},
            {"app": "rebuild", "name": "rebuild_prev", "root": str(tp), "interval": i0, "time": t0,
             "buckets": args.buckets},
            {"app": "rebuild", "name": "rebuild_1M", "root": str(tp), "interval": i1, "time": t1,
             "buckets": args.buckets},
        ]
        del rows, dups, prev
        if args.dedupe_only:
            steps = [s for s in steps if s["app"] == "dedupe"]

    # 2. history scaling: the same batch of devices on histories of different size
    batch_devices = sorted(random.Random(args.seed + 1).sample(range(args.devices), args.batch_devices))
    scenarios = [] if args.skip_history else [
        ("1x", args.devices, 3, args.buckets),
        ("10x_events", args.devices, 30, args.buckets),
        ("10x_devices", args.devices * 10, 3, args.buckets * 10),
        ("10x_devices_same_buckets", args.devices * 10, 3, args.buckets),
    ]
    generated: dict[tuple[int, int], Path] = {}
    for name, n_devices, changes, buckets in scenarios:
        root = work / f"history_{name}"
        same = generated.get((n_devices, changes))
        if same is not None:  # same input as an earlier scenario: copy it, with its companion table
            for table in ("events_deduped", "msgid_index"):
                shutil.copytree(same / table, root / table, dirs_exist_ok=True)
            sizes[f"history_{name}_rows"] = sizes[f"history_{same.name[len('history_'):]}_rows"]
        else:
            f = EventFactory(args.seed)
            hist = f.history(range(n_devices), changes, START_NS)
            write_events(root, "events_deduped", i0, hist)
            batch = f.batch(batch_devices, START_NS + HOUR)
            write_events(root, "events_deduped", i1, batch)
            sizes[f"history_{name}_rows"] = len(hist)
            sizes["batch_rows"] = len(batch)
            generated[(n_devices, changes)] = root
            del hist
        steps += [
            {"app": "rebuild", "name": f"history_{name}", "root": str(root), "interval": i0, "time": t0,
             "buckets": buckets},
            {"app": "rebuild", "name": f"batch_on_{name}", "root": str(root), "interval": i1, "time": t1,
             "buckets": buckets},
        ]
    print(f"generated inputs in {time.perf_counter() - t_gen:.0f} s: {sizes}", flush=True)

    py_files = build_py_files_zip(work / "py")
    driver = work / "driver.py"
    driver.write_text(DRIVER)
    cfg = work / "cfg.json"
    out = work / "out.json"
    cfg.write_text(json.dumps({"steps": steps, "out": str(out)}))
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYSPARK_PYTHON"] = sys.executable
    cmd = ["spark-submit", "--master", args.master, "--driver-memory", args.driver_memory, "--py-files", py_files,
           "--conf", "spark.ui.enabled=false", str(driver), str(cfg)]
    with exclusive_lock(args.lock):
        t = time.perf_counter()
        with (work / "spark.log").open("wb") as log:
            proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        wall = time.perf_counter() - t
    if proc.returncode != 0:
        tail = (work / "spark.log").read_text(errors="replace").splitlines()[-40:]
        raise SystemExit("spark-submit failed:\n" + "\n".join(tail))
    res = json.loads(out.read_text())

    figures: dict = {"sizes": sizes, "spark_wall_seconds": round(wall, 1), "runs": {}}
    for name, r in res.items():
        s = r["summary"]
        figures["runs"][name] = {"seconds": round(r["seconds"], 2), "driver_peak_rss": r.get("driver_peak_rss"),
                                 "input": s.get("input", s.get("events")),
                                 "touched_buckets": s.get("touched_buckets"), "buckets": s.get("buckets")}
    print(f"\nbench_rebuild (spark-submit {args.master}, one driver; total wall incl. JVM start {wall:.0f} s)")
    if "dedupe_1M" in res:
        d = res["dedupe_1M"]
        n_in = d["summary"]["input"]
        figures["dedupe_events_per_s"] = round(n_in / d["seconds"])
        figures["dedupe_driver_peak_rss"] = d["driver_peak_rss"]
        print(f"  dedupe : the driver's peak RSS (Python) after the first {n_in:,}-row run: "
              f"{d['driver_peak_rss'] / 2**20:,.0f} MiB")
        d2 = res["dedupe_1M_rerun"]
        figures["dedupe_rerun_events_per_s"] = round(n_in / d2["seconds"])
        print(f"  dedupe : {n_in:>9,} rows in {d['seconds']:6.1f} s = {n_in / d['seconds']:>9,.0f} events/s "
              f"(within {d['summary']['within_batch_duplicates']:,}, cross {d['summary']['cross_batch_duplicates']:,}); "
              f"rerun {d2['seconds']:.1f} s = {n_in / d2['seconds']:,.0f} events/s")
    if "rebuild_1M" in res:
        rb = res["rebuild_1M"]
        n_rb = rb["summary"]["events"]
        figures["rebuild_events_per_s"] = round(n_rb / rb["seconds"])
        print(f"  rebuild: {n_rb:>9,} rows in {rb['seconds']:6.1f} s = {n_rb / rb['seconds']:>9,.0f} events/s "
              f"(first snapshot on a small base; {rb['summary']['devices_refolded']:,} devices)")
    if not scenarios:
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=2))
        return figures
    base = res["batch_on_1x"]["seconds"]
    print(f"  same batch ({sizes['batch_rows']:,} rows, {args.batch_devices:,} devices) on top of a history of:")
    for name, n_devices, _changes, buckets in scenarios:
        r = res[f"batch_on_{name}"]
        hist = res[f"history_{name}"]
        ratio = r["seconds"] / base
        figures["runs"][f"batch_on_{name}"]["ratio_to_1x"] = round(ratio, 2)
        print(f"    {name:<26} {sizes[f'history_{name}_rows']:>10,} rows, {n_devices:>7,} devices, {buckets:>4} buckets: "
              f"{r['seconds']:6.1f} s  ({ratio:4.2f}x; touched {r['summary']['touched_buckets']} buckets; "
              f"history build {hist['seconds']:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    main()
