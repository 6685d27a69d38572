"""Pure fold logic of the snapshot rebuild: previous state of a device + its new events -> new state.

No Spark here: plain Python over ``events`` rows (dicts with the column names of
:data:`airflow_provider_plgd.spark.schemas.EVENTS_SCHEMA`, as ``pyarrow.Table.to_pylist()`` gives them). The rebuild
app calls :func:`fold_bucket_arrow` (Arrow in, Arrow out) once per touched bucket inside its
reduce tasks (``RDD.mapPartitions``, ``spark/rebuild_input.py``), which calls :func:`fold_device`
per device; the unit tests call both directly.
Semantics: ``docs/wire-format.md`` §4 (state of each aggregate kind) and §4.9 (the
consumer rules); the model followed is the resource-aggregate (RA) write side.

Unit of work: one **device**
-----------------------------
All state of one device lives together: its resource aggregates (one per href), its links
aggregate, its metadata aggregate and its registration (owner -> device). A
``devicesunregistered`` drops *all* of it at once (§4.7), so the device is the smallest unit that
can be folded independently. The device state is a dict of JSON types only (see
:func:`new_device_state`; :func:`dumps_state` / :func:`loads_state` round-trip it): content bytes
are kept as a digest, etags as base64 text.

Rules applied (each cites its source)
-------------------------------------
* Per aggregate ``(group_id, aggregate_id)``: events in ``version`` order, ``stream_seq`` breaking
  ties (§4.9 rule 1). A version ``<=`` the stored version is ignored (§4.3: duplicate/old).
* The first known version above 0, or a jump past ``stored + 1``, is a gap: the aggregate is kept,
  flagged ``complete = False``, and the missing version range is recorded (§4.9 rule 7). It is
  never guessed and never dropped; later versions keep folding on top.
* Old-hub ``*snapshottaken`` events (hub < v2.16.0) replace the whole state when their version is
  above the stored one (or nothing is stored); the aggregate is complete again (§4.9 rule 8, §4.3).
* Incarnations (§4.9 rule 3): a ``devicesunregistered`` drops all state of its devices; events of
  the device with ``timestamp <=`` the unregistration time are from the dropped incarnation and
  are ignored, also when they arrive in a later batch. A version-0 event whose timestamp is newer
  than the aggregate's last applied event starts a new incarnation of that aggregate (device
  deleted and re-created, versions restarting at 0), even without an unregistration.
* Resources (§4.4): ``latest`` = the last accepted ``resourcechanged``; a ``resourcechanged`` is
  dropped by the RA stale-skip rule (``ValidateSequence`` + ``Equal``). Pending commands per kind
  (create/retrieve/update/delete) are appended unless already expired at the event's timestamp;
  a confirmation removes the first pending of its kind with the same ``correlation_id``; a
  ``resourcedeleted`` with status ``OK``/``ACCEPTED`` clears all four lists, otherwise it removes
  its delete pending. ``resource_types`` follow the last event that carried a non-empty list.
* Links (§4.5): ``resourcelinkspublished`` upserts by href, ``resourcelinksunpublished`` removes
  the listed hrefs (an empty list removes all), the snapshot replaces the map.
* Device metadata (§4.6): the last ``devicemetadataupdated`` gives connection, ``twin_enabled``
  and ``twin_synchronization`` (a ``canceled`` one repeats the previous values); it resolves the
  pending with its (non-empty) ``correlation_id``; ``devicemetadataupdatepending`` is appended
  unless already expired. Before any update ``twin_enabled`` is true (the RA model's default).
* Registrations (§4.7): ``devicesregistered`` registers the device to the subject's
  ``owner_id`` (the latest registration wins; ``registered_at`` is its timestamp).
* Snapshot time (§4.9 rules 4 and 6): pendings with ``valid_until != 0`` and ``valid_until <
  snapshot_time_ns`` are dropped (:func:`expire_pendings`). Because snapshot times only grow, a
  pending dropped once would be dropped by every later snapshot too, so it is removed from the
  state for good.

Times are unix **nanoseconds** (``int``), as in the ``events`` table.
"""

from __future__ import annotations

import base64
import hashlib
import json
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from typing import Any, Iterable, Mapping, NoReturn

from airflow_provider_plgd.plgd.event_types import (
    AGGREGATE_LINKS,
    AGGREGATE_METADATA,
    AGGREGATE_RESOURCE,
    EVENT_TYPES,
)
from airflow_provider_plgd.plgd.tables import SNAPSHOT_TABLES

__all__ = [
    "BASE_COLUMNS",
    "COLUMNS_BY_EVENT_TYPE",
    "DEVICES_REGISTERED",
    "DEVICES_UNREGISTERED",
    "FOLD_INPUT_COLUMNS",
    "FoldStats",
    "PENDING_KINDS",
    "SNAPSHOT_TABLE_NAMES",
    "STATE_FORMAT_VERSION",
    "content_digest",
    "device_rows",
    "dumps_state",
    "expire_pendings",
    "fold_bucket_arrow",
    "fold_device",
    "fold_output_schema",
    "is_empty_state",
    "loads_state",
    "new_device_state",
    "next_expiry",
]

#: Format version of the serialised device state; bump when its shape changes incompatibly.
STATE_FORMAT_VERSION = 1

DEVICES_REGISTERED = "devicesregistered"
DEVICES_UNREGISTERED = "devicesunregistered"

