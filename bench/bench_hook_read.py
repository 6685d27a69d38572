"""Benchmark: read speed of ``JetStreamHook.iter_batches`` vs a naive nats-py pull loop.

Starts its own nats-server (``plgd_devtools.nats_server``), creates the plgd
bundle stream, publishes ``--messages`` (default 200 000) messages of ``--size`` (default 300)
bytes on realistic plgd subjects, then reads them all back:

- ``hook.iter_batches("plgd.>")`` (raw MSG.NEXT pulls into a callback subscription);
- ``js.pull_subscribe("plgd.>", ...)`` + ``fetch(batch)`` loop (nats-py's own pull consumer,
  ack none), the naive baseline: once reading ``msg.metadata`` (stream seq and time, which the
  hook also delivers) and once payload only.

Prints msgs/s and MB/s (payload bytes, 10^6, wall clock) of each, the client process CPU
time (useful on a busy machine, where wall clock is noisy) and the ratios. Usage:
``python -m bench.bench_hook_read [--messages N] [--size BYTES] [--batch N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

from plgd_devtools.nats_server import NatsServer, recreate_stream


def _subject(i: int) -> str:
    owner = f"0000000{i % 3}-0000-0000-0000-000000000000"
    device = f"{i % 50:08d}-1111-2222-3333-444444444444"
    return f"plgd.owners.{owner}.devices.{device}.metadata.devicemetadataupdated"


async def _publish(url: str, n: int, size: int) -> None:
    """Core-NATS publish (fast; the stream stores it), then wait until the stream holds n."""
    import nats

    nc = await nats.connect(url)
    payload = os.urandom(size)
    for i in range(n):
        await nc.publish(_subject(i), payload)
    await nc.flush()
    deadline = time.monotonic() + 120
    while True:
        state = json.loads((await nc.request("$JS.API.STREAM.INFO.EVENTS", b"", timeout=10)).data)["state"]
        if state["messages"] >= n or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    await nc.close()
    if state["messages"] != n:
        raise SystemExit(f"stream holds {state['messages']} messages, expected {n}")


async def _naive_fetch(url: str, n: int, batch: int, metadata: bool) -> tuple[int, int]:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig

    nc = await nats.connect(url)
    js = nc.jetstream()
    sub = await js.pull_subscribe("plgd.>", config=ConsumerConfig(ack_policy=AckPolicy.NONE))
    count = nbytes = 0
    while count < n:
        for msg in await sub.fetch(batch, timeout=5):
            if metadata:  # what a real reader needs, and the hook gives: stream seq and time
                md = msg.metadata
                _ = (md.sequence.stream, md.timestamp)
            count += 1
            nbytes += len(msg.data)
    await sub.unsubscribe()
    await nc.close()
    return count, nbytes


def _hook_read(batch: int) -> tuple[int, int]:
    from airflow_provider_plgd.hooks.jetstream import JetStreamHook

    count = nbytes = 0
    for b in JetStreamHook().iter_batches("plgd.>", batch_size=batch):
        count += len(b)
        nbytes += sum(len(m.data) for m in b)
    return count, nbytes


def _fill(server: NatsServer, n: int, size: int) -> None:
    """Create the stream on ``server``, point the default connection at it, publish ``n`` messages."""
    recreate_stream(server.url)
    os.environ["AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT"] = json.dumps(
        {"conn_type": "plgd_jetstream", "host": server.host, "port": server.port, "extra": {"stream": "EVENTS"}}
    )
    t0 = time.perf_counter()
    asyncio.run(_publish(server.url, n, size))
    print(f"published {n:,} x {size} B in {time.perf_counter() - t0:.1f}s; load average {os.getloadavg()[0]:.2f}",
          flush=True)


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark and print the figures; return them as a dict."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=300, help="payload bytes per message")
    parser.add_argument("--batch", type=int, default=None, help="hook batch size (default: the hook's)")
    parser.add_argument("--fetch-batch", type=int, default=1000, help="batch of the naive fetch loop")
    args = parser.parse_args(argv)

    with NatsServer() as server:
        _fill(server, args.messages, args.size)

        from airflow_provider_plgd.hooks.jetstream import DEFAULT_BATCH_SIZE

        batch = args.batch or DEFAULT_BATCH_SIZE
        results = {}
        runs = (
            ("hook.iter_batches", lambda: _hook_read(batch)),
            ("naive fetch() + msg.metadata", lambda: asyncio.run(
                _naive_fetch(server.url, args.messages, args.fetch_batch, metadata=True))),
            ("naive fetch(), payload only", lambda: asyncio.run(
                _naive_fetch(server.url, args.messages, args.fetch_batch, metadata=False))),
        )
        for name, run in runs:
            t0, c0 = time.perf_counter(), time.process_time()
            count, nbytes = run()
            secs, cpu = time.perf_counter() - t0, time.process_time() - c0
            if count != args.messages:
                raise SystemExit(f"{name}: read {count} messages, expected {args.messages}")
            results[name] = count / secs
            print(
                f"{name:30s} {count / secs:10,.0f} msgs/s {nbytes / secs / 1e6:8.1f} MB/s ({secs:.2f}s wall, "
                f"{cpu:.2f}s client CPU = {count / cpu:,.0f} msgs per CPU-s)"
            )
        hook = results["hook.iter_batches"]
        for name, rate in list(results.items())[1:]:
            print(f"ratio hook / {name}: {hook / rate:.1f}x")
        return results


if __name__ == "__main__":
    main()
