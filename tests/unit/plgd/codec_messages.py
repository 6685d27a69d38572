"""plgd messages of every event type built field by field, their golden subjects and aggregate IDs,
and small helpers: shared by test_codec.py and test_codec_errors.py.
"""

from __future__ import annotations

import pytest

from airflow_provider_plgd.plgd import codec, event_types
from airflow_provider_plgd.plgd.codec import PlgdDecodeError
from airflow_provider_plgd.plgd.pb import identitystore_pb2
from airflow_provider_plgd.plgd.pb import resourceaggregate_pb2 as ra

OWNER_RAW = "a"
OWNER = "e1407479-3136-56c0-9908-bb02fb0339e2"
DEVICE = "00000000-0000-0000-0000-000000000001"
HREF = "/light/1"
HREF_ID = "78baefb2-dcdc-50c3-bb55-5ff4c5e4c8b2"
RESOURCE_AGG = "7d1aabc8-742c-5bd7-8d42-2fbf77af9440"
LINKS_AGG = "7bfecfc4-cbbb-59c2-8d8e-b004c12c30d6"
METADATA_AGG = "2c4c4360-71fc-5b9a-a544-4dbcf3bb8d45"
TS = 1_700_000_000_123_456_789
LIGHT_CBOR = bytes.fromhex("a3646e616d65654c6967687465706f776572182a657374617465f5")  # name/power/state


def _meta(version):
    return ra.EventMetadata(version=version, timestamp=TS, connection_id="10.0.0.1:5684", sequence=7, hub_id="hub-1")


def _audit():
    return ra.AuditContext(user_id="u1", correlation_id="c-1", owner=OWNER_RAW)


def _rid():
    return ra.ResourceId(device_id=DEVICE, href=HREF)


def _content():
    return ra.Content(data=LIGHT_CBOR, content_type="application/vnd.ocf+cbor", coap_content_format=10000)


def _resource():
    return ra.Resource(
        href=HREF,
        device_id=DEVICE,
        resource_types=["core.light"],
        interfaces=["oic.if.baseline"],
        anchor=f"ocf://{DEVICE}",
        policy=ra.Policy(bit_flags=3),
        endpoint_informations=[ra.EndpointInformation(endpoint="coaps+tcp://[::1]:5684", priority=1)],
    )