#: Pending event type -> pending kind; confirmation event type -> pending kind (§4.4).
_PENDING_KIND = {
    "resourcecreatepending": "create",
    "resourceretrievepending": "retrieve",
    "resourceupdatepending": "update",
    "resourcedeletepending": "delete",
}
_CONFIRM_KIND = {
    "resourcecreated": "create",
    "resourceretrieved": "retrieve",
    "resourceupdated": "update",
    "resourcedeleted": "delete",
}
PENDING_KINDS = ("create", "retrieve", "update", "delete")
#: ``resourcedeleted`` statuses that clear all pendings (RA model, §4.4).
_DELETE_SUCCESS = frozenset({"OK", "ACCEPTED"})

# Fields copied from an event row into the stored "latest resource change" / pendings. They are
# the field names of schemas.RESOURCE_CHANGE_TYPE / RESOURCE_PENDING_TYPE / DEVICE_METADATA_*,
# so old-hub snapshot payloads (nested structs with those names) load the same way.
# The stored latest change keeps what the stale-skip rule compares and what the resources table
# shows; the content bytes are kept as a digest only (the rule compares them for equality), the
# etag as base64 text (the table's form), so a state holds no bytes.
_CHANGE_FIELDS = ("version", "timestamp", "connection_id", "sequence", "user_id", "status", "content_type",
                  "coap_content_format", "content_json", "resource_types")
# Pendings keep only what a rule or a snapshot column needs (their content is never used).
_PENDING_FIELDS = ("version", "timestamp", "correlation_id", "valid_until")
_MD_UPDATED_FIELDS = ("version", "timestamp", "correlation_id", "connection", "twin_enabled",
                      "twin_synchronization", "canceled")
_MD_PENDING_FIELDS = ("version", "timestamp", "correlation_id", "update_pending", "update_pending_value",
                      "valid_until")


#: ``events`` columns each event type needs (besides :data:`BASE_COLUMNS`); the Arrow glue
#: converts only these to Python, which makes the conversion several times cheaper.
BASE_COLUMNS: tuple[str, ...] = ("stream_seq", "owner_id", "event_type", "version", "aggregate_id", "timestamp")
_RESOURCE_PENDING_COLUMNS = ("href", "correlation_id", "valid_until", "resource_types")
_RESOURCE_CONFIRM_COLUMNS = ("href", "correlation_id", "status", "resource_types")
COLUMNS_BY_EVENT_TYPE: dict[str, tuple[str, ...]] = {
    "resourcechanged": ("href", "connection_id", "sequence", "user_id", "status", "content_type",
                        "coap_content_format", "content_data", "content_json", "etag",
                        "resource_types"),
    **{et: _RESOURCE_PENDING_COLUMNS for et in _PENDING_KIND},
    **{et: _RESOURCE_CONFIRM_COLUMNS for et in _CONFIRM_KIND},
    "resourcestatesnapshottaken": ("href", "resource_types", "resource_snapshot"),
    "resourcelinkspublished": ("resources",),
    "resourcelinksunpublished": ("hrefs",),
    "resourcelinkssnapshottaken": ("resources",),
    "devicemetadataupdated": ("correlation_id", "connection", "twin_enabled", "twin_synchronization", "canceled"),
    "devicemetadataupdatepending": ("correlation_id", "update_pending", "update_pending_value", "valid_until"),
    "devicemetadatasnapshottaken": ("metadata_snapshot",),
    DEVICES_REGISTERED: ("registration_owner",),
    DEVICES_UNREGISTERED: (),
}
#: Every ``events`` column the rebuild reads: the fold's columns plus the device keys
#: (``device_id``/``group_id``; ``device_ids`` of identity-store events).
FOLD_INPUT_COLUMNS: tuple[str, ...] = tuple(c for c in dict.fromkeys(
    BASE_COLUMNS + ("device_id", "group_id", "device_ids")
    + tuple(c for cols in COLUMNS_BY_EVENT_TYPE.values() for c in cols)
))


class FoldStats(Counter):
    """Counters of one fold (a ``collections.Counter`` of str -> int).

    Keys: ``applied`` (events that advanced an aggregate), ``old_version`` (ignored: version <=
    stored), ``stale_incarnation`` (ignored: from a dropped incarnation), ``stale_registration``,
    ``stale_resourcechanged`` (RA stale-skip), ``expired_on_arrival`` (pending already expired at
    its own timestamp), ``gaps`` (missing ranges recorded), ``incarnations`` (new incarnations
    started by a version 0), ``unregistered`` (devices dropped), ``snapshots`` (old-hub snapshots
    applied), ``expired_pendings`` (dropped at snapshot time), ``unknown_event_type``.
    """


# ---------------------------------------------------------------------------------------------
# State shape
# ---------------------------------------------------------------------------------------------

def new_device_state(device_id: str) -> dict[str, Any]:
    """Return the empty state of device ``device_id``.

    Shape (all times unix ns)::

        {"format": 1, "device_id": str,
         "unregistered_at": int | None,   # last devicesunregistered applied (tombstone)
         "registration": {"owner_id", "owner", "registered_at"} | None,   # latest registration
         "aggregates": {aggregate_id: aggregate state (see _new_aggregate)}}
    """
    return {
        "format": STATE_FORMAT_VERSION,
        "device_id": device_id,
        "unregistered_at": None,
        "registration": None,
        "aggregates": {},
    }


