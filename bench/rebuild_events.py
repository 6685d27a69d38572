"""Synthetic decoded ``events`` rows for ``bench/bench_rebuild.py``: an :class:`EventFactory` of
devices with realistic payloads, :func:`write_events` that commits them as ``decode_events`` /
``dedupe_events`` do, and the benchmark's hourly :func:`interval` IDs."""

from __future__ import annotations

import json
import random
import time
from datetime import date
from pathlib import Path

import cbor2
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_plgd import times
from airflow_provider_plgd.plgd import ids
from airflow_provider_plgd.spark import schemas
from airflow_provider_plgd.spark.dedupe_job import MSGID_INDEX_SCHEMA
from airflow_provider_plgd.spark.parquet_io import write_parquet_file
from airflow_provider_plgd.tables import delta_tables, file_records
from airflow_provider_plgd.tables.layout import Layout
from airflow_provider_plgd.tables.storage import to_fs

SEC = 1_000_000_000
START_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
HOUR = 3600 * SEC


class EventFactory:
    """Builds ``events`` rows (dicts) for synthetic devices; deterministic for a seed."""

    def __init__(self, seed: int, owners: int = 10, resources: int = 4) -> None:
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
    # the next stage takes an interval only when one run committed all of the app's tables
    # (delta_tables.run_committed): the companion table (quarantine, msgid_index) gets an empty
    # commit of the same run
    app, companion, companion_schema = (("decode", delta_tables.QUARANTINE, schemas.QUARANTINE_SCHEMA)
                                        if table_dir == delta_tables.EVENTS else
                                        ("dedupe", delta_tables.MSGID_INDEX, MSGID_INDEX_SCHEMA))
    run_version = time.time_ns() // 1_000_000
    for name, schema, files in ((table_dir, schemas.EVENTS_SCHEMA, records), (companion, companion_schema, [])):
        delta_tables.commit_files(delta_tables.interval_table_uri(Layout.of(str(root)), name), files, schema=schema,
                                  partition_by=delta_tables.INTERVAL_TABLES[name],
                                  replace=delta_tables.interval_filter(interval_id),
                                  metadata={"interval_id": interval_id}, app_id=f"plgd.{app}.{name}/{interval_id}",
                                  run_version=run_version)


def interval(k: int) -> tuple[str, str]:
    return times.interval_id(START_NS + k * HOUR, START_NS + (k + 1) * HOUR), str(START_NS + (k + 1) * HOUR)
