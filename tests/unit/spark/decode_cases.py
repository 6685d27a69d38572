"""Hand-made plgd messages of every event type with every field set, the columns each must decode
to, corrupt rows with their quarantine reason, and staging batches of them: shared by
test_decode_batch.py, test_public_api.py and (loaded from test_decode_batch.py) the decode app's
integration test.
"""

from __future__ import annotations

from datetime import datetime, timezone

import cbor2
import pyarrow as pa
import pyarrow.parquet

from airflow_provider_plgd.plgd import codec, ids, subjects
from airflow_provider_plgd.plgd.event_types import EVENT_TYPES
from airflow_provider_plgd.plgd.pb import eventbus_pb2
from airflow_provider_plgd.plgd.pb import identitystore_pb2 as isp
from airflow_provider_plgd.plgd.pb import resourceaggregate_pb2 as ra
from airflow_provider_plgd.spark import schemas
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