def _new_aggregate(kind: str, aggregate_id: str, device_id: str) -> dict[str, Any]:
    """Empty state of one aggregate.

    Common keys: ``kind`` (resource|links|metadata), ``aggregate_id``, ``device_id``, ``owner_id``
    (subject owner of the last applied event), ``href`` (resource only), ``version`` (last applied
    version, None = nothing applied), ``first_version`` (first version applied in this incarnation),
    ``complete`` (bool), ``missing`` (list of ``[first, last]`` inclusive version ranges never
    seen), ``first_ts`` / ``last_ts`` (timestamps of the first / last applied event),
    ``last_event_type``. ``owner_id`` is taken from the first applied event of the incarnation.
    Resource: ``latest`` (dict of _CHANGE_FIELDS + ``content_digest`` (MD5 hex of the content
    bytes, see :func:`content_digest`) + ``etag`` (base64 text or None), or None),
    ``resource_types`` (list[str]),
    ``pendings`` ({kind: [dict of _PENDING_FIELDS]}).
    Links: ``links`` ({href: link dict of schemas.RESOURCE_LINK_TYPE plus ``version`` and
    ``timestamp`` of the event that last published it}).
    Metadata: ``updated`` (dict of _MD_UPDATED_FIELDS or None), ``pendings`` (list of dict of
    _MD_PENDING_FIELDS).
    """
    agg: dict[str, Any] = {
        "kind": kind,
        "aggregate_id": aggregate_id,
        "device_id": device_id,
        "owner_id": None,
        "href": None,
        "version": None,
        "first_version": None,
        "complete": True,
        "missing": [],
        "first_ts": None,
        "last_ts": None,
        "last_event_type": None,
    }
    if kind == AGGREGATE_RESOURCE:
        agg.update(latest=None, resource_types=[], pendings={k: [] for k in PENDING_KINDS})
    elif kind == AGGREGATE_LINKS:
        agg.update(links={})
    else:
        agg.update(updated=None, pendings=[])
    return agg


def is_empty_state(state: dict[str, Any]) -> bool:
    """True when the device state holds nothing worth keeping (no aggregates, registrations or
    tombstone)."""
    return not state["aggregates"] and state["registration"] is None and state["unregistered_at"] is None


# ---------------------------------------------------------------------------------------------
# Serialisation (JSON; a state holds only JSON types)
# ---------------------------------------------------------------------------------------------

def dumps_state(state: dict[str, Any]) -> str:
    """Serialise a device state to compact JSON text.

    Key order is the state's own (deterministic for the same events), so equal folds give equal
    text. :raises TypeError: if the state holds a value that is not JSON (a bug).
    """
    return json.dumps(state, separators=(",", ":"))


def loads_state(text: str) -> dict[str, Any]:
    """Inverse of :func:`dumps_state`.

    :raises ValueError: if ``text`` is not a device state of format :data:`STATE_FORMAT_VERSION`.
    """
    try:
        state = json.loads(text)
    except (TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"device state is not valid JSON: {exc}; got {str(text)[:80]!r}") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT_VERSION:
        raise ValueError(
            f"device state has format {state.get('format') if isinstance(state, dict) else None!r}; "
            f"expected {STATE_FORMAT_VERSION}"
        )
    return state


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def _ts(ev: dict[str, Any]) -> int:
    return ev.get("timestamp") or 0


def _seq(ev: dict[str, Any]) -> int:
    return ev.get("stream_seq") or 0


def _pick(row: dict[str, Any] | None, fields: Iterable[str]) -> dict[str, Any]:
    row = row or {}
    return {f: row.get(f) for f in fields}


def _digest(data: bytes | None) -> str:
    """MD5 hex of content bytes (None reads as empty). Used only to compare contents for equality
    (the stale-skip rule); the same value as Spark SQL ``md5(content_data)``."""
    return hashlib.md5(data or b"", usedforsecurity=False).hexdigest()


def content_digest(row: dict[str, Any]) -> str:
    """The content digest of an events row: :func:`_digest` of its ``content_data``."""
    return _digest(row.get("content_data"))


def _b64(value: bytes | None) -> str | None:
    """Standard base64 text of non-empty bytes; None for None or empty (the tables' etag form)."""
    return base64.b64encode(bytes(value)).decode("ascii") if value else None


def _change(row: dict[str, Any]) -> dict[str, Any]:
    """The stored form of a ``resourcechanged`` (an events row or a snapshot's latest change)."""
    out = _pick(row, _CHANGE_FIELDS)
    out["content_digest"] = content_digest(row)
    out["etag"] = _b64(row.get("etag"))
    return out


def _expired(valid_until: int | None, now_ns: int) -> bool:
    """§4.4/§4.9: a pending with ``valid_until != 0`` expires once ``valid_until < now``."""
    return valid_until is not None and valid_until != 0 and valid_until < now_ns


# ---------------------------------------------------------------------------------------------
# Resource aggregate (§4.4)
# ---------------------------------------------------------------------------------------------

def _change_is_stale(latest: dict[str, Any] | None, ev: dict[str, Any]) -> bool:
    """RA ``ValidateSequence`` + ``Equal`` (§4.4): True when ``ev`` must not replace ``latest``."""
    if latest is None:
        return False
    if (ev.get("connection_id") or "") == (latest.get("connection_id") or ""):
        if (ev.get("sequence") or 0) <= (latest.get("sequence") or 0):
            return True  # same connection and not a strictly newer sequence
    return (
        ev.get("status") == latest.get("status")
        and ev.get("coap_content_format") == latest.get("coap_content_format")
        and (ev.get("content_type") or "") == (latest.get("content_type") or "")
        and content_digest(ev) == latest.get("content_digest")
        and (ev.get("user_id") or "") == (latest.get("user_id") or "")
        and list(ev.get("resource_types") or []) == list(latest.get("resource_types") or [])
    )


