"""The device state of the fold: its shape, its JSON form, the stored form of values, the
counters, and what the snapshot time does to it (expiry of pendings).

A device state is a dict of JSON types only (:func:`new_device_state`; :func:`dumps_state` /
:func:`loads_state` round-trip it): content bytes are kept as a digest, etags as base64 text.
Times are unix **nanoseconds** (``int``). Semantics: ``docs/wire-format.md`` §4 and §4.9.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

from airflow_provider_plgd.plgd.event_types import AGGREGATE_LINKS, AGGREGATE_METADATA, AGGREGATE_RESOURCE

#: Format version of the serialised device state; bump when its shape changes incompatibly.
STATE_FORMAT_VERSION = 1

DEVICES_REGISTERED = "devicesregistered"
DEVICES_UNREGISTERED = "devicesunregistered"

PENDING_KINDS = ("create", "retrieve", "update", "delete")

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
