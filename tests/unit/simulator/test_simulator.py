"""Unit tests of the plgd traffic simulator (no server): determinism, event and fault coverage,
wire-format validity through the codec, subjects, timing, and the expected state (hand-checked
literally). The fold on hand-made events, the encoding, the ground truth and the CLI:
test_simulator_fold_cli.py.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import replace

import pytest

from airflow_provider_plgd.plgd import codec, ids, lead_resource_type, subjects
from airflow_provider_plgd.plgd.content import content_to_json
from airflow_provider_plgd.plgd.event_types import LIVE_EVENT_TYPES, SNAPSHOT_EVENT_TYPES
from airflow_provider_plgd.plgd.msgid import message_id
from airflow_provider_plgd.plgd.tables import SNAPSHOT_SCHEMAS
from airflow_provider_plgd.simulator import (
    SNAPSHOT_TABLES,
    SimulationConfig,
    expected_state,
    generate,
)
from tests.unit.simulator.sim_configs import ALL_FAULTS, BASE, NO_FAULTS, originals

# ---- determinism ----------------------------------------------------------------------------


def test_same_seed_same_bytes(faulty):
    again = generate(replace(BASE, **ALL_FAULTS))
    assert [(m.subject, m.data, m.interval, m.fault) for m in again.messages] == [
        (m.subject, m.data, m.interval, m.fault) for m in faulty.messages
    ]
    assert again.states == faulty.states


def test_other_seed_other_bytes(faulty):
    other = generate(replace(BASE, seed=4, **ALL_FAULTS))
    assert [m.data for m in other.messages] != [m.data for m in faulty.messages]


def test_faults_do_not_change_live_traffic_of_duplicates_and_corrupt(clean):
    # duplicates/corrupt use their own random generator: the live traffic stays the same
    sim = generate(replace(BASE, **{**NO_FAULTS, "duplicates": 0.1, "corrupt": 3}))
    assert [m.data for m in originals(sim)] == [m.data for m in clean.messages]
    assert sim.states == clean.states


# ---- coverage of event types and faults ------------------------------------------------------


def test_every_live_event_type_appears(faulty):
    assert set(LIVE_EVENT_TYPES) <= {m.event_type for m in faulty.messages}


def test_small_default_config_covers_all_live_types_but_unregistration():
    sim = generate(SimulationConfig(owners=1, devices_per_owner=1, resources_per_device=1, steps_per_interval=12))
    assert set(LIVE_EVENT_TYPES) - {m.event_type for m in sim.messages} == {"devicesunregistered"}


def test_no_faults_when_disabled(clean):
    assert {m.fault for m in clean.messages} == {None}
    assert not {m.event_type for m in clean.messages} & set(SNAPSHOT_EVENT_TYPES)
    assert "devicesunregistered" not in {m.event_type for m in clean.messages}
    assert clean.gaps == [] and clean.corrupt == [] and clean.unregistrations == []
    # versions of every aggregate are 0, 1, 2, ... without holes
    versions = defaultdict(list)
    for m in clean.messages:
        if m.aggregate_id:
            versions[m.aggregate_id].append(m.version)
    assert all(v == list(range(len(v))) for v in versions.values())
    # a message's bytes appear once
    assert len({m.data for m in clean.messages}) == len(clean.messages)
    final = expected_state(clean, 2)
    assert all(r["complete"] for t in ("resources", "device_metadata", "device_links") for r in final[t])


def test_duplicates(faulty):
    first_seen: dict[bytes, object] = {}
    right_after = next_interval = 0
    for i, m in enumerate(faulty.messages):
        if m.fault == "duplicate":
            orig = first_seen[m.data]  # same bytes were published before
            assert (orig.subject, orig.msg_id, orig.version, orig.timestamp_ns) == (
                m.subject, m.msg_id, m.version, m.timestamp_ns)
            assert orig.fault != "corrupt"
            right_after += faulty.messages[i - 1].data == m.data
            next_interval += m.interval == orig.interval + 1
        else:
            assert m.data not in first_seen
            first_seen[m.data] = m
    assert right_after >= 1 and next_interval >= 1
    assert faulty.duplicates["right_after"] >= 1 and faulty.duplicates["next_interval"] >= 1


def test_corrupt_payloads_fail_to_decode(faulty):
    corrupt = [m for m in faulty.messages if m.fault == "corrupt"]
    assert len(corrupt) == 4
    assert Counter(c["kind"] for c in faulty.corrupt) == {"random_bytes": 2, "truncated_protobuf": 1, "bad_snappy": 1}
    for m in corrupt:
        assert m.msg_id is None and m.aggregate_id is None and m.version is None
        subjects.parse_subject(m.subject)  # the subject itself is valid
        with pytest.raises(codec.PlgdDecodeError):
            codec.decode_payload(m.subject, m.data)


def test_every_other_message_decodes_and_matches_its_fields(faulty):
    for m in faulty.messages:
        if m.fault == "corrupt":
            continue
        d = codec.decode_payload(m.subject, m.data)
        assert d.event_type == m.event_type
        assert d.timestamp == m.timestamp_ns
        assert d.aggregate_id == m.aggregate_id
        assert d.version == m.version
        if d.envelope is not None:
            assert d.device_id == m.device_id and d.href == m.href
            assert d.envelope.is_snapshot is False and d.envelope.timestamp == 0
        else:
            assert subjects.parse_subject(m.subject).owner_id == m.owner_id == ids.owner_id(d.message.owner)
        assert m.msg_id == message_id(header_msg_id=None, subject=m.subject, data=m.data,
                                      aggregate_id=d.aggregate_id, version=d.version, event_type=d.event_type,
                                      timestamp=d.timestamp)


def test_old_hub_snapshots(faulty):
    snaps = [m for m in faulty.messages if m.fault == "old_hub_snapshot"]
    assert {m.event_type for m in snaps} == set(SNAPSHOT_EVENT_TYPES)
    for m in snaps:
        assert ".leadrt" not in m.subject
        d = codec.decode_payload(m.subject, m.data)
        assert d.message.event_metadata.version == m.version  # its own version number


def test_old_hub_snapshot_has_its_own_version():
    sim = generate(replace(BASE, old_hub_snapshots=True, leadrt="first"))
    snapshot_aggregates = {m.aggregate_id for m in sim.messages if m.fault == "old_hub_snapshot"}
    versions = defaultdict(list)
    for m in sim.messages:
        if m.aggregate_id in snapshot_aggregates:
            versions[m.aggregate_id].append((m.version, m.event_type))
    for v in versions.values():
        assert [n for n, _ in v] == list(range(len(v)))  # contiguous: the snapshot took a version
        # after every snapshot_threshold (3) events, one snapshot
        runs = "".join("S" if et.endswith("snapshottaken") else "e" for _, et in v).split("S")
        assert all(run == "eee" for run in runs[:-1]) and len(runs[-1]) <= 3
    final = expected_state(sim, 2)
    assert all(r["complete"] for t in ("resources", "device_metadata", "device_links") for r in final[t])


def test_snapshot_carries_the_full_state(faulty):
    # the last resource snapshot equals what the fold had at that point: check latest content
    last_change: dict[str, bytes] = {}
    checked = 0
    for m in originals(faulty):
        if m.event_type == "resourcechanged":
            last_change[m.aggregate_id] = codec.decode_payload(m.subject, m.data).message.SerializeToString()
        elif m.event_type == "resourcestatesnapshottaken":
            snap = codec.decode_payload(m.subject, m.data).message
            assert snap.latest_resource_change.SerializeToString() == last_change[m.aggregate_id]
            checked += 1
    assert checked


def test_version_gaps(faulty):
    reasons = {g["reason"] for g in faulty.gaps}
    assert reasons == {"lost_publish", "forced_pending_unpublished"}
    published = defaultdict(set)
    for m in originals(faulty):
        if m.aggregate_id:
            published[m.aggregate_id].add(m.version)
    for g in faulty.gaps:
        assert not any(v in published[g["aggregate_id"]] for v in range(g["first"], g["last"] + 1))
    lost = next(g for g in faulty.gaps if g["reason"] == "lost_publish")
    assert min(published[lost["aggregate_id"]]) == 1  # first known version > 0
    rows = {r["aggregate_id"]: r for r in expected_state(faulty, 0)["resources"]}
    row = rows[lost["aggregate_id"]]
    assert row["complete"] is False and row["missing_versions"][0] == {"first": 0, "last": 0}
    forced = next(g for g in faulty.gaps if g["reason"] == "forced_pending_unpublished")
    row = rows[forced["aggregate_id"]]
    assert {"first": forced["first"], "last": forced["last"]} in row["missing_versions"]
    assert row["update_pendings"] == [] or all(
        p["version"] != forced["first"] for p in row["update_pendings"])


def test_unregister_and_recreate(faulty):
    events = [m for m in faulty.messages if m.event_type == "devicesunregistered" and m.fault is None]
    payloads = [codec.decode_payload(m.subject, m.data).message for m in events]
    assert any(len(p.device_ids) == 0 for p in payloads)  # published unconditionally
    target = faulty.unregistrations[0]["device_id"]
    # after the unregistration the device is registered again and its aggregates restart at 0
    idx = next(i for i, m in enumerate(faulty.messages) if m.event_type == "devicesunregistered"
               and codec.decode_payload(m.subject, m.data).message.device_ids == [target])
    later = [m for m in faulty.messages[idx + 1:] if m.device_id == target and m.fault is None]
    assert later and later[0].version == 0
    k = faulty.unregistrations[0]["interval"]
    state = expected_state(faulty, k)
    recreated = any(m.event_type == "devicesregistered" and m.interval == k
                    and codec.decode_payload(m.subject, m.data).message.device_ids == [target]
                    for m in faulty.messages[idx + 1:])
    if not recreated:
        assert all(r["device_id"] != target for t in state.values() for r in t)
    final = expected_state(faulty, 2)
    assert any(r["device_id"] == target for r in final["owner_devices"])
    assert all(r["version"] < 40 for r in final["device_metadata"] if r["device_id"] == target)


def test_owner_ids(faulty):
    raws = [o["owner"] for o in faulty.owners]
    assert raws[0] == "owner-1"
    assert ids.owner_id(raws[-1]) == raws[-1]  # the UUID owner is kept unchanged
    assert {o["owner_id"] for o in faulty.owners} == {ids.owner_id(r) for r in raws}


# ---- subjects --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["first", "uuid"])
def test_leadrt_subjects(mode):
    sim = generate(replace(BASE, leadrt=mode, old_hub_snapshots=True))
    leads = Counter()
    for m in sim.messages:
        s = subjects.parse_subject(m.subject)
        if s.family != "resources":
            continue
        if m.event_type == "resourcestatesnapshottaken":
            assert not s.leadrt
            continue
        assert s.leadrt
        leads[s.lead_resource_type] += 1
    expected = {"core.light", "oic.wk.d", "oic.r.switch.binary", None}  # None: untyped switch (bare .leadrt)
    if mode == "uuid":
        expected = {lead_resource_type.lead_resource_type_token(t, use_uuid=True) if t else None for t in expected}
    assert set(leads) == expected
    assert any(m.subject.endswith(".leadrt") for m in sim.messages)


def test_leadrt_off_subjects(clean):
    assert not any(".leadrt" in m.subject for m in clean.messages)


# ---- timing ----------------------------------------------------------------------------------


def test_timestamps_inside_intervals_and_increasing(faulty):
    bounds = faulty.interval_bounds()
    assert [m.interval for m in faulty.messages] == sorted(m.interval for m in faulty.messages)
    last = 0
    for m in faulty.messages:
        if m.fault == "duplicate":
            continue
        start, end = bounds[m.interval]
        assert start <= m.timestamp_ns < end
        assert m.timestamp_ns > last
        last = m.timestamp_ns


def test_interval_too_short_is_a_clear_error():
    import random

    from airflow_provider_plgd.simulator.model import Clock

    clock = Clock(SimulationConfig(interval_seconds=0.001), random.Random(1))
    clock.begin_step(0, 0, 1)
    with pytest.raises(RuntimeError, match="interval 0 cannot hold its events"):
        for _ in range(1000):
            clock.tick()


def test_target_messages_scales_activity():
    sim = generate(replace(BASE, target_messages=20_000, **ALL_FAULTS))
    assert 17_000 <= len(sim.messages) <= 23_000
    assert sim.steps_per_interval > BASE.steps_per_interval


@pytest.mark.parametrize(
    "field,value,exc",
    [("owners", 0, ValueError), ("leadrt", "last", ValueError), ("duplicates", 1.0, ValueError),
     ("interval_seconds", 0, ValueError), ("corrupt", -1, ValueError), ("unregister", 1, TypeError)],
)
def test_config_validation_names_the_field(field, value, exc):
    with pytest.raises(exc, match=field):
        generate(replace(BASE, **{field: value}))


# ---- expected state --------------------------------------------------------------------------

TINY = SimulationConfig(seed=7, owners=1, devices_per_owner=1, resources_per_device=1, intervals=1,
                        steps_per_interval=0, interval_seconds=10)
DEVICE = "1600a35a-0999-40d8-b6f6-75cc81e74ef5"
OWNER_ID = "ed54c5d8-c823-5b4c-b8d9-ef4489072d51"  # uuid5(URL, "owner-1")
T0 = 1_767_225_600_389_609_433  # start (2026-01-01T00:00:00Z) + deterministic offset of step 0


def test_tiny_registration_messages():
    sim = generate(TINY)
    assert [(m.event_type, m.version, m.timestamp_ns - T0) for m in sim.messages] == [
        ("devicesregistered", None, 0),
        ("devicemetadataupdated", 0, 1_000_000),  # ONLINE
        ("resourcelinkspublished", 0, 2_000_000),
        ("devicemetadataupdated", 1, 3_000_000),  # SYNCING
        ("resourcechanged", 0, 4_000_000),
        ("devicemetadataupdated", 2, 5_000_000),  # IN_SYNC
    ]
    assert sim.messages[4].subject == (
        f"plgd.owners.{OWNER_ID}.devices.{DEVICE}.resources.78baefb2-dcdc-50c3-bb55-5ff4c5e4c8b2.resourcechanged")


def test_tiny_expected_state_literal():
    state = expected_state(generate(TINY), 0)
    assert state == {
        "resources": [{
            "owner_id": OWNER_ID, "device_id": DEVICE, "href": "/light/1",
            "aggregate_id": ids.resource_aggregate_id(DEVICE, "/light/1"),
            "resource_types": ["core.light"], "status": "OK",
            "content_type": "application/vnd.ocf+cbor", "coap_content_format": 10000,
            "content_json": '{"name":"Light 1","power":80,"state":false}', "etag": "D9Yw8fKdDak=",
            "create_pendings": [], "retrieve_pendings": [], "update_pendings": [], "delete_pendings": [],
            "version": 0, "timestamp": T0 + 4_000_000, "complete": True, "missing_versions": [],
        }],
        "device_metadata": [{
            "owner_id": OWNER_ID, "device_id": DEVICE, "aggregate_id": ids.metadata_aggregate_id(DEVICE),
            "connection_status": "ONLINE", "connection_id": "10.217.30.212:38081",
            "connected_at": T0 + 1_000_000, "connection_protocol": "COAPS_TCP",
            "service_id": "d23f0824-128b-4f33-8c5c-7fd0a6a3a450",
            "local_endpoints": ["coaps+tcp://10.0.0.234:5684", "coap+tcp://[fe80::0]:5683"],
            "twin_enabled": True, "twin_synchronization_state": "IN_SYNC",
            "twin_syncing_at": T0 + 3_000_000, "twin_in_sync_at": T0 + 5_000_000,
            "twin_force_synchronization_at": 0, "update_pendings": [],
            "version": 2, "timestamp": T0 + 5_000_000, "complete": True, "missing_versions": [],
        }],
        "device_links": [{
            "owner_id": OWNER_ID, "device_id": DEVICE, "href": "/light/1",
            "aggregate_id": ids.links_aggregate_id(DEVICE), "resource_types": ["core.light"],
            "interfaces": ["oic.if.baseline", "oic.if.a"], "anchor": f"ocf://{DEVICE}", "title": "Light 1",
            "supported_content_types": ["application/vnd.ocf+cbor"], "valid_until": 0, "policy_bit_flags": 3,
            "endpoint_informations": [{"endpoint": "coaps+tcp://10.0.0.234:5684", "priority": 1}],
            "version": 0, "timestamp": T0 + 2_000_000, "complete": True, "missing_versions": [],
        }],
        "owner_devices": [{"owner_id": OWNER_ID, "owner": "owner-1", "device_id": DEVICE, "registered_at": T0}],
    }


def test_expected_state_columns_match_the_contract(faulty):
    for k in range(3):
        state = expected_state(faulty, k)
        assert set(state) == set(SNAPSHOT_TABLES)
        for table, rows in state.items():
            assert rows, table
            cols = [c for c, _, _ in SNAPSHOT_TABLES[table]]
            for row in rows:
                assert list(row) == cols
            # the rows fit the Arrow schema of the contract (types and nullability)
            import pyarrow as pa

            assert pa.Table.from_pylist(rows, schema=SNAPSHOT_SCHEMAS[table]).num_rows == len(rows)


def test_expected_state_returns_a_copy_and_checks_the_interval(faulty):
    a = expected_state(faulty, 1)
    a["resources"].clear()
    assert expected_state(faulty, 1)["resources"]
    for bad in (-1, 3, "1", True):
        with pytest.raises(ValueError, match="through_interval"):
            expected_state(faulty, bad)


def test_expected_content_is_the_last_published_change(clean):
    """Independent check through the codec: last resourcechanged by version = content_json."""
    last: dict[str, tuple[int, str | None, str]] = {}
    for m in clean.messages:
        if m.event_type == "resourcechanged":
            msg = codec.decode_payload(m.subject, m.data).message
            c = msg.content
            last[m.aggregate_id] = (m.version, content_to_json(c.data, c.content_type, c.coap_content_format),
                                    msg.Status.Name(msg.status) if hasattr(msg, "Status") else msg.status)
    rows = expected_state(clean, 2)["resources"]
    assert len(rows) == len(last)
    for row in rows:
        assert row["content_json"] == last[row["aggregate_id"]][1]


def test_pendings_expire_at_snapshot_time(faulty):
    """Pendings in a state are unexpired at its snapshot time; some expire between snapshots."""
    bounds = faulty.interval_bounds()
    dropped_later = 0
    for k in range(3):
        end = bounds[k][1]
        for row in expected_state(faulty, k)["resources"]:
            for kind in ("create", "retrieve", "update", "delete"):
                for p in row[f"{kind}_pendings"]:
                    assert p["valid_until"] == 0 or p["valid_until"] >= end
                    if k < 2 and p["valid_until"] and p["valid_until"] < bounds[k + 1][1]:
                        dropped_later += 1
    assert dropped_later  # "expiring" pendings: open at snapshot k, expired by k+1
