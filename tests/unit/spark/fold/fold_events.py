"""Builders of ``events`` rows for the fold tests (plain dicts with the table's column names), and
the fold run with a state round trip: shared by test_fold.py and test_fold_rows.py.
"""

from __future__ import annotations

import itertools

from airflow_provider_plgd.plgd import ids
from airflow_provider_plgd.spark import fold
from airflow_provider_plgd.spark.fold import fold_device

DEV = "00000000-0000-0000-0000-000000000001"
OWNER = "e1407479-3136-56c0-9908-bb02fb0339e2"
OWNER2 = "11111111-2222-3333-4444-555555555555"
HREF = "/light/1"
SEC = 1_000_000_000
T0 = 1_767_225_600 * SEC  # 2026-01-01T00:00:00Z
END = T0 + 3600 * SEC  # snapshot time of the first interval
_seq = itertools.count(1)


def ra(event_type, version, *, href=HREF, device=DEV, ts=None, seq=None, owner=OWNER, **fields):
    """A resource-aggregate ``events`` row."""
    kind = fold.EVENT_TYPES[event_type].aggregate
    if kind == "resource":
        aggregate_id = ids.resource_aggregate_id(device, href)
    elif kind == "links":
        aggregate_id, href = ids.links_aggregate_id(device), None
    else:
        aggregate_id, href = ids.metadata_aggregate_id(device), None
    row = {
        "stream_seq": next(_seq) if seq is None else seq,
        "owner_id": owner,
        "device_id": device,
        "group_id": device,
        "event_type": event_type,
        "version": version,
        "aggregate_id": aggregate_id,
        "timestamp": T0 + (version + 1) * SEC if ts is None else ts,
        "connection_id": "10.0.0.1:5684",
        "sequence": version,
        "user_id": "user-1",
        "correlation_id": "",
        "href": href,
    }
    row.update(fields)
    row["msg_id"] = f"ra:{aggregate_id}:{version}:{event_type}:{row['timestamp']}"
    return row


def reg(event_type, ts, *, devices=(DEV,), owner=OWNER, seq=None):
    """An identity-store ``events`` row."""
    return {
        "stream_seq": next(_seq) if seq is None else seq,
        "owner_id": owner,
        "event_type": event_type,
        "timestamp": ts,
        "device_ids": list(devices),
        "registration_owner": "owner-a",
        "hub_id": "hub-1",
        "user_id": "user-1",
    }


def content(data: bytes, json_text: str | None = None):
    return {
        "content_type": "application/vnd.ocf+cbor",
        "coap_content_format": 10000,
        "content_data": data,
        "content_json": json_text,
    }


def changed(version, data=b"\xa1\x62on\xf5", *, status="OK", **kw):
    kw.setdefault("etag", b"etag%d" % version)
    return ra("resourcechanged", version, status=status, resource_types=["core.light"],
              **content(data, '{"on":true}'), **kw)


def run(events, state=None, *, at=END, stats=None):
    return fold_device(DEV, state, events, snapshot_time_ns=at, stats=stats)


def resource(state, href=HREF):
    return state["aggregates"][ids.resource_aggregate_id(DEV, href)]


def links(state):
    return state["aggregates"][ids.links_aggregate_id(DEV)]


def metadata(state):
    return state["aggregates"][ids.metadata_aggregate_id(DEV)]


def pending_ids(agg, kind):
    return [p["correlation_id"] for p in agg["pendings"][kind]]

def conn(status, cid, *, at=T0, service="gw-1"):
    return {"status": status, "id": cid, "connected_at": at, "protocol": "COAPS_TCP",
            "service_id": service if status == "ONLINE" else "", "local_endpoints": ["coaps+tcp://10.0.0.1:5684"]}


def twin(state, *, force_at=0, cid="", seq=0):
    return {"state": state, "syncing_at": 0, "in_sync_at": 0, "command_connection_id": cid,
            "command_sequence": seq, "force_synchronization_at": force_at}


def md(version, connection, *, twin_enabled=True, twin_sync=None, canceled=False, **kw):
    return ra("devicemetadataupdated", version, connection=connection, twin_enabled=twin_enabled,
              twin_synchronization=twin_sync or twin("OUT_OF_SYNC"), canceled=canceled, **kw)


def link(href, *, title="", types=("core.light",)):
    return {"href": href, "device_id": DEV, "resource_types": list(types), "interfaces": ["oic.if.baseline"],
            "anchor": f"ocf://{DEV}", "title": title, "supported_content_types": [], "valid_until": 0,
            "bit_flags": 3, "endpoint_informations": [{"endpoint": "coaps+tcp://10.0.0.1:5684", "priority": 1}]}
