"""Codec round trips and decode errors (docs/wire-format.md §2, §3)."""

from __future__ import annotations

import pickle
import random

import cramjam
import pytest
import snappy

from airflow_provider_plgd.plgd import codec, event_types, ids, subjects
from airflow_provider_plgd.plgd.codec import PlgdDecodeError, decode_payload
from airflow_provider_plgd.plgd.pb import eventbus_pb2, identitystore_pb2
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


# ---- decode errors --------------------------------------------------------------------------------


def _envelope(**kw):
    base = dict(version=1, event_type="resourcechanged", group_id=DEVICE, aggregate_id=RESOURCE_AGG)
    base.update(kw)
    return eventbus_pb2.Event(**base).SerializeToString()


RC_SUBJECT = golden_subject("resourcechanged")


def test_bad_snappy():
    err = reason_of(decode_payload, RC_SUBJECT, _envelope(data=b"\x05garbage-not-snappy"))
    assert err.reason == "bad_snappy" and "'resourcechanged'" in str(err)
    assert reason_of(decode_payload, RC_SUBJECT, _envelope(data=b"")).reason == "bad_snappy"
    # the framed format is not what plgd uses
    framed = snappy.StreamCompressor().add_chunk(build_message("resourcechanged").SerializeToString())
    assert reason_of(decode_payload, RC_SUBJECT, _envelope(data=framed)).reason == "bad_snappy"
    is_subject = golden_subject("devicesregistered")
    assert reason_of(decode_payload, is_subject, b"\xff\xff\xff\xff").reason == "bad_snappy"
    assert reason_of(decode_payload, is_subject, b"").reason == "bad_snappy"
    assert reason_of(codec.decode_identity_store_payload, None).reason == "bad_snappy"


def test_truncated_protobuf():
    data = encode("resourcechanged", build_message("resourcechanged"))
    err = reason_of(decode_payload, RC_SUBJECT, data[:-1])
    assert err.reason == "bad_protobuf" and "eventbus.v2.Event" in str(err)
    inner = build_message("resourcechanged").SerializeToString()
    err = reason_of(decode_payload, RC_SUBJECT, _envelope(data=snappy.compress(inner[:-3])))
    assert err.reason == "bad_protobuf" and "ResourceChanged" in str(err)
    is_inner = identitystore_pb2.Event(devices_registered=build_message("devicesregistered")).SerializeToString()
    err = reason_of(decode_payload, golden_subject("devicesregistered"), snappy.compress(is_inner[:-2]))
    assert err.reason == "bad_protobuf"
    assert reason_of(codec.decode_resource_aggregate_payload, None).reason == "bad_protobuf"


def test_envelope_without_event_type_is_bad_protobuf():
    assert reason_of(decode_payload, RC_SUBJECT, b"").reason == "bad_protobuf"
    assert reason_of(codec.decode_resource_aggregate_payload, _envelope(event_type="")).reason == "bad_protobuf"


def test_identity_store_empty_or_unknown_oneof():
    subject = golden_subject("devicesregistered")
    assert reason_of(decode_payload, subject, snappy.compress(b"")).reason == "bad_protobuf"
    newer = snappy.compress(_field(3, 2, b"\x0a\x01x"))  # a oneof member this code does not know
    assert reason_of(decode_payload, subject, newer).reason == "unknown_event_type"


def test_unknown_event_type():
    err = reason_of(decode_payload, RC_SUBJECT, _envelope(event_type="resourcefrobnicated", data=snappy.compress(b"")))
    assert err.reason == "unknown_event_type" and "'resourcefrobnicated'" in str(err)
    inner = ra.ServiceMetadataUpdated().SerializeToString()
    err = reason_of(codec.decode_resource_aggregate_payload, _envelope(event_type="ServiceMetadataUpdated", data=snappy.compress(inner)))
    assert err.reason == "unknown_event_type"
    # an identity-store type inside a resource-aggregate envelope
    err = reason_of(codec.decode_resource_aggregate_payload, _envelope(event_type="devicesregistered"))
    assert err.reason == "unknown_event_type"
    # subject with an unknown type
    err = reason_of(decode_payload, RC_SUBJECT.replace("resourcechanged", "resourcefoo"), b"")
    assert err.reason == "unknown_event_type"
    err = reason_of(codec.decode_identity_store_payload, encode("devicesregistered", build_message("devicesregistered")), "resourcechanged")
    assert err.reason == "unknown_event_type"


@pytest.mark.parametrize(
    "subject",
    [
        "",
        "foo.bar",
        "plgd.owners.x",
        f"plgd.owners.{OWNER}.devices.{DEVICE}.things.{HREF_ID}.resourcechanged",
        f"plgd.owners.{OWNER}.devices.{DEVICE}.resources.{HREF_ID}.resourcechanged.extra",
        f"plgd.owners.{OWNER}.devices.{DEVICE}.metadata.resourcechanged",  # type of another family
        f"plgd.owners.{OWNER}.registrations.resourcechanged",
    ],
)
def test_bad_subject(subject):
    data = encode("resourcechanged", build_message("resourcechanged"))
    err = reason_of(decode_payload, subject, data)
    assert err.reason == "bad_subject"
    assert repr(subject) in str(err) or subject in str(err)


def test_bad_subject_type():
    assert reason_of(decode_payload, None, b"").reason == "bad_subject"