def build_message(event_type, version=5):
    """A realistic inner message of each event type in EVENT_TYPES."""
    types = ["core.light"]
    otel = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    m = _meta(version)
    common = dict(resource_id=_rid(), audit_context=_audit(), event_metadata=m)
    builders = {
        "resourcelinkspublished": lambda: ra.ResourceLinksPublished(
            device_id=DEVICE, resources=[_resource()], audit_context=_audit(), event_metadata=m,
            open_telemetry_carrier=otel,
        ),
        "resourcelinksunpublished": lambda: ra.ResourceLinksUnpublished(
            device_id=DEVICE, hrefs=[HREF], audit_context=_audit(), event_metadata=m
        ),
        "resourcelinkssnapshottaken": lambda: ra.ResourceLinksSnapshotTaken(
            device_id=DEVICE, resources={HREF: _resource()}, event_metadata=m, audit_context=_audit()
        ),
        "devicemetadataupdatepending": lambda: ra.DeviceMetadataUpdatePending(
            device_id=DEVICE, twin_enabled=False, audit_context=_audit(), event_metadata=m, valid_until=TS + 10**10
        ),
        "devicemetadataupdated": lambda: ra.DeviceMetadataUpdated(
            device_id=DEVICE,
            connection=ra.Connection(
                status=ra.Connection.ONLINE, id="10.0.0.1:5684", connected_at=TS, protocol=ra.Connection.COAPS_TCP,
                service_id="cgw-1", local_endpoints=["coaps+tcp://10.0.0.1:5684"],
            ),
            audit_context=_audit(), event_metadata=m, twin_enabled=True,
            twin_synchronization=ra.TwinSynchronization(state=ra.TwinSynchronization.IN_SYNC, in_sync_at=TS),
        ),
        "devicemetadatasnapshottaken": lambda: ra.DeviceMetadataSnapshotTaken(
            device_id=DEVICE,
            device_metadata_updated=ra.DeviceMetadataUpdated(device_id=DEVICE, twin_enabled=True),
            update_pendings=[ra.DeviceMetadataUpdatePending(device_id=DEVICE, twin_force_synchronization=True)],
            event_metadata=m,
        ),
        "resourcechanged": lambda: ra.ResourceChanged(
            content=_content(), status=ra.OK, etag=b"\x01\x02", resource_types=types,
            open_telemetry_carrier=otel, **common,
        ),
        "resourceupdatepending": lambda: ra.ResourceUpdatePending(
            resource_interface="oic.if.rw", content=_content(), valid_until=TS + 10**9, resource_types=types, **common
        ),
        "resourceupdated": lambda: ra.ResourceUpdated(status=ra.OK, content=_content(), resource_types=types, **common),
        "resourceretrievepending": lambda: ra.ResourceRetrievePending(
            resource_interface="oic.if.baseline", valid_until=0, etag=[b"e1", b"e2"], resource_types=types, **common
        ),
        "resourceretrieved": lambda: ra.ResourceRetrieved(
            status=ra.NOT_MODIFIED, content=_content(), etag=b"e1", resource_types=types, **common
        ),
        "resourcedeletepending": lambda: ra.ResourceDeletePending(
            valid_until=TS, resource_interface="oic.if.baseline", resource_types=types, **common
        ),
        "resourcedeleted": lambda: ra.ResourceDeleted(status=ra.ACCEPTED, resource_types=types, **common),
        "resourcecreatepending": lambda: ra.ResourceCreatePending(content=_content(), valid_until=0, resource_types=types, **common),
        "resourcecreated": lambda: ra.ResourceCreated(status=ra.CREATED, content=_content(), resource_types=types, **common),
        "resourcestatesnapshottaken": lambda: ra.ResourceStateSnapshotTaken(
            resource_id=_rid(),
            latest_resource_change=ra.ResourceChanged(resource_id=_rid(), content=_content(), status=ra.OK),
            resource_update_pendings=[ra.ResourceUpdatePending(resource_id=_rid(), valid_until=0)],
            audit_context=_audit(), event_metadata=m, resource_types=types,
        ),
        "devicesregistered": lambda: identitystore_pb2.DevicesRegistered(
            owner=OWNER_RAW, device_ids=[DEVICE], timestamp=TS,
            audit_context=identitystore_pb2.AuditContext(user_id="u1"),
            event_metadata=identitystore_pb2.EventMetadata(hub_id="hub-1"), open_telemetry_carrier=otel,
        ),
        "devicesunregistered": lambda: identitystore_pb2.DevicesUnregistered(
            owner=OWNER_RAW, device_ids=[DEVICE, "00000000-0000-0000-0000-000000000002"], timestamp=TS,
        ),
    }
    assert set(builders) == set(event_types.EVENT_TYPES)
    return builders[event_type]()


def golden_subject(event_type):
    family = event_types.EVENT_TYPES[event_type].family
    if family == "registrations":
        return f"plgd.owners.{OWNER}.registrations.{event_type}"
    if family == "resource-links":
        return f"plgd.owners.{OWNER}.devices.{DEVICE}.resource-links.{event_type}"
    if family == "metadata":
        return f"plgd.owners.{OWNER}.devices.{DEVICE}.metadata.{event_type}"
    return f"plgd.owners.{OWNER}.devices.{DEVICE}.resources.{HREF_ID}.{event_type}"


GOLDEN_AGGREGATE = {"resource": RESOURCE_AGG, "links": LINKS_AGG, "metadata": METADATA_AGG}
ALL_TYPES = sorted(event_types.EVENT_TYPES)
RA_TYPES = [t for t in ALL_TYPES if event_types.EVENT_TYPES[t].family != "registrations"]
IS_TYPES = ["devicesregistered", "devicesunregistered"]


def encode(event_type, message):
    return codec.encode_event(message) if event_type in IS_TYPES else codec.encode_resource_aggregate_event(event_type, message)


def reason_of(fn, *args):
    with pytest.raises(PlgdDecodeError) as err:
        fn(*args)
    assert err.value.reason in codec.DECODE_ERROR_REASONS
    return err.value


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(num, wire, payload):
    key = _varint(num << 3 | wire)
    if wire == 0:
        return key + _varint(payload)
    return key + _varint(len(payload)) + payload
