"""Unit tests of airflow_provider_plgd.spark.decode_batch: staging RecordBatch -> union RecordBatch (no Spark).

Messages are built with the codec (``airflow_provider_plgd.plgd.codec``) with every field set to a
non-default value, so each output column is checked against what was published. Corrupt rows
must come out as quarantine rows with the right reason.
"""

from __future__ import annotations

import collections
import hashlib
import json
from datetime import date, datetime, timezone
from pathlib import Path

import cbor2
import pyarrow as pa
import pyarrow.parquet
import pytest

from airflow_provider_plgd.plgd import codec, ids, subjects
from airflow_provider_plgd.plgd.event_types import EVENT_TYPES
from airflow_provider_plgd.plgd.pb import eventbus_pb2
from airflow_provider_plgd.plgd.pb import identitystore_pb2 as isp
from airflow_provider_plgd.plgd.pb import resourceaggregate_pb2 as ra
from airflow_provider_plgd.spark import schemas
from airflow_provider_plgd.spark.decode_batch import decode_batch, decode_batch_parts, decode_batches
from airflow_provider_plgd.spark.decode_job import EVENTS_PARTITIONS
from airflow_provider_plgd.tables import staging

INTERVAL = "20260101T000000Z_20260101T010000Z"
OWNER_RAW = "alice"
OWNER = ids.owner_id(OWNER_RAW)
DEV = "00000000-0000-0000-0000-000000000001"
DEV2 = "00000000-0000-0000-0000-000000000002"
HREF = "/light/1"
TYPES = ["core.light", "oic.r.switch.binary"]
TS0 = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z in ns
VALID_UNTIL = 1_767_229_200_000_000_000
CBOR = cbor2.dumps({"power": 5, "state": True})
PUBLISHED = datetime(2026, 1, 1, 0, 10, 0, 123456, tzinfo=timezone.utc)


def em(version: int) -> ra.EventMetadata:
    return ra.EventMetadata(
        version=version, timestamp=TS0 + version, connection_id="10.0.0.1:5684",
        sequence=100 + version, hub_id="hub-1",
    )


def ac(corr: str = "corr-1") -> ra.AuditContext:
    return ra.AuditContext(user_id="user-1", correlation_id=corr, owner=OWNER_RAW)


def content() -> ra.Content:
    return ra.Content(data=CBOR, content_type="application/vnd.ocf+cbor", coap_content_format=10000)


RID = ra.ResourceId(device_id=DEV, href=HREF)


def link(href: str, valid_until: int = 0) -> ra.Resource:
    return ra.Resource(
        href=href, device_id=DEV, resource_types=["core.light"], interfaces=["oic.if.baseline", "oic.if.a"],
        anchor=f"ocf://{DEV}", title=f"Light {href}", supported_content_types=["application/vnd.ocf+cbor"],
        valid_until=valid_until, policy=ra.Policy(bit_flags=3),
        endpoint_informations=[
            ra.EndpointInformation(endpoint="coaps+tcp://10.0.0.1:5684", priority=1),
            ra.EndpointInformation(endpoint="coap://10.0.0.1:5683", priority=2),
        ],
    )


def link_row(href: str, valid_until: int = 0) -> dict:
    return {
        "href": href, "device_id": DEV, "resource_types": ["core.light"],
        "interfaces": ["oic.if.baseline", "oic.if.a"], "anchor": f"ocf://{DEV}", "title": f"Light {href}",
        "supported_content_types": ["application/vnd.ocf+cbor"], "valid_until": valid_until, "bit_flags": 3,
        "endpoint_informations": [
            {"endpoint": "coaps+tcp://10.0.0.1:5684", "priority": 1},
            {"endpoint": "coap://10.0.0.1:5683", "priority": 2},
        ],
    }


def meta_cols(version: int, *, audit: bool = True, corr: str = "corr-1") -> dict:
    cols = {
        "version": version, "timestamp": TS0 + version, "connection_id": "10.0.0.1:5684",
        "sequence": 100 + version, "hub_id": "hub-1",
    }
    if audit:
        cols.update(user_id="user-1", correlation_id=corr, owner=OWNER_RAW)
    return cols


def content_cols() -> dict:
    return {
        "content_type": "application/vnd.ocf+cbor", "coap_content_format": 10000, "content_data": CBOR,
    }


