"""Unit tests of airflow_provider_plgd/spark/fold/: plgd's own state-test scenarios, written as our own data.

The scenarios follow the cases of plgd's ``resource-aggregate/events/*_test.go`` (create/update/
delete pending then confirmation, device metadata online/offline and twin sync, links publish
and unpublish) and the ETL rules of docs/wire-format.md §4.9 (dedupe, order, gaps, incarnations,
old-hub snapshots). Rows are plain dicts with the ``events`` column names; no Spark.
"""

from __future__ import annotations

import pytest

from airflow_provider_plgd.plgd import ids
from airflow_provider_plgd.spark import fold
from airflow_provider_plgd.spark.fold import FoldStats, dumps_state, loads_state
from tests.unit.spark.fold.fold_events import (
    DEV,
    END,
    HREF,
    OWNER,
    OWNER2,
    SEC,
    T0,
    changed,
    conn,
    content,
    link,
    links,
    md,
    metadata,
    pending_ids,
    ra,
    reg,
    resource,
    run,
    twin,
)

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
