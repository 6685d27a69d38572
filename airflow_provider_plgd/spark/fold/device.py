"""The fold of one device: its new events in the right order onto its previous state.

Per aggregate: events in (``version``, ``stream_seq``) order, gaps recorded, old-hub snapshots,
incarnations split at newer version-0 events (§4.3, §4.9 rules 1, 3, 7, 8); per device: the
identity-store events (registrations, unregistrations that drop all state) interleaved in time
with the resource-aggregate events; at the end, pendings expired at the snapshot time are
dropped. Each event goes to the rule of its aggregate kind (:mod:`~airflow_provider_plgd.spark.fold.rules`).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from airflow_provider_plgd.plgd.event_types import EVENT_TYPES
from airflow_provider_plgd.spark.fold.rules import _APPLY, _no_rule
from airflow_provider_plgd.spark.fold.state import (
    DEVICES_REGISTERED,
    DEVICES_UNREGISTERED,
    FoldStats,
    _new_aggregate,
    _seq,
    _ts,
    expire_pendings,
    new_device_state,
)

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