CONNECTION = ra.Connection(
    status=ra.Connection.ONLINE, id="10.0.0.1:5684", connected_at=TS0 - 5, protocol=ra.Connection.COAPS_TCP,
    service_id="cgw-1", local_endpoints=["coaps+tcp://192.168.0.2:5684"],
)
CONNECTION_ROW = {
    "status": "ONLINE", "id": "10.0.0.1:5684", "connected_at": TS0 - 5, "protocol": "COAPS_TCP",
    "service_id": "cgw-1", "local_endpoints": ["coaps+tcp://192.168.0.2:5684"],
}
TWIN = ra.TwinSynchronization(
    state=ra.TwinSynchronization.IN_SYNC, syncing_at=TS0 - 4, in_sync_at=TS0 - 3,
    command_metadata=ra.CommandMetadata(connection_id="10.0.0.1:5684", sequence=77),
    force_synchronization_at=TS0 - 2,
)
TWIN_ROW = {
    "state": "IN_SYNC", "syncing_at": TS0 - 4, "in_sync_at": TS0 - 3, "command_connection_id": "10.0.0.1:5684",
    "command_sequence": 77, "force_synchronization_at": TS0 - 2,
}


def _resource_cases():
    """(event_type, message, expected non-null type-specific columns) for the 9 live resource types."""
    rt = {"href": HREF, "resource_types": TYPES}
    return [
        ("resourcechanged",
         ra.ResourceChanged(resource_id=RID, content=content(), status=ra.OK, audit_context=ac(),
                            event_metadata=em(1), etag=b"etag-1", resource_types=TYPES),
         {**rt, **meta_cols(1), **content_cols(), "status": "OK", "etag": b"etag-1"}),
        ("resourceupdatepending",
         ra.ResourceUpdatePending(resource_id=RID, resource_interface="oic.if.a", content=content(),
                                  audit_context=ac("corr-2"), event_metadata=em(2), valid_until=VALID_UNTIL,
                                  resource_types=TYPES),
         {**rt, **meta_cols(2, corr="corr-2"), **content_cols(), "resource_interface": "oic.if.a",
          "valid_until": VALID_UNTIL}),
        ("resourceupdated",
         ra.ResourceUpdated(resource_id=RID, status=ra.ACCEPTED, content=content(), audit_context=ac("corr-2"),
                            event_metadata=em(3), resource_types=TYPES),
         {**rt, **meta_cols(3, corr="corr-2"), **content_cols(), "status": "ACCEPTED"}),
        ("resourceretrievepending",
         ra.ResourceRetrievePending(resource_id=RID, resource_interface="oic.if.baseline", audit_context=ac("c3"),
                                    event_metadata=em(4), valid_until=VALID_UNTIL, etag=[b"e1", b"e2"],
                                    resource_types=TYPES),
         {**rt, **meta_cols(4, corr="c3"), "resource_interface": "oic.if.baseline", "valid_until": VALID_UNTIL,
          "etags": [b"e1", b"e2"]}),
        ("resourceretrieved",
         ra.ResourceRetrieved(resource_id=RID, status=ra.NOT_MODIFIED, content=content(), audit_context=ac("c3"),
                              event_metadata=em(5), etag=b"etag-5", resource_types=TYPES),
         {**rt, **meta_cols(5, corr="c3"), **content_cols(), "status": "NOT_MODIFIED", "etag": b"etag-5"}),
        ("resourcedeletepending",
         ra.ResourceDeletePending(resource_id=RID, audit_context=ac("c4"), event_metadata=em(6),
                                  valid_until=VALID_UNTIL, resource_interface="oic.if.rw", resource_types=TYPES),
         {**rt, **meta_cols(6, corr="c4"), "valid_until": VALID_UNTIL, "resource_interface": "oic.if.rw"}),
        ("resourcedeleted",
         ra.ResourceDeleted(resource_id=RID, status=ra.FORBIDDEN, content=content(), audit_context=ac("c4"),
                            event_metadata=em(7), resource_types=TYPES),
         {**rt, **meta_cols(7, corr="c4"), **content_cols(), "status": "FORBIDDEN"}),
        ("resourcecreatepending",
         ra.ResourceCreatePending(resource_id=RID, content=content(), audit_context=ac("c5"), event_metadata=em(8),
                                  valid_until=VALID_UNTIL, resource_types=TYPES),
         {**rt, **meta_cols(8, corr="c5"), **content_cols(), "valid_until": VALID_UNTIL}),
        ("resourcecreated",
         ra.ResourceCreated(resource_id=RID, status=ra.CREATED, content=content(), audit_context=ac("c5"),
                            event_metadata=em(9), resource_types=TYPES),
         {**rt, **meta_cols(9, corr="c5"), **content_cols(), "status": "CREATED"}),
    ]


def _pending_row(version: int, corr: str, **extra) -> dict:
    row = {name: None for name in schemas.RESOURCE_PENDING_TYPE.names}
    row.update(meta_cols(version, corr=corr), resource_types=TYPES, valid_until=VALID_UNTIL, **extra)
    return row


