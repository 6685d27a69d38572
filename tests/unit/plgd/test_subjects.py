"""Subjects S1-S6 (docs/wire-format.md §1.1-§1.4), filters and token rules."""

from __future__ import annotations

import pytest

from airflow_provider_plgd.plgd import event_types, ids, lead_resource_type, subjects
from airflow_provider_plgd.plgd.subjects import Subject, parse_subject

OWNER = "e1407479-3136-56c0-9908-bb02fb0339e2"  # owner "a"
DEVICE = "00000000-0000-0000-0000-000000000001"
LIGHT = "78baefb2-dcdc-50c3-bb55-5ff4c5e4c8b2"  # href_id("/light/1")
RES = f"plgd.owners.{OWNER}.devices.{DEVICE}.resources.{LIGHT}"

# docs/wire-format.md §1.4 examples, verbatim (the O, D and H placeholders expanded).
GOLDEN = {
    "off": f"plgd.owners.{OWNER}.devices.{DEVICE}.resources.{LIGHT}.resourcechanged",
    "first": f"{RES}.resourcechanged.leadrt.core.light",
    "uuid": f"{RES}.resourcechanged.leadrt.6ed09a04-e205-5403-82cf-b999b53ad325",
    "none": f"{RES}.resourcechanged.leadrt",
    "links": f"plgd.owners.{OWNER}.devices.{DEVICE}.resource-links.resourcelinkspublished",
    "metadata": f"plgd.owners.{OWNER}.devices.{DEVICE}.metadata.devicemetadataupdated",
    "is": "plgd.owners.e1407479-3136-56c0-9908-bb02fb0339e2.registrations.devicesregistered",
}


def test_builders_match_golden_examples():
    owner = ids.owner_id("a")
    href = ids.href_id("/light/1")
    assert subjects.resource_subject(owner, DEVICE, href, "resourcechanged") == GOLDEN["off"]
    lead = lead_resource_type.select_lead_resource_type(["core.light"], filter="first")
    assert lead == "core.light"
    assert (
        subjects.resource_subject(owner, DEVICE, href, "resourcechanged", leadrt=True, lead_resource_type=lead)
        == GOLDEN["first"]
    )
    lead_uuid = lead_resource_type.select_lead_resource_type(["core.light"], filter="first", use_uuid=True)
    assert (
        subjects.resource_subject(owner, DEVICE, href, "resourcechanged", leadrt=True, lead_resource_type=lead_uuid)
        == GOLDEN["uuid"]
    )
    assert subjects.resource_subject(owner, DEVICE, href, "resourcechanged", leadrt=True) == GOLDEN["none"]
    assert subjects.links_subject(owner, DEVICE, "resourcelinkspublished") == GOLDEN["links"]
    assert subjects.metadata_subject(owner, DEVICE, "devicemetadataupdated") == GOLDEN["metadata"]
    assert subjects.registrations_subject(owner, "devicesregistered") == GOLDEN["is"]
    assert (
        subjects.registrations_subject(owner, "devicesunregistered")
        == "plgd.owners.e1407479-3136-56c0-9908-bb02fb0339e2.registrations.devicesunregistered"
    )


def test_lead_type_implies_leadrt_and_empty_lead_type_is_bare_suffix():
    owner, href = OWNER, LIGHT
    assert (
        subjects.resource_subject(owner, DEVICE, href, "resourcechanged", lead_resource_type="core.light")
        == GOLDEN["first"]
    )
    assert (
        subjects.resource_subject(owner, DEVICE, href, "resourcechanged", leadrt=True, lead_resource_type="")
        == GOLDEN["none"]
    )


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("off", Subject("resources", OWNER, "resourcechanged", DEVICE, LIGHT, False, None)),
        ("first", Subject("resources", OWNER, "resourcechanged", DEVICE, LIGHT, True, "core.light")),
        (
            "uuid",
            Subject(
                "resources", OWNER, "resourcechanged", DEVICE, LIGHT, True, "6ed09a04-e205-5403-82cf-b999b53ad325"
            ),
        ),
        ("none", Subject("resources", OWNER, "resourcechanged", DEVICE, LIGHT, True, None)),
        ("links", Subject("resource-links", OWNER, "resourcelinkspublished", DEVICE)),
        ("metadata", Subject("metadata", OWNER, "devicemetadataupdated", DEVICE)),
        ("is", Subject("registrations", OWNER, "devicesregistered")),
    ],
)
def test_parse_golden_and_render_back(key, expected):
    parsed = parse_subject(GOLDEN[key])
    assert parsed == expected
    assert str(parsed) == GOLDEN[key]


