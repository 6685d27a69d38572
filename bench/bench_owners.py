"""Benchmark: what grows with the number of owners, measured at 10k owners in one interval.

Starts its own nats-server (``plgd_devtools.nats_server``) with the plgd bundle stream, publishes
``--messages-per-owner`` messages (default 2) for each of ``--owners`` owners (default 10,000) on
plgd subjects, then runs the ETL's ``plan`` work and ``fetch_ranges`` the way the DAG does:

1. owner discovery: ``JetStreamHook.list_owners()`` (the stream's subject list);
2. the interval ledger: ``etl.write_interval_ledger`` (server-side counts for ``plgd.>`` and one
   ``plgd.owners.{owner}.>`` filter per owner, then ``stream.json``);
3. ``fetch_ranges``: the mapped fetch tasks' kwargs (``{"ledger_group": i}``) and one group's
   owners (``ledger.owner_group``).
4. one fetch task's share (``--fetch-one``, default on): ``JetStreamToStagingOperator`` for group 0
   (``owners / max_fetch_tasks`` owners, one consumer each).

Prints seconds per step, the sizes of ``stream.json`` and of the plan's XCom value (bytes), and
nats-server's RSS. Figures, not a test. Usage:
``python -m bench.bench_owners [--owners N] [--messages-per-owner M] [--max-fetch-tasks G]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from datetime import datetime, timedelta, timezone

from plgd_devtools.nats_server import NatsServer, recreate_stream


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


def _manifests(folder: str):
    for dirpath, _dirs, files in os.walk(folder):
        if "_manifest.json" in files:
            yield dirpath


def _rss_mb(pid: int | None) -> float:
    try:
        import psutil

        return psutil.Process(pid).memory_info().rss / 1e6
    except Exception:  # noqa: BLE001 - a figure only
        return float("nan")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--owners", type=int, default=10_000)
    parser.add_argument("--messages-per-owner", type=int, default=2)
    parser.add_argument("--max-fetch-tasks", type=int, default=16)
    parser.add_argument("--fetch-one", choices=("on", "off"), default="on")
    parser.add_argument("--log-level", default="WARNING", help="level of the provider's loggers")
    args = parser.parse_args(argv)
    import logging

    logging.basicConfig(level=args.log_level)
    for name in ("airflow", "airflow.task", "airflow_provider_plgd"):
        logging.getLogger(name).setLevel(args.log_level)

    owners = owner_ids(args.owners)
    with tempfile.TemporaryDirectory(prefix="bench-owners-") as tmp, NatsServer(store_dir=f"{tmp}/js") as server:
        recreate_stream(server.url)
        start = datetime.now(timezone.utc) - timedelta(seconds=1)
        t0 = time.perf_counter()
        published = asyncio.run(_publish(server.url, owners, args.messages_per_owner))
        t_pub = time.perf_counter() - t0
        end = datetime.now(timezone.utc) + timedelta(milliseconds=1)
        host, port = server.url.removeprefix("nats://").rsplit(":", 1)
        os.environ["AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT"] = json.dumps(
            {"conn_type": "plgd_jetstream", "host": host, "port": int(port), "extra": {"stream": "EVENTS"}})

        from airflow_provider_plgd import ledger, times
        from airflow_provider_plgd.etl import write_interval_ledger
        from airflow_provider_plgd.hooks.jetstream import JetStreamHook
        from airflow_provider_plgd.plgd.event_types import EVENT_TYPES

        root = f"{tmp}/root"
        hook = JetStreamHook(jetstream_conn_id="plgd_jetstream_default", stream="EVENTS")
        t0 = time.perf_counter()
        found = sorted(hook.list_owners())
        t_list = time.perf_counter() - t0
        if len(found) != len(owners):
            raise SystemExit(f"discovered {len(found)} owners, published {len(owners)}")
        interval = times.interval_id(start, end)
        t0 = time.perf_counter()
        record = write_interval_ledger(hook, root, interval, start, end, found, True, list(EVENT_TYPES),
                                       accept_fewer=False, fetch_ranges=args.max_fetch_tasks)
        t_ledger = time.perf_counter() - t0
        if record["total"] != published:
            raise SystemExit(f"ledger counts {record['total']}, published {published}")
        stream_json = os.path.getsize(f"{ledger.interval_dir(root, 'EVENTS', interval)}/stream.json")
        groups = [{"ledger_group": i} for i in range(record["fetch_ranges"])]
        xcom = len(json.dumps({"storage_root": root, "interval_id": interval, "owners": len(found),
                               "messages": record["total"], "fetch_ranges": groups, "py_files": "x" * 100}))
        t0 = time.perf_counter()
        group0 = ledger.owner_group(record, 0)
        t_group = time.perf_counter() - t0

        print(f"owners {len(owners):,}, messages {published:,} (published in {t_pub:.1f} s)")
        print(f"list_owners                {t_list:8.2f} s")
        print(f"write_interval_ledger      {t_ledger:8.2f} s  ({len(found) + 1:,} filters counted; "
              f"{t_ledger / (len(found) + 1) * 1e3:.2f} ms per filter)")
        print(f"stream.json                {stream_json:8,} bytes")
        print(f"plan XCom value            {xcom:8,} bytes  ({len(groups)} fetch tasks)")
        print(f"owner_group(0)             {t_group * 1e3:8.2f} ms  ({len(group0):,} owners)")
        print(f"nats-server RSS            {_rss_mb(server.pid):8.0f} MB")

        if args.fetch_one == "on":
            from airflow_provider_plgd.operators.jetstream_to_staging import JetStreamToStagingOperator

            op = JetStreamToStagingOperator(
                task_id="fetch", jetstream_conn_id="plgd_jetstream_default", stream="EVENTS",
                destination=root, ledger=ledger.interval_dir(root, "EVENTS", interval), ledger_group=0,
                settle_seconds=0)
            context = {"data_interval_start": start, "data_interval_end": end, "ti": None}
            t0 = time.perf_counter()
            result = op.execute(context)
            t_fetch = time.perf_counter() - t0
            batches = sum(1 for _ in _manifests(f"{root}/staging/EVENTS"))
            print(f"fetch, group 0             {t_fetch:8.2f} s  ({len(group0):,} owners; "
                  f"{t_fetch / max(len(group0), 1) * 1e3:.1f} ms per owner; {batches:,} staging batches "
                  f"committed; XCom {len(json.dumps(result, default=str)):,} bytes)")


if __name__ == "__main__":
    main()