def _other_cases():
    snap = ra.ResourceStateSnapshotTaken(
        resource_id=RID,
        latest_resource_change=ra.ResourceChanged(
            resource_id=RID, content=content(), status=ra.OK, audit_context=ac(""), event_metadata=em(10),
            etag=b"etag-10", resource_types=TYPES),
        resource_create_pendings=[ra.ResourceCreatePending(
            resource_id=RID, content=content(), audit_context=ac("p1"), event_metadata=em(11),
            valid_until=VALID_UNTIL, resource_types=TYPES)],
        resource_retrieve_pendings=[ra.ResourceRetrievePending(
            resource_id=RID, resource_interface="oic.if.baseline", audit_context=ac("p2"), event_metadata=em(12),
            valid_until=VALID_UNTIL, etag=[b"x"], resource_types=TYPES)],
        resource_update_pendings=[
            ra.ResourceUpdatePending(resource_id=RID, resource_interface="oic.if.a", content=content(),
                                     audit_context=ac("p3"), event_metadata=em(13), valid_until=VALID_UNTIL,
                                     resource_types=TYPES),
            ra.ResourceUpdatePending(resource_id=RID, resource_interface="oic.if.a", content=content(),
                                     audit_context=ac("p4"), event_metadata=em(14), valid_until=VALID_UNTIL,
                                     resource_types=TYPES),
        ],
        resource_delete_pendings=[],
        audit_context=ac("snap"), event_metadata=em(15), resource_types=TYPES,
    )
    latest_row = {name: None for name in schemas.RESOURCE_CHANGE_TYPE.names}
    latest_row.update(meta_cols(10, corr=""), **content_cols(), status="OK", etag=b"etag-10", resource_types=TYPES)
    snap_cols = {
        "href": HREF, "resource_types": TYPES, **meta_cols(15, corr="snap"),
        "resource_snapshot": {
            "latest_resource_change": latest_row,
            "create_pendings": [_pending_row(11, "p1", **content_cols())],
            "retrieve_pendings": [_pending_row(12, "p2", resource_interface="oic.if.baseline", etags=[b"x"])],
            "update_pendings": [_pending_row(13, "p3", resource_interface="oic.if.a", **content_cols()),
                                _pending_row(14, "p4", resource_interface="oic.if.a", **content_cols())],
            "delete_pendings": [],
        },
    }
    dmu = ra.DeviceMetadataUpdated(
        device_id=DEV, connection=CONNECTION, audit_context=ac("m1"), event_metadata=em(20), canceled=True,
        twin_synchronization=TWIN, twin_enabled=True,
    )
    dmu_cols = {**meta_cols(20, corr="m1"), "connection": CONNECTION_ROW, "twin_enabled": True,
                "twin_synchronization": TWIN_ROW, "canceled": True}
    pend_force = ra.DeviceMetadataUpdatePending(
        device_id=DEV, twin_force_synchronization=True, audit_context=ac("m2"), event_metadata=em(21),
        valid_until=VALID_UNTIL)
    pend_twin = ra.DeviceMetadataUpdatePending(
        device_id=DEV, twin_enabled=False, audit_context=ac("m3"), event_metadata=em(22), valid_until=0)
    md_snap = ra.DeviceMetadataSnapshotTaken(
        device_id=DEV, device_metadata_updated=dmu, update_pendings=[pend_force, pend_twin], event_metadata=em(23))
    md_pending_rows = [
        {**meta_cols(21, corr="m2"), "update_pending": "twin_force_synchronization", "update_pending_value": True,
         "valid_until": VALID_UNTIL},
        {**meta_cols(22, corr="m3"), "update_pending": "twin_enabled", "update_pending_value": False,
         "valid_until": 0},
    ]
    links_agg = ids.links_aggregate_id(DEV)
    md_agg = ids.metadata_aggregate_id(DEV)
    return [
        ("resourcestatesnapshottaken", snap, snap_cols, None),
        ("resourcelinkspublished",
         ra.ResourceLinksPublished(device_id=DEV, resources=[link("/a"), link("/b", VALID_UNTIL)],
                                   audit_context=ac(""), event_metadata=em(30)),
         {**meta_cols(30, corr=""), "resources": [link_row("/a"), link_row("/b", VALID_UNTIL)]}, links_agg),
        ("resourcelinksunpublished",
         ra.ResourceLinksUnpublished(device_id=DEV, hrefs=["/a", "/b"], audit_context=ac("u"), event_metadata=em(31)),
         {**meta_cols(31, corr="u"), "hrefs": ["/a", "/b"]}, links_agg),
        ("resourcelinkssnapshottaken",
         ra.ResourceLinksSnapshotTaken(device_id=DEV, resources={"/b": link("/b"), "/a": link("/a")},
                                       event_metadata=em(32), audit_context=ac("s")),
         {**meta_cols(32, corr="s"), "resources": [link_row("/a"), link_row("/b")]}, links_agg),
        ("devicemetadataupdated", dmu, dmu_cols, md_agg),
        ("devicemetadataupdatepending", pend_force,
         {**meta_cols(21, corr="m2"), "update_pending": "twin_force_synchronization", "update_pending_value": True,
          "valid_until": VALID_UNTIL}, md_agg),
        ("devicemetadataupdatepending", pend_twin,
         {**meta_cols(22, corr="m3"), "update_pending": "twin_enabled", "update_pending_value": False,
          "valid_until": 0}, md_agg),
        ("devicemetadatasnapshottaken", md_snap,
         {**meta_cols(23, audit=False), "metadata_snapshot": {
             "device_metadata_updated": {**{k: None for k in schemas.DEVICE_METADATA_UPDATED_TYPE.names}, **dmu_cols},
             "update_pendings": md_pending_rows}}, md_agg),
    ]