def _remove_first(pendings: list[dict[str, Any]], correlation_id: str | None) -> bool:
    for i, pending in enumerate(pendings):
        if pending.get("correlation_id") == correlation_id:
            del pendings[i]
            return True
    return False


def _no_rule(et: str) -> NoReturn:
    """An event type of ``EVENT_TYPES`` that the rule chain of its aggregate does not handle: a
    type added to ``plgd/event_types.py`` without its fold rule here."""
    raise ValueError(f"no fold rule for event type {et!r}: every type of plgd/event_types.py EVENT_TYPES "
                     "needs one in airflow_provider_plgd/spark/fold.py")


def _apply_resource(agg: dict[str, Any], ev: dict[str, Any], et: str, stats: FoldStats) -> None:
    if ev.get("href") is not None:
        agg["href"] = ev["href"]
    if et == "resourcestatesnapshottaken":
        snap = ev.get("resource_snapshot") or {}
        latest = snap.get("latest_resource_change")
        agg["latest"] = _change(latest) if latest else None
        agg["pendings"] = {
            kind: [_pick(p, _PENDING_FIELDS) for p in (snap.get(f"{kind}_pendings") or [])]
            for kind in PENDING_KINDS
        }
        if ev.get("resource_types"):
            agg["resource_types"] = list(ev["resource_types"])
        return
    types = ev.get("resource_types")
    if et == "resourcechanged":
        if _change_is_stale(agg["latest"], ev):
            stats["stale_resourcechanged"] += 1
            return
        agg["latest"] = _change(ev)
    elif et in _PENDING_KIND:
        if _expired(ev.get("valid_until"), _ts(ev)):
            stats["expired_on_arrival"] += 1  # RA: expired at processing time -> not appended
        else:
            agg["pendings"][_PENDING_KIND[et]].append(_pick(ev, _PENDING_FIELDS))
    elif et in _CONFIRM_KIND:
        kind = _CONFIRM_KIND[et]
        if kind == "delete" and ev.get("status") in _DELETE_SUCCESS:
            agg["pendings"] = {k: [] for k in PENDING_KINDS}
        else:
            _remove_first(agg["pendings"][kind], ev.get("correlation_id"))
    else:
        _no_rule(et)
    if types:
        agg["resource_types"] = list(types)


# ---------------------------------------------------------------------------------------------
# Links aggregate (§4.5)
# ---------------------------------------------------------------------------------------------

def _apply_links(agg: dict[str, Any], ev: dict[str, Any], et: str, stats: FoldStats) -> None:
    links = agg["links"]
    stamp = {"version": ev.get("version"), "timestamp": _ts(ev)}
    if et == "resourcelinkssnapshottaken":
        agg["links"] = {r["href"]: {**r, **stamp} for r in (ev.get("resources") or [])}
    elif et == "resourcelinkspublished":
        for r in ev.get("resources") or []:
            links[r["href"]] = {**r, **stamp}
    elif et == "resourcelinksunpublished":
        hrefs = ev.get("hrefs") or []
        if not hrefs:
            links.clear()  # replaying an empty unpublish removes all links (§4.5)
        for href in hrefs:
            links.pop(href, None)
    else:
        _no_rule(et)


# ---------------------------------------------------------------------------------------------
# Device-metadata aggregate (§4.6)
# ---------------------------------------------------------------------------------------------

def _md_equal(a: dict[str, Any] | None, b: dict[str, Any]) -> bool:
    if a is None:
        return False
    return all(a.get(f) == b.get(f) for f in ("connection", "twin_enabled", "twin_synchronization"))


def _apply_metadata(agg: dict[str, Any], ev: dict[str, Any], et: str, stats: FoldStats) -> None:
    if et == "devicemetadatasnapshottaken":
        snap = ev.get("metadata_snapshot") or {}
        upd = snap.get("device_metadata_updated")
        agg["updated"] = _pick(upd, _MD_UPDATED_FIELDS) if upd else None
        agg["pendings"] = [_pick(p, _MD_PENDING_FIELDS) for p in (snap.get("update_pendings") or [])]
    elif et == "devicemetadataupdatepending":
        if _expired(ev.get("valid_until"), _ts(ev)):
            stats["expired_on_arrival"] += 1
        else:
            agg["pendings"].append(_pick(ev, _MD_PENDING_FIELDS))
    elif et == "devicemetadataupdated":
        # Full state; resolves the pending with its correlation ID. A ``canceled`` event repeats
        # the previous values, so storing it changes nothing visible (§4.6).
        if ev.get("correlation_id"):
            _remove_first(agg["pendings"], ev["correlation_id"])
        new = _pick(ev, _MD_UPDATED_FIELDS)
        if not _md_equal(agg["updated"], new):
            agg["updated"] = new
    else:
        _no_rule(et)


_APPLY = {AGGREGATE_RESOURCE: _apply_resource, AGGREGATE_LINKS: _apply_links, AGGREGATE_METADATA: _apply_metadata}


# ---------------------------------------------------------------------------------------------
# Generic aggregate fold (§4.3, §4.9)
# ---------------------------------------------------------------------------------------------

