"""Ground truth of a (published) simulation, and its directory format: the test oracle of
``plgd-simulate --ground-truth`` (which loads this module on demand), the tests, the benchmarks and
the demo. Not part of the provider's wheel.

``GroundTruth.of(sim, publish(sim, ...))`` (or ``GroundTruth(sim)`` when not published);
``GroundTruth.write(directory)`` writes:

* ``messages.parquet``: one row per message in publish order. Columns: ``stream_seq`` int64
  (null if not published), ``subject`` string, ``interval`` int32, ``event_type`` string,
  ``owner_id`` string, ``device_id`` string, ``href`` string, ``aggregate_id`` string,
  ``version`` int64, ``timestamp_ns`` int64 (inner event time, unix ns), ``msg_id`` string
  (``plgd.msgid.message_id``; null for corrupt payloads), ``fault`` string (``duplicate``,
  ``corrupt``, ``old_hub_snapshot`` or null), ``bytes`` int64 (payload size).
* ``state_<k>.json``: ``expected_state(sim, k)`` for every interval k.
* ``summary.json``: config, interval bounds (ns), counts per owner x event type x interval,
  duplicates, corrupt payloads, old-hub snapshots, version gaps, unregistrations, publish
  timing (see :meth:`GroundTruth.summary`).

Every file is written to a temporary name and renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_provider_plgd.simulator.generator import Simulation
from airflow_provider_plgd.simulator.messages import FAULT_CODE, FAULTS
from airflow_provider_plgd.simulator.publisher import PublishResult

__all__ = ["MESSAGES_SCHEMA", "GroundTruth"]

MESSAGES_SCHEMA = pa.schema(
    [
        ("stream_seq", pa.int64()),
        ("subject", pa.string()),
        ("interval", pa.int32()),
        ("event_type", pa.string()),
        ("owner_id", pa.string()),
        ("device_id", pa.string()),
        ("href", pa.string()),
        ("aggregate_id", pa.string()),
        ("version", pa.int64()),
        ("timestamp_ns", pa.int64()),
        ("msg_id", pa.string()),
        ("fault", pa.string()),
        ("bytes", pa.int64()),
    ]
)


def _int_array(values, typ: pa.DataType, null_below: int | None = None) -> pa.Array:
    arr = pa.array(values, type=typ)
    if null_below is not None:
        arr = pc.if_else(pc.less(arr, null_below), pa.scalar(None, typ), arr)
    return arr


@dataclass
class GroundTruth:
    """What was published and what the ETL must rebuild from it.

    :ivar sim: the simulation.
    :ivar stream: JetStream stream name, or None if not published.
    :ivar first_seq: stream sequence of ``sim.messages[0]``; message i has ``first_seq + i``
        (verified after publishing). None if not published.
    :ivar wait_for_intervals: whether publishing respected the interval windows.
    :ivar windows: per interval ``{"interval", "window_start_ns", "window_end_ns",
        "published_from_ns", "stored_by_ns", "messages"}`` (wall clock, unix ns).
    :ivar publish_seconds: wall-clock duration of publishing (s).
    """

    sim: Simulation
    stream: str | None = None
    first_seq: int | None = None
    wait_for_intervals: bool | None = None
    windows: list[dict[str, Any]] = field(default_factory=list)
    publish_seconds: float | None = None

    @classmethod
    def of(cls, sim: Simulation, published: PublishResult | None = None) -> GroundTruth:
        """The ground truth of ``sim``, published as ``published`` (the result of
        ``simulator.publish``/``apublish``), or not published (None)."""
        if published is None:
            return cls(sim)
        return cls(sim, stream=published.stream, first_seq=published.first_seq,
                   wait_for_intervals=published.wait_for_intervals, windows=list(published.windows),
                   publish_seconds=published.publish_seconds)

    @property
    def last_seq(self) -> int | None:
        """Stream sequence of the last message, or None."""
        if self.first_seq is None or not len(self.sim.messages):
            return None
        return self.first_seq + len(self.sim.messages) - 1

    def stream_seq(self, index: int) -> int | None:
        """Stream sequence of ``sim.messages[index]`` (None if not published)."""
        return None if self.first_seq is None else self.first_seq + index

    def message_batches(self, chunk_rows: int = 100_000) -> Iterator[pa.RecordBatch]:
        """``messages.parquet`` rows as ``pyarrow.RecordBatch``\ es of at most ``chunk_rows`` rows
        (schema ``MESSAGES_SCHEMA``), so a million messages never sit in memory twice."""
        log = self.sim.messages
        n = len(log)
        keys = log.keys
        key_columns = [pa.array([k[pos] for k in keys], type=pa.string()) for pos in range(5)]
        faults = pa.array(FAULTS, type=pa.string())
        for lo in range(0, n, chunk_rows):
            hi = min(n, lo + chunk_rows)
            take = pa.array(log.key_index[lo:hi], type=pa.int32())
            if self.first_seq is None:
                stream_seq = pa.nulls(hi - lo, pa.int64())
            else:
                stream_seq = pa.array(range(self.first_seq + lo, self.first_seq + hi), type=pa.int64())
            columns = [
                stream_seq,
                pa.array(log.subjects[lo:hi], type=pa.string()),
                pa.array(log.intervals[lo:hi], type=pa.int32()),
                *(col.take(take) for col in key_columns),
                _int_array(log.versions[lo:hi], pa.int64(), null_below=0),
                pa.array(log.timestamps[lo:hi], type=pa.int64()),
                pa.array([log.msg_id(i) for i in range(lo, hi)], type=pa.string()),
                faults.take(pa.array(log.fault_codes[lo:hi], type=pa.int8())),
                pa.array([len(d) for d in log.data[lo:hi]], type=pa.int64()),
            ]
            yield pa.RecordBatch.from_arrays(columns, schema=MESSAGES_SCHEMA)

    def message_table(self) -> pa.Table:
        """``messages.parquet`` as one ``pyarrow.Table`` (schema ``MESSAGES_SCHEMA``)."""
        return pa.Table.from_batches(list(self.message_batches()), schema=MESSAGES_SCHEMA)

    def _write_messages(self, path: Path) -> None:
        with pq.ParquetWriter(path, MESSAGES_SCHEMA) as writer:
            for batch in self.message_batches():
                writer.write_batch(batch)

    def summary(self) -> dict[str, Any]:
        """The ``summary.json`` content (JSON-ready dict)."""
        sim = self.sim
        log = sim.messages
        intervals = sim.config.intervals
        counts: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
        for key, k, data in zip(log.key_index, log.intervals, log.data, strict=True):
            c = counts[(key, k)]
            c[0] += 1
            c[1] += len(data)
        grouped: dict[tuple[str, str, int], list[int]] = defaultdict(lambda: [0, 0])
        for (key, k), (m, b) in counts.items():
            event_type, owner_id = log.keys[key][:2]
            g = grouped[(owner_id, event_type, k)]
            g[0] += m
            g[1] += b
        per_interval = [[0, 0] for _ in range(intervals)]
        for (_, _, k), (m, b) in grouped.items():
            per_interval[k][0] += m
            per_interval[k][1] += b
        codes = log.fault_codes
        return {
            "config": sim.config.as_dict(),
            "steps_per_interval": sim.steps_per_interval,
            "messages": len(log),
            "bytes": log.total_bytes,
            "stream": self.stream,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "intervals": [
                {"interval": k, "start_ns": s, "end_ns": e, "messages": per_interval[k][0], "bytes": per_interval[k][1]}
                for k, (s, e) in enumerate(sim.interval_bounds())
            ],
            "counts": [
                {"owner_id": o, "event_type": et, "interval": k, "messages": m, "bytes": b}
                for (o, et, k), (m, b) in sorted(grouped.items())
            ],
            "owners": sim.owners,
            "duplicates": {"total": codes.count(FAULT_CODE["duplicate"]), **sim.duplicates},
            "corrupt": {
                "total": len(sim.corrupt),
                "messages": [{**c, "stream_seq": self.stream_seq(c["index"])} for c in sim.corrupt],
            },
            "old_hub_snapshots": codes.count(FAULT_CODE["old_hub_snapshot"]),
            "version_gaps": sim.gaps,
            "unregistrations": sim.unregistrations,
            "generation_seconds": round(sim.generation_seconds, 3),
            "publish": {
                "wait_for_intervals": self.wait_for_intervals,
                "seconds": None if self.publish_seconds is None else round(self.publish_seconds, 3),
                "windows": self.windows,
            },
        }

    def write(self, directory: str | os.PathLike[str]) -> Path:
        """Write ``messages.parquet``, ``state_<k>.json`` and ``summary.json`` into ``directory``
        (created if missing; existing files of these names are replaced). Returns the path."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)

        def atomic(name: str, write) -> None:
            tmp = out / f".{name}.tmp"
            write(tmp)
            os.replace(tmp, out / name)

        atomic("messages.parquet", self._write_messages)
        for k, state in enumerate(self.sim.states):
            atomic(f"state_{k}.json", lambda p, s=state: p.write_text(json.dumps(s, indent=1) + "\n"))
        atomic("summary.json", lambda p: p.write_text(json.dumps(self.summary(), indent=1) + "\n"))
        return out