def _subject(event_type: str, *, leadrt: bool = False) -> str:
    family = EVENT_TYPES[event_type].family
    if family == "resources":
        return subjects.resource_subject(OWNER, DEV, ids.href_id(HREF), event_type, leadrt=leadrt,
                                         lead_resource_type="core.light" if leadrt else None)
    if family == "resource-links":
        return subjects.links_subject(OWNER, DEV, event_type)
    if family == "metadata":
        return subjects.metadata_subject(OWNER, DEV, event_type)
    return subjects.registrations_subject(OWNER, event_type)


def all_cases():
    """[(event_type, subject, payload, expected columns)] covering every event type in EVENT_TYPES."""
    cases = []
    for event_type, msg, cols in _resource_cases():
        agg = ids.resource_aggregate_id(DEV, HREF)
        cases.append((event_type, _subject(event_type), codec.encode_resource_aggregate_event(event_type, msg),
                      {**cols, "href_id": ids.href_id(HREF), "device_id": DEV, "group_id": DEV, "aggregate_id": agg}))
    for event_type, msg, cols, agg in _other_cases():
        agg = agg or ids.resource_aggregate_id(DEV, HREF)
        extra = {"href_id": ids.href_id(HREF)} if event_type == "resourcestatesnapshottaken" else {}
        cases.append((event_type, _subject(event_type), codec.encode_resource_aggregate_event(event_type, msg),
                      {**cols, **extra, "device_id": DEV, "group_id": DEV, "aggregate_id": agg}))
    for event_type, cls in (("devicesregistered", isp.DevicesRegistered),
                            ("devicesunregistered", isp.DevicesUnregistered)):
        msg = cls(owner=OWNER_RAW, device_ids=[DEV, DEV2], timestamp=TS0 + 50,
                  audit_context=isp.AuditContext(user_id="user-1"), event_metadata=isp.EventMetadata(hub_id="hub-1"),
                  open_telemetry_carrier={"traceparent": "00-abc-def-01"})
        cases.append((event_type, _subject(event_type), codec.encode_identity_store_event(msg),
                      {"registration_owner": OWNER_RAW, "device_ids": [DEV, DEV2], "timestamp": TS0 + 50,
                       "user_id": "user-1", "hub_id": "hub-1"}))
    return cases


def staging_batch(rows: list[tuple]) -> pa.RecordBatch:
    """rows: (subject, data[, msg_id header]) -> a RecordBatch with staging.SCHEMA."""
    n = len(rows)
    headers = [{"Nats-Msg-Id": r[2]} if len(r) > 2 and r[2] else None for r in rows]
    return pa.RecordBatch.from_arrays(
        [
            pa.array(["EVENTS"] * n, pa.string()),
            pa.array(list(range(1, n + 1)), pa.int64()),
            pa.array([r[0] for r in rows], pa.string()),
            pa.array([PUBLISHED] * n, pa.timestamp("us", tz="UTC")),
            pa.array([r[2] if len(r) > 2 else None for r in rows], pa.string()),
            pa.array([list(h.items()) if h else None for h in headers], pa.map_(pa.string(), pa.string())),
            pa.array([r[1] for r in rows], pa.binary()),
        ],
        schema=staging.SCHEMA,
    )


def rows_by_seq(out: pa.RecordBatch) -> dict[int, dict]:
    return {row["stream_seq"]: row for row in out.to_pylist()}


QUARANTINE_ONLY = [n for n in schemas.UNION_COLUMNS if n not in schemas.EVENTS_COLUMNS]