def _fold_incarnation(agg: dict[str, Any], events: list[dict[str, Any]], stats: FoldStats) -> None:
    """Fold ``events`` (one aggregate, one incarnation) onto ``agg`` in (version, stream_seq) order."""
    apply = _APPLY[agg["kind"]]
    for ev in sorted(events, key=lambda e: (e.get("version") or 0, _seq(e))):
        et = ev["event_type"]
        version = ev.get("version") or 0
        stored = agg["version"]
        if EVENT_TYPES[et].snapshot:
            if stored is not None and version <= stored:
                stats["old_version"] += 1
                continue
            # A full state as of ``version``: whatever was missing before it no longer matters.
            agg["complete"], agg["missing"] = True, []
            stats["snapshots"] += 1
        else:
            if stored is not None and version <= stored:
                stats["old_version"] += 1
                continue
            expected = 0 if stored is None else stored + 1
            if version > expected:
                agg["missing"].append([expected, version - 1])
                agg["complete"] = False
                stats["gaps"] += 1
        if agg["first_version"] is None:
            agg["first_version"] = version
            agg["first_ts"] = _ts(ev)
        apply(agg, ev, et, stats)
        agg["version"] = version
        agg["last_ts"] = _ts(ev)
        agg["last_event_type"] = et
        if agg["owner_id"] is None:
            agg["owner_id"] = ev.get("owner_id")
        stats["applied"] += 1


def _fold_aggregate(
    agg: dict[str, Any] | None,
    kind: str,
    aggregate_id: str,
    device_id: str,
    events: list[dict[str, Any]],
    stats: FoldStats,
) -> dict[str, Any]:
    """Fold the events of one aggregate, splitting them into incarnations at newer version-0 events."""
    last_ts = agg["last_ts"] if agg is not None and agg["version"] is not None else None
    starts = sorted({
        _ts(e) for e in events
        if (e.get("version") or 0) == 0 and not EVENT_TYPES[e["event_type"]].snapshot
        and (last_ts is None or _ts(e) > last_ts)
    })
    if agg is None:
        agg = _new_aggregate(kind, aggregate_id, device_id)
    if not starts or (agg["version"] is None and len(starts) == 1):
        _fold_incarnation(agg, events, stats)
        return agg
    groups: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for ev in events:
        groups[bisect_right(starts, _ts(ev))].append(ev)
    for index in range(len(starts) + 1):
        if index > 0:
            if agg["version"] is not None:
                stats["incarnations"] += 1
            agg = _new_aggregate(kind, aggregate_id, device_id)
        if groups.get(index):
            _fold_incarnation(agg, groups[index], stats)
    return agg


def _fold_ra_events(state: dict[str, Any], events: list[dict[str, Any]], stats: FoldStats) -> None:
    by_aggregate: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for ev in events:
        by_aggregate[ev["aggregate_id"]].append(ev)
    aggregates = state["aggregates"]
    for aggregate_id in sorted(by_aggregate):
        evs = by_aggregate[aggregate_id]
        kind = EVENT_TYPES[evs[0]["event_type"]].aggregate
        assert kind is not None  # fold_device passes only resource-aggregate events here
        aggregates[aggregate_id] = _fold_aggregate(
            aggregates.get(aggregate_id), kind, aggregate_id, state["device_id"], evs, stats
        )


# ---------------------------------------------------------------------------------------------
# Device fold
# ---------------------------------------------------------------------------------------------

def fold_device(
    device_id: str,
    state: dict[str, Any] | None,
    events: Iterable[dict[str, Any]],
    *,
    snapshot_time_ns: int,
    stats: FoldStats | None = None,
) -> dict[str, Any]:
    """Fold the new events of one device onto its previous state.

    :param device_id: the device (``group_id`` of its resource-aggregate events; one of the
        ``device_ids`` of its identity-store events).
    :param state: the previous state (:func:`new_device_state` shape, e.g. from
        :func:`loads_state`), or None for a device never seen. It is modified in place.
    :param events: ``events`` rows of this device (any order; dicts with the
        ``schemas.EVENTS_SCHEMA`` column names; missing keys read as null). Identity-store rows
        apply to ``device_id`` whatever else their ``device_ids`` list holds. Rows of other
        devices must not be passed.
    :param snapshot_time_ns: the snapshot time (interval end), unix ns; pendings expired by then
        are dropped.
    :param stats: a :class:`FoldStats` to add counters to (optional).
    :return: the new state (the same object as ``state`` when one was given).
    :raises ValueError: if an event has an event type that is not a plgd event type.
    """
    stats = stats if stats is not None else FoldStats()
    if state is None:
        state = new_device_state(device_id)
    registrations: list[dict[str, Any]] = []
    others: list[dict[str, Any]] = []
    for ev in events:
        et = ev.get("event_type")
        info = EVENT_TYPES.get(et) if isinstance(et, str) else None
        if info is None:
            raise ValueError(f"event of device {device_id!r} has unknown event type {et!r}; "
                             f"expected one of {', '.join(EVENT_TYPES)}")
        (registrations if info.aggregate is None else others).append(ev)

    # Events of an incarnation dropped by an earlier devicesunregistered (§4.9 rule 3).
    unregistered_at = state["unregistered_at"]
    if unregistered_at is not None:
        kept = [e for e in others if _ts(e) > unregistered_at]
        stats["stale_incarnation"] += len(others) - len(kept)
        others = kept

    # Effective identity-store operations, in time order.
    latest_reg = state["registration"]["registered_at"] if state["registration"] else None
    ops: list[tuple[int, str, dict[str, Any]]] = []
    for ev in sorted(registrations, key=lambda e: (_ts(e), _seq(e))):
        ts = _ts(ev)
        if unregistered_at is not None and ts <= unregistered_at:
            stats["stale_registration"] += 1
            continue
        if ev["event_type"] == DEVICES_REGISTERED:
            latest_reg = ts if latest_reg is None else max(latest_reg, ts)
            ops.append((ts, DEVICES_REGISTERED, ev))
        elif ev["event_type"] == DEVICES_UNREGISTERED:
            if latest_reg is not None and ts < latest_reg:
                stats["stale_registration"] += 1  # an unregistration older than the registration
                continue
            unregistered_at = ts
            ops.append((ts, DEVICES_UNREGISTERED, ev))
        else:
            _no_rule(ev["event_type"])
    boundaries = [ts for ts, et, _ in ops if et == DEVICES_UNREGISTERED]

    # RA events up to and including an unregistration time belong to the incarnation it drops.
    segments: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for ev in others:
        segments[bisect_left(boundaries, _ts(ev))].append(ev)
    op_index = 0
    for segment in range(len(boundaries) + 1):
        if segments.get(segment):
            _fold_ra_events(state, segments[segment], stats)
        while op_index < len(ops):
            ts, et, ev = ops[op_index]
            op_index += 1
            if et == DEVICES_REGISTERED:
                # the latest registration wins (ops are in time order)
                state["registration"] = {
                    "owner_id": ev.get("owner_id"),
                    "owner": ev.get("registration_owner"),
                    "registered_at": ts,
                }
            else:
                state["aggregates"] = {}
                state["registration"] = None
                state["unregistered_at"] = ts
                stats["unregistered"] += 1
                break  # the next segment starts after this unregistration
    expire_pendings(state, snapshot_time_ns, stats)
    return state