def test_parse_fields_by_name():
    s = parse_subject(f"{RES}.resourceupdatepending.leadrt.oic.r.switch.binary")
    assert s.family == "resources"
    assert s.owner_id == OWNER
    assert s.device_id == DEVICE
    assert s.href_id == LIGHT
    assert s.event_type == "resourceupdatepending"
    assert s.leadrt is True
    assert s.lead_resource_type == "oic.r.switch.binary"
    r = parse_subject(GOLDEN["is"])
    assert (r.device_id, r.href_id, r.leadrt, r.lead_resource_type) == (None, None, False, None)


def test_parse_keeps_owner_spelling():
    owner = "3F2A1B4C-5D6E-4F70-8A9B-0C1D2E3F4A5B"
    s = parse_subject(f"plgd.owners.{owner}.registrations.devicesunregistered")
    assert s.owner_id == owner


@pytest.mark.parametrize("event_type", sorted(event_types.EVENT_TYPES))
def test_build_parse_round_trip_every_event_type(event_type):
    info = event_types.event_type_info(event_type)
    if info.family == "registrations":
        built = [subjects.registrations_subject(OWNER, event_type)]
    elif info.family == "resource-links":
        built = [subjects.links_subject(OWNER, DEVICE, event_type)]
    elif info.family == "metadata":
        built = [subjects.metadata_subject(OWNER, DEVICE, event_type)]
    else:
        built = [
            subjects.resource_subject(OWNER, DEVICE, LIGHT, event_type),
            subjects.resource_subject(OWNER, DEVICE, LIGHT, event_type, leadrt=True),
            subjects.resource_subject(OWNER, DEVICE, LIGHT, event_type, lead_resource_type="x.y.z"),
        ]
    for subject in built:
        parsed = parse_subject(subject)
        assert parsed.event_type == event_type
        assert parsed.family == info.family
        assert parsed.owner_id == OWNER
        assert str(parsed) == subject


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "plgd",
        "nats.owners.x.registrations.devicesregistered",
        "plgd.users.x.registrations.devicesregistered",
        f"plgd.owners.{OWNER}.registrations",
        f"plgd.owners.{OWNER}.registrations.devicesregistered.extra",
        f"plgd.owners.{OWNER}.devices.{DEVICE}",
        f"plgd.owners.{OWNER}.devices.{DEVICE}.metadata",
        f"plgd.owners.{OWNER}.devices.{DEVICE}.metadata.devicemetadataupdated.extra",
        f"plgd.owners.{OWNER}.devices.{DEVICE}.things.x.resourcechanged",
        f"plgd.owners.{OWNER}.devices.{DEVICE}.resources.{LIGHT}",
        f"{RES}.resourcechanged.notleadrt.core",
        f"{RES}.resourcechanged.leadrt.",
        f"{RES}..resourcechanged",
        "plgd.owners.*.registrations.devicesregistered",
        f"plgd.owners.{OWNER}.>",
        f"plgd.owners.{OWNER}.other.devicesregistered",
        # bytes that were not UTF-8, as the fetch stages them (U+FFFD each): decode's bad_subject
        f"plgd.owners.{OWNER}.devices.\ufffd\ufffd.resources.{LIGHT}.resourcechanged",
        # unknown event type / wrong family
        f"plgd.owners.{OWNER}.registrations.resourcechanged",
        f"plgd.owners.{OWNER}.devices.{DEVICE}.metadata.resourcechanged",
        f"{RES}.devicemetadataupdated",
        f"{RES}.ResourceChanged",
        f"plgd.owners.{OWNER}.devices.{DEVICE}.metadata.ServiceMetadataUpdated",
    ],
)
def test_parse_rejects_unknown_shapes_naming_the_subject(bad):
    with pytest.raises(ValueError) as err:
        parse_subject(bad)
    assert repr(bad) in str(err.value)