def test_subject_mismatch():
    data = encode("resourcechanged", build_message("resourcechanged"))
    # event type differs
    err = reason_of(decode_payload, golden_subject("resourceupdated"), data)
    assert err.reason == "subject_mismatch" and "'resourceupdated'" in str(err)
    # device differs
    other = RC_SUBJECT.replace(DEVICE, "00000000-0000-0000-0000-000000000002")
    err = reason_of(decode_payload, other, data)
    assert err.reason == "subject_mismatch" and "00000000-0000-0000-0000-000000000002" in str(err)
    # href differs
    err = reason_of(decode_payload, RC_SUBJECT.replace(HREF_ID, ids.href_id("/oic/d")), data)
    assert err.reason == "subject_mismatch" and "'/light/1'" in str(err)
    # the pre-v2.8.0 token (uuid5(device+href)) is not accepted as hrefId
    err = reason_of(decode_payload, RC_SUBJECT.replace(HREF_ID, RESOURCE_AGG), data)
    assert err.reason == "subject_mismatch"
    # envelope group_id differs from the subject and the body
    env = eventbus_pb2.Event.FromString(data)
    env.group_id = "someone-else"
    err = reason_of(decode_payload, RC_SUBJECT, env.SerializeToString())
    assert err.reason == "subject_mismatch" and "group_id" in str(err)
    # links / metadata device mismatch
    links = encode("resourcelinkspublished", build_message("resourcelinkspublished"))
    err = reason_of(decode_payload, golden_subject("resourcelinkspublished").replace(DEVICE, "dev2"), links)
    assert err.reason == "subject_mismatch"
    # identity store: registered body on unregistered subject
    reg = encode("devicesregistered", build_message("devicesregistered"))
    err = reason_of(decode_payload, golden_subject("devicesunregistered"), reg)
    assert err.reason == "subject_mismatch"
    # an RA payload on a registrations subject: not snappy
    assert reason_of(decode_payload, golden_subject("devicesregistered"), data).reason in {"bad_snappy", "bad_protobuf"}


def test_random_and_mutated_input_only_raises_plgd_decode_error():
    rng = random.Random(1234)
    samples = [encode(t, build_message(t)) for t in ALL_TYPES]
    outcomes = {"ok": 0}
    for i in range(3000):
        if i % 3 == 0:
            data = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 80)))
        else:
            base = bytearray(rng.choice(samples))
            for _ in range(rng.randrange(1, 4)):
                base[rng.randrange(len(base))] = rng.getrandbits(8)
            data = bytes(base[: rng.randrange(1, len(base) + 1)])
        for t in (rng.choice(RA_TYPES), rng.choice(IS_TYPES)):
            try:
                decode_payload(golden_subject(t), data)
                outcomes["ok"] += 1
            except PlgdDecodeError as exc:
                outcomes[exc.reason] = outcomes.get(exc.reason, 0) + 1
    assert set(outcomes) - {"ok"} <= codec.DECODE_ERROR_REASONS
    assert outcomes.get("bad_snappy", 0) > 0 and outcomes.get("bad_protobuf", 0) > 0


def test_plgd_decode_error_properties():
    err = PlgdDecodeError("bad_snappy", "detail here")
    assert isinstance(err, ValueError)
    assert str(err) == "detail here" and err.reason == "bad_snappy"
    clone = pickle.loads(pickle.dumps(err))
    assert (type(clone), clone.reason, str(clone)) == (PlgdDecodeError, "bad_snappy", "detail here")
    with pytest.raises(ValueError, match="reason"):
        PlgdDecodeError("oops", "x")


# ---- encode errors --------------------------------------------------------------------------------


def test_encode_errors():
    with pytest.raises(TypeError, match="ResourceChanged"):
        codec.encode_resource_aggregate_event("resourcechanged", ra.ResourceUpdated())
    with pytest.raises(ValueError, match="identity-store"):
        codec.encode_resource_aggregate_event("devicesregistered", identitystore_pb2.DevicesRegistered())
    with pytest.raises(ValueError, match="'nope'"):
        codec.encode_resource_aggregate_event("nope", ra.ResourceChanged())
    with pytest.raises(ValueError, match="empty device_id"):
        codec.encode_resource_aggregate_event("resourcelinkspublished", ra.ResourceLinksPublished())
    with pytest.raises(TypeError, match="DevicesRegistered"):
        codec.encode_identity_store_event(ra.ResourceChanged())
    with pytest.raises(TypeError):
        codec.encode_event(ra.ServiceMetadataUpdated())


def test_event_types_docstring_states_the_tables_counts():
    """The module docstring of ``plgd/event_types.py`` is the one place that writes the counts
    out; they follow the table (live resource-aggregate + identity-store, snapshot, all)."""
    import re

    infos = event_types.EVENT_TYPES.values()
    live_ra = sum(1 for i in infos if i.live and i.aggregate is not None)
    live_is = sum(1 for i in infos if i.live and i.aggregate is None)
    snapshot = sum(1 for i in infos if i.snapshot)
    doc = " ".join((event_types.__doc__ or "").split())
    assert f"``live``; {live_ra} + {live_is})" in doc and f"``snapshot``; {snapshot}): " in doc, doc
    assert re.search(rf"\b{len(event_types.EVENT_TYPES)} in all\b", doc), doc
    assert live_ra + live_is == len(event_types.LIVE_EVENT_TYPES)
