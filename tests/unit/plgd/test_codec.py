"""Codec round trips and the wire layout pinned independently of our .proto (docs/wire-format.md
§2, §3); decode errors: test_codec_errors.py."""

from __future__ import annotations

import cramjam
import pytest
import snappy

from airflow_provider_plgd.plgd import codec, event_types, ids, subjects
from airflow_provider_plgd.plgd.codec import decode_payload
from airflow_provider_plgd.plgd.pb import eventbus_pb2, identitystore_pb2
from airflow_provider_plgd.plgd.pb import resourceaggregate_pb2 as ra
from tests.unit.plgd.codec_messages import (
    ALL_TYPES,
    DEVICE,
    GOLDEN_AGGREGATE,
    HREF,
    LIGHT_CBOR,
    OWNER_RAW,
    RA_TYPES,
    RESOURCE_AGG,
    TS,
    _field,
    build_message,
    encode,
    golden_subject,
)

# ---- round trips --------------------------------------------------------------------------------


@pytest.mark.parametrize("event_type", ALL_TYPES)
def test_round_trip_every_event_type(event_type):
    message = build_message(event_type, version=5)
    data = encode(event_type, message)
    subject = golden_subject(event_type)
    decoded = decode_payload(subject, data)
    assert decoded.event_type == event_type
    assert type(decoded.message) is event_types.message_class(event_type)
    assert decoded.message == message
    assert decoded.info is event_types.EVENT_TYPES[event_type]
    info = event_types.EVENT_TYPES[event_type]
    if info.family == "registrations":
        assert decoded.envelope is None
        assert decoded.aggregate_id is None and decoded.version is None and decoded.device_id is None
        assert decoded.timestamp == TS
        # the whole payload is snappy block of identitystore.pb.Event
        event = identitystore_pb2.Event.FromString(snappy.decompress(data))
        assert event.WhichOneof("type") == event_types.IDENTITY_STORE_EVENT_TYPE_TO_ONEOF[event_type]
        assert codec.decode_identity_store_payload(data).message == message
    else:
        env = decoded.envelope
        assert isinstance(env, eventbus_pb2.Event)
        assert env.version == 5
        assert env.event_type == event_type
        assert env.group_id == DEVICE
        assert env.aggregate_id == GOLDEN_AGGREGATE[info.aggregate]
        assert env.is_snapshot is False
        assert env.timestamp == 0
        # data is snappy *block* format (no framing header), decodable by an independent decoder
        assert not env.data.startswith(b"\xff\x06\x00\x00sNaPpY")
        assert bytes(cramjam.snappy.decompress_raw(env.data)) == message.SerializeToString(deterministic=True)
        assert decoded.aggregate_id == GOLDEN_AGGREGATE[info.aggregate]
        assert decoded.version == 5
        assert decoded.timestamp == TS
        assert decoded.device_id == DEVICE
        assert decoded.href == (HREF if info.family == "resources" else None)
        assert codec.decode_resource_aggregate_payload(data).message == message


@pytest.mark.parametrize("event_type", [t for t in RA_TYPES if event_types.EVENT_TYPES[t].family == "resources"])
@pytest.mark.parametrize("suffix", ["", ".leadrt", ".leadrt.core.light", ".leadrt.6ed09a04-e205-5403-82cf-b999b53ad325"])
def test_resource_events_decode_with_every_subject_form(event_type, suffix):
    data = encode(event_type, build_message(event_type))
    decoded = decode_payload(golden_subject(event_type) + suffix, data)
    assert decoded.message.resource_id.href == HREF


def test_decode_accepts_parsed_subject_and_bytes_like():
    data = encode("resourcechanged", build_message("resourcechanged"))
    parsed = subjects.parse_subject(golden_subject("resourcechanged"))
    assert decode_payload(parsed, bytearray(data)).message.content.data == LIGHT_CBOR
    assert decode_payload(parsed, memoryview(data)).event_type == "resourcechanged"
    is_data = encode("devicesregistered", build_message("devicesregistered"))
    assert list(decode_payload(golden_subject("devicesregistered"), bytearray(is_data)).message.device_ids) == [DEVICE]


def test_encoding_is_deterministic():
    m = build_message("resourcelinkspublished")
    assert codec.encode_resource_aggregate_event("resourcelinkspublished", m) == codec.encode_event(m)
    assert codec.encode_event(build_message("devicesregistered")) == codec.encode_event(build_message("devicesregistered"))