def test_parse_without_event_type_check_accepts_unknown_types():
    s = parse_subject(f"{RES}.resourcefrobnicated", check_event_type=False)
    assert s.event_type == "resourcefrobnicated"
    with pytest.raises(ValueError, match="unknown event type"):
        parse_subject(f"{RES}.resourcefrobnicated")


def test_parse_type_error():
    with pytest.raises(TypeError):
        parse_subject(b"plgd.owners.a.registrations.devicesregistered")


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("abc", True),
        ("00000000-0000-0000-0000-000000000001", True),
        ("urn:uuid:x", True),
        ("", False),
        ("a.b", False),
        ("a..b", False),
        ("*", False),
        ("a>", False),
        ("/light/1", False),
        ("a b", False),
        ("a\tb", False),
        ("a\u00a0b", False),
        ("a\x00b", False),
        ("a\x7fb", False),
        ("a\x85b", False),
    ],
)
def test_validate_token(value, ok):
    if ok:
        assert subjects.validate_token(value, "device_id") == value
    else:
        with pytest.raises(ValueError) as err:
            subjects.validate_token(value, "device_id")
        assert "device_id" in str(err.value)
        if value:
            assert repr(value) in str(err.value)


def test_validate_token_type_error():
    with pytest.raises(TypeError, match="href_id"):
        subjects.validate_token(None, "href_id")


def test_builders_validate_tokens_and_families():
    with pytest.raises(ValueError, match="device_id"):
        subjects.links_subject(OWNER, "dev.1", "resourcelinkspublished")
    with pytest.raises(ValueError, match="href_id"):
        subjects.resource_subject(OWNER, DEVICE, "/light/1", "resourcechanged")
    with pytest.raises(ValueError, match="owner_id"):
        subjects.registrations_subject("*", "devicesregistered")
    with pytest.raises(ValueError, match="resource-links"):
        subjects.metadata_subject(OWNER, DEVICE, "resourcelinkspublished")
    with pytest.raises(ValueError, match="unknown plgd event type"):
        subjects.registrations_subject(OWNER, "devicesfoo")
    with pytest.raises(ValueError, match="never published"):
        subjects.metadata_subject(OWNER, DEVICE, "ServiceMetadataUpdated")
    for bad_lead in ["core.*", "a>b", "core..light", ".core", "core.", "has space"]:
        with pytest.raises(ValueError, match="lead_resource_type"):
            subjects.resource_subject(OWNER, DEVICE, LIGHT, "resourcechanged", lead_resource_type=bad_lead)


def test_lead_resource_type_token():
    assert lead_resource_type.lead_resource_type_token("core.light") == "core.light"
    assert lead_resource_type.lead_resource_type_token("a*b>c$d") == "a_b_c_d"
    assert lead_resource_type.lead_resource_type_token("$$") == "__"
    assert lead_resource_type.lead_resource_type_token("core.light", use_uuid=True) == "6ed09a04-e205-5403-82cf-b999b53ad325"
    # hash computed after the replacement
    assert lead_resource_type.lead_resource_type_token("a*", use_uuid=True) == ids.uuid5_url("a_")
    assert lead_resource_type.lead_resource_type_token("", use_uuid=True) == ""


def test_select_lead_resource_type():
    types = ["oic.r.switch.binary", "core.light", "x$y"]
    sel = lead_resource_type.select_lead_resource_type
    assert sel([], filter="first") is None
    assert sel(types) is None
    assert sel(types, filter="first") == "oic.r.switch.binary"
    assert sel(types, filter="last") == "x_y"
    assert sel(types, regex_filter=[r"core\.light"]) == "core.light"
    assert sel(types, regex_filter=[r"nomatch", r"oic\.r.*"]) == "oic.r.switch.binary"
    # no regex match falls back to filter
    assert sel(types, regex_filter=[r"nomatch"], filter="last") == "x_y"
    assert sel(types, regex_filter=[r"nomatch"]) is None
    assert sel(types, filter="first", use_uuid=True) == ids.uuid5_url("oic.r.switch.binary")
    with pytest.raises(ValueError, match="filter"):
        sel(types, filter="middle")


# ---- subject_filters: check with a NATS subject matcher ----------------------------------------