def test_every_event_type_every_field():
    cases = all_cases()
    assert {c[0] for c in cases} == set(EVENT_TYPES)
    batch = staging_batch([(subject, data) for _, subject, data, _ in cases])
    out = decode_batch(batch, INTERVAL)
    assert out.schema == schemas.UNION_SCHEMA
    assert out.num_rows == batch.num_rows
    got = rows_by_seq(out)
    for seq, (event_type, subject, data, cols) in enumerate(cases, start=1):
        row = got[seq]
        assert row["reason"] is None, (event_type, row["detail"])
        expected = {name: None for name in schemas.UNION_COLUMNS}
        expected.update(
            stream="EVENTS", stream_seq=seq, published_at=PUBLISHED, subject=subject, owner_id=OWNER,
            event_type=event_type, interval_id=INTERVAL, date=date(2026, 1, 1),
        )
        expected.update(cols)
        if "content_data" in cols:
            expected["content_json"] = row["content_json"]
            assert json.loads(row["content_json"]) == {"power": 5, "state": True}, event_type
        if cols.get("aggregate_id"):
            expected["msg_id"] = f"ra:{cols['aggregate_id']}:{cols['version']}:{event_type}:{cols['timestamp']}"
        else:
            expected["msg_id"] = "is:" + hashlib.sha256(subject.encode() + b"\n" + data).hexdigest()
        _fix_nested_json(row, expected)
        for name in schemas.UNION_COLUMNS:
            assert row[name] == expected[name], (event_type, name, row[name], expected[name])


def _fix_nested_json(row: dict, expected: dict) -> None:
    """content_json inside snapshot structs: check it parses to the CBOR content, then compare the rest."""
    snap = row.get("resource_snapshot")
    if snap is None:
        return
    items = [snap["latest_resource_change"]] + [p for k in ("create", "retrieve", "update", "delete")
                                                for p in snap[f"{k}_pendings"]]
    exp_snap = expected["resource_snapshot"]
    exp_items = [exp_snap["latest_resource_change"]] + [p for k in ("create", "retrieve", "update", "delete")
                                                        for p in exp_snap[f"{k}_pendings"]]
    for got, exp in zip(items, exp_items, strict=True):
        if exp.get("content_data") is not None:
            assert json.loads(got["content_json"]) == {"power": 5, "state": True}
            exp["content_json"] = got["content_json"]


def test_leadrt_subject_and_header_msg_id():
    _, _, data, _ = next(c for c in all_cases() if c[0] == "resourcechanged")
    lead_subject = _subject("resourcechanged", leadrt=True)
    batch = staging_batch([(lead_subject, data), (_subject("resourcechanged"), data, "header-id-1")])
    got = rows_by_seq(decode_batch(batch, INTERVAL))
    assert got[1]["lead_resource_type"] == "core.light"
    assert got[1]["subject"] == lead_subject
    assert got[1]["msg_id"].startswith("ra:")
    assert got[2]["lead_resource_type"] is None
    assert got[2]["msg_id"] == "header-id-1"  # header wins
    assert got[2]["headers"] is None and got[2]["data"] is None  # raw columns only on quarantine rows


def _corrupt_rows():
    _, rc_subject, rc_data, _ = next(c for c in all_cases() if c[0] == "resourcechanged")
    is_subject = _subject("devicesregistered")
    bad_inner = eventbus_pb2.Event(version=1, event_type="resourcechanged", group_id=DEV,
                                   aggregate_id=ids.resource_aggregate_id(DEV, HREF), data=b"\xff\xff\xff\xff")
    other_device = subjects.resource_subject(OWNER, DEV2, ids.href_id(HREF), "resourcechanged")
    unknown = f"plgd.owners.{OWNER}.devices.{DEV}.resources.{ids.href_id(HREF)}.resourcefrobnicated"
    return [
        ("bad_snappy", (rc_subject, bad_inner.SerializeToString(), "hdr-q1")),
        ("bad_snappy", (is_subject, b"\xff\xfe\xfd not snappy")),
        ("bad_protobuf", (rc_subject, b"\xff\xff\xff\xff\xff")),
        ("bad_protobuf", (rc_subject, b"")),
        ("unknown_event_type", (unknown, rc_data)),
        ("bad_subject", ("not.a.plgd.subject", rc_data)),
        ("bad_subject", (f"plgd.owners.{OWNER}.registrations.resourcechanged", rc_data)),
        ("subject_mismatch", (other_device, rc_data)),
        ("subject_mismatch", (_subject("resourceupdated"), rc_data)),
    ]