def test_version_zero_and_empty_href_aggregate():
    m = ra.ResourceChanged(resource_id=ra.ResourceId(device_id=DEVICE, href=""), event_metadata=ra.EventMetadata())
    env = eventbus_pb2.Event.FromString(codec.encode_resource_aggregate_event("resourcechanged", m))
    assert env.version == 0
    assert env.aggregate_id == ids.NIL_UUID


# ---- wire layout pinned independently of our .proto ----------------------------------------------



def test_hand_built_hub_bytes_decode():
    """Bytes laid out per docs/wire-format.md field numbers (§2.2, §3.2, §3.3), not by our generated code."""
    rid = _field(1, 2, DEVICE.encode()) + _field(2, 2, HREF.encode())
    content = _field(1, 2, LIGHT_CBOR) + _field(2, 2, b"application/vnd.ocf+cbor") + _field(3, 0, 10000)
    meta = _field(1, 0, 9) + _field(2, 0, TS) + _field(3, 2, b"conn") + _field(4, 0, 3) + _field(5, 2, b"hub")
    audit = _field(1, 2, b"u1") + _field(2, 2, b"corr") + _field(3, 2, OWNER_RAW.encode())
    inner = (
        _field(1, 2, rid) + _field(2, 2, content) + _field(3, 0, 1) + _field(4, 2, audit) + _field(5, 2, meta)
        + _field(6, 2, b"etag") + _field(7, 2, b"core.light")
        + _field(100, 2, _field(1, 2, b"traceparent") + _field(2, 2, b"00-1-2-01"))
    )
    envelope = (
        _field(1, 0, 9) + _field(2, 2, b"resourcechanged") + _field(3, 2, DEVICE.encode())
        + _field(4, 2, RESOURCE_AGG.encode()) + _field(5, 2, snappy.compress(inner))
    )
    d = decode_payload(golden_subject("resourcechanged"), envelope)
    m = d.message
    assert (m.resource_id.device_id, m.resource_id.href) == (DEVICE, HREF)
    assert (m.content.data, m.content.content_type, m.content.coap_content_format) == (
        LIGHT_CBOR, "application/vnd.ocf+cbor", 10000,
    )
    assert m.status == ra.OK
    assert (m.audit_context.user_id, m.audit_context.correlation_id, m.audit_context.owner) == ("u1", "corr", "a")
    assert (m.event_metadata.version, m.event_metadata.timestamp, m.event_metadata.connection_id) == (9, TS, "conn")
    assert (m.event_metadata.sequence, m.event_metadata.hub_id) == (3, "hub")
    assert (m.etag, list(m.resource_types)) == (b"etag", ["core.light"])
    assert dict(m.open_telemetry_carrier) == {"traceparent": "00-1-2-01"}
    assert d.version == 9 and d.aggregate_id == RESOURCE_AGG

    reg = _field(1, 2, b"a") + _field(2, 2, DEVICE.encode()) + _field(3, 0, TS) + _field(4, 2, _field(1, 2, b"u"))
    reg += _field(5, 2, _field(1, 2, b"hub"))
    is_payload = snappy.compress(_field(2, 2, reg))  # oneof member 2 = devices_unregistered
    d = decode_payload(golden_subject("devicesunregistered"), is_payload)
    assert d.event_type == "devicesunregistered"
    assert (d.message.owner, list(d.message.device_ids), d.message.timestamp) == ("a", [DEVICE], TS)
    assert (d.message.audit_context.user_id, d.message.event_metadata.hub_id) == ("u", "hub")


def test_device_metadata_update_pending_oneof_numbers():
    inner = _field(1, 2, DEVICE.encode()) + _field(7, 0, 1) + _field(5, 0, 123)
    m = ra.DeviceMetadataUpdatePending.FromString(inner)
    assert m.WhichOneof("update_pending") == "twin_force_synchronization" and m.valid_until == 123
    upd = ra.DeviceMetadataUpdated.FromString(_field(6, 0, 1) + _field(8, 0, 1) + _field(7, 2, _field(1, 0, 3)))
    assert upd.canceled and upd.twin_enabled and upd.twin_synchronization.state == ra.TwinSynchronization.IN_SYNC