def _nats_match(filter_subject: str, subject: str) -> bool:
    f, s = filter_subject.split("."), subject.split(".")
    for i, tok in enumerate(f):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok != "*" and tok != s[i]):
            return False
    return len(f) == len(s)


OWNER_B = ids.owner_id("b")


def _all_subjects():
    out = []
    for owner in (OWNER, OWNER_B):
        for et, info in event_types.EVENT_TYPES.items():
            if info.family == "registrations":
                out.append((owner, et, subjects.registrations_subject(owner, et)))
            elif info.family == "resource-links":
                out.append((owner, et, subjects.links_subject(owner, DEVICE, et)))
            elif info.family == "metadata":
                out.append((owner, et, subjects.metadata_subject(owner, DEVICE, et)))
            else:
                for kw in ({}, {"leadrt": True}, {"lead_resource_type": "core.light"}):
                    out.append((owner, et, subjects.resource_subject(owner, DEVICE, LIGHT, et, **kw)))
    return out


@pytest.mark.parametrize("owner", ["*", OWNER])
@pytest.mark.parametrize("event_type", [None, *sorted(event_types.EVENT_TYPES)])
def test_subject_filters_match_exactly(owner, event_type):
    filters = subjects.subject_filters(owner, event_type)
    for subj_owner, et, subject in _all_subjects():
        expected = (owner == "*" or owner == subj_owner) and (event_type is None or et == event_type)
        matching = [f for f in filters if _nats_match(f, subject)]
        assert len(matching) == (1 if expected else 0), (filters, subject)


def test_subject_filters_literal_values():
    assert subjects.subject_filters() == ["plgd.owners.*.>"]
    assert subjects.subject_filters(OWNER) == [f"plgd.owners.{OWNER}.>"]
    assert subjects.subject_filters(event_type="resourcechanged") == [
        "plgd.owners.*.devices.*.resources.*.resourcechanged",
        "plgd.owners.*.devices.*.resources.*.resourcechanged.>",
    ]
    assert subjects.subject_filters(OWNER, "devicesregistered") == [
        f"plgd.owners.{OWNER}.registrations.devicesregistered"
    ]
    assert subjects.subject_filters("*", "resourcelinkspublished") == [
        "plgd.owners.*.devices.*.resource-links.resourcelinkspublished"
    ]
    assert subjects.subject_filters("*", "devicemetadataupdatepending") == [
        "plgd.owners.*.devices.*.metadata.devicemetadataupdatepending"
    ]


def test_subject_filters_errors():
    with pytest.raises(ValueError, match="owner_id"):
        subjects.subject_filters("a.b")
    with pytest.raises(ValueError, match="owner_id"):
        subjects.subject_filters(">")
    with pytest.raises(ValueError, match="'resourcefoo'"):
        subjects.subject_filters("*", "resourcefoo")
    with pytest.raises(ValueError, match="never published"):
        subjects.subject_filters("*", "ServiceMetadataSnapshotTaken")