def test_corrupt_rows_are_quarantined_with_reason():
    good = [(s, d) for _, s, d, _ in all_cases()[:3]]
    corrupt = _corrupt_rows()
    rows = good[:1] + [r for _, r in corrupt] + good[1:]
    batch = staging_batch(rows)
    out = decode_batch(batch, INTERVAL)
    assert out.num_rows == len(rows)
    got = rows_by_seq(out)
    raw = rows_by_seq(batch)
    for k, (reason, _row_in) in enumerate(corrupt):
        seq = k + 2
        row = got[seq]
        assert row["reason"] == reason, (reason, row["detail"])
        assert row["detail"], reason
        assert row["stage"] == "decode"
        assert row["interval_id"] == INTERVAL
        for col in ("stream", "stream_seq", "subject", "published_at", "msg_id", "data"):
            assert row[col] == raw[seq][col], (reason, col)
        assert (row["headers"] or None) == (raw[seq]["headers"] or None)
        for col in schemas.EVENTS_COLUMNS:
            if col not in schemas.QUARANTINE_COLUMNS:
                assert row[col] is None, (reason, col)
    assert got[1]["msg_id"] != "hdr-q1"
    assert got[2]["msg_id"] == "hdr-q1" and got[2]["headers"] == [("Nats-Msg-Id", "hdr-q1")]
    decoded = [r for r in got.values() if r["reason"] is None]
    assert len(decoded) == len(good)


def test_parts_and_iterator_keep_every_row():
    cases = all_cases()
    rows = [(s, d) for _, s, d, _ in cases] + [r for _, r in _corrupt_rows()]
    batch = staging_batch(rows)
    parts = decode_batch_parts(batch, INTERVAL)
    assert sum(p.num_rows for p in parts) == batch.num_rows
    assert all(p.schema == schemas.UNION_SCHEMA for p in parts)
    # one part per (event type) plus one quarantine part
    assert len(parts) == len(EVENT_TYPES) + 1
    seqs = sorted(s for p in decode_batches([batch.slice(0, 5), batch.slice(5)], INTERVAL)
                  for s in p.column("stream_seq").to_pylist())
    assert seqs == list(range(1, batch.num_rows + 1))


def test_empty_batch():
    out = decode_batch(pa.RecordBatch.from_pylist([], schema=staging.SCHEMA), INTERVAL)
    assert out.num_rows == 0 and out.schema == schemas.UNION_SCHEMA


def test_uint64_wraps_and_unknown_enum_is_kept_as_number():
    msg = ra.ResourceChanged(resource_id=RID, content=content(), status=99, audit_context=ac(),
                             event_metadata=ra.EventMetadata(version=2**63 + 1, timestamp=TS0, sequence=2**64 - 1),
                             resource_types=TYPES)
    data = codec.encode_resource_aggregate_event("resourcechanged", msg)
    row = decode_batch(staging_batch([(_subject("resourcechanged"), data)]), INTERVAL).to_pylist()[0]
    assert row["reason"] is None
    assert row["status"] == "99"
    assert row["sequence"] == -1
    assert row["version"] == -(2**63) + 1


def test_empty_content_and_defaults():
    msg = ra.ResourceChanged(resource_id=RID, content=ra.Content(coap_content_format=-1), status=ra.NOT_FOUND,
                             event_metadata=em(0))
    data = codec.encode_resource_aggregate_event("resourcechanged", msg)
    row = decode_batch(staging_batch([(_subject("resourcechanged"), data)]), INTERVAL).to_pylist()[0]
    assert row["reason"] is None
    assert row["content_type"] == "" and row["coap_content_format"] == -1 and row["content_data"] == b""
    assert row["content_json"] is None
    assert row["resource_types"] == [] and row["etag"] == b"" and row["user_id"] == ""
    assert row["version"] == 0


def test_snapshot_without_latest_change_is_null_struct():
    snap = ra.ResourceStateSnapshotTaken(resource_id=RID, event_metadata=em(3))
    data = codec.encode_resource_aggregate_event("resourcestatesnapshottaken", snap)
    row = decode_batch(staging_batch([(_subject("resourcestatesnapshottaken"), data)]), INTERVAL).to_pylist()[0]
    assert row["reason"] is None
    assert row["resource_snapshot"]["latest_resource_change"] is None
    assert row["resource_snapshot"]["create_pendings"] == []


def test_spark_schemas_convert():
    pytest.importorskip("pyspark")
    union = schemas.union_spark_schema()
    assert union.fieldNames() == list(schemas.UNION_COLUMNS)
    assert union["published_at"].dataType.typeName() == "timestamp"
    assert schemas.quarantine_spark_schema().fieldNames() == list(schemas.QUARANTINE_COLUMNS)


# ---- helpers of the Spark app that run without Spark -------------------------------------------

def test_hive_escape_matches_spark():
    from airflow_provider_plgd.spark.parquet_io import HIVE_DEFAULT_PARTITION, hive_escape, partition_dir

    assert hive_escape("e1407479-3136-56c0-9908-bb02fb0339e2") == "e1407479-3136-56c0-9908-bb02fb0339e2"
    assert hive_escape("urn:uuid:{A}") == "urn%3Auuid%3A%7BA}"
    assert hive_escape("a/b=c%d") == "a%2Fb%3Dc%25d"
    assert hive_escape(None) == hive_escape("") == HIVE_DEFAULT_PARTITION
    assert partition_dir(["owner_id", "date"], ["o", date(2026, 1, 2)]) == "owner_id=o/date=2026-01-02"


