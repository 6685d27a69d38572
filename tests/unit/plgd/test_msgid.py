"""Message-ID rule (docs/architecture.md, "Message ID (dedupe key)")."""

from __future__ import annotations

import hashlib

import pytest

from airflow_provider_plgd.plgd.msgid import message_id

IS_SUBJECT = "plgd.owners.e1407479-3136-56c0-9908-bb02fb0339e2.registrations.devicesregistered"
RA_SUBJECT = (
    "plgd.owners.e1407479-3136-56c0-9908-bb02fb0339e2.devices.00000000-0000-0000-0000-000000000001"
    ".resources.78baefb2-dcdc-50c3-bb55-5ff4c5e4c8b2.resourcechanged"
)
AGG = "7d1aabc8-742c-5bd7-8d42-2fbf77af9440"
TS = 1_700_000_000_123_456_789


def test_header_wins():
    assert message_id(header_msg_id="hdr-1", subject=IS_SUBJECT, data=b"x") == "hdr-1"
    assert (
        message_id(
            header_msg_id="hdr-2", subject=RA_SUBJECT, data=b"x", aggregate_id=AGG, version=1,
            event_type="resourcechanged", timestamp=TS,
        )
        == "hdr-2"
    )


def test_resource_aggregate_rule():
    mid = message_id(
        header_msg_id=None, subject=RA_SUBJECT, data=b"ignored", aggregate_id=AGG, version=3,
        event_type="resourcechanged", timestamp=TS,
    )
    assert mid == "ra:7d1aabc8-742c-5bd7-8d42-2fbf77af9440:3:resourcechanged:1700000000123456789"
    # the payload bytes and the subject do not matter: a re-published copy gets the same ID
    again = message_id(
        header_msg_id="", subject=RA_SUBJECT + ".leadrt", data=b"other", aggregate_id=AGG, version=3,
        event_type="resourcechanged", timestamp=TS,
    )
    assert again == mid
    assert (
        message_id(header_msg_id=None, subject=RA_SUBJECT, data=b"", aggregate_id=AGG, version=0,
                   event_type="resourcechanged", timestamp=0)
        == "ra:7d1aabc8-742c-5bd7-8d42-2fbf77af9440:0:resourcechanged:0"
    )


def test_resource_aggregate_rule_needs_all_fields():
    with pytest.raises(ValueError, match="version, timestamp"):
        message_id(header_msg_id=None, subject=RA_SUBJECT, data=b"", aggregate_id=AGG, event_type="resourcechanged")
    with pytest.raises(ValueError, match="event_type"):
        message_id(header_msg_id=None, subject=RA_SUBJECT, data=b"", aggregate_id=AGG, version=1, timestamp=TS)


def test_identity_store_rule_golden():
    mid = message_id(header_msg_id=None, subject=IS_SUBJECT, data=b"\x01\x02\x03")
    assert mid == "is:531b427a024252ab64f0b22426db13b81149ea82287fa23968939add87ce3289"
    assert mid == "is:" + hashlib.sha256(IS_SUBJECT.encode() + b"\n" + b"\x01\x02\x03").hexdigest()
    assert len(mid) == 67
    # bytes-like payloads hash the same; empty header counts as absent
    assert message_id(header_msg_id="", subject=IS_SUBJECT, data=bytearray(b"\x01\x02\x03")) == mid
    assert message_id(header_msg_id=None, subject=IS_SUBJECT, data=memoryview(b"\x01\x02\x03")) == mid


def test_identity_store_rule_separates_subject_and_payload():
    a = message_id(header_msg_id=None, subject=IS_SUBJECT, data=b"\x01")
    b = message_id(header_msg_id=None, subject=IS_SUBJECT.replace("devicesregistered", "devicesunregistered"), data=b"\x01")
    c = message_id(header_msg_id=None, subject=IS_SUBJECT, data=b"\x02")
    assert len({a, b, c}) == 3


def test_type_errors():
    with pytest.raises(TypeError, match="subject"):
        message_id(header_msg_id=None, subject=None, data=b"")
    with pytest.raises(TypeError):
        message_id(header_msg_id=None, subject=IS_SUBJECT, data="text")
    with pytest.raises(TypeError):
        message_id(None, IS_SUBJECT, b"")  # keyword-only
