"""Benchmark: does the ETL's plan + fetch + decode cost grow with the number of owners? Same messages, few vs many owners.

Starts its own nats-server (``plgd_devtools.nats_server``) with the plgd bundle stream. For each
case of ``--owners`` (default ``8,100000``) it re-creates the stream, publishes ``--messages``
messages (default 200,000; ``messages / owners`` per owner, at least 1) on plgd subjects, then runs
what the ETL DAG runs for the interval:

1. ``plan``: ``etl.write_interval_ledger`` (every owner selected, every event type): the interval's
   stream-sequence range cut into at most ``--max-fetch-tasks`` ranges of about
   ``--fetch-range-messages`` messages, each counted on the server;
2. ``fetch``: ``JetStreamToStagingOperator(ledger=..., ledger_range=i)`` for every range, one
   after the other (the DAG maps them over workers);
3. ``decode`` (unless ``--no-decode``): ``spark_apps/decode_events.py --ledger ...`` through a
   real ``spark-submit --master local[2]`` (``FAST_LOCAL_SPARK_CONF``), under ``/tmp/spark.lock``
   (the wait for the lock is not timed). Its wall time is the whole ``spark-submit`` (JVM start
   included); its driver's peak RSS is the ``VmHWM`` of the Python driver process (the one that
   runs ``decode_events.py``), polled every 50 ms until it exits.

Prints per case the wall time of plan, fetch and decode, the staging data files (every
``*.parquet`` under ``{root}/staging``, whatever the layout) and their bytes, the decode driver's
peak RSS, the sizes of the ledger's ``stream.json`` and fetch records, and what the
server saw during plan + fetch, counted on a separate nats-py connection: consumers created
(``$JS.EVENT.ADVISORY.CONSUMER.CREATED.>``), JetStream API requests (``$JS.EVENT.ADVISORY.API``:
one audit advisory per request; pull requests ``$JS.API.CONSUMER.MSG.NEXT.*`` are not audited and
are counted apart by subscribing to them). Then the ratio of the last case to the first.
Figures, not a test. Usage:
``python -m bench.bench_owners [--owners 8,100000] [--messages 200000] [--max-fetch-tasks 16] [--s3]``
(``--s3``: the storage root on a moto S3 server started here, ``plgd_devtools.s3_server``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone

from airflow_provider_plgd.tables.layout import Layout
from plgd_devtools.nats_server import NatsServer, recreate_stream
from plgd_devtools.s3_server import S3Server

#: Subjects counted by :class:`ServerCounts` (name -> subject).
COUNTED = {
    "consumers": "$JS.EVENT.ADVISORY.CONSUMER.CREATED.>",
    "api": "$JS.EVENT.ADVISORY.API",
    "pulls": "$JS.API.CONSUMER.MSG.NEXT.>",
}


def _subject(owner: str, i: int) -> str:
    device = f"{i:08d}-1111-2222-3333-444444444444"
    return f"plgd.owners.{owner}.devices.{device}.metadata.devicemetadataupdated"


def owner_ids(n: int) -> list[str]:
    """``n`` distinct owner IDs in UUID form."""
    return [f"{i:08x}-0000-4000-8000-000000000000" for i in range(n)]


async def _publish(url: str, owners: list[str], per_owner: int) -> int:
    """Core-NATS publish, then wait until the stream holds them all; return the count."""
    import nats

    nc = await nats.connect(url)
    payload = b"x" * 64
    n = 0
    for owner in owners:
        for i in range(per_owner):
            await nc.publish(_subject(owner, i), payload)
            n += 1
    await nc.flush()
    deadline = time.monotonic() + 300
    while True:
        state = json.loads((await nc.request("$JS.API.STREAM.INFO.EVENTS", b"", timeout=10)).data)["state"]
        if state["messages"] >= n or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    await nc.close()
    if state["messages"] != n:
        raise SystemExit(f"stream holds {state['messages']} messages, expected {n}")
    return n


class ServerCounts:
    """Count the messages of :data:`COUNTED` on a separate connection (its own thread and event loop).

    ``start()`` subscribes and flushes; ``snapshot()`` flushes, waits ``settle`` seconds for the
    server's advisories and returns ``{name: count}`` since ``start()``; ``close()`` disconnects.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.counts = dict.fromkeys(COUNTED, 0)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.nc = None

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    async def _start(self) -> None:
        import nats

        self.nc = await nats.connect(self.url)
        for name, subject in COUNTED.items():
            async def count(_msg, name=name) -> None:
                self.counts[name] += 1
            await self.nc.subscribe(subject, cb=count)
        await self.nc.flush()

    def start(self) -> None:
        self._call(self._start())

    def snapshot(self, settle: float = 1.0) -> dict[str, int]:
        self._call(self.nc.flush())
        time.sleep(settle)
        self._call(self.nc.flush())
        return dict(self.counts)

    def close(self) -> None:
        self._call(self.nc.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _data_files(folder: str) -> tuple[int, int]:
    """``(files, bytes)`` of every ``*.parquet`` below ``folder`` (any staging layout; not the Delta log)."""
    from airflow_provider_plgd.tables import storage

    fs, path = storage.to_fs(folder)
    found = fs.find(path, detail=True)
    sizes = [int(info["size"]) for name, info in found.items()
             if name.endswith(".parquet") and "/_delta_log/" not in name]
    return len(sizes), sum(sizes)


def _peak_rss_of(proc, marker: str, period: float = 0.05) -> tuple[int, float]:
    """Wait for ``proc`` (a ``subprocess.Popen``); return ``(returncode, peak RSS in MB)`` of its
    descendant whose command line holds ``marker`` (``VmHWM``, read until the process ends)."""
    import psutil

    peak = 0
    root = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            for child in root.children(recursive=True):
                try:
                    if any(marker in part for part in child.cmdline()):
                        with open(f"/proc/{child.pid}/status") as fh:
                            for line in fh:
                                if line.startswith("VmHWM:"):
                                    peak = max(peak, int(line.split()[1]) * 1024)
                except (psutil.Error, OSError):
                    pass
        except psutil.Error:
            pass
        time.sleep(period)
    return proc.returncode, peak / 1e6


def run_decode(root: str, interval: str, log_path: str) -> tuple[float, float]:
    """``decode_events.py --ledger`` through ``spark-submit --master local[2]``; return ``(wall s, driver peak RSS MB)``."""
    import shutil
    import subprocess

    from airflow_provider_plgd.spark_deps import spark_app_path
    from plgd_devtools.spark import FAST_LOCAL_SPARK_CONF, spark_lock, spark_submit_env

    app = str(spark_app_path("decode_events"))
    cmd = [shutil.which("spark-submit") or "spark-submit", "--master", "local[2]"]
    for key, value in FAST_LOCAL_SPARK_CONF.items():
        cmd += ["--conf", f"{key}={value}"]
    cmd += [app, "--root", root, "--stream", "EVENTS", "--ledger",
            "--interval-id", interval, "--log-level", "WARN"]
    env = spark_submit_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env.get("PYTHONPATH", "")) if p)
    with spark_lock(), open(log_path, "w") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        code, peak = _peak_rss_of(proc, "decode_events.py")
        wall = time.perf_counter() - t0
    if code:
        with open(log_path) as fh:
            raise SystemExit(f"decode failed ({code}):\n" + "".join(fh.readlines()[-40:]))
    return wall, peak