def test_partitioned_writer_deterministic_files(tmp_path):
    import pyarrow.dataset as ds

    from airflow_provider_plgd.spark.parquet_io import ArrowPartitionedWriter

    cases = all_cases()
    batch = staging_batch([(s, d) for _, s, d, _ in cases])
    out = decode_batch(batch, INTERVAL).select(list(schemas.EVENTS_COLUMNS))
    files = []
    for _attempt in range(2):  # a retried task attempt rewrites the same names with the same content
        w = ArrowPartitionedWriter(str(tmp_path / "ev"), 7, schemas.EVENTS_SCHEMA, EVENTS_PARTITIONS,
                                   write_id="w1", row_group_rows=4)
        w.write(out.slice(0, 10))
        w.write(out.slice(10))
        files.append(w.close())
    assert files[0] == files[1]
    assert sum(f["rows"] for f in files[0]) == out.num_rows
    assert {f["partition"]["event_type"] for f in files[0]} == set(EVENT_TYPES)
    assert all(f["path"].endswith("/part-00007-w1.parquet") and f["path"].startswith(f"interval_id={INTERVAL}/")
               for f in files[0])
    assert all(f["size"] == (tmp_path / "ev" / f["path"]).stat().st_size for f in files[0])
    assert all(json.loads(f["stats"])["numRecords"] == f["rows"] for f in files[0])
    on_disk = sorted(str(p.relative_to(tmp_path / "ev")) for p in (tmp_path / "ev").rglob("*.parquet"))
    assert on_disk == sorted(f["path"] for f in files[0])
    part = ds.partitioning(pa.schema([(c, pa.string()) for c in EVENTS_PARTITIONS]), flavor="hive")
    back = ds.dataset(str(tmp_path / "ev"), format="parquet", partitioning=part).to_table()
    assert back.num_rows == out.num_rows
    assert sorted(back.column("msg_id").to_pylist()) == sorted(out.column("msg_id").to_pylist())
    empty = ArrowPartitionedWriter(str(tmp_path / "q"), 0, schemas.QUARANTINE_SCHEMA, (), write_id="w1",
                                   always_write=True).close()
    assert [(e["path"], e["rows"], e["partition"]) for e in empty] == [("part-00000-w1.parquet", 0, {})]
    assert pa.parquet.read_table(tmp_path / "q" / "part-00000-w1.parquet").num_rows == 0


def test_py_files_zip(tmp_path):
    import zipfile

    from airflow_provider_plgd.spark_deps import ZIP_NAME, build_py_files_zip

    path = build_py_files_zip(tmp_path / "deps")
    assert path.endswith(ZIP_NAME)
    first = Path(path).read_bytes()
    assert build_py_files_zip(tmp_path / "deps") == path and Path(path).read_bytes() == first  # deterministic
    names = zipfile.ZipFile(path).namelist()
    for needed in ("airflow_provider_plgd/__init__.py", "airflow_provider_plgd/tables/staging.py",
                   "airflow_provider_plgd/tables/run_summary.py", "airflow_provider_plgd/plgd/codec.py",
                   "airflow_provider_plgd/plgd/pb/resourceaggregate_pb2.py", "airflow_provider_plgd/spark_apps/decode_events.py",
                   "airflow_provider_plgd/spark/decode_batch.py", "airflow_provider_plgd/spark/schemas.py",
                   "airflow_provider_plgd/spark/session.py", "airflow_provider_plgd/tables/delta_tables.py", "airflow_provider_plgd/tables/storage.py"):
        assert needed in names
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    assert "airflow_provider_plgd/hooks/jetstream.py" in names  # the package, whole
    assert build_py_files_zip(tmp_path / "x.zip").endswith("x.zip")


def test_plan_tasks_packs_row_groups_into_few_decreasing_tasks():
    """``task_plan.plan_tasks``: every row group once, few tasks, big first, even tail."""
    from airflow_provider_plgd.spark.task_plan import plan_tasks

    # the bench's shape: 10 x 50k, 5 x 28k, ..., 5 x 20 rows (75 row groups, 974k rows)
    sizes = [50_000] * 10 + [28_000] * 5 + [12_700] * 5 + [9_200] * 5 + [8_000] * 5 + [7_200] * 5 \
        + [5_800] * 5 + [5_200] * 5 + [4_800] * 10 + [3_500] * 10 + [2_500] * 5 + [20] * 5
    units = [(f"file://f{i}.parquet", i % 2, n) for i, n in enumerate(sizes)]
    tasks = plan_tasks(units, 2)
    assert sorted(u for t in tasks for u in t) == sorted(units)  # each unit exactly once
    assert all(t for t in tasks) and len(tasks) < len(units) // 2
    rows = [sum(u[2] for u in t) for t in tasks]
    assert rows[0] == max(rows) and rows[0] <= 0.25 * sum(sizes) / 2 + 50_000
    assert max(rows[-4:]) <= 20_000  # the tail is small (about min_rows), so slots end together
    # simulated schedule (tasks start in list order on the first free slot): even finish
    slots = [0, 0]
    for r in rows:
        slots[slots.index(min(slots))] += r
    assert abs(slots[0] - slots[1]) <= 10_000

    assert plan_tasks([], 2) == []
    assert plan_tasks([("f", 0, 5)], 2) == [[("f", 0, 5)]]
    one_slot = plan_tasks(units, 1, min_rows=1, share=1.0)
    assert len(one_slot) == 1 and len(one_slot[0]) == len(units)  # share 1 on one slot: one task


