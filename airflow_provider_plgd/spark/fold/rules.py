"""The fold rules per aggregate kind: how one event changes one aggregate's state.

Resources (§4.4), links (§4.5) and device metadata (§4.6) of ``docs/wire-format.md``; the order in
which events reach these rules (versions, gaps, incarnations, registrations) is
:mod:`airflow_provider_plgd.spark.fold.device`. An event type of ``EVENT_TYPES`` that the chain of
its aggregate kind does not handle raises ``ValueError`` ("no fold rule for event type ...").
"""

from __future__ import annotations

from typing import Any, NoReturn

from airflow_provider_plgd.plgd.event_types import AGGREGATE_LINKS, AGGREGATE_METADATA, AGGREGATE_RESOURCE
from airflow_provider_plgd.spark.fold.state import (
    _MD_PENDING_FIELDS,
    _MD_UPDATED_FIELDS,
    _PENDING_FIELDS,
    PENDING_KINDS,
    FoldStats,
    _change,
    _expired,
    _pick,
    _ts,
    content_digest,
)

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

#: ``resourcedeleted`` statuses that clear all pendings (RA model, §4.4).
_DELETE_SUCCESS = frozenset({"OK", "ACCEPTED"})


# ---------------------------------------------------------------------------------------------
# Resource aggregate (§4.4)
# ---------------------------------------------------------------------------------------------


def _change_is_stale(latest: dict[str, Any] | None, ev: dict[str, Any]) -> bool:
    """RA ``ValidateSequence`` + ``Equal`` (§4.4): True when ``ev`` must not replace ``latest``."""
    if latest is None:
        return False
    if ((ev.get("connection_id") or "") == (latest.get("connection_id") or "")
            and (ev.get("sequence") or 0) <= (latest.get("sequence") or 0)):
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
                     "needs one in airflow_provider_plgd/spark/fold/rules.py")


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
