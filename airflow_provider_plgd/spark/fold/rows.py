"""The fold's output: the snapshot-table rows of one device state (``docs/data-contracts.md``
"Snapshot tables"; columns: ``airflow_provider_plgd/plgd/tables.py``)."""

from __future__ import annotations

from typing import Any

from airflow_provider_plgd.plgd.event_types import AGGREGATE_METADATA, AGGREGATE_RESOURCE
from airflow_provider_plgd.plgd.tables import SNAPSHOT_TABLES
from airflow_provider_plgd.spark.fold.state import PENDING_KINDS, _expired


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
