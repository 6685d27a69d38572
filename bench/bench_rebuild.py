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
import fcntl
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import date
from pathlib import Path

from airflow_provider_plgd.tables.layout import Layout

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SEC = 1_000_000_000
START_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
HOUR = 3600 * SEC


# ------------------------------------------------------------------------------------------------
# synthetic events
# ------------------------------------------------------------------------------------------------

class EventFactory:
    """Builds ``events`` rows (dicts) for synthetic devices; deterministic for a seed."""

    def __init__(self, seed: int, owners: int = 10, resources: int = 4) -> None:
        import cbor2

        from airflow_provider_plgd.plgd import ids

        self.ids = ids
        self.cbor2 = cbor2
        self.rng = random.Random(seed)
        self.owners = [ids.owner_id(f"owner-{i}") for i in range(owners)]
        self.hrefs = [f"/light/{i}" for i in range(1, resources + 1)]
        self.seq = 0
        self.versions: dict[str, int] = {}

    def device(self, index: int) -> str:
        return f"00000000-0000-4000-8000-{index:012d}"

    def owner(self, index: int) -> str:
        return self.owners[index % len(self.owners)]

    def _next_version(self, aggregate_id: str) -> int:
        v = self.versions.get(aggregate_id, -1) + 1
        self.versions[aggregate_id] = v
        return v

    def _base(self, dev: int, event_type: str, ts: int, aggregate_id: str | None, href: str | None) -> dict:
        self.seq += 1
        d = self.device(dev)
        version = self._next_version(aggregate_id) if aggregate_id else None
        msg = f"ra:{aggregate_id}:{version}:{event_type}:{ts}" if aggregate_id else f"is:{self.seq:064x}"
        return {
            "stream": "EVENTS", "stream_seq": self.seq, "subject": f"plgd.owners.{self.owner(dev)}.x",
            "owner_id": self.owner(dev), "device_id": d if aggregate_id else None, "event_type": event_type,
            "version": version, "group_id": d if aggregate_id else None, "aggregate_id": aggregate_id,
            "timestamp": ts, "connection_id": "10.1.2.3:5684", "sequence": self.seq, "hub_id": "hub",
            "user_id": "user-1", "correlation_id": "", "owner": "owner", "href": href, "msg_id": msg,
        }

    def registered(self, dev: int, ts: int) -> dict:
        row = self._base(dev, "devicesregistered", ts, None, None)
        row.update(device_ids=[self.device(dev)], registration_owner=f"owner-{dev % len(self.owners)}")
        return row

    def links(self, dev: int, ts: int) -> dict:
        d = self.device(dev)
        row = self._base(dev, "resourcelinkspublished", ts, self.ids.links_aggregate_id(d), None)
        row["resources"] = [{
            "href": h, "device_id": d, "resource_types": ["core.light"], "interfaces": ["oic.if.baseline"],
            "anchor": f"ocf://{d}", "title": "", "supported_content_types": [], "valid_until": 0, "bit_flags": 3,
            "endpoint_informations": [{"endpoint": "coaps+tcp://10.1.2.3:5684", "priority": 1}],
        } for h in self.hrefs]
        return row

    def metadata(self, dev: int, ts: int, online: bool = True) -> dict:
        d = self.device(dev)
        row = self._base(dev, "devicemetadataupdated", ts, self.ids.metadata_aggregate_id(d), None)
        row.update(
            connection={"status": "ONLINE" if online else "OFFLINE", "id": "10.1.2.3:5684", "connected_at": ts,
                        "protocol": "COAPS_TCP", "service_id": "gw-1" if online else "",
                        "local_endpoints": ["coaps+tcp://10.1.2.3:5684"]},
            twin_enabled=True,
            twin_synchronization={"state": "IN_SYNC", "syncing_at": ts, "in_sync_at": ts,
                                  "command_connection_id": "", "command_sequence": 0, "force_synchronization_at": 0},
            canceled=False,
        )
        return row

    def changed(self, dev: int, href: str, ts: int) -> dict:
        d = self.device(dev)
        row = self._base(dev, "resourcechanged", ts, self.ids.resource_aggregate_id(d, href), href)
        value = {"name": href, "power": self.rng.randint(0, 100), "state": self.rng.random() < 0.5}
        row.update(status="OK", resource_types=["core.light"], etag=self.seq.to_bytes(8, "big"),
                   content_type="application/vnd.ocf+cbor", coap_content_format=10000,
                   content_data=self.cbor2.dumps(value), content_json=json.dumps(value, separators=(",", ":")))
        return row

    def update_pair(self, dev: int, href: str, ts: int) -> list[dict]:
        d = self.device(dev)
        agg = self.ids.resource_aggregate_id(d, href)
        corr = f"c-{self.seq}"
        pending = self._base(dev, "resourceupdatepending", ts, agg, href)
        pending.update(correlation_id=corr, valid_until=ts + HOUR // 2, resource_interface="",
                       resource_types=["core.light"], content_type="application/json", coap_content_format=-1,
                       content_data=b'{"power":1}', content_json='{"power":1}')
        done = self._base(dev, "resourceupdated", ts + SEC, agg, href)
        done.update(correlation_id=corr, status="OK", resource_types=["core.light"])
        return [pending, done]

    def history(self, devices: range, changes_per_resource: int, t0: int) -> list[dict]:
        """Registration, links, metadata and ``changes_per_resource`` changes per resource."""
        rows = []
        for dev in devices:
            ts = t0 + dev * 1000
            rows += [self.registered(dev, ts), self.links(dev, ts + 1), self.metadata(dev, ts + 2)]
            for c in range(changes_per_resource):
                for h in self.hrefs:
                    rows.append(self.changed(dev, h, ts + 10 + c * 10))
        return rows

    def batch(self, devices: list[int], t0: int) -> list[dict]:
        """~20 events per device: changes, an update command with its confirmation, a reconnect."""
        rows = []
        for i, dev in enumerate(devices):
            ts = t0 + i * 1000
            for c in range(3):
                for h in self.hrefs:
                    rows.append(self.changed(dev, h, ts + c * 10))
            rows += self.update_pair(dev, self.hrefs[0], ts + 100)
            rows += [self.metadata(dev, ts + 200, online=False), self.metadata(dev, ts + 300)]
            rows.append(self.links(dev, ts + 400))
        return rows


