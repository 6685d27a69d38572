"""Benchmark: JetStream -> committed Parquet staging, our operator vs a naive nats-py fetch() loop.

Prints figures (not a test):

* msgs/s and MB/s (payload bytes) from the first pull to committed Parquet, for
  ``JetStreamToStagingOperator`` (sequence-range mode, one owner x one event type) and for a
  naive loop on the same data (``js.pull_subscribe`` + ``fetch(100)`` + ``msg.ack()`` per
  message, rows gathered in a list, one ``pq.write_table`` at the end), and the ratio;
* peak RSS (``ru_maxrss``) of each run, each in its own subprocess, at every size, and the
  growth from the smallest to the largest size.

Targets (issue "Bounded fetch into Parquet staging"): operator >= 4x the naive loop; operator
peak RSS growth < 50 MB from 100k to 1M messages.

Usage::

    python -m bench.bench_fetch                      # 100k and 1M messages, ~300 B payloads
    python -m bench.bench_fetch --sizes 20000 100000 --payload-bytes 500
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OWNER = "e1407479-3136-56c0-9908-bb02fb0339e2"
SUBJECT = f"plgd.owners.{OWNER}.registrations.devicesregistered"
OTHER = f"plgd.owners.{OWNER}.devices.d1.metadata.devicemetadataupdated"
EVENT_TYPE = "devicesregistered"


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------
async def _publish(url: str, count: int, payload_bytes: int, other_every: int) -> int:
    """Publish ``count`` messages of our subject (plus one of another subject every ``other_every``),
    with payload sizes uniform in [payload_bytes/2, 3*payload_bytes/2] (random bytes, like snappy
    output). Core publishes with a flush every 5000, then wait until the stream holds them all."""
    import nats

    rng = random.Random(1)
    blob = rng.randbytes(4 * payload_bytes)
    nc = await nats.connect(url)
    js = nc.jetstream()
    sent = 0
    for i in range(count):
        size = rng.randint(payload_bytes // 2, payload_bytes * 3 // 2)
        off = rng.randint(0, len(blob) - size)
        await nc.publish(SUBJECT, blob[off:off + size])
        sent += 1
        if other_every and i % other_every == 0:
            await nc.publish(OTHER, blob[:64])
            sent += 1
        if sent % 5000 < 2:
            await nc.flush()
    await nc.flush()
    deadline = time.monotonic() + 120
    while (await js.stream_info("EVENTS")).state.messages < sent:
        if time.monotonic() > deadline:
            raise RuntimeError("the stream did not store every published message")
        await asyncio.sleep(0.2)
    await nc.close()
    return sent


# ---------------------------------------------------------------------------------------------
# children (one process per run, so ru_maxrss is that run's peak)
# ---------------------------------------------------------------------------------------------
def _child_operator(url: str, root: str, last_seq: int) -> dict:
    host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
    os.environ["AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT"] = json.dumps(
        {"conn_type": "plgd_jetstream", "host": host, "port": int(port), "extra": {"stream": "EVENTS"}})
    import pyarrow.parquet  # noqa: F401

    # A warm process, as an Airflow worker is: modules imported and the connection looked up once
    # (the naive loop's imports are outside its timing too).
    import airflow_provider_plgd.plgd.subjects  # noqa: F401
    from airflow_provider_plgd.hooks.jetstream import JetStreamHook
    from airflow_provider_plgd.operators.jetstream_to_staging import JetStreamToStagingOperator

    JetStreamHook.get_connection("plgd_jetstream_default")
    op = JetStreamToStagingOperator(task_id="bench", owner_id=OWNER, event_type=EVENT_TYPE, start_seq=1,
                                    end_seq=last_seq, storage_root=root, progress_interval_seconds=3600,
                                    progress_every_messages=10**9)
    started = time.perf_counter()
    out = op.execute({"params": {}})
    return {"seconds": time.perf_counter() - started, "count": out["count"], "bytes": out["bytes"]}


async def _naive(url: str, root: str) -> dict:
    import nats
    import pyarrow as pa
    import pyarrow.parquet as pq

    started = time.perf_counter()
    nc = await nats.connect(url)
    js = nc.jetstream()
    psub = await js.pull_subscribe(SUBJECT, stream="EVENTS")
    rows = []
    while True:
        try:
            msgs = await psub.fetch(100, timeout=1)
        except nats.errors.TimeoutError:
            break
        for msg in msgs:
            meta = msg.metadata
            rows.append({"stream": "EVENTS", "stream_seq": meta.sequence.stream, "subject": msg.subject,
                         "published_at": meta.timestamp, "msg_id": (msg.headers or {}).get("Nats-Msg-Id"),
                         "headers": list((msg.headers or {}).items()) or None, "data": msg.data})
            await msg.ack()
    await nc.close()
    table = pa.Table.from_pylist(rows)
    os.makedirs(root, exist_ok=True)
    pq.write_table(table, os.path.join(root, "naive.parquet"))
    # the 1 s fetch timeout that ends the loop is not work: do not count it
    seconds = time.perf_counter() - started - 1.0
    return {"seconds": seconds, "count": len(rows), "bytes": sum(len(r["data"]) for r in rows)}


def _child(kind: str, url: str, root: str, last_seq: int) -> None:
    result = _child_operator(url, root, last_seq) if kind == "operator" else asyncio.run(_naive(url, root))
    result["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    print("BENCH_RESULT " + json.dumps(result))


def _run_child(kind: str, url: str, root: str, last_seq: int, env: dict) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.bench_fetch", "--child", kind, "--url", url, "--root", root,
         "--last-seq", str(last_seq)],
        env=env, capture_output=True, text=True, cwd=str(Path(__file__).resolve().parents[1]),
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("BENCH_RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{kind} run failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(line[len("BENCH_RESULT "):])


def _best(runs: list[dict]) -> dict:
    """The fastest run, with the highest peak RSS of all runs (RSS is not a speed figure)."""
    best = dict(min(runs, key=lambda r: r["seconds"]))
    best["maxrss_mb"] = max(r["maxrss_mb"] for r in runs)
    return best


# ---------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--payload-bytes", type=int, default=300)
    parser.add_argument("--other-every", type=int, default=10,
                        help="interleave one message of another subject every N (0: none)")
    parser.add_argument("--naive-max", type=int, default=1_000_000,
                        help="skip the naive loop above this size (it holds the batch in memory)")
    parser.add_argument("--repeat", type=int, default=2,
                        help="runs per size and kind, interleaved; the fastest counts (the machine is shared)")
    parser.add_argument("--child", choices=["operator", "naive"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--last-seq", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.url, args.root, args.last_seq)
        return 0

    work = Path(tempfile.mkdtemp(prefix="plgd-bench-fetch-"))
    env = {**os.environ, "AIRFLOW_HOME": str(work / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING"}
    results = []
    try:
        _measure(args, work, env, results)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _report(args, results)
    return 0


def _measure(args, work: Path, env: dict, results: list) -> None:
    from plgd_devtools.nats_server import NatsServer, recreate_stream

    with NatsServer(store_dir=work / "nats") as server:
        for size in args.sizes:
            recreate_stream(server.url)
            t = time.perf_counter()
            total = asyncio.run(_publish(server.url, size, args.payload_bytes, args.other_every))
            print(f"[bench] published {total} messages ({size} to fetch) in {time.perf_counter() - t:.1f} s",
                  flush=True)
            ops, naives = [], []
            for rep in range(args.repeat):
                ops.append(_run_child("operator", server.url, str(work / f"op-{size}-{rep}"), total, env))
                if size <= args.naive_max:
                    naives.append(_run_child("naive", server.url, str(work / f"naive-{size}-{rep}"), total, env))
            op = _best(ops)
            naive = _best(naives) if naives else None
            for name, r in (("operator", op), ("naive", naive)):
                if r is None:
                    continue
                if r["count"] != size:
                    raise RuntimeError(f"{name} fetched {r['count']} messages, expected {size}")
                print(f"[bench] {size:>9} msgs  {name:<8} {r['seconds']:7.2f} s  {size / r['seconds']:>9,.0f} msgs/s  "
                      f"{r['bytes'] / 1e6 / r['seconds']:6.1f} MB/s  peak RSS {r['maxrss_mb']:6.1f} MB", flush=True)
            results.append((size, op, naive))


def _report(args, results: list) -> None:
    print("\n=== JetStream -> committed Parquet: operator vs naive nats-py fetch loop ===")
    print(f"payload ~{args.payload_bytes} B; 1 in {args.other_every} messages on another subject")
    print(f"{'messages':>10} {'operator msg/s':>15} {'MB/s':>7} {'naive msg/s':>12} {'MB/s':>7} {'ratio':>6} "
          f"{'op RSS MB':>10} {'naive RSS MB':>13}")
    for size, op, naive in results:
        op_rate = size / op["seconds"]
        line = f"{size:>10,} {op_rate:>15,.0f} {op['bytes'] / 1e6 / op['seconds']:>7.1f}"
        if naive:
            nv_rate = size / naive["seconds"]
            line += (f" {nv_rate:>12,.0f} {naive['bytes'] / 1e6 / naive['seconds']:>7.1f} {op_rate / nv_rate:>5.1f}x"
                     f" {op['maxrss_mb']:>10.1f} {naive['maxrss_mb']:>13.1f}")
        else:
            line += f" {'-':>12} {'-':>7} {'-':>6} {op['maxrss_mb']:>10.1f} {'-':>13}"
        print(line)
    if len(results) > 1:
        growth = results[-1][1]["maxrss_mb"] - results[0][1]["maxrss_mb"]
        print(f"operator peak RSS growth {results[0][0]:,} -> {results[-1][0]:,} messages: {growth:+.1f} MB "
              f"(target < 50 MB)")
    ratios = [size / op["seconds"] / (size / nv["seconds"]) for size, op, nv in results if nv]
    if ratios:
        print(f"speed-up over the naive loop: {min(ratios):.1f}x .. {max(ratios):.1f}x (target >= 4x)")


if __name__ == "__main__":
    sys.exit(main())
