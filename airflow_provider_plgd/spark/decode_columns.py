"""Decoded plgd messages as Arrow columns: the protobuf fields of each event type (plgd's
resource-aggregate and identity-store messages, ``plgd/pb``) turned into the columns and nested
structs of the ``events`` table (``spark/schemas.py``). Used by :mod:`.decode_batch`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

from airflow_provider_plgd.plgd import content
from airflow_provider_plgd.plgd.pb import resourceaggregate_pb2 as _ra
from airflow_provider_plgd.spark import schemas as S

STR = pa.string()
I64 = pa.int64()
_I32 = pa.int32()
BIN = pa.binary()
_BOOL = pa.bool_()
_STR_LIST = pa.list_(pa.string())
_BIN_LIST = pa.list_(pa.binary())


def _enum_names(enum_descriptor) -> dict[int, str]:
    return {v.number: v.name for v in enum_descriptor.values}


_STATUS = _enum_names(_ra.Status.DESCRIPTOR)
_CONN_STATUS = _enum_names(_ra.Connection.Status.DESCRIPTOR)
_PROTOCOL = _enum_names(_ra.Connection.Protocol.DESCRIPTOR)
_TWIN_STATE = _enum_names(_ra.TwinSynchronization.State.DESCRIPTOR)


def _names(values: Sequence[int], table: dict[int, str]) -> pa.Array:
    """Enum numbers -> names; an unknown number (proto3 open enum) becomes its decimal string."""
    return pa.array([table.get(v) or str(v) for v in values], STR)


def u64_array(values: Sequence[int]) -> pa.Array:
    """uint64 wire values -> int64 (values above 2**63-1 wrap, see schemas.py)."""
    return pa.array(values, pa.uint64()).cast(I64, safe=False)


def _list_array(flat_struct: pa.Array, offsets: list[int], list_type: pa.DataType) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(offsets, _I32), flat_struct, type=list_type)


def _flatten(per_row: Iterable[Iterable[Any]]) -> tuple[list[Any], list[int]]:
    flat: list[Any] = []
    offsets = [0]
    for items in per_row:
        flat.extend(items)
        offsets.append(len(flat))
    return flat, offsets


def _struct(cols: dict[str, pa.Array], n: int, struct_type: pa.StructType, mask=None) -> pa.StructArray:
    """Assemble a struct from named child arrays; a child not in ``cols`` is all null."""
    fields = list(struct_type)
    children = [cols[f.name] if f.name in cols else pa.nulls(n, f.type) for f in fields]
    if mask is not None:
        mask = pa.array(mask, _BOOL)
    return pa.StructArray.from_arrays(children, fields=fields, mask=mask)


# ---------------------------------------------------------------------------------------------
# Generic column extraction driven by the message descriptor
# ---------------------------------------------------------------------------------------------

def message_columns(msgs: list, desc) -> dict[str, pa.Array]:
    """Build the typed columns that a protobuf message class carries, for a list of its messages.

    Column names are those of ``schemas.EVENTS_SCHEMA`` (and of the nested structs, which reuse the
    same names): EventMetadata -> version/timestamp/connection_id/sequence/hub_id; AuditContext ->
    user_id/correlation_id/owner; resource_id.href -> href; enum fields -> names; content ->
    content_type/coap_content_format/content_data/content_json; ... Fields the class does not
    have are absent from the result.
    """
    f = desc.fields_by_name
    n = len(msgs)
    out: dict[str, pa.Array] = {}

    if "event_metadata" in f:
        ems = [m.event_metadata for m in msgs]
        ef = f["event_metadata"].message_type.fields_by_name
        if "version" in ef:  # resource-aggregate EventMetadata
            out["version"] = u64_array([e.version for e in ems])
            out["timestamp"] = pa.array([e.timestamp for e in ems], I64)
            out["connection_id"] = pa.array([e.connection_id for e in ems], STR)
            out["sequence"] = u64_array([e.sequence for e in ems])
        out["hub_id"] = pa.array([e.hub_id for e in ems], STR)
    if "timestamp" in f:  # identity-store events carry the time at the top level
        out["timestamp"] = pa.array([m.timestamp for m in msgs], I64)
    if "audit_context" in f:
        acs = [m.audit_context for m in msgs]
        af = f["audit_context"].message_type.fields_by_name
        out["user_id"] = pa.array([a.user_id for a in acs], STR)
        if "correlation_id" in af:
            out["correlation_id"] = pa.array([a.correlation_id for a in acs], STR)
        if "owner" in af:
            out["owner"] = pa.array([a.owner for a in acs], STR)
    if "resource_id" in f:
        out["href"] = pa.array([m.resource_id.href for m in msgs], STR)
    if "resource_types" in f:
        out["resource_types"] = pa.array([list(m.resource_types) for m in msgs], _STR_LIST)
    if "status" in f:
        out["status"] = _names([m.status for m in msgs], _STATUS)
    if "resource_interface" in f:
        out["resource_interface"] = pa.array([m.resource_interface for m in msgs], STR)
    if "valid_until" in f:
        out["valid_until"] = pa.array([m.valid_until for m in msgs], I64)
    if "etag" in f:
        if f["etag"].is_repeated:
            out["etags"] = pa.array([list(m.etag) for m in msgs], _BIN_LIST)
        else:
            out["etag"] = pa.array([m.etag for m in msgs], BIN)
    if "content" in f:
        cs = [m.content for m in msgs]
        types = [c.content_type for c in cs]
        formats = [c.coap_content_format for c in cs]
        datas = [c.data for c in cs]
        out["content_type"] = pa.array(types, STR)
        out["coap_content_format"] = pa.array(formats, _I32)
        out["content_data"] = pa.array(datas, BIN)
        to_json = content.content_to_json
        out["content_json"] = pa.array(
            [to_json(d, t, c) for d, t, c in zip(datas, types, formats, strict=True)], STR
        )
    if "resources" in f:
        if f["resources"].message_type.GetOptions().map_entry:  # links snapshot: map href -> Resource
            per_row = [[m.resources[k] for k in sorted(m.resources)] for m in msgs]
        else:
            per_row = [m.resources for m in msgs]
        out["resources"] = _links(per_row)
    if "hrefs" in f:
        out["hrefs"] = pa.array([list(m.hrefs) for m in msgs], _STR_LIST)
    if "connection" in f:
        out["connection"] = _connections([m.connection for m in msgs])
    if "twin_enabled" in f and f["twin_enabled"].containing_oneof is None:
        out["twin_enabled"] = pa.array([m.twin_enabled for m in msgs], _BOOL)
    if "twin_synchronization" in f:
        out["twin_synchronization"] = _twin_syncs([m.twin_synchronization for m in msgs])
    if "canceled" in f:
        out["canceled"] = pa.array([m.canceled for m in msgs], _BOOL)
    if "update_pending" in desc.oneofs_by_name:
        which = [m.WhichOneof("update_pending") for m in msgs]
        out["update_pending"] = pa.array(which, STR)
        out["update_pending_value"] = pa.array(
            [None if w is None else getattr(m, w) for m, w in zip(msgs, which, strict=True)], _BOOL
        )
    if "owner" in f:  # identity store: raw owner claim
        out["registration_owner"] = pa.array([m.owner for m in msgs], STR)
    if "device_ids" in f:
        out["device_ids"] = pa.array([list(m.device_ids) for m in msgs], _STR_LIST)
    if "latest_resource_change" in f:
        out["resource_snapshot"] = _resource_snapshots(msgs, desc)
    if "device_metadata_updated" in f:
        out["metadata_snapshot"] = _metadata_snapshots(msgs, desc)
    assert all(len(a) == n for a in out.values())
    return out


def _links(per_row: list) -> pa.Array:
    """Per row, a sequence of ``Resource`` messages -> ``list<RESOURCE_LINK_TYPE>``."""
    flat, offsets = _flatten(per_row)
    eps, ep_offsets = _flatten(r.endpoint_informations for r in flat)
    ep_struct = pa.StructArray.from_arrays(
        [pa.array([e.endpoint for e in eps], STR), u64_array([e.priority for e in eps])],
        fields=list(S.ENDPOINT_INFORMATION_TYPE),
    )
    cols = {
        "href": pa.array([r.href for r in flat], STR),
        "device_id": pa.array([r.device_id for r in flat], STR),
        "resource_types": pa.array([list(r.resource_types) for r in flat], _STR_LIST),
        "interfaces": pa.array([list(r.interfaces) for r in flat], _STR_LIST),
        "anchor": pa.array([r.anchor for r in flat], STR),
        "title": pa.array([r.title for r in flat], STR),
        "supported_content_types": pa.array([list(r.supported_content_types) for r in flat], _STR_LIST),
        "valid_until": pa.array([r.valid_until for r in flat], I64),
        "bit_flags": pa.array([r.policy.bit_flags for r in flat], _I32),
        "endpoint_informations": _list_array(
            ep_struct, ep_offsets, pa.list_(S.ENDPOINT_INFORMATION_TYPE)
        ),
    }
    struct = _struct(cols, len(flat), S.RESOURCE_LINK_TYPE)
    return _list_array(struct, offsets, pa.list_(S.RESOURCE_LINK_TYPE))


def _connections(conns: list) -> pa.StructArray:
    cols = {
        "status": _names([c.status for c in conns], _CONN_STATUS),
        "id": pa.array([c.id for c in conns], STR),
        "connected_at": pa.array([c.connected_at for c in conns], I64),
        "protocol": _names([c.protocol for c in conns], _PROTOCOL),
        "service_id": pa.array([c.service_id for c in conns], STR),
        "local_endpoints": pa.array([list(c.local_endpoints) for c in conns], _STR_LIST),
    }
    return _struct(cols, len(conns), S.CONNECTION_TYPE)


def _twin_syncs(tss: list) -> pa.StructArray:
    cms = [t.command_metadata for t in tss]
    cols = {
        "state": _names([t.state for t in tss], _TWIN_STATE),
        "syncing_at": pa.array([t.syncing_at for t in tss], I64),
        "in_sync_at": pa.array([t.in_sync_at for t in tss], I64),
        "command_connection_id": pa.array([c.connection_id for c in cms], STR),
        "command_sequence": u64_array([c.sequence for c in cms]),
        "force_synchronization_at": pa.array([t.force_synchronization_at for t in tss], I64),
    }
    return _struct(cols, len(tss), S.TWIN_SYNCHRONIZATION_TYPE)


def _nested_list(per_row: list, desc, struct_type: pa.StructType) -> pa.Array:
    """Per row, a repeated message field -> ``list<struct_type>`` (columns via message_columns)."""
    flat, offsets = _flatten(per_row)
    struct = _struct(message_columns(flat, desc), len(flat), struct_type)
    return _list_array(struct, offsets, pa.list_(struct_type))


def _resource_snapshots(msgs: list, desc) -> pa.StructArray:
    """``ResourceStateSnapshotTaken`` payload -> ``RESOURCE_SNAPSHOT_TYPE`` (latest change + pendings)."""
    f = desc.fields_by_name
    latest = [m.latest_resource_change for m in msgs]
    missing = [not m.HasField("latest_resource_change") for m in msgs]
    latest_struct = _struct(
        message_columns(latest, f["latest_resource_change"].message_type),
        len(msgs), S.RESOURCE_CHANGE_TYPE, mask=missing if any(missing) else None,
    )
    cols = {"latest_resource_change": latest_struct}
    for kind in ("create", "retrieve", "update", "delete"):
        field = f"resource_{kind}_pendings"
        cols[f"{kind}_pendings"] = _nested_list(
            [getattr(m, field) for m in msgs], f[field].message_type, S.RESOURCE_PENDING_TYPE
        )
    return _struct(cols, len(msgs), S.RESOURCE_SNAPSHOT_TYPE)


def _metadata_snapshots(msgs: list, desc) -> pa.StructArray:
    """``DeviceMetadataSnapshotTaken`` payload -> ``METADATA_SNAPSHOT_TYPE``."""
    f = desc.fields_by_name
    dmu = [m.device_metadata_updated for m in msgs]
    missing = [not m.HasField("device_metadata_updated") for m in msgs]
    dmu_struct = _struct(
        message_columns(dmu, f["device_metadata_updated"].message_type),
        len(msgs), S.DEVICE_METADATA_UPDATED_TYPE, mask=missing if any(missing) else None,
    )
    pendings = _nested_list(
        [m.update_pendings for m in msgs], f["update_pendings"].message_type,
        S.DEVICE_METADATA_PENDING_TYPE,
    )
    return _struct(
        {"device_metadata_updated": dmu_struct, "update_pendings": pendings},
        len(msgs), S.METADATA_SNAPSHOT_TYPE,
    )
