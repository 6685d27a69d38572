"""The traffic of one benchmark size: a simulation of plgd hub events (cached as Parquet) and its
core-NATS publish (see :mod:`bench.e2e.run`, step 1 and 2)."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import nats
import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_plgd.simulator import SimulationConfig, generate


def sim_config(args: argparse.Namespace, events: int):
    """The ``SimulationConfig`` of one size: one interval of an hour (simulated timestamps from the
    simulator's fixed start), ``target_messages=events``, 1% duplicates, 1 corrupt per 100k."""
    return SimulationConfig(
        seed=args.seed, owners=args.owners, devices_per_owner=args.devices, resources_per_device=args.resources,
        intervals=1, interval_seconds=3600.0, target_messages=events, duplicates=0.01,
        corrupt=max(1, events // 100_000),
    )


def load_messages(config, cache_dir: str | None) -> tuple[list[str], list[bytes], dict[str, Any]]:
    """``(subjects, payloads, info)`` of the simulation of ``config``, publish order.

    ``info``: ``{"generated_s", "cached": bool, "cache_file", "bytes" (payload total)}``. A cache
    file (Parquet: ``subject`` string, ``data`` binary) is named by the SHA-256 of the config.
    """
    key = hashlib.sha256(json.dumps(config.as_dict(), sort_keys=True).encode()).hexdigest()[:16]
    path = Path(cache_dir) / f"sim-{key}.parquet" if cache_dir else None
    if path is not None and path.exists():
        t0 = time.perf_counter()
        table = pq.read_table(path)
        subjects, data = table.column("subject").to_pylist(), table.column("data").to_pylist()
        meta = json.loads((table.schema.metadata or {}).get(b"e2e", b"{}"))
        return subjects, data, {"generated_s": meta.get("generated_s"), "cached": True, "cache_file": str(path),
                                "load_s": round(time.perf_counter() - t0, 1), "bytes": sum(map(len, data))}
    sim = generate(config)
    subjects, data = list(sim.messages.subjects), list(sim.messages.data)
    info = {"generated_s": round(sim.generation_seconds, 1), "cached": False,
            "cache_file": str(path) if path else None, "bytes": sum(map(len, data)),
            "steps_per_interval": sim.steps_per_interval}
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        table = pa.table({"subject": pa.array(subjects, pa.string()), "data": pa.array(data, pa.binary())})
        table = table.replace_schema_metadata({"e2e": json.dumps(info), "config": json.dumps(config.as_dict())})
        tmp = path.with_suffix(".tmp")
        pq.write_table(table, tmp)
        tmp.rename(path)
    return subjects, data, info


async def apublish(url: str, subjects: list[str], data: list[bytes], stream: str = "EVENTS") -> int:
    """Core-NATS publish in order (flush every 10k; wait when the stream lags > 20k: a larger
    backlog of core publishes can overflow the server's ingest queue on a busy machine, which then
    drops them), then wait until the stream holds them all; return the stream's last sequence.

    :raises RuntimeError: the stream does not hold exactly ``len(subjects)`` messages within 120 s.
    """
    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        for i, (subject, payload) in enumerate(zip(subjects, data, strict=True), start=1):
            await nc.publish(subject, payload)
            if i % 10_000 == 0:
                await nc.flush()
                while i - (await js.stream_info(stream)).state.last_seq > 20_000:
                    await asyncio.sleep(0.01)
        await nc.flush()
        deadline = time.monotonic() + 120
        while (state := (await js.stream_info(stream)).state).messages < len(subjects):
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        if state.messages != len(subjects):
            raise RuntimeError(f"stream {stream} holds {state.messages} messages, expected {len(subjects)}")
        return state.last_seq
    finally:
        await nc.close()