# ---------------------------------------------------------------------------------------------
# Snapshot-time expiry
# ---------------------------------------------------------------------------------------------

def expire_pendings(state: dict[str, Any], snapshot_time_ns: int, stats: FoldStats | None = None) -> bool:
    """Drop pendings with ``valid_until != 0 and valid_until < snapshot_time_ns`` (§4.9 rules 4, 6).

    :return: True if anything was dropped. The state is modified in place.
    """
    dropped = 0
    for agg in state["aggregates"].values():
        if agg["kind"] == AGGREGATE_RESOURCE:
            for kind, pendings in agg["pendings"].items():
                kept = [p for p in pendings if not _expired(p.get("valid_until"), snapshot_time_ns)]
                dropped += len(pendings) - len(kept)
                agg["pendings"][kind] = kept
        elif agg["kind"] == AGGREGATE_METADATA:
            kept = [p for p in agg["pendings"] if not _expired(p.get("valid_until"), snapshot_time_ns)]
            dropped += len(agg["pendings"]) - len(kept)
            agg["pendings"] = kept
    if stats is not None and dropped:
        stats["expired_pendings"] += dropped
    return bool(dropped)


def next_expiry(state: dict[str, Any]) -> int | None:
    """The smallest non-zero ``valid_until`` (unix ns) among the device's open pendings, or None.

    The rebuild records it per device and per bucket, so a later snapshot rewrites a bucket whose
    pendings expire even when no new event touches it.
    """
    best = None
    for agg in state["aggregates"].values():
        if agg["kind"] == AGGREGATE_RESOURCE:
            lists = agg["pendings"].values()
        elif agg["kind"] == AGGREGATE_METADATA:
            lists = (agg["pendings"],)
        else:
            continue
        for pendings in lists:
            for p in pendings:
                vu = p.get("valid_until")
                if vu and (best is None or vu < best):
                    best = vu
    return best


# ---------------------------------------------------------------------------------------------
# Snapshot rows (docs/data-contracts.md "Snapshot tables"; columns: airflow_provider_plgd/plgd/tables.py)
# ---------------------------------------------------------------------------------------------

def _tail(agg: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": agg["version"],
        "timestamp": agg["last_ts"],
        "complete": agg["complete"],
        "missing_versions": [{"first": a, "last": b} for a, b in agg["missing"]],
    }


def _open_pendings(pendings: list[dict[str, Any]], snapshot_time_ns: int) -> list[dict[str, Any]]:
    return [p for p in pendings if not _expired(p.get("valid_until"), snapshot_time_ns)]


def _resource_row(agg: dict[str, Any], device_id: str, t: int) -> dict[str, Any]:
    latest = agg["latest"] or {}
    row = {
        "owner_id": agg["owner_id"],
        "device_id": device_id,
        "href": agg["href"],
        "aggregate_id": agg["aggregate_id"],
        "resource_types": list(agg["resource_types"] or []),
        "status": latest.get("status"),
        "content_type": latest.get("content_type"),
        "coap_content_format": latest.get("coap_content_format"),
        "content_json": latest.get("content_json"),
        "etag": latest.get("etag"),
    }
    for kind in PENDING_KINDS:
        row[f"{kind}_pendings"] = [
            {"correlation_id": p.get("correlation_id"), "valid_until": p.get("valid_until") or 0,
             "version": p.get("version"), "timestamp": p.get("timestamp")}
            for p in _open_pendings(agg["pendings"][kind], t)
        ]
    row.update(_tail(agg))
    return row


