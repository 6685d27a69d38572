"""Benchmark: read rate of the Spark data source ``plgd-jetstream`` against the hook and nats-py.

Starts its own nats-server (``plgd_devtools.nats_server``), creates the plgd bundle stream,
publishes ``--messages`` (default 1,000,000) messages of ``--size`` (default 300) bytes on
realistic plgd subjects (``bench.bench_hook_read``'s), then reads them all, each way in turn:

- **raw pull ceiling**: nats-py alone, no parsing: ``$JS.API.CONSUMER.MSG.NEXT`` pulls of 10,000
  messages (two in flight) into one inbox subscription whose callback only counts (what the
  client library can take in at all);
- **hook**: ``JetStreamHook.iter_batches("plgd.>")`` (the fetch task's read loop: pulls, reply
  subject parsing, batches of ``StreamMessage``);
- **data source**: ``spark.read.format("plgd-jetstream")`` with 1, 2 and 4 partitions
  (``--partitions``; ``max_partition_messages`` = messages / partitions), ``local[--cores]``
  (default 2), the rows counted and their payload bytes summed by Spark (every row reaches the
  JVM). The time includes planning (the exact counts per range on the server) and, for the first
  run, starting the Python workers; each partition count runs ``--repeat`` times (default 2).

Prints msgs/s, MB/s (payload, 10^6 bytes), wall seconds, CPU seconds of this process and of its
children (the JVM and its Python workers, the nats-server) and the share of the machine's CPUs
that was busy. Spark runs hold the Spark lock (``/tmp/spark.lock``). Usage::

    python -m bench.bench_datasource [--messages N] [--size BYTES] [--partitions 1 2 4] [--cores 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Callable
from typing import Any

from bench.bench_hook_read import _fill, _hook_read
from bench.machine import busy_since, proc_stat
from plgd_devtools.nats_server import NatsServer


def _tree_cpu() -> float:
    """CPU seconds of this process and its descendants (ended ones too, once waited for)."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


async def _raw_pull(url: str, n: int, batch: int = 10_000) -> tuple[int, int]:
    """nats-py with raw pull requests and a counting callback (no parsing): the client's ceiling."""
    import nats

    nc = await nats.connect(url)
    name = "bench_raw"
    config = {"name": name, "ack_policy": "none", "deliver_policy": "all", "mem_storage": True,
              "inactive_threshold": 60 * 10**9}
    await nc.request(f"$JS.API.CONSUMER.CREATE.EVENTS.{name}", json.dumps({"stream_name": "EVENTS", "config": config})
                     .encode(), timeout=10)
    done = asyncio.Event()
    seen = {"count": 0, "bytes": 0, "asked": 0}
    inbox = nc.new_inbox()

    async def ask() -> None:
        seen["asked"] += batch
        await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.EVENTS.{name}",
                         json.dumps({"batch": batch, "expires": 30 * 10**9}).encode(), reply=inbox)

    async def on_msg(msg: Any) -> None:
        if not msg.reply:  # a status (e.g. 408 at the end)
            return
        seen["count"] += 1
        seen["bytes"] += len(msg.data)
        if seen["count"] >= n:
            done.set()
        elif seen["count"] % batch == 0 and seen["asked"] < n:
            await ask()

    await nc.subscribe(inbox, cb=on_msg, pending_msgs_limit=4 * batch, pending_bytes_limit=0)
    await ask()
    await ask()
    await asyncio.wait_for(done.wait(), 600)
    await nc.request(f"$JS.API.CONSUMER.DELETE.EVENTS.{name}", b"", timeout=10)
    await nc.close()
    return seen["count"], seen["bytes"]


def _spark_session(cores: int) -> Any:
    from pyspark.sql import SparkSession

    from airflow_provider_plgd.spark.datasource import JetStreamDataSource

    spark = (SparkSession.builder.master(f"local[{cores}]").appName("plgd-bench-datasource")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.driver.memory", "2g").getOrCreate())
    spark.dataSource.register(JetStreamDataSource)
    return spark


def _spark_read(spark: Any, url: str, n: int, partitions: int) -> tuple[int, int]:
    from pyspark.sql import functions as F

    df = (spark.read.format("plgd-jetstream").option("servers", url)
          .option("max_partition_messages", str(-(-n // partitions))).load())
    row = (df.select(F.spark_partition_id().alias("p"), F.length("data").alias("size"))
           .agg(F.count("*").alias("n"), F.sum("size").alias("b"), F.countDistinct("p").alias("p")).collect()[0])
    if row["p"] != partitions:
        raise SystemExit(f"planned {row['p']} partitions, expected {partitions}")
    return int(row["n"]), int(row["b"] or 0)


def _measure(name: str, run: Callable[[], tuple[int, int]], expected: int, results: list[dict]) -> None:
    t0, c0, s0 = time.perf_counter(), _tree_cpu(), proc_stat()
    count, nbytes = run()
    secs, cpu = time.perf_counter() - t0, _tree_cpu() - c0
    if count != expected:
        raise SystemExit(f"{name}: read {count} messages, expected {expected}")
    entry = {"name": name, "messages": count, "seconds": round(secs, 2), "msgs_per_s": round(count / secs),
             "mb_per_s": round(nbytes / secs / 1e6, 1), "cpu_s": round(cpu, 2), "busy": busy_since(s0)}
    results.append(entry)
    print(f"{name:34s} {entry['msgs_per_s']:>10,} msgs/s {entry['mb_per_s']:7.1f} MB/s  {secs:6.2f} s wall  "
          f"{cpu:6.2f} s CPU (this process + children)  CPUs {entry['busy']:.0%} busy", flush=True)


def main(argv: list[str] | None = None) -> list[dict]:
    """Run the benchmark and print the figures; return them as a list of dicts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=300, help="payload bytes per message")
    parser.add_argument("--partitions", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--cores", type=int, default=2, help="Spark local[N]")
    parser.add_argument("--repeat", type=int, default=2, help="runs per partition count")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)

    from plgd_devtools.spark import spark_lock, spark_submit_env

    results: list[dict] = []
    with NatsServer() as server:
        _fill(server, args.messages, args.size)
        n = args.messages
        _measure("raw pull ceiling (nats-py)", lambda: asyncio.run(_raw_pull(server.url, n)), n, results)
        _measure("hook.iter_batches", lambda: _hook_read(1000), n, results)
        os.environ.update(spark_submit_env())
        with spark_lock():
            spark = _spark_session(args.cores)
            try:
                for p in args.partitions:
                    for i in range(args.repeat):
                        _measure(f"data source, {p} partition(s), run {i + 1}",
                                 lambda p=p: _spark_read(spark, server.url, n, p), n, results)
            finally:
                spark.stop()
        print(f"load average at the end {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "results": results}, fh, indent=1)
    return results


if __name__ == "__main__":
    main()
