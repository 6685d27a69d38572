"""Golden values of plgd IDs (docs/wire-format.md §1.2, §1.4, §4.1, §6)."""

from __future__ import annotations

import uuid

import pytest

from airflow_provider_plgd.plgd import ids

DEVICE = "00000000-0000-0000-0000-000000000001"


def _uuid5(name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, name))


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # docs/wire-format.md §6 computed reference values
        ("a", "e1407479-3136-56c0-9908-bb02fb0339e2"),
        ("/light/1", "78baefb2-dcdc-50c3-bb55-5ff4c5e4c8b2"),
        ("/oic/d", "7cd3e969-b4f7-5130-bc74-51ca4b70fe9f"),
        ("core.light", "6ed09a04-e205-5403-82cf-b999b53ad325"),
        ("oic.wk.d", "f8f11cfc-71ab-5156-ad45-229eb4cd0516"),
        (DEVICE + "/light/1", "7d1aabc8-742c-5bd7-8d42-2fbf77af9440"),
        (DEVICE + "/plgd/res", "7bfecfc4-cbbb-59c2-8d8e-b004c12c30d6"),
        (DEVICE + "/plgd/s", "2c4c4360-71fc-5b9a-a544-4dbcf3bb8d45"),
    ],
)
def test_uuid5_url_golden(name, expected):
    assert ids.uuid5_url(name) == expected


def test_href_id_golden():
    assert ids.href_id("/light/1") == "78baefb2-dcdc-50c3-bb55-5ff4c5e4c8b2"
    assert ids.href_id("/oic/d") == "7cd3e969-b4f7-5130-bc74-51ca4b70fe9f"
    # only the href is hashed, not device + href (hub >= v2.8.0)
    assert ids.href_id("/light/1") != ids.resource_aggregate_id(DEVICE, "/light/1")


def test_aggregate_ids_golden():
    assert ids.LINKS_HREF == "/plgd/res"
    assert ids.METADATA_HREF == "/plgd/s"
    assert ids.resource_aggregate_id(DEVICE, "/light/1") == "7d1aabc8-742c-5bd7-8d42-2fbf77af9440"
    assert ids.links_aggregate_id(DEVICE) == "7bfecfc4-cbbb-59c2-8d8e-b004c12c30d6"
    assert ids.metadata_aggregate_id(DEVICE) == "2c4c4360-71fc-5b9a-a544-4dbcf3bb8d45"
    assert ids.resource_aggregate_id(DEVICE, ids.LINKS_HREF) == ids.links_aggregate_id(DEVICE)


def test_resource_aggregate_id_empty_href_is_nil():
    assert ids.resource_aggregate_id(DEVICE, "") == "00000000-0000-0000-0000-000000000000"


def test_owner_id_hashes_non_uuid_owners():
    assert ids.owner_id("a") == "e1407479-3136-56c0-9908-bb02fb0339e2"
    for owner in ["", "*", "user@example.com", "auth0|5f1c", "ünïcode", "1" * 31, "1" * 33]:
        assert ids.owner_id(owner) == _uuid5(owner), owner


@pytest.mark.parametrize(
    "owner",
    [
        "3f2a1b4c-5d6e-4f70-8a9b-0c1d2e3f4a5b",  # canonical
        "3F2A1B4C-5D6E-4F70-8A9B-0C1D2E3F4A5B",  # upper case stays upper case
        "urn:uuid:3f2a1b4c-5d6e-4f70-8a9b-0c1d2e3f4a5b",
        "URN:UUID:3f2a1b4c-5d6e-4f70-8a9b-0c1d2e3f4a5b",  # prefix compared case-insensitively
        "{3f2a1b4c-5d6e-4f70-8a9b-0c1d2e3f4a5b}",
        "3f2a1b4c5d6e4f708a9b0c1d2e3f4a5b",  # 32 hex digits
        "3F2A1B4C5D6E4F708A9B0C1D2E3F4A5B",
        "(3f2a1b4c-5d6e-4f70-8a9b-0c1d2e3f4a5b)",  # Go Parse only examines the middle 36 bytes
        "00000000-0000-0000-0000-000000000001",  # not nil
    ],
)
def test_owner_id_keeps_uuid_spellings_unchanged(owner):
    assert ids.is_go_uuid(owner)
    assert ids.owner_id(owner) == owner


@pytest.mark.parametrize(
    "owner",
    [
        "00000000-0000-0000-0000-000000000000",  # nil UUID is hashed
        "{00000000-0000-0000-0000-000000000000}",
        "urn:uuid:00000000-0000-0000-0000-000000000000",
        "00000000000000000000000000000000",
    ],
)
def test_owner_id_hashes_nil_uuid(owner):
    assert ids.is_go_uuid(owner)
    assert ids.owner_id(owner) == _uuid5(owner)
    assert ids.owner_id(owner) != owner


@pytest.mark.parametrize(
    "owner",
    [
        "3f2a1b4c-5d6e-4f70-8a9b-0c1d2e3f4a5g",  # non-hex digit
        "3f2a1b4c_5d6e-4f70-8a9b-0c1d2e3f4a5b",  # wrong separator
        "3f2a1b4c5d6e-4f70-8a9b-0c1d2e3f4a5b0",  # hyphens in wrong places (36 chars)
        "urx:uuid:3f2a1b4c-5d6e-4f70-8a9b-0c1d2e3f4a5b",  # bad urn prefix
        "3f2a1b4c-5d6e-4f70-8a9b-0c1d2e3f4a5",  # 35 chars
        " 3f2a1b4c-5d6e-4f70-8a9b-0c1d2e3f4a5b",  # 37 chars
        "3f2a1b4c5d6e4f708a9b0c1d2e3f4a5z",  # 32 chars, not hex
        "3f2a1b4c-5d6e-4f70-8a9b-0c1d2e3f4aé",  # 36 chars but 37 UTF-8 bytes
    ],
)
def test_owner_id_hashes_strings_go_does_not_parse(owner):
    assert not ids.is_go_uuid(owner)
    assert ids.owner_id(owner) == _uuid5(owner)


def test_type_errors_name_the_value():
    with pytest.raises(TypeError, match="href"):
        ids.href_id(None)
    with pytest.raises(TypeError, match="owner"):
        ids.owner_id(5)
    with pytest.raises(TypeError, match="device_id"):
        ids.links_aggregate_id(b"dev")