def _metadata_row(agg: dict[str, Any], device_id: str, t: int) -> dict[str, Any]:
    upd = agg["updated"]
    row: dict[str, Any] = {
        "owner_id": agg["owner_id"],
        "device_id": device_id,
        "aggregate_id": agg["aggregate_id"],
        "connection_status": None,
        "connection_id": None,
        "connected_at": None,
        "connection_protocol": None,
        "service_id": None,
        "local_endpoints": None,
        "twin_enabled": True,  # the RA model's default before any update (§4.6)
        "twin_synchronization_state": None,
        "twin_syncing_at": None,
        "twin_in_sync_at": None,
        "twin_force_synchronization_at": None,
    }
    if upd is not None:
        conn = upd.get("connection") or {}
        twin = upd.get("twin_synchronization") or {}
        row.update(
            connection_status=conn.get("status"),
            connection_id=conn.get("id"),
            connected_at=conn.get("connected_at"),
            connection_protocol=conn.get("protocol"),
            service_id=conn.get("service_id"),
            local_endpoints=list(conn.get("local_endpoints") or []),
            twin_enabled=bool(upd.get("twin_enabled")),
            twin_synchronization_state=twin.get("state"),
            twin_syncing_at=twin.get("syncing_at"),
            twin_in_sync_at=twin.get("in_sync_at"),
            twin_force_synchronization_at=twin.get("force_synchronization_at"),
        )
    row["update_pendings"] = [
        {
            "correlation_id": p.get("correlation_id"),
            "twin_enabled": p.get("update_pending_value") if p.get("update_pending") == "twin_enabled" else None,
            "twin_force_synchronization": (
                p.get("update_pending_value") if p.get("update_pending") == "twin_force_synchronization" else None
            ),
            "valid_until": p.get("valid_until") or 0,
            "version": p.get("version"),
            "timestamp": p.get("timestamp"),
        }
        for p in _open_pendings(agg["pendings"], t)
    ]
    row.update(_tail(agg))
    return row


def _link_rows(agg: dict[str, Any], device_id: str) -> list[dict[str, Any]]:
    tail = _tail(agg)
    rows = []
    for href in sorted(agg["links"]):
        link = agg["links"][href]
        rows.append({
            "owner_id": agg["owner_id"],
            "device_id": device_id,
            "href": href,
            "aggregate_id": agg["aggregate_id"],
            "resource_types": list(link.get("resource_types") or []),
            "interfaces": list(link.get("interfaces") or []),
            "anchor": link.get("anchor") or "",
            "title": link.get("title") or "",
            "supported_content_types": list(link.get("supported_content_types") or []),
            "valid_until": link.get("valid_until") or 0,
            "policy_bit_flags": link.get("bit_flags") or 0,
            "endpoint_informations": [
                {"endpoint": e.get("endpoint"), "priority": e.get("priority")}
                for e in (link.get("endpoint_informations") or [])
            ],
            "version": link.get("version"),
            "timestamp": link.get("timestamp"),
            "complete": tail["complete"],
            "missing_versions": tail["missing_versions"],
        })
    return rows


#: The snapshot tables :func:`device_rows` produces, in the order of ``plgd.tables.SNAPSHOT_TABLES``.
SNAPSHOT_TABLE_NAMES: tuple[str, ...] = tuple(SNAPSHOT_TABLES)


def device_rows(state: dict[str, Any], snapshot_time_ns: int) -> dict[str, list[dict[str, Any]]]:
    """The rows of the four snapshot tables that one device state contributes.

    Columns exactly as ``docs/data-contracts.md`` "Snapshot tables"
    (``airflow_provider_plgd.plgd.tables.SNAPSHOT_TABLES``): ``resources`` (one row per
    resource aggregate), ``device_metadata`` (one row if the metadata aggregate exists),
    ``device_links`` (one row per published href; ``version``/``timestamp`` of the event that
    last published the link, ``complete``/``missing_versions`` of the links aggregate),
    ``owner_devices`` (one row while the device is registered). Enums are proto names, bytes
    (``etag``) standard base64 text, times unix ns. Pendings expired at ``snapshot_time_ns`` are
    left out. A tombstone (unregistered device) has no rows.

    :return: ``{table: [row dict]}`` for every table of :data:`SNAPSHOT_TABLE_NAMES`.
    """
    device_id = state["device_id"]
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in SNAPSHOT_TABLE_NAMES}
    for aggregate_id in sorted(state["aggregates"]):
        agg = state["aggregates"][aggregate_id]
        if agg["version"] is None:
            continue
        if agg["kind"] == AGGREGATE_RESOURCE:
            out["resources"].append(_resource_row(agg, device_id, snapshot_time_ns))
        elif agg["kind"] == AGGREGATE_METADATA:
            out["device_metadata"].append(_metadata_row(agg, device_id, snapshot_time_ns))
        else:
            out["device_links"].extend(_link_rows(agg, device_id))
    reg = state["registration"]
    if reg is not None:
        out["owner_devices"].append({
            "owner_id": reg["owner_id"],
            "owner": reg["owner"] or "",
            "device_id": device_id,
            "registered_at": reg["registered_at"],
        })
    return out


# ---------------------------------------------------------------------------------------------
# Arrow glue for Spark's grouped UDFs (pyarrow imported lazily; still no Spark)
# ---------------------------------------------------------------------------------------------

#: Name of the internal state table in :func:`fold_output_schema` (``snapshot_store.STATE_TABLE``).
STATE_TABLE_NAME = "_device_state"


