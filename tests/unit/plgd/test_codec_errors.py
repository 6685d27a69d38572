"""Unit tests of airflow_provider_plgd.plgd.codec: decode errors, each with its quarantine reason
(bad snappy, truncated protobuf, unknown event type, bad subject, subject mismatch), and random
and mutated input that only raises ``PlgdDecodeError``.
"""

from __future__ import annotations

import pickle
import random

import pytest
import snappy

from airflow_provider_plgd.plgd import codec, event_types, ids
from airflow_provider_plgd.plgd.codec import PlgdDecodeError, decode_payload
from airflow_provider_plgd.plgd.pb import eventbus_pb2, identitystore_pb2
from airflow_provider_plgd.plgd.pb import resourceaggregate_pb2 as ra
from tests.unit.plgd.codec_messages import (
    ALL_TYPES,
    DEVICE,
    HREF_ID,
    IS_TYPES,
    OWNER,
    RA_TYPES,
    RESOURCE_AGG,
    _field,
    build_message,
    encode,
    golden_subject,
    reason_of,
)

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