def _sizes(folder: str, pattern: str) -> int:
    from airflow_provider_plgd.tables import storage

    fs, path = storage.to_fs(folder)
    return sum(int(info["size"]) for info in fs.glob(f"{path}/{pattern}", detail=True).values())


def _rss_mb(pid: int | None) -> float:
    try:
        import psutil

        return psutil.Process(pid).memory_info().rss / 1e6
    except Exception:  # a figure only
        return float("nan")


def run_case(server: NatsServer, tmp: str, n_owners: int, args: argparse.Namespace, s3: S3Server | None) -> dict:
    """Publish, plan and fetch one case; return its figures."""
    from airflow_provider_plgd import times
    from airflow_provider_plgd.etl import write_interval_ledger
    from airflow_provider_plgd.hooks.jetstream import JetStreamHook
    from airflow_provider_plgd.operators.jetstream_to_staging import JetStreamToStagingOperator
    from airflow_provider_plgd.plgd.event_types import EVENT_TYPES
    from airflow_provider_plgd.tables import ledger

    per_owner = max(1, args.messages // n_owners)
    recreate_stream(server.url)
    start = datetime.now(timezone.utc) - timedelta(seconds=1)
    t0 = time.perf_counter()
    published = asyncio.run(_publish(server.url, owner_ids(n_owners), per_owner))
    t_pub = time.perf_counter() - t0
    end = datetime.now(timezone.utc) + timedelta(milliseconds=1)
    time.sleep(0.1)  # the interval is complete on the server's clock
    root = s3.root_url(f"root-{n_owners}") if s3 else f"{tmp}/root-{n_owners}"
    interval = times.interval_id(start, end)
    counts = ServerCounts(server.url)
    counts.start()
    t0 = time.perf_counter()
    record = write_interval_ledger(JetStreamHook(jetstream_conn_id="plgd_jetstream_default", stream="EVENTS"),
                                   Layout.of(root), times.Interval.of(start, end), None, list(EVENT_TYPES), accept_fewer=False,
                                   max_ranges=args.max_fetch_tasks, range_messages=args.fetch_range_messages)
    t_plan = time.perf_counter() - t0
    if record["total"] != published:
        raise SystemExit(f"the plan counts {record['total']}, published {published}")
    at_plan = counts.snapshot()
    base = ledger.interval_dir(Layout.of(root), "EVENTS", interval)
    t0 = time.perf_counter()
    staged = 0
    for i in range(record["fetch_ranges"]):
        result = JetStreamToStagingOperator(
            task_id="fetch", jetstream_conn_id="plgd_jetstream_default", stream="EVENTS", storage_root=root,
            ledger=base, ledger_range=str(i)).execute({"params": {}})
        staged += int(result["count"])
    t_fetch = time.perf_counter() - t0
    total = counts.snapshot()
    counts.close()
    if staged != published:
        raise SystemExit(f"the fetch staged {staged}, published {published}")
    t_decode = peak = float("nan")
    if args.decode:
        t_decode, peak = run_decode(root, interval, f"{tmp}/decode-{n_owners}.log")
    files, size = _data_files(f"{root}/staging")
    return {"owners": n_owners, "messages": published, "publish_s": t_pub, "plan_s": t_plan, "fetch_s": t_fetch,
            "decode_s": t_decode, "decode_driver_peak_mb": peak, "staging_files": files, "staging_bytes": size,
            "ranges": record["fetch_ranges"],
            "records_bytes": _sizes(base, "fetch/range-*.json"), "stream_json_bytes": _sizes(base, "stream.json"),
            "plan_counts": at_plan, "counts": total, "rss_mb": _rss_mb(server.pid)}


def _print_case(c: dict) -> None:
    pc, tc = c["plan_counts"], c["counts"]
    print(f"owners {c['owners']:,}, messages {c['messages']:,} (published in {c['publish_s']:.1f} s), "
          f"{c['ranges']} range(s)")
    print(f"  plan        {c['plan_s']:8.2f} s   consumers {pc['consumers']:,}, API requests {pc['api']:,}, "
          f"pull requests {pc['pulls']:,}")
    print(f"  fetch       {c['fetch_s']:8.2f} s   consumers {tc['consumers'] - pc['consumers']:,}, "
          f"API requests {tc['api'] - pc['api']:,}, pull requests {tc['pulls'] - pc['pulls']:,}")
    print(f"  plan+fetch  {c['plan_s'] + c['fetch_s']:8.2f} s   consumers {tc['consumers']:,}, "
          f"API requests {tc['api']:,}, pull requests {tc['pulls']:,}; nats-server RSS {c['rss_mb']:.0f} MB")
    print(f"  decode      {c['decode_s']:8.2f} s   driver peak RSS {c['decode_driver_peak_mb']:.0f} MB")
    print(f"  total       {c['plan_s'] + c['fetch_s'] + c['decode_s']:8.2f} s   plan + fetch + decode")
    print(f"  staging     {c['staging_files']:,} data files, {c['staging_bytes'] / 1e6:.1f} MB")
    if "records_bytes" in c:
        print(f"  ledger      stream.json {c['stream_json_bytes']:,} bytes, fetch records {c['records_bytes']:,} bytes")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--owners", default="8,100000", help="comma-separated owner counts, one case each")
    parser.add_argument("--messages", type=int, default=200_000, help="messages per case")
    parser.add_argument("--max-fetch-tasks", type=int, default=16)
    parser.add_argument("--fetch-range-messages", type=int, default=100_000)
    parser.add_argument("--s3", action="store_true",
                        help="the storage root on a moto S3 server started here (default: a local folder)")
    parser.add_argument("--no-decode", dest="decode", action="store_false",
                        help="skip the decode step (spark-submit)")
    parser.add_argument("--json", help="also write the figures of every case to this file")
    parser.add_argument("--log-level", default="WARNING", help="level of the provider's loggers")
    args = parser.parse_args(argv)
    import logging

    logging.basicConfig(level=args.log_level)
    for name in ("airflow", "airflow.task", "airflow_provider_plgd"):
        logging.getLogger(name).setLevel(args.log_level)

    cases = [int(n) for n in args.owners.split(",")]
    load_before = os.getloadavg()
    print(f"load average at start: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f} "
          f"({os.cpu_count()} cores, shared)")
    results = []
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-owners-"))
        server = stack.enter_context(NatsServer(store_dir=f"{tmp}/js"))
        s3 = stack.enter_context(S3Server()) if args.s3 else None
        if s3:
            os.environ.update(s3.env())
        host, port = server.url.removeprefix("nats://").rsplit(":", 1)
        os.environ["AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT"] = json.dumps(
            {"conn_type": "plgd_jetstream", "host": host, "port": int(port), "extra": {"stream": "EVENTS"}})
        for n in cases:
            results.append(run_case(server, tmp, n, args, s3))
            _print_case(results[-1])
    load = os.getloadavg()
    print(f"load average at end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if len(results) > 1:
        a, b = results[0], results[-1]

        def ratio(x: float, y: float) -> str:
            return f"{x / y:.2f}x" if y else "n/a"

        print(f"ratio {b['owners']:,} owners / {a['owners']:,} owners: "
              f"plan {ratio(b['plan_s'], a['plan_s'])}, fetch {ratio(b['fetch_s'], a['fetch_s'])}, "
              f"decode {ratio(b['decode_s'], a['decode_s'])}, "
              f"plan+fetch {ratio(b['plan_s'] + b['fetch_s'], a['plan_s'] + a['fetch_s'])}, "
              f"plan+fetch+decode {ratio(b['plan_s'] + b['fetch_s'] + b['decode_s'], a['plan_s'] + a['fetch_s'] + a['decode_s'])}, "
              f"decode driver peak RSS {ratio(b['decode_driver_peak_mb'], a['decode_driver_peak_mb'])}, "
              f"staging files {ratio(b['staging_files'], a['staging_files'])}, "
              f"consumers {ratio(b['counts']['consumers'], a['counts']['consumers'])}, "
              f"API requests {ratio(b['counts']['api'], a['counts']['api'])}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"cases": results, "load_before": load_before, "load_after": os.getloadavg()}, fh, indent=1)


if __name__ == "__main__":
    main()