def fold_output_schema(table_schemas: Mapping[str, Any]):
    """Arrow schema of :func:`fold_bucket_arrow`'s result: one row per output row of any table.

    Columns: ``bucket`` int32, ``table`` string (a key of ``table_schemas``, or ``"_stats"``),
    ``device_id`` string, then one nullable struct column per table (named like the table, with
    that table's columns; set only on that table's rows), then ``stats_json`` string (set only on
    the one ``_stats`` row: :class:`FoldStats` as JSON).

    :param table_schemas: ``{table name: pyarrow.Schema}`` including :data:`STATE_TABLE_NAME`.
    """
    import pyarrow as pa

    fields = [pa.field("bucket", pa.int32()), pa.field("table", pa.string()), pa.field("device_id", pa.string())]
    fields += [pa.field(name, pa.struct(list(schema))) for name, schema in table_schemas.items()]
    fields.append(pa.field("stats_json", pa.string()))
    return pa.schema(fields)


def fold_bucket_arrow(
    events,
    states,
    *,
    snapshot_time_ns: int,
    table_schemas: Mapping[str, Any],
    bucket_column: str = "_bucket",
    device_column: str = "_device",
    bucket: int | None = None,
):
    """Fold one bucket: new events + previous states of the touched devices -> output rows.

    Called once per touched bucket by :func:`airflow_provider_plgd.spark.snapshot_store.rebuild_bucket` (inside the
    rebuild's reduce tasks, ``RDD.mapPartitions``); the unit tests call it directly.

    :param events: ``pyarrow.Table`` of ``events`` rows of this bucket, plus ``bucket_column``
        (int) and ``device_column`` (the device the row applies to: ``device_id``/``group_id``,
        or one of an identity-store row's ``device_ids``, exploded one row per device).
    :param states: ``pyarrow.Table`` of ``_device_state`` rows (``device_id``, ``next_expiry_ns``,
        ``state_json``) plus ``bucket_column``: the previous state of every device to refold
        (devices with new events, and devices whose pendings expire by ``snapshot_time_ns``).
    :param snapshot_time_ns: snapshot time (unix ns).
    :param table_schemas: as for :func:`fold_output_schema`.
    :param bucket: the bucket number (default: read from ``bucket_column`` of the first row).
    :return: a ``pyarrow.Table`` with :func:`fold_output_schema` ``(table_schemas)``: for every
        device in either input, one ``_device_state`` row and its rows of each snapshot table
        (:func:`device_rows`), plus one ``_stats`` row.
    :raises ValueError: a state that does not load, or an unknown event type.
    """
    import pyarrow as pa

    out_schema = fold_output_schema(table_schemas)
    if not events.num_rows and not states.num_rows:
        return out_schema.empty_table()
    if bucket is None:
        source = events if events.num_rows else states
        bucket = source.column(bucket_column)[0].as_py()
    import pyarrow.compute as pc

    by_device: dict[str, list[dict[str, Any]]] = defaultdict(list)
    if events.num_rows:
        kinds = events.column("event_type")
        present = set(events.column_names)
        for et in pc.unique(kinds).to_pylist():
            wanted = BASE_COLUMNS + COLUMNS_BY_EVENT_TYPE.get(et, tuple(events.column_names)) + (device_column,)
            part = events.filter(pc.equal(kinds, et)).select([c for c in dict.fromkeys(wanted) if c in present])
            for row in part.to_pylist():
                by_device[row[device_column]].append(row)
    previous = dict(zip(states.column("device_id").to_pylist(), states.column("state_json").to_pylist()))
    stats = FoldStats()
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in table_schemas}
    for device_id in sorted(set(by_device) | set(previous)):
        text = previous.get(device_id)
        state = loads_state(text) if text is not None else None
        state = fold_device(device_id, state, by_device.get(device_id, ()), snapshot_time_ns=snapshot_time_ns,
                            stats=stats)
        stats["devices"] += 1
        rows[STATE_TABLE_NAME].append(
            {"device_id": device_id, "next_expiry_ns": next_expiry(state), "state_json": dumps_state(state)}
        )
        for name, table_rows in device_rows(state, snapshot_time_ns).items():
            rows[name].extend(table_rows)
    parts = []
    for name, schema in table_schemas.items():
        n = len(rows[name])
        if not n:
            continue
        data = pa.Table.from_pylist(rows[name], schema=schema).combine_chunks()
        columns = {
            "bucket": pa.array([bucket] * n, pa.int32()),
            "table": pa.array([name] * n, pa.string()),
            "device_id": data.column("device_id"),
        }
        for other in table_schemas:
            field = out_schema.field(other)
            if other == name:
                columns[other] = pa.StructArray.from_arrays(
                    [data.column(c).chunk(0) if data.column(c).num_chunks else pa.array([], f.type)
                     for c, f in zip(schema.names, schema)],
                    fields=list(schema),
                )
            else:
                columns[other] = pa.nulls(n, field.type)
        columns["stats_json"] = pa.nulls(n, pa.string())
        parts.append(pa.table(columns, schema=out_schema))
    stats_row = {name: pa.nulls(1, out_schema.field(name).type) for name in table_schemas}
    parts.append(pa.table({
        "bucket": pa.array([bucket], pa.int32()),
        "table": pa.array(["_stats"]),
        "device_id": pa.nulls(1, pa.string()),
        **stats_row,
        "stats_json": pa.array([json.dumps(dict(stats), sort_keys=True)]),
    }, schema=out_schema))
    return pa.concat_tables(parts)