def test_rdd_task_reads_its_row_groups_and_writes_both_tables(tmp_path, monkeypatch):
    """``decode_job.make_rdd_task`` run in-process (no Spark): a staging file cut into slices by
    its row count alone (no footer read on the driver), each task reads its slices' row groups
    (footer read in the task), every row once; decoded rows land in ``events``, bad ones in
    ``quarantine``; with owners, only their rows are read."""
    import pyarrow.dataset as ds

    from airflow_provider_plgd.spark.decode_job import make_rdd_task, staging_units
    from airflow_provider_plgd.spark.task_plan import plan_tasks

    cases = all_cases()
    rows = [(s, d) for _, s, d, _ in cases] * 3 + [(cases[0][1], b"\x00bad")]
    batch = staging_batch(rows)
    path = tmp_path / "staging.parquet"
    owners = [f"o{i % 3}" for i in range(len(rows))]
    table = pa.Table.from_batches([batch]).cast(staging.SCHEMA).append_column("owner_id", pa.array(owners))
    pa.parquet.write_table(table, path, row_group_size=7)
    staged = staging.StagedFile("x.parquet", str(path), len(rows), path.stat().st_size, INTERVAL, "t",
                                "o0", "o2", 1, len(rows), 0)
    units = staging_units([staged], slice_rows=5)  # row ranges that do not follow the row groups (7 rows)
    assert sum(u[2] for u in units) == len(rows) and len(units) == -(-len(rows) // 5)
    starts = sorted(u[1] for u in units)
    assert starts[0] == 0 and all(b - a in (5, 4) for a, b in zip(starts, [*starts[1:], len(rows)], strict=True))
    tasks = plan_tasks(units, 2, min_rows=10)
    assert 1 < len(tasks) < len(units)
    ev, q = str(tmp_path / "ev"), str(tmp_path / "q")
    records = []
    import pyspark

    for task_id, task_units in enumerate(tasks):  # one Spark task (partition) per element
        ctx = type("Ctx", (), {"partitionId": lambda self, i=task_id: i})()
        monkeypatch.setattr(pyspark.TaskContext, "get", classmethod(lambda cls, c=ctx: c))
        records += list(make_rdd_task(INTERVAL, ev, q, "w1", batch_rows=5)(iter([task_units])))
    by_table = collections.Counter()
    for rec in records:
        by_table[rec["table"]] += rec["rows"] if rec["table"] == "input" else rec["file"]["rows"]
    assert by_table == {"events": len(rows) - 1, "quarantine": 1, "input": len(rows)}
    assert [rec["reasons"] for rec in records if rec["table"] == "quarantine" and rec["file"]["rows"]] == \
        [{"bad_protobuf": 1}]
    part = ds.partitioning(pa.schema([(c, pa.string()) for c in EVENTS_PARTITIONS]), flavor="hive")
    back = ds.dataset(ev, format="parquet", partitioning=part).to_table()
    expected = decode_batch(batch, INTERVAL)
    decoded = expected.filter(expected.column("reason").is_null())
    assert sorted(back.column("msg_id").to_pylist()) == sorted(decoded.column("msg_id").to_pylist())
    quarantined = ds.dataset(q, format="parquet").to_table()
    assert quarantined.column("reason").to_pylist() == ["bad_protobuf"]
    assert {rec["file"]["path"] for rec in records if "file" in rec} == {
        str(f.relative_to(tmp_path / t)) for t in ("ev", "q") for f in (tmp_path / t).rglob("*.parquet")}
    # only some owners' rows: the task filters them (and skips row groups whose statistics exclude them)
    only = list(make_rdd_task(INTERVAL, str(tmp_path / "ev2"), str(tmp_path / "q2"), "w2", batch_rows=5,
                              owners=["o1"])(iter([units])))
    assert sum(rec["rows"] for rec in only if rec["table"] == "input") == owners.count("o1")