def write_events(root: Path, table_dir: str, interval_id: str, rows: list[dict]) -> None:
    """Commit ``rows`` to the Delta table ``{root}/{table_dir}`` (``events`` or ``events_deduped``)
    as the interval's rows, as ``decode_events`` / ``dedupe_events`` commit them (one file per event
    type, the same idempotency key, so dedupe and rebuild take them as committed)."""
    import time as _time

    import pyarrow as pa
    import pyarrow.compute as pc

    from airflow_provider_plgd.spark import schemas
    from airflow_provider_plgd.spark.parquet_io import write_parquet_file
    from airflow_provider_plgd.tables import delta_tables, file_records
    from airflow_provider_plgd.tables.storage import to_fs

    day = date(2026, 1, 1)
    names = schemas.EVENTS_SCHEMA.names
    cols = {n: [r.get(n) for r in rows] for n in names}
    cols["interval_id"] = [interval_id] * len(rows)
    cols["date"] = [day] * len(rows)
    cols["published_at"] = [None] * len(rows)
    table = pa.table(cols, schema=schemas.EVENTS_SCHEMA)
    uri = str(root / table_dir)
    fs, base = to_fs(uri)
    partitions = delta_tables.INTERVAL_TABLES[table_dir]
    records = []
    for event_type in sorted(set(table.column("event_type").to_pylist())):
        part = table.filter(pc.equal(table.column("event_type"), event_type)).drop_columns(list(partitions))
        rel = f"interval_id={interval_id}/event_type={event_type}/part-00000-bench.parquet"
        size, meta = write_parquet_file(fs, f"{base}/{rel}", part, row_group_size=100_000)
        records.append(file_records.file_record(rel, rows=part.num_rows, size=size,
                                                partition={"interval_id": interval_id, "event_type": event_type},
                                                stats=file_records.parquet_stats(meta)))
    from airflow_provider_plgd.spark.dedupe_job import MSGID_INDEX_SCHEMA

    # the next stage takes an interval only when one run committed all of the app's tables
    # (delta_tables.run_committed): the companion table (quarantine, msgid_index) gets an empty
    # commit of the same run
    app, companion, companion_schema = (("decode", delta_tables.QUARANTINE, schemas.QUARANTINE_SCHEMA)
                                        if table_dir == delta_tables.EVENTS else
                                        ("dedupe", delta_tables.MSGID_INDEX, MSGID_INDEX_SCHEMA))
    run_version = _time.time_ns() // 1_000_000
    for name, schema, files in ((table_dir, schemas.EVENTS_SCHEMA, records), (companion, companion_schema, [])):
        delta_tables.commit_files(delta_tables.interval_table_uri(Layout.of(str(root)), name), files, schema=schema,
                                  partition_by=delta_tables.INTERVAL_TABLES[name],
                                  replace=delta_tables.interval_filter(interval_id),
                                  metadata={"interval_id": interval_id}, app_id=f"plgd.{app}.{name}/{interval_id}",
                                  run_version=run_version)


def interval(k: int) -> tuple[str, str]:
    from airflow_provider_plgd import times

    return times.interval_id(START_NS + k * HOUR, START_NS + (k + 1) * HOUR), str(START_NS + (k + 1) * HOUR)


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


@contextmanager
def exclusive_lock(path: str):
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


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