def test_event_type_table():
    et = event_types
    assert len(et.EVENT_TYPES) == len(et.LIVE_EVENT_TYPES) + len(et.SNAPSHOT_EVENT_TYPES)
    assert set(et.LIVE_EVENT_TYPES) == set(et.EVENT_TYPES) - set(et.SNAPSHOT_EVENT_TYPES)
    assert set(et.SNAPSHOT_EVENT_TYPES) == {
        "resourcelinkssnapshottaken",
        "devicemetadatasnapshottaken",
        "resourcestatesnapshottaken",
    }
    assert not set(et.SNAPSHOT_EVENT_TYPES) & set(et.LIVE_EVENT_TYPES)
    assert "ServiceMetadataUpdated" not in et.EVENT_TYPES
    assert et.SERVICE_METADATA_EVENT_TYPES["ServiceMetadataUpdated"].on_nats is False
    assert et.EVENT_TYPES_BY_FAMILY["resources"] == (
        "resourcechanged",
        "resourceupdatepending",
        "resourceupdated",
        "resourceretrievepending",
        "resourceretrieved",
        "resourcedeletepending",
        "resourcedeleted",
        "resourcecreatepending",
        "resourcecreated",
        "resourcestatesnapshottaken",
    )
    rc = et.event_type_info("resourcechanged")
    assert (rc.message_name, rc.family, rc.aggregate, rc.live, rc.snapshot) == (
        "ResourceChanged",
        "resources",
        "resource",
        True,
        False,
    )
    links = et.event_type_info("resourcelinkssnapshottaken")
    assert (links.family, links.aggregate, links.live, links.snapshot) == ("resource-links", "links", False, True)
    md = et.event_type_info("devicemetadataupdatepending")
    assert (md.family, md.aggregate) == ("metadata", "metadata")
    reg = et.event_type_info("devicesunregistered")
    assert (reg.family, reg.aggregate, reg.message_name) == ("registrations", None, "DevicesUnregistered")
    assert et.IDENTITY_STORE_ONEOF_TO_EVENT_TYPE == {
        "devices_registered": "devicesregistered",
        "devices_unregistered": "devicesunregistered",
    }
    for name, info in et.EVENT_TYPES.items():
        cls = et.message_class(name)
        assert cls.__name__ == info.message_name
        expected_pkg = "identitystore.pb" if info.family == "registrations" else "resourceaggregate.pb"
        assert cls.DESCRIPTOR.full_name == f"{expected_pkg}.{info.message_name}"
        assert et.event_type_for_message(cls()) == name
    with pytest.raises(ValueError, match="'ResourceChanged'"):
        et.event_type_info("ResourceChanged")
    with pytest.raises(TypeError):
        et.event_type_for_message(object())


# ---------------------------------------------------------------------------------------------
# one home each: the filter-subject check (hook and operator) and the owner of a subject (hook's
# owner listing and the unrouted fetch's router)


@pytest.mark.parametrize("value", ["plgd.>", "plgd.owners.*.>", "a", "a.*.b", ">"])
def test_check_filter_subject_accepts_filters(value):
    from airflow_provider_plgd.plgd.subjects import check_filter_subject

    assert check_filter_subject(value) == value


@pytest.mark.parametrize("value", ["", "plgd. >", "a..b", "a.>.b", "a*.b", "a.b>", ".a", "a.", "a\tb", None, 5])
def test_check_filter_subject_rejects_and_names_the_value(value):
    from airflow_provider_plgd.plgd.subjects import check_filter_subject

    with pytest.raises(ValueError, match="subject_filter") as err:
        check_filter_subject(value, "subject_filter")
    assert repr(value) in str(err.value) and "is not a valid NATS filter subject" in str(err.value)


def test_subject_owner():
    from airflow_provider_plgd.plgd.subjects import subject_owner

    owner = "e1407479-3136-56c0-9908-bb02fb0339e2"
    assert subject_owner(f"plgd.owners.{owner}.registrations.devicesregistered") == owner
    for subject in (f"plgd.owners.{owner}", "plgd.owners.*.registrations.x", "plgd.owners.a=b.x",
                    "other.owners.o.x", "plgd.devices.o.x"):
        assert subject_owner(subject) is None


def test_owner_ids_never_collide_with_reserved_names_or_stand_for_bytes_that_are_not_utf8():
    """``validate_owner_id``: the ETL's partitions ``_unrouted``/``_unknown`` (and any leading ``_``)
    and U+FFFD are never an owner; such subjects are unrouted and decode calls them ``bad_subject``."""
    from airflow_provider_plgd.plgd.subjects import parse_subject, subject_owner, validate_owner_id

    owner = "6ba7b811-9dad-11d1-80b4-00c04fd430c8"
    assert validate_owner_id(owner) == owner and subject_owner(f"plgd.owners.{owner}.registrations.x") == owner
    for token, named in (("_unrouted", "reserved"), ("_unknown", "reserved"), ("_x", "reserved"),
                         ("ab\ufffd", r"U\+FFFD"), ("a*b", "not a valid NATS subject token")):
        with pytest.raises(ValueError, match=named):
            validate_owner_id(token)
        assert subject_owner(f"plgd.owners.{token}.registrations.devicesregistered") is None
        with pytest.raises(ValueError):
            parse_subject(f"plgd.owners.{token}.registrations.devicesregistered")
    assert validate_owner_id("a_b") == "a_b"  # only a leading '_' is reserved
