"""Pure batch decoder: Arrow ``RecordBatch`` of staging rows -> ``RecordBatch`` of decoded rows.

No SparkSession is needed: the decode app's tasks (``spark/decode_job.py``, a plain
``RDD.mapPartitions``) call :func:`decode_batch_parts` per staging batch; unit tests and
``bench/bench_decode.py`` call :func:`decode_batch` directly.

Input columns (the staging contract, ``airflow_provider_plgd.tables.staging``; extra columns are ignored):
``stream`` string, ``stream_seq`` int64, ``subject`` string, ``published_at`` timestamp[us, UTC],
``msg_id`` string (the ``Nats-Msg-Id`` header) or null, ``headers`` map<string,string> or null
(optional column), ``data`` binary (the NATS payload).

Output: ``airflow_provider_plgd.spark.schemas.UNION_SCHEMA`` -- every ``events`` column plus the quarantine-only
columns. Exactly one output row per input row:

* decoded rows: ``reason`` is null; the typed columns are filled per event type (see
  ``docs/events.md``); ``msg_id`` is :func:`airflow_provider_plgd.plgd.msgid.message_id`
  (header wins).
* rows that do not decode: ``reason`` is the ``PlgdDecodeError.reason`` (``bad_snappy``,
  ``bad_protobuf``, ``unknown_event_type``, ``bad_subject``, ``subject_mismatch``,
  ``content_too_large``), ``detail`` its message, ``stage`` = ``"decode"``; the raw staging columns are copied unchanged (``msg_id`` =
  the raw header value); the typed columns are null. An unexpected non-codec exception while
  decoding one payload is quarantined with reason ``internal_error`` instead of failing the job.

Decode bombs: ``max_content_bytes`` (default ``codec.DEFAULT_MAX_DECODED_BYTES``, 4 MiB) caps the
snappy-decompressed size of each event, and so of its resource content; a payload whose snappy
header declares more is quarantined as ``content_too_large`` without being decompressed (its raw
``data`` is kept like every quarantined row's).

Rows are grouped by event type inside a batch (output order differs from input order).
How: decode every payload once (``codec.decode_payload``), group the decoded messages by
message class, then build each output column as a Python list with a list comprehension over
the group and convert it with ``pa.array(values, type)`` -- no per-row dicts, no pandas.
Columns an event type does not have are ``pa.nulls``. Source of the fields: docs/wire-format.md §2, §3.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_plgd.plgd import codec, content, msgid, subjects
from airflow_provider_plgd.plgd.pb import resourceaggregate_pb2 as _ra

from airflow_provider_plgd.spark import schemas as S

STAGE = "decode"
#: Default cap on one event's decoded size (bytes): ``codec.DEFAULT_MAX_DECODED_BYTES``, 4 MiB.
DEFAULT_MAX_CONTENT_BYTES = codec.DEFAULT_MAX_DECODED_BYTES
#: Reason used when decoding one payload raised something other than ``PlgdDecodeError``
#: (a bug); the row is quarantined, not dropped, and the job goes on.
INTERNAL_ERROR = "internal_error"

_STR = pa.string()
_I64 = pa.int64()
_I32 = pa.int32()
_BIN = pa.binary()
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
    return pa.array([table.get(v) or str(v) for v in values], _STR)


def _u64(values: Sequence[int]) -> pa.Array:
    """uint64 wire values -> int64 (values above 2**63-1 wrap, see schemas.py)."""
    return pa.array(values, pa.uint64()).cast(_I64, safe=False)


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

def _message_columns(msgs: list, desc) -> dict[str, pa.Array]:
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
            out["version"] = _u64([e.version for e in ems])
            out["timestamp"] = pa.array([e.timestamp for e in ems], _I64)
            out["connection_id"] = pa.array([e.connection_id for e in ems], _STR)
            out["sequence"] = _u64([e.sequence for e in ems])
        out["hub_id"] = pa.array([e.hub_id for e in ems], _STR)
    if "timestamp" in f:  # identity-store events carry the time at the top level
        out["timestamp"] = pa.array([m.timestamp for m in msgs], _I64)
    if "audit_context" in f:
        acs = [m.audit_context for m in msgs]
        af = f["audit_context"].message_type.fields_by_name
        out["user_id"] = pa.array([a.user_id for a in acs], _STR)
        if "correlation_id" in af:
            out["correlation_id"] = pa.array([a.correlation_id for a in acs], _STR)
        if "owner" in af:
            out["owner"] = pa.array([a.owner for a in acs], _STR)
    if "resource_id" in f:
        out["href"] = pa.array([m.resource_id.href for m in msgs], _STR)
    if "resource_types" in f:
        out["resource_types"] = pa.array([list(m.resource_types) for m in msgs], _STR_LIST)
    if "status" in f:
        out["status"] = _names([m.status for m in msgs], _STATUS)
    if "resource_interface" in f:
        out["resource_interface"] = pa.array([m.resource_interface for m in msgs], _STR)
    if "valid_until" in f:
        out["valid_until"] = pa.array([m.valid_until for m in msgs], _I64)
    if "etag" in f:
        if f["etag"].is_repeated:
            out["etags"] = pa.array([list(m.etag) for m in msgs], _BIN_LIST)
        else:
            out["etag"] = pa.array([m.etag for m in msgs], _BIN)
    if "content" in f:
        cs = [m.content for m in msgs]
        types = [c.content_type for c in cs]
        formats = [c.coap_content_format for c in cs]
        datas = [c.data for c in cs]
        out["content_type"] = pa.array(types, _STR)
        out["coap_content_format"] = pa.array(formats, _I32)
        out["content_data"] = pa.array(datas, _BIN)
        to_json = content.content_to_json
        out["content_json"] = pa.array(
            [to_json(d, t, c) for d, t, c in zip(datas, types, formats)], _STR
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
        out["update_pending"] = pa.array(which, _STR)
        out["update_pending_value"] = pa.array(
            [None if w is None else getattr(m, w) for m, w in zip(msgs, which)], _BOOL
        )
    if "owner" in f:  # identity store: raw owner claim
        out["registration_owner"] = pa.array([m.owner for m in msgs], _STR)
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
        [pa.array([e.endpoint for e in eps], _STR), _u64([e.priority for e in eps])],
        fields=list(S.ENDPOINT_INFORMATION_TYPE),
    )
    cols = {
        "href": pa.array([r.href for r in flat], _STR),
        "device_id": pa.array([r.device_id for r in flat], _STR),
        "resource_types": pa.array([list(r.resource_types) for r in flat], _STR_LIST),
        "interfaces": pa.array([list(r.interfaces) for r in flat], _STR_LIST),
        "anchor": pa.array([r.anchor for r in flat], _STR),
        "title": pa.array([r.title for r in flat], _STR),
        "supported_content_types": pa.array([list(r.supported_content_types) for r in flat], _STR_LIST),
        "valid_until": pa.array([r.valid_until for r in flat], _I64),
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
        "id": pa.array([c.id for c in conns], _STR),
        "connected_at": pa.array([c.connected_at for c in conns], _I64),
        "protocol": _names([c.protocol for c in conns], _PROTOCOL),
        "service_id": pa.array([c.service_id for c in conns], _STR),
        "local_endpoints": pa.array([list(c.local_endpoints) for c in conns], _STR_LIST),
    }
    return _struct(cols, len(conns), S.CONNECTION_TYPE)


def _twin_syncs(tss: list) -> pa.StructArray:
    cms = [t.command_metadata for t in tss]
    cols = {
        "state": _names([t.state for t in tss], _TWIN_STATE),
        "syncing_at": pa.array([t.syncing_at for t in tss], _I64),
        "in_sync_at": pa.array([t.in_sync_at for t in tss], _I64),
        "command_connection_id": pa.array([c.connection_id for c in cms], _STR),
        "command_sequence": _u64([c.sequence for c in cms]),
        "force_synchronization_at": pa.array([t.force_synchronization_at for t in tss], _I64),
    }
    return _struct(cols, len(tss), S.TWIN_SYNCHRONIZATION_TYPE)


def _nested_list(per_row: list, desc, struct_type: pa.StructType) -> pa.Array:
    """Per row, a repeated message field -> ``list<struct_type>`` (columns via _message_columns)."""
    flat, offsets = _flatten(per_row)
    struct = _struct(_message_columns(flat, desc), len(flat), struct_type)
    return _list_array(struct, offsets, pa.list_(struct_type))


def _resource_snapshots(msgs: list, desc) -> pa.StructArray:
    """``ResourceStateSnapshotTaken`` payload -> ``RESOURCE_SNAPSHOT_TYPE`` (latest change + pendings)."""
    f = desc.fields_by_name
    latest = [m.latest_resource_change for m in msgs]
    missing = [not m.HasField("latest_resource_change") for m in msgs]
    latest_struct = _struct(
        _message_columns(latest, f["latest_resource_change"].message_type),
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
        _message_columns(dmu, f["device_metadata_updated"].message_type),
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


# ---------------------------------------------------------------------------------------------
# Batch driver
# ---------------------------------------------------------------------------------------------

_SUBJECT_CACHE: dict[str, Any] = {}
_SUBJECT_CACHE_MAX = 200_000


def _parse_subject(subject: str | None):
    """Parsed ``Subject`` (cached; subjects repeat per resource and event type) or the error."""
    if subject is None:
        return codec.PlgdDecodeError("bad_subject", "subject is null; expected plgd.owners.{owner}...")
    hit = _SUBJECT_CACHE.get(subject)
    if hit is not None:
        return hit
    try:  # event type checks are left to the codec (it reports unknown_event_type separately)
        hit = subjects.parse_subject(subject, check_event_type=False)
    except (ValueError, TypeError) as err:
        hit = codec.PlgdDecodeError("bad_subject", str(err))
    if len(_SUBJECT_CACHE) >= _SUBJECT_CACHE_MAX:
        _SUBJECT_CACHE.clear()
    _SUBJECT_CACHE[subject] = hit
    return hit


def _column_or_nulls(batch: pa.RecordBatch, name: str, typ: pa.DataType) -> pa.Array:
    idx = batch.schema.get_field_index(name)
    if idx < 0:
        return pa.nulls(batch.num_rows, typ)
    col = batch.column(idx)
    return col if col.type == typ else col.cast(typ)


_HEADERS_TYPE = S.UNION_SCHEMA.field("headers").type


def _headers(batch: pa.RecordBatch, take: pa.Array) -> pa.Array:
    """The ``headers`` of the rows ``take`` (nulls without a ``headers`` column)."""
    return _column_or_nulls(batch, "headers", _HEADERS_TYPE).take(take)


def _assemble(cols: dict[str, pa.Array], n: int) -> pa.RecordBatch:
    arrays = [
        cols[f.name] if f.name in cols else pa.nulls(n, f.type) for f in S.UNION_SCHEMA
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=S.UNION_SCHEMA)


def decode_batch_parts(
    batch: pa.RecordBatch, interval_id: str | None, *, max_content_bytes: int | None = DEFAULT_MAX_CONTENT_BYTES,
) -> list[pa.RecordBatch]:
    """Decode one staging batch into one ``UNION_SCHEMA`` batch per event type (+ one quarantine batch).

    :param batch: staging rows (columns listed in the module docstring).
    :param interval_id: the staging interval ID, copied into ``interval_id``.
    :param max_content_bytes: cap on each event's decoded (snappy-decompressed) size in bytes;
        over it the row is quarantined as ``content_too_large`` (None = no cap).
    :return: batches whose row counts sum to ``batch.num_rows``; empty list for an empty batch.
    :raises KeyError: if ``subject`` or ``data`` is missing from the input batch.
    """
    n_in = batch.num_rows
    if n_in == 0:
        return []
    if "subject" not in batch.schema.names or "data" not in batch.schema.names:
        raise KeyError(f"staging batch needs 'subject' and 'data' columns, got {batch.schema.names}")
    subject_col = batch.column(batch.schema.get_field_index("subject")).to_pylist()
    data_col = batch.column(batch.schema.get_field_index("data")).to_pylist()
    header_col = _column_or_nulls(batch, "msg_id", _STR).to_pylist()

    groups: dict[Any, tuple[list, list, list]] = {}  # (event type, class) -> (row idx, Subject, Decoded)
    q_idx: list[int] = []
    q_reason: list[str] = []
    q_detail: list[str] = []
    decode = codec.decode_payload
    decode_error = codec.PlgdDecodeError
    for i, (subject, data) in enumerate(zip(subject_col, data_col)):
        parsed = _parse_subject(subject)
        if isinstance(parsed, decode_error):
            q_idx.append(i)
            q_reason.append(parsed.reason)
            q_detail.append(str(parsed))
            continue
        try:
            decoded = decode(parsed, b"" if data is None else data, max_decoded_bytes=max_content_bytes)
        except decode_error as err:
            q_idx.append(i)
            q_reason.append(err.reason)
            q_detail.append(str(err))
            continue
        except Exception as err:  # a bug, not bad data: keep the row, do not fail the job
            q_idx.append(i)
            q_reason.append(INTERNAL_ERROR)
            q_detail.append(f"{type(err).__name__}: {err}")
            continue
        key = (decoded.event_type, type(decoded.message))
        group = groups.get(key)
        if group is None:
            group = groups[key] = ([], [], [])
        group[0].append(i)
        group[1].append(parsed)
        group[2].append(decoded)

    parts: list[pa.RecordBatch] = []
    stream_col = _column_or_nulls(batch, "stream", _STR)
    seq_col = _column_or_nulls(batch, "stream_seq", _I64)
    subj_arr = _column_or_nulls(batch, "subject", _STR)
    pub_col = _column_or_nulls(batch, "published_at", S.UNION_SCHEMA.field("published_at").type)

    for (event_type, _cls), (idx, subjs, decs) in groups.items():
        n = len(idx)
        take = pa.array(idx, _I64)
        msgs = [d.message for d in decs]
        cols = _message_columns(msgs, msgs[0].DESCRIPTOR)
        envs = [d.envelope for d in decs]
        if envs[0] is not None:  # resource aggregate: envelope fields win
            versions = [e.version for e in envs]
            aggregate_ids = [e.aggregate_id for e in envs]
            cols["version"] = _u64(versions)
            cols["group_id"] = pa.array([e.group_id for e in envs], _STR)
            cols["aggregate_id"] = pa.array(aggregate_ids, _STR)
            timestamps = [m.event_metadata.timestamp for m in msgs]
        else:  # identity store: no aggregate, no version
            cols.pop("version", None)
            versions = [None] * n
            aggregate_ids = [None] * n
            timestamps = [getattr(m, "timestamp", None) for m in msgs]
        published = pub_col.take(take)
        subject_strs = [subject_col[i] for i in idx]
        message_id = msgid.message_id
        cols.update(
            stream=stream_col.take(take),
            stream_seq=seq_col.take(take),
            published_at=published,
            subject=subj_arr.take(take),
            owner_id=pa.array([s.owner_id for s in subjs], _STR),
            device_id=pa.array([s.device_id for s in subjs], _STR),
            href_id=pa.array([s.href_id for s in subjs], _STR),
            lead_resource_type=pa.array([s.lead_resource_type for s in subjs], _STR),
            event_type=pa.repeat(pa.scalar(event_type, _STR), n),
            msg_id=pa.array(
                [
                    message_id(
                        header_msg_id=header_col[i], subject=s, data=data_col[i],
                        aggregate_id=a, version=v, event_type=event_type, timestamp=t,
                    )
                    for i, s, a, v, t in zip(idx, subject_strs, aggregate_ids, versions, timestamps)
                ],
                _STR,
            ),
            interval_id=pa.repeat(pa.scalar(interval_id, _STR), n),
            date=pc.cast(published, pa.date32()),
        )
        parts.append(_assemble(cols, n))

    if q_idx:
        n = len(q_idx)
        take = pa.array(q_idx, _I64)
        cols = {
            "stream": stream_col.take(take),
            "stream_seq": seq_col.take(take),
            "subject": subj_arr.take(take),
            "published_at": pub_col.take(take),
            "msg_id": _column_or_nulls(batch, "msg_id", _STR).take(take),
            "headers": _headers(batch, take),
            "data": _column_or_nulls(batch, "data", _BIN).take(take),
            "reason": pa.array(q_reason, _STR),
            "detail": pa.array(q_detail, _STR),
            "stage": pa.repeat(pa.scalar(STAGE, _STR), n),
            "interval_id": pa.repeat(pa.scalar(interval_id, _STR), n),
        }
        parts.append(_assemble(cols, n))
    return parts


def decode_batch(
    batch: pa.RecordBatch, interval_id: str | None, *, max_content_bytes: int | None = DEFAULT_MAX_CONTENT_BYTES,
) -> pa.RecordBatch:
    """Decode one staging batch into a single ``schemas.UNION_SCHEMA`` batch (same row count).

    See the module docstring for the input columns and the output rules. Never raises on bad
    payloads (they become quarantine rows).

    :param batch: staging rows.
    :param interval_id: the staging interval ID (string, copied into ``interval_id``).
    :param max_content_bytes: as in :func:`decode_batch_parts`.
    :return: ``pa.RecordBatch`` with ``batch.num_rows`` rows, schema ``UNION_SCHEMA``.
    """
    parts = decode_batch_parts(batch, interval_id, max_content_bytes=max_content_bytes)
    if not parts:
        return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in S.UNION_SCHEMA], schema=S.UNION_SCHEMA)
    if len(parts) == 1:
        return parts[0]
    return pa.concat_batches(parts)


def decode_batches(
    batches: Iterable[pa.RecordBatch], interval_id: str, *,
    max_content_bytes: int | None = DEFAULT_MAX_CONTENT_BYTES,
) -> Iterator[pa.RecordBatch]:
    """Decode each staging batch, yield its ``UNION_SCHEMA`` parts (:func:`decode_batch_parts`
    over a stream of batches)."""
    for batch in batches:
        yield from decode_batch_parts(batch, interval_id, max_content_bytes=max_content_bytes)


def decode_message(
    subject: str, payload: bytes, *, msg_id: str | None = None, stream: str | None = None,
    stream_seq: int | None = None, published_at: Any = None, interval_id: str | None = None,
    max_content_bytes: int | None = DEFAULT_MAX_CONTENT_BYTES,
) -> dict[str, Any]:
    """Decode one plgd message (a NATS subject and its payload) into a row of the ``events`` table.

    The same code path as the decode application (:func:`decode_batch` on a one-row batch), so the
    result has exactly the ``events`` columns (``schemas.EVENTS_COLUMNS``, described in
    ``docs/events.md``) with the same values; for a notebook, a test or another DAG.

    :param subject: the NATS subject, ``plgd.owners.{owner}...`` (docs/wire-format.md §1).
    :param payload: the NATS payload (bytes): the protobuf envelope with its snappy-compressed event.
    :param msg_id: the ``Nats-Msg-Id`` header, if any (it wins as ``msg_id``; else the ID is derived).
    :param stream: ``stream_seq``, ``published_at`` (aware datetime), ``interval_id``: copied into
        the row as given (None when unknown).
    :param max_content_bytes: cap on the decoded event's size (bytes); None = no cap.
    :return: ``{column: value}`` for every ``events`` column; nested columns as dicts and lists.
    :raises airflow_provider_plgd.plgd.codec.PlgdDecodeError: the message does not decode; its
        ``reason`` is the quarantine reason the application would record (``bad_snappy``,
        ``bad_protobuf``, ``unknown_event_type``, ``bad_subject``, ``subject_mismatch``,
        ``content_too_large``).
    :raises TypeError: ``subject`` is not a str or ``payload`` not bytes.
    """
    if not isinstance(subject, str):
        raise TypeError(f"subject must be a str, got {type(subject).__name__}")
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise TypeError(f"payload must be bytes, got {type(payload).__name__}")
    batch = pa.RecordBatch.from_pydict(
        {"stream": [stream], "stream_seq": [stream_seq], "subject": [subject],
         "published_at": [published_at], "msg_id": [msg_id], "data": [bytes(payload)]},
        schema=pa.schema([("stream", _STR), ("stream_seq", _I64), ("subject", _STR),
                          S.UNION_SCHEMA.field("published_at"), ("msg_id", _STR), ("data", _BIN)]),
    )
    row = decode_batch(batch, interval_id, max_content_bytes=max_content_bytes).to_pylist()[0]
    if row["reason"] == INTERNAL_ERROR:
        raise RuntimeError(f"decoding {subject!r} failed unexpectedly: {row['detail']}")
    if row["reason"] is not None:
        raise codec.PlgdDecodeError(row["reason"], row["detail"])
    return {name: row[name] for name in S.EVENTS_COLUMNS}
