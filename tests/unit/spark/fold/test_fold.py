"""Unit tests of airflow_provider_plgd/spark/fold/: plgd's own state-test scenarios, written as our own data.

The scenarios follow the cases of plgd's ``resource-aggregate/events/*_test.go`` (create/update/
delete pending then confirmation, device metadata online/offline and twin sync, links publish
and unpublish) and the ETL rules of docs/wire-format.md §4.9 (dedupe, order, gaps, incarnations,
old-hub snapshots). Rows are plain dicts with the ``events`` column names; no Spark.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections import Counter

import pytest

from airflow_provider_plgd.plgd import event_types, ids
from airflow_provider_plgd.spark import fold, snapshot_buckets
from airflow_provider_plgd.spark.fold import FoldStats, dumps_state, fold_device, loads_state
from airflow_provider_plgd.tables.layout import Layout

DEV = "00000000-0000-0000-0000-000000000001"
OWNER = "e1407479-3136-56c0-9908-bb02fb0339e2"
OWNER2 = "11111111-2222-3333-4444-555555555555"
HREF = "/light/1"
SEC = 1_000_000_000
T0 = 1_767_225_600 * SEC  # 2026-01-01T00:00:00Z
END = T0 + 3600 * SEC  # snapshot time of the first interval
_seq = itertools.count(1)


def ra(event_type, version, *, href=HREF, device=DEV, ts=None, seq=None, owner=OWNER, **fields):
    """A resource-aggregate ``events`` row."""
    kind = fold.EVENT_TYPES[event_type].aggregate
    if kind == "resource":
        aggregate_id = ids.resource_aggregate_id(device, href)
    elif kind == "links":
        aggregate_id, href = ids.links_aggregate_id(device), None
    else:
        aggregate_id, href = ids.metadata_aggregate_id(device), None
    row = {
        "stream_seq": next(_seq) if seq is None else seq,
        "owner_id": owner,
        "device_id": device,
        "group_id": device,
        "event_type": event_type,
        "version": version,
        "aggregate_id": aggregate_id,
        "timestamp": T0 + (version + 1) * SEC if ts is None else ts,
        "connection_id": "10.0.0.1:5684",
        "sequence": version,
        "user_id": "user-1",
        "correlation_id": "",
        "href": href,
    }
    row.update(fields)
    row["msg_id"] = f"ra:{aggregate_id}:{version}:{event_type}:{row['timestamp']}"
    return row


def reg(event_type, ts, *, devices=(DEV,), owner=OWNER, seq=None):
    """An identity-store ``events`` row."""
    return {
        "stream_seq": next(_seq) if seq is None else seq,
        "owner_id": owner,
        "event_type": event_type,
        "timestamp": ts,
        "device_ids": list(devices),
        "registration_owner": "owner-a",
        "hub_id": "hub-1",
        "user_id": "user-1",
    }


def content(data: bytes, json_text: str | None = None):
    return {
        "content_type": "application/vnd.ocf+cbor",
        "coap_content_format": 10000,
        "content_data": data,
        "content_json": json_text,
    }


def changed(version, data=b"\xa1\x62on\xf5", *, status="OK", **kw):
    kw.setdefault("etag", b"etag%d" % version)
    return ra("resourcechanged", version, status=status, resource_types=["core.light"],
              **content(data, '{"on":true}'), **kw)


def run(events, state=None, *, at=END, stats=None):
    return fold_device(DEV, state, events, snapshot_time_ns=at, stats=stats)


def resource(state, href=HREF):
    return state["aggregates"][ids.resource_aggregate_id(DEV, href)]


def links(state):
    return state["aggregates"][ids.links_aggregate_id(DEV)]


def metadata(state):
    return state["aggregates"][ids.metadata_aggregate_id(DEV)]


def pending_ids(agg, kind):
    return [p["correlation_id"] for p in agg["pendings"][kind]]


# ------------------------------------------------------------------------------------------
# Resource aggregate: pending -> confirmation (resourceStateSnapshotTaken_test.go cases)
# ------------------------------------------------------------------------------------------

def test_create_pending_then_created():
    st = run([
        changed(0),
        ra("resourcecreatepending", 1, correlation_id="c1", valid_until=0, **content(b"{}")),
    ])
    assert pending_ids(resource(st), "create") == ["c1"]
    st = run([ra("resourcecreated", 2, correlation_id="c1", status="CREATED")], st)
    agg = resource(st)
    assert pending_ids(agg, "create") == []
    assert agg["version"] == 2 and agg["complete"] and agg["missing"] == []
    assert agg["latest"]["content_digest"] == fold._digest(b"\xa1\x62on\xf5")  # confirmations never change content


def test_update_pending_then_updated_removes_only_its_correlation_id():
    st = run([
        changed(0),
        ra("resourceupdatepending", 1, correlation_id="u1", valid_until=0, resource_interface="oic.if.baseline"),
        ra("resourceupdatepending", 2, correlation_id="u2", valid_until=0),
        ra("resourceupdated", 3, correlation_id="u1", status="OK", **content(b"\xa0")),
    ])
    agg = resource(st)
    assert pending_ids(agg, "update") == ["u2"]
    # a confirmation of another kind with the same id does not touch update pendings
    st = run([ra("resourceretrieved", 4, correlation_id="u2", status="OK")], st)
    assert pending_ids(resource(st), "update") == ["u2"]
    st = run([ra("resourceupdated", 5, correlation_id="u2", status="CANCELED")], st)
    assert pending_ids(resource(st), "update") == []


def test_retrieve_pending_then_retrieved_keeps_latest_content():
    st = run([
        changed(0, b"A"),
        ra("resourceretrievepending", 1, correlation_id="r1", valid_until=0, etags=[b"e1"]),
        ra("resourceretrieved", 2, correlation_id="r1", status="OK", **content(b"B")),
    ])
    agg = resource(st)
    assert pending_ids(agg, "retrieve") == []
    assert agg["latest"]["content_digest"] == fold._digest(b"A")


def test_delete_pending_then_deleted_success_clears_all_pendings():
    st = run([
        changed(0),
        ra("resourceupdatepending", 1, correlation_id="u1", valid_until=0),
        ra("resourcecreatepending", 2, correlation_id="c1", valid_until=0),
        ra("resourcedeletepending", 3, correlation_id="d1", valid_until=0),
        ra("resourcedeleted", 4, correlation_id="d1", status="OK"),
    ])
    agg = resource(st)
    assert all(agg["pendings"][k] == [] for k in fold.PENDING_KINDS)
    assert agg["latest"] is not None  # latest_resource_change is kept (§4.4)


@pytest.mark.parametrize("status", ["ACCEPTED"])
def test_delete_accepted_also_clears_all(status):
    st = run([changed(0), ra("resourceupdatepending", 1, correlation_id="u1", valid_until=0),
              ra("resourcedeletepending", 2, correlation_id="d1", valid_until=0),
              ra("resourcedeleted", 3, correlation_id="d1", status=status)])
    assert all(resource(st)["pendings"][k] == [] for k in fold.PENDING_KINDS)


def test_delete_failure_removes_only_its_delete_pending():
    st = run([
        changed(0),
        ra("resourceupdatepending", 1, correlation_id="u1", valid_until=0),
        ra("resourcedeletepending", 2, correlation_id="d1", valid_until=0),
        ra("resourcedeletepending", 3, correlation_id="d2", valid_until=0),
        ra("resourcedeleted", 4, correlation_id="d1", status="FORBIDDEN"),
    ])
    agg = resource(st)
    assert pending_ids(agg, "delete") == ["d2"]
    assert pending_ids(agg, "update") == ["u1"]


# ------------------------------------------------------------------------------------------
# Pending expiry
# ------------------------------------------------------------------------------------------

def test_pending_expiry_at_snapshot_time():
    soon, later = T0 + 100 * SEC, END + 100 * SEC
    events = [
        changed(0),
        ra("resourceupdatepending", 1, correlation_id="expires", valid_until=soon),
        ra("resourceupdatepending", 2, correlation_id="later", valid_until=later),
        ra("resourceupdatepending", 3, correlation_id="never", valid_until=0),
        ra("devicemetadataupdatepending", 0, correlation_id="m-exp", valid_until=soon,
           update_pending="twin_enabled", update_pending_value=False),
        ra("devicemetadataupdatepending", 1, correlation_id="m-ok", valid_until=later,
           update_pending="twin_enabled", update_pending_value=False),
    ]
    stats = FoldStats()
    st = run(events, stats=stats)
    assert pending_ids(resource(st), "update") == ["later", "never"]
    assert [p["correlation_id"] for p in metadata(st)["pendings"]] == ["m-ok"]
    assert stats["expired_pendings"] == 2
    assert fold.next_expiry(st) == later
    # the next snapshot, after `later`, drops the rest; no event needed
    assert fold.expire_pendings(st, later + 1)
    assert pending_ids(resource(st), "update") == ["never"]
    assert metadata(st)["pendings"] == [] and fold.next_expiry(st) is None


def test_valid_until_equal_to_snapshot_time_is_not_expired():
    st = run([changed(0), ra("resourceupdatepending", 1, correlation_id="u", valid_until=END)])
    assert pending_ids(resource(st), "update") == ["u"]


def test_pending_already_expired_when_emitted_is_not_appended():
    stats = FoldStats()
    ts = T0 + 50 * SEC
    st = run([changed(0), ra("resourceupdatepending", 1, correlation_id="u", valid_until=ts - 1, ts=ts)],
             stats=stats)
    assert pending_ids(resource(st), "update") == []
    assert stats["expired_on_arrival"] == 1
    assert resource(st)["version"] == 1  # the version is consumed all the same


# ------------------------------------------------------------------------------------------
# ResourceChanged stale-skip (ValidateSequence + Equal)
# ------------------------------------------------------------------------------------------

def test_stale_resourcechanged_same_connection_older_sequence_is_skipped():
    stats = FoldStats()
    st = run([
        changed(0, b"A", sequence=10),
        changed(1, b"B", sequence=9),  # same connection, sequence not newer -> dropped
        changed(2, b"C", sequence=10),  # equal sequence -> dropped
    ], stats=stats)
    agg = resource(st)
    assert agg["latest"]["content_digest"] == fold._digest(b"A")
    assert agg["version"] == 2  # versions still advance
    assert stats["stale_resourcechanged"] == 2


def test_resourcechanged_from_new_connection_with_lower_sequence_is_accepted():
    st = run([changed(0, b"A", sequence=10), changed(1, b"B", sequence=1, connection_id="10.0.0.2:5684")])
    assert resource(st)["latest"]["content_digest"] == fold._digest(b"B")


def test_equal_resourcechanged_is_skipped_but_etag_change_alone_does_not_count():
    st = run([changed(0, b"A", sequence=1), changed(1, b"A", sequence=2, etag=b"other")])
    assert resource(st)["latest"]["etag"] == "ZXRhZzA="  # kept the first: Equal ignores etag
    st = run([changed(2, b"A", sequence=3, status="NOT_FOUND")], st)
    assert resource(st)["latest"]["status"] == "NOT_FOUND"


# ------------------------------------------------------------------------------------------
# Device metadata (deviceMetadataSnapshotTaken_test.go cases)
# ------------------------------------------------------------------------------------------

def conn(status, cid, *, at=T0, service="gw-1"):
    return {"status": status, "id": cid, "connected_at": at, "protocol": "COAPS_TCP",
            "service_id": service if status == "ONLINE" else "", "local_endpoints": ["coaps+tcp://10.0.0.1:5684"]}


def twin(state, *, force_at=0, cid="", seq=0):
    return {"state": state, "syncing_at": 0, "in_sync_at": 0, "command_connection_id": cid,
            "command_sequence": seq, "force_synchronization_at": force_at}


def md(version, connection, *, twin_enabled=True, twin_sync=None, canceled=False, **kw):
    return ra("devicemetadataupdated", version, connection=connection, twin_enabled=twin_enabled,
              twin_synchronization=twin_sync or twin("OUT_OF_SYNC"), canceled=canceled, **kw)


def test_online_online_offline():
    st = run([
        md(0, conn("ONLINE", "c1")),
        md(1, conn("ONLINE", "c2", at=T0 + 10 * SEC)),
        md(2, conn("OFFLINE", "c2", at=T0 + 10 * SEC)),
    ])
    m = metadata(st)
    assert m["updated"]["connection"]["status"] == "OFFLINE"
    assert m["updated"]["connection"]["id"] == "c2"
    assert m["version"] == 2 and m["complete"]


def test_offline_from_old_connection_arrives_late_and_is_ignored():
    # online c1 (v0), online c2 (v1), then a duplicate/late offline of c1 carrying v0 again
    first = run([md(0, conn("ONLINE", "c1")), md(1, conn("ONLINE", "c2"))])
    stats = FoldStats()
    st = run([md(0, conn("OFFLINE", "c1"), ts=T0 + SEC)], first, stats=stats)
    assert metadata(st)["updated"]["connection"]["id"] == "c2"
    assert metadata(st)["updated"]["connection"]["status"] == "ONLINE"
    assert stats["old_version"] == 1


def test_twin_disable_pending_then_updated():
    st = run([
        md(0, conn("ONLINE", "c1"), twin_sync=twin("IN_SYNC")),
        ra("devicemetadataupdatepending", 1, correlation_id="t1", valid_until=0,
           update_pending="twin_enabled", update_pending_value=False),
    ])
    assert [p["update_pending"] for p in metadata(st)["pendings"]] == ["twin_enabled"]
    st = run([md(2, conn("ONLINE", "c1"), twin_enabled=False, twin_sync=twin("DISABLED"), correlation_id="t1")], st)
    m = metadata(st)
    assert m["pendings"] == []
    assert m["updated"]["twin_enabled"] is False and m["updated"]["twin_synchronization"]["state"] == "DISABLED"


def test_twin_force_sync_and_canceled_update():
    st = run([
        md(0, conn("ONLINE", "c1"), twin_sync=twin("IN_SYNC")),
        ra("devicemetadataupdatepending", 1, correlation_id="f1", valid_until=0,
           update_pending="twin_force_synchronization", update_pending_value=True),
        ra("devicemetadataupdatepending", 2, correlation_id="f2", valid_until=0,
           update_pending="twin_force_synchronization", update_pending_value=True),
        md(3, conn("ONLINE", "c1"), twin_sync=twin("OUT_OF_SYNC", force_at=T0 + 4 * SEC), correlation_id="f1"),
        # canceled: repeats the previous values and resolves the pending (§4.6)
        md(4, conn("ONLINE", "c1"), twin_sync=twin("OUT_OF_SYNC", force_at=T0 + 4 * SEC), canceled=True,
           correlation_id="f2"),
    ])
    m = metadata(st)
    assert m["pendings"] == []
    assert m["updated"]["twin_synchronization"]["force_synchronization_at"] == T0 + 4 * SEC
    assert m["updated"]["connection"]["status"] == "ONLINE"
    assert m["version"] == 4


def test_metadata_pendings_without_update_keep_default():
    st = run([ra("devicemetadataupdatepending", 0, correlation_id="p", valid_until=0,
                 update_pending="twin_enabled", update_pending_value=False)])
    assert metadata(st)["updated"] is None


# ------------------------------------------------------------------------------------------
# Links (resourceLinksSnapshotTaken_test.go cases)
# ------------------------------------------------------------------------------------------

def link(href, *, title="", types=("core.light",)):
    return {"href": href, "device_id": DEV, "resource_types": list(types), "interfaces": ["oic.if.baseline"],
            "anchor": f"ocf://{DEV}", "title": title, "supported_content_types": [], "valid_until": 0,
            "bit_flags": 3, "endpoint_informations": [{"endpoint": "coaps+tcp://10.0.0.1:5684", "priority": 1}]}


def test_links_published_changed_unpublished():
    st = run([ra("resourcelinkspublished", 0, resources=[link("/a"), link("/b"), link("/c")])])
    assert sorted(links(st)["links"]) == ["/a", "/b", "/c"]
    st = run([ra("resourcelinkspublished", 1, resources=[link("/b", title="changed")]),
              ra("resourcelinksunpublished", 2, hrefs=["/a", "/nope"])], st)
    lk = links(st)["links"]
    assert sorted(lk) == ["/b", "/c"] and lk["/b"]["title"] == "changed"
    st = run([ra("resourcelinksunpublished", 3, hrefs=[])], st)  # empty list removes all
    assert links(st)["links"] == {} and links(st)["version"] == 3


# ------------------------------------------------------------------------------------------
# Registrations and incarnations
# ------------------------------------------------------------------------------------------

def test_device_unregistered_and_reregistered_with_versions_restarting():
    st = run([
        reg("devicesregistered", T0),
        changed(0, b"old", ts=T0 + SEC),
        changed(1, b"old2", ts=T0 + 2 * SEC, sequence=5),
        ra("resourcelinkspublished", 0, resources=[link("/light/1")], ts=T0 + SEC),
    ])
    assert st["registration"]["registered_at"] == T0 and st["registration"]["owner_id"] == OWNER
    stats = FoldStats()
    st = run([
        reg("devicesunregistered", T0 + 10 * SEC),
        reg("devicesregistered", T0 + 20 * SEC, owner=OWNER2),
        changed(0, b"new", ts=T0 + 21 * SEC, owner=OWNER2),
        # a late copy of an old-incarnation event (older than the unregistration): ignored
        changed(2, b"stale", ts=T0 + 3 * SEC, sequence=6),
    ], st, stats=stats)
    assert st["registration"]["owner_id"] == OWNER2
    assert st["unregistered_at"] == T0 + 10 * SEC
    assert set(st["aggregates"]) == {ids.resource_aggregate_id(DEV, HREF)}  # links dropped
    agg = resource(st)
    assert agg["latest"]["content_digest"] == fold._digest(b"new") and agg["version"] == 0 and agg["complete"]
    assert agg["owner_id"] == OWNER2
    assert stats["unregistered"] == 1  # the late v2 folded into the dropped incarnation
    # in a later batch: a redelivered old unregistration changes nothing
    st = run([reg("devicesunregistered", T0 + 10 * SEC)], st)
    assert st["registration"]["owner_id"] == OWNER2 and resource(st)["version"] == 0


def test_unregister_only_tombstone_and_late_old_events():
    st = run([changed(0), reg("devicesunregistered", T0 + 100 * SEC)])
    assert st["aggregates"] == {} and st["unregistered_at"] == T0 + 100 * SEC
    assert not fold.is_empty_state(st)
    st = run([changed(1, ts=T0 + 50 * SEC)], st)
    assert st["aggregates"] == {}


def test_version_zero_with_newer_timestamp_starts_new_incarnation_without_unregister():
    st = run([changed(0, b"A", ts=T0 + SEC), changed(1, b"B", ts=T0 + 2 * SEC, sequence=7)])
    stats = FoldStats()
    st = run([changed(0, b"C", ts=T0 + 30 * SEC), changed(1, b"D", ts=T0 + 31 * SEC, sequence=9),
              changed(2, b"E", ts=T0 + 3 * SEC, sequence=8)], st, stats=stats)
    agg = resource(st)
    # v2 (older timestamp) continued the old incarnation, then v0/v1 of the new one replaced it
    assert agg["latest"]["content_digest"] == fold._digest(b"D") and agg["version"] == 1 and agg["complete"]
    assert stats["incarnations"] == 1


def test_duplicate_version_zero_with_same_timestamp_is_not_a_new_incarnation():
    first = changed(0, b"A", ts=T0 + SEC)
    st = run([first, changed(1, b"B", ts=T0 + 2 * SEC, sequence=3)])
    st = run([dict(first)], st)
    assert resource(st)["latest"]["content_digest"] == fold._digest(b"B") and resource(st)["version"] == 1


# ------------------------------------------------------------------------------------------
# Duplicates, order, gaps
# ------------------------------------------------------------------------------------------

def test_duplicates_across_two_intervals_are_ignored_by_version():
    ev = [changed(0, b"A", sequence=1), ra("resourceupdatepending", 1, correlation_id="u", valid_until=0)]
    st = run(ev)
    stats = FoldStats()
    st2 = run([dict(e) for e in ev] + [changed(2, b"B", sequence=2)], loads_state(dumps_state(st)), stats=stats)
    assert stats["old_version"] == 2 and stats["applied"] == 1
    assert pending_ids(resource(st2), "update") == ["u"]  # not doubled
    assert resource(st2)["latest"]["content_digest"] == fold._digest(b"B")


def test_out_of_order_versions_within_a_batch():
    events = [changed(2, b"C", sequence=3), changed(0, b"A", sequence=1), changed(1, b"B", sequence=2)]
    st = run(events)
    assert resource(st)["latest"]["content_digest"] == fold._digest(b"C") and resource(st)["complete"]


def test_same_version_twice_tie_break_by_stream_seq():
    a = changed(0, b"first", seq=10)
    b = changed(0, b"second", seq=5, ts=a["timestamp"])
    st = run([a, b])
    assert resource(st)["latest"]["content_digest"] == fold._digest(b"second")


def test_version_gap_is_kept_flagged_and_later_versions_apply():
    stats = FoldStats()
    st = run([changed(0, b"A", sequence=1), changed(3, b"D", sequence=4), changed(4, b"E", sequence=5)],
             stats=stats)
    agg = resource(st)
    assert agg["complete"] is False and agg["missing"] == [[1, 2]]
    assert agg["latest"]["content_digest"] == fold._digest(b"E") and agg["version"] == 4
    # a late arrival of a missing version is ignored (versions <= stored), the range stays
    st = run([changed(1, b"B", sequence=2)], st)
    assert resource(st)["missing"] == [[1, 2]] and resource(st)["latest"]["content_digest"] == fold._digest(b"E")
    assert stats["gaps"] == 1


def test_version_gap_across_two_batches_survives_the_state_round_trip():
    st = loads_state(dumps_state(run([changed(0, b"A", sequence=1), changed(1, b"B", sequence=2)])))
    stats = FoldStats()
    st = loads_state(dumps_state(run([changed(4, b"E", sequence=5)], st, stats=stats)))
    agg = resource(st)
    assert agg["complete"] is False and agg["missing"] == [[2, 3]] and stats["gaps"] == 1
    st = run([changed(5, b"F", sequence=6)], st)
    assert resource(st)["version"] == 5 and resource(st)["missing"] == [[2, 3]]
    assert resource(st)["latest"]["content_digest"] == fold._digest(b"F")


def test_first_known_version_above_zero_is_incomplete():
    st = run([ra("resourcelinkspublished", 5, resources=[link("/x")])])
    assert links(st)["complete"] is False and links(st)["missing"] == [[0, 4]]
    assert sorted(links(st)["links"]) == ["/x"]


# ------------------------------------------------------------------------------------------
# Old-hub snapshots
# ------------------------------------------------------------------------------------------

def test_old_hub_resource_snapshot_replaces_state():
    latest = {"version": 15, "timestamp": T0, "connection_id": "c", "sequence": 3, "user_id": "u",
              "correlation_id": "", "status": "OK", **content(b"SNAP"), "etag": b"e", "resource_types": ["core.light"]}
    pending = {"version": 14, "timestamp": T0, "correlation_id": "p1", "valid_until": 0, **content(b"{}")}
    snap = ra("resourcestatesnapshottaken", 16, resource_types=["core.light"],
              resource_snapshot={"latest_resource_change": latest, "create_pendings": [],
                                 "retrieve_pendings": [], "update_pendings": [pending], "delete_pendings": []})
    st = run([snap, changed(17, b"AFTER", sequence=4, connection_id="c")])
    agg = resource(st)
    assert agg["complete"] is True and agg["missing"] == []  # a full state needs no earlier versions
    assert pending_ids(agg, "update") == ["p1"]
    assert agg["latest"]["content_digest"] == fold._digest(b"AFTER") and agg["version"] == 17
    # an older snapshot arriving later is ignored
    st = run([dict(snap, version=8, stream_seq=999)], st)
    assert resource(st)["version"] == 17


def test_old_hub_snapshot_after_a_gap_makes_the_aggregate_complete_again():
    """§4.9 rule 8: a ``*snapshottaken`` with a version above the stored one is a full-state reset,
    so the versions missing before it no longer matter (§4.3: snapshot = new base)."""
    st = run([ra("resourcelinkspublished", 0, resources=[link("/a")]),
              ra("resourcelinkspublished", 3, resources=[link("/b")])])
    assert links(st)["missing"] == [[1, 2]] and links(st)["complete"] is False
    st = run([ra("resourcelinkssnapshottaken", 4, resources=[link("/c")])], loads_state(dumps_state(st)))
    assert links(st)["complete"] is True and links(st)["missing"] == []
    assert sorted(links(st)["links"]) == ["/c"] and links(st)["version"] == 4
    rows = fold.device_rows(st, END)["device_links"]
    assert [(r["href"], r["complete"], r["missing_versions"]) for r in rows] == [("/c", True, [])]


def test_old_hub_links_and_metadata_snapshots():
    st = run([
        ra("resourcelinkspublished", 0, resources=[link("/gone")]),
        ra("resourcelinkssnapshottaken", 16, resources=[link("/a"), link("/b")]),
        ra("devicemetadatasnapshottaken", 16, metadata_snapshot={
            "device_metadata_updated": {"version": 15, "connection": conn("ONLINE", "c9"), "twin_enabled": True,
                                        "twin_synchronization": twin("IN_SYNC"), "canceled": False},
            "update_pendings": [{"version": 14, "correlation_id": "m1", "update_pending": "twin_enabled",
                                 "update_pending_value": False, "valid_until": 0}]}),
    ])
    assert sorted(links(st)["links"]) == ["/a", "/b"] and links(st)["complete"]
    m = metadata(st)
    assert m["updated"]["connection"]["id"] == "c9" and [p["correlation_id"] for p in m["pendings"]] == ["m1"]
    assert m["complete"] is True


# ------------------------------------------------------------------------------------------
# State round trip and errors
# ------------------------------------------------------------------------------------------

def test_state_round_trip_keeps_bytes_and_is_canonical():
    st = run([changed(0, b"\x00\xff"), ra("resourceretrievepending", 1, correlation_id="r", valid_until=0,
                                         etags=[b"\x01"])])
    text = dumps_state(st)
    back = loads_state(text)
    assert back == st and dumps_state(back) == text
    assert resource(back)["latest"]["content_digest"] == fold._digest(b"\x00\xff")


def test_loads_state_rejects_garbage():
    with pytest.raises(ValueError, match="not valid JSON"):
        loads_state("{nope")
    with pytest.raises(ValueError, match="format"):
        loads_state('{"format": 99}')


def test_unknown_event_type_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown event type 'bogus'"):
        run([{"event_type": "bogus", "version": 0}])


# ------------------------------------------------------------------------------------------
# Device rows and the simulator's ground truth (decode_batch -> dedupe by msg_id -> fold)
# ------------------------------------------------------------------------------------------

def test_device_rows_columns_match_the_contract():
    from airflow_provider_plgd.plgd.tables import SNAPSHOT_TABLES

    st = run([
        reg("devicesregistered", T0),
        changed(0), ra("resourceupdatepending", 1, correlation_id="u", valid_until=0),
        md(0, conn("ONLINE", "c1")),
        ra("devicemetadataupdatepending", 1, correlation_id="t", valid_until=0,
           update_pending="twin_force_synchronization", update_pending_value=True),
        ra("resourcelinkspublished", 3, resources=[link("/a")]),
    ])
    rows = fold.device_rows(st, END)
    for table, columns in SNAPSHOT_TABLES.items():
        assert len(rows[table]) == 1, table
        assert list(rows[table][0]) == [c for c, _, _ in columns], table
    r = rows["resources"][0]
    assert r["etag"] == "ZXRhZzA=" and r["status"] == "OK" and r["content_json"] == '{"on":true}'
    assert r["update_pendings"] == [{"correlation_id": "u", "valid_until": 0, "version": 1,
                                     "timestamp": T0 + 2 * SEC}]
    m = rows["device_metadata"][0]
    assert m["update_pendings"][0]["twin_force_synchronization"] is True
    assert m["update_pendings"][0]["twin_enabled"] is None and m["connection_status"] == "ONLINE"
    lk = rows["device_links"][0]
    assert (lk["version"], lk["complete"], lk["missing_versions"]) == (3, False, [{"first": 0, "last": 2}])
    assert rows["owner_devices"][0] == {"owner_id": OWNER, "owner": "owner-a", "device_id": DEV,
                                        "registered_at": T0}
    # a tombstone has no rows
    st = run([reg("devicesunregistered", T0 + 100 * SEC)], st)
    assert all(v == [] for v in fold.device_rows(st, END).values())


def _sim_fold(config, batches=None):
    """Decode the simulator's messages per interval, keep the first copy of every msg_id, fold
    device by device with a JSON round trip of the state between batches (as the Spark app
    does), and yield (last interval of the batch, rows, expected rows at its end).

    :param batches: lists of interval indexes folded together, snapshot time = end of the last
        one (default: one batch per interval).
    """
    from collections import defaultdict

    import pyarrow as pa

    from airflow_provider_plgd import times
    from airflow_provider_plgd.plgd.tables import SNAPSHOT_SORT_KEYS
    from airflow_provider_plgd.simulator import expected_state, generate
    from airflow_provider_plgd.spark import decode_batch

    sim = generate(config)
    bounds = config.interval_bounds()
    seen: set[str] = set()
    states: dict[str, str] = {}
    for batch_intervals in batches or [[k] for k in range(len(bounds))]:
        by_device = defaultdict(list)
        for k in batch_intervals:
            start, end = bounds[k]
            msgs = [(seq, m) for seq, m in enumerate(sim.messages, start=1) if m.interval == k]
            batch = pa.RecordBatch.from_pydict({
                "stream": ["EVENTS"] * len(msgs),
                "stream_seq": [seq for seq, _ in msgs],
                "subject": [m.subject for _, m in msgs],
                "published_at": pa.array([start // 1000] * len(msgs), pa.timestamp("us", tz="UTC")),
                "msg_id": pa.nulls(len(msgs), pa.string()),
                "data": [m.data for _, m in msgs],
            })
            decoded = decode_batch.decode_batch(batch, times.interval_id(start, end)).to_pylist()
            for row in sorted((r for r in decoded if r["reason"] is None), key=lambda r: r["stream_seq"]):
                if row["msg_id"] in seen:
                    continue
                seen.add(row["msg_id"])
                for device in (row["device_ids"] if row["event_type"].startswith("devices") else [row["device_id"]]):
                    by_device[device].append(row)
        k = batch_intervals[-1]
        end = bounds[k][1]
        got = {t: [] for t in fold.SNAPSHOT_TABLE_NAMES}
        for device in sorted(set(by_device) | set(states)):
            state = loads_state(states[device]) if device in states else None
            state = fold_device(device, state, by_device.get(device, []), snapshot_time_ns=end)
            states[device] = dumps_state(state)
            for table, rows in fold.device_rows(state, end).items():
                got[table].extend(rows)
        for table, keys in SNAPSHOT_SORT_KEYS.items():
            got[table].sort(key=lambda r: tuple(r[c] for c in keys))
        yield k, got, expected_state(sim, k)


@pytest.mark.parametrize("config_kw", [
    dict(seed=3, intervals=3, duplicates=0.05, unregister=True, version_gaps=True, old_hub_snapshots=True, corrupt=2),
    dict(seed=5, owners=3, devices_per_owner=4, intervals=4, steps_per_interval=60, duplicates=0.1,
         unregister=True, version_gaps=True, old_hub_snapshots=True, leadrt="first"),
])
def test_folding_simulated_traffic_gives_expected_state(config_kw):
    from airflow_provider_plgd.simulator import SimulationConfig

    for k, got, expected in _sim_fold(SimulationConfig(**config_kw)):
        for table in expected:
            assert got[table] == expected[table], f"interval {k} table {table}"


def test_incremental_fold_equals_one_fold_of_everything():
    """Folding interval by interval (state round trip in between) gives the same tables as one
    fold of all intervals at the last snapshot time, and both equal the ground truth."""
    from airflow_provider_plgd.simulator import SimulationConfig

    config = SimulationConfig(seed=7, intervals=4, duplicates=0.1, unregister=True, version_gaps=True,
                              old_hub_snapshots=True)
    *_, (k_inc, incremental, expected) = _sim_fold(config)
    [(k_all, at_once, _)] = _sim_fold(config, batches=[list(range(config.intervals))])
    assert k_inc == k_all == config.intervals - 1
    for table in expected:
        assert at_once[table] == incremental[table] == expected[table], table
    assert all(expected[t] for t in expected), "scenario too small: a table is empty"


# ------------------------------------------------------------------------------------------
# Arrow glue (what the Spark UDF runs) and one bucket's rebuild (snapshot_buckets)
# ------------------------------------------------------------------------------------------

def test_fold_bucket_arrow_matches_device_rows():
    import pyarrow as pa

    from airflow_provider_plgd.spark import schemas
    from airflow_provider_plgd.tables import snapshot_store

    table_schemas = {t: snapshot_store.table_schema(t) for t in snapshot_store.ALL_TABLES}
    first = [reg("devicesregistered", T0), changed(0), md(0, conn("ONLINE", "c1")),
             ra("resourceupdatepending", 1, correlation_id="u", valid_until=END + SEC)]

    def events_table(rows):
        full = [{c: r.get(c) for c in schemas.EVENTS_SCHEMA.names} | {"_bucket": 3, "_device": DEV} for r in rows]
        schema = schemas.EVENTS_SCHEMA.append(pa.field("_bucket", pa.int32())).append(pa.field("_device", pa.string()))
        return pa.Table.from_pylist(full, schema=schema)

    empty_states = pa.table({"device_id": pa.array([], pa.string()), "next_expiry_ns": pa.array([], pa.int64()),
                             "state_json": pa.array([], pa.string()), "_bucket": pa.array([], pa.int32())})
    out = fold.fold_bucket_arrow(events_table(first), empty_states, snapshot_time_ns=END, table_schemas=table_schemas)
    assert out.schema == fold.fold_output_schema(table_schemas)
    by_table = Counter(out.column("table").to_pylist())
    assert by_table == {"_device_state": 1, "resources": 1, "device_metadata": 1, "owner_devices": 1, "_stats": 1}
    state_row = next(r for r in out.to_pylist() if r["table"] == "_device_state")["_device_state"]
    assert state_row["next_expiry_ns"] == END + SEC
    expected = fold.device_rows(loads_state(state_row["state_json"]), END)
    got_res = [r["resources"] for r in out.to_pylist() if r["table"] == "resources"]
    assert got_res == expected["resources"]
    stats = json.loads(next(r for r in out.to_pylist() if r["table"] == "_stats")["stats_json"])
    assert stats["applied"] == 3 and stats["devices"] == 1
    # second batch: no new events, only the state with a pending expiring before the next snapshot
    states = pa.table({"device_id": [DEV], "next_expiry_ns": [END + SEC], "state_json": [state_row["state_json"]],
                       "_bucket": pa.array([3], pa.int32())})
    out2 = fold.fold_bucket_arrow(events_table([]), states, snapshot_time_ns=END + 2 * SEC,
                                  table_schemas=table_schemas)
    res2 = [r["resources"] for r in out2.to_pylist() if r["table"] == "resources"]
    assert res2[0]["update_pendings"] == []
    # nothing at all -> empty table
    empty = fold.fold_bucket_arrow(events_table([]), empty_states, snapshot_time_ns=END, table_schemas=table_schemas)
    assert empty.num_rows == 0


def test_rebuild_bucket_refolds_touched_devices_and_copies_the_rest(tmp_path):
    """snapshot_buckets.rebuild_bucket (the executor task of rebuild_snapshots) on a local folder."""
    import pyarrow as pa

    from airflow_provider_plgd.spark import schemas
    from airflow_provider_plgd.tables import snapshot_store

    table_schemas = {t: snapshot_store.table_schema(t) for t in snapshot_store.ALL_TABLES}
    dev_b = "00000000-0000-0000-0000-00000000000b"
    ev_schema = schemas.EVENTS_SCHEMA.append(pa.field("_bucket", pa.int32())).append(pa.field("_device", pa.string()))

    def events(rows, bucket=7):
        full = [{c: r.get(c) for c in schemas.EVENTS_SCHEMA.names}
                | {"_bucket": bucket, "_device": r.get("device_id") or (r.get("device_ids") or [None])[0]}
                for r in rows]
        return pa.Table.from_pylist(full, schema=ev_schema)

    def files(result):
        return {r["table"]: [str(tmp_path / "snapshots" / r["table"] / r["file"])]
                for r in result.to_pylist() if r["file"]}

    def resources(result):
        import pyarrow.parquet as pq

        path = files(result)["resources"][0]
        return pq.read_table(path).sort_by([(k, "ascending") for k in snapshot_store.sort_keys("resources")]).to_pylist()

    first = snapshot_buckets.rebuild_bucket(
        events([changed(0), ra("resourcelinkspublished", 0, resources=[link("/a")]),
                changed(0, device=dev_b),
                ra("resourceupdatepending", 1, device=dev_b, correlation_id="p", valid_until=END + 5 * SEC)]),
        snapshots=Layout.of(str(tmp_path)), run_id="a", old_files={}, table_schemas=table_schemas, snapshot_time_ns=END)
    rows = {r["table"]: r for r in first.to_pylist()}
    assert rows["resources"]["file"] == "bucket=7/part-a.parquet"
    assert json.loads(rows["resources"]["stats"])["numRecords"] == 2
    assert rows["resources"]["rows"] == 2 and rows["device_links"]["rows"] == 1
    assert rows["owner_devices"]["file"] is None  # no registrations in this bucket
    assert rows["_device_state"]["next_expiry_ns"] == END + 5 * SEC
    assert json.loads(rows["_stats"]["stats_json"])["devices"] == 2 and rows["_stats"]["events"] == 4
    old = files(first)

    # only DEV has new events: dev_b's rows are copied, not refolded
    second = snapshot_buckets.rebuild_bucket(
        events([changed(1, b"new", sequence=99)]), snapshots=Layout.of(str(tmp_path)), run_id="b", old_files=old,
        table_schemas=table_schemas, snapshot_time_ns=END + SEC)
    stats = json.loads(next(r for r in second.to_pylist() if r["table"] == "_stats")["stats_json"])
    assert stats["devices"] == 1
    res = resources(second)
    assert [(r["device_id"], r["version"]) for r in res] == [(DEV, 1), (dev_b, 1)]
    assert res[1]["update_pendings"][0]["correlation_id"] == "p"

    # a marker row only (no events): dev_b's pending expires, so dev_b is refolded
    marker = events([{"device_id": None}])
    third = snapshot_buckets.rebuild_bucket(marker, snapshots=Layout.of(str(tmp_path)), run_id="c", old_files=files(second),
                                          table_schemas=table_schemas, snapshot_time_ns=END + 10 * SEC)
    stats = json.loads(next(r for r in third.to_pylist() if r["table"] == "_stats")["stats_json"])
    assert stats == {"devices": 1, "expired_pendings": 1}
    res = resources(third)
    assert res[1]["update_pendings"] == [] and res[0]["version"] == 1
    assert next(r for r in third.to_pylist() if r["table"] == "_device_state")["next_expiry_ns"] is None


def test_spark_apps_run_from_the_py_files_zip_alone(tmp_path):
    """The fold/snapshot modules need only the ``--py-files`` zip (plgd model incl. the snapshot
    table schemas, staging): importing them from the zip loads neither the simulator (nats-py),
    Airflow nor pyspark."""
    import subprocess
    import sys

    from airflow_provider_plgd.spark_deps import build_py_files_zip

    zip_path = build_py_files_zip(tmp_path)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from airflow_provider_plgd.spark import fold, snapshot_buckets; "
            "from airflow_provider_plgd.tables import snapshot_store; "
            "from airflow_provider_plgd.spark_apps import dedupe_events, rebuild_snapshots; "
            "assert snapshot_store.__file__.startswith(sys.argv[1]), snapshot_store.__file__; "
            "assert snapshot_buckets.__file__.startswith(sys.argv[1]), snapshot_buckets.__file__; "
            "assert snapshot_store.table_schema('resources').names[0] == 'owner_id'; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('nats', 'airflow', 'pyspark') "
            "or m.startswith('airflow_provider_plgd.simulator')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code, zip_path], check=True, cwd=tmp_path)


@pytest.mark.parametrize("event_type", sorted(event_types.EVENT_TYPES))
def test_every_event_type_has_a_fold_rule(event_type):
    """Every type of ``plgd/event_types.py`` reaches a rule of the fold's chains (spark/fold/rules.py); a type added
    there without its rule fails here with "no fold rule for event type …"."""
    info = event_types.EVENT_TYPES[event_type]
    if info.aggregate is None:
        state = run([reg(event_type, T0 + SEC)])
        assert (state["registration"] is not None) == (event_type == fold.DEVICES_REGISTERED)
    else:
        ev = ra(event_type, 1)
        state = run([ev])
        assert state["aggregates"][ev["aggregate_id"]]["kind"] == info.aggregate


@pytest.mark.parametrize("like", ["resourcechanged", "resourcelinkspublished", "devicemetadataupdated",
                                  "devicesregistered"])
def test_an_event_type_without_a_fold_rule_is_an_error(monkeypatch, like):
    new = dataclasses.replace(event_types.EVENT_TYPES[like], name="somethingnew")
    patched = {**fold.EVENT_TYPES, "somethingnew": new}
    monkeypatch.setattr(fold, "EVENT_TYPES", patched)  # the test's own helpers read it here
    monkeypatch.setattr(fold.device, "EVENT_TYPES", patched)  # the fold's chains read it there
    ev = reg("somethingnew", T0 + SEC) if new.aggregate is None else ra("somethingnew", 1)
    with pytest.raises(ValueError, match="no fold rule for event type 'somethingnew'"):
        run([ev])
