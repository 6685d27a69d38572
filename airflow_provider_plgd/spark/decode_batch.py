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

from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_plgd.plgd import codec, msgid, subjects
from airflow_provider_plgd.spark import schemas as S
from airflow_provider_plgd.spark.decode_columns import BIN, I64, STR, message_columns, u64_array

STAGE = "decode"
#: Default cap on one event's decoded size (bytes): ``codec.DEFAULT_MAX_DECODED_BYTES``, 4 MiB.
DEFAULT_MAX_CONTENT_BYTES = codec.DEFAULT_MAX_DECODED_BYTES
#: Reason used when decoding one payload raised something other than ``PlgdDecodeError``
#: (a bug); the row is quarantined, not dropped, and the job goes on.
INTERNAL_ERROR = "internal_error"


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
    header_col = _column_or_nulls(batch, "msg_id", STR).to_pylist()

    groups: dict[Any, tuple[list, list, list]] = {}  # (event type, class) -> (row idx, Subject, Decoded)
    q_idx: list[int] = []
    q_reason: list[str] = []
    q_detail: list[str] = []
    decode = codec.decode_payload
    decode_error = codec.PlgdDecodeError
    for i, (subject, data) in enumerate(zip(subject_col, data_col, strict=True)):
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
    stream_col = _column_or_nulls(batch, "stream", STR)
    seq_col = _column_or_nulls(batch, "stream_seq", I64)
    subj_arr = _column_or_nulls(batch, "subject", STR)
    pub_col = _column_or_nulls(batch, "published_at", S.UNION_SCHEMA.field("published_at").type)

    for (event_type, _cls), (idx, subjs, decs) in groups.items():
        n = len(idx)
        take = pa.array(idx, I64)
        msgs = [d.message for d in decs]
        cols = message_columns(msgs, msgs[0].DESCRIPTOR)
        envs = [d.envelope for d in decs]
        if envs[0] is not None:  # resource aggregate: envelope fields win
            versions = [e.version for e in envs]
            aggregate_ids = [e.aggregate_id for e in envs]
            cols["version"] = u64_array(versions)
            cols["group_id"] = pa.array([e.group_id for e in envs], STR)
            cols["aggregate_id"] = pa.array(aggregate_ids, STR)
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
            owner_id=pa.array([s.owner_id for s in subjs], STR),
            device_id=pa.array([s.device_id for s in subjs], STR),
            href_id=pa.array([s.href_id for s in subjs], STR),
            lead_resource_type=pa.array([s.lead_resource_type for s in subjs], STR),
            event_type=pa.repeat(pa.scalar(event_type, STR), n),
            msg_id=pa.array(
                [
                    message_id(
                        header_msg_id=header_col[i], subject=s, data=data_col[i],
                        aggregate_id=a, version=v, event_type=event_type, timestamp=t,
                    )
                    for i, s, a, v, t in zip(idx, subject_strs, aggregate_ids, versions, timestamps, strict=True)
                ],
                STR,
            ),
            interval_id=pa.repeat(pa.scalar(interval_id, STR), n),
            date=pc.cast(published, pa.date32()),
        )
        parts.append(_assemble(cols, n))

    if q_idx:
        n = len(q_idx)
        take = pa.array(q_idx, I64)
        cols = {
            "stream": stream_col.take(take),
            "stream_seq": seq_col.take(take),
            "subject": subj_arr.take(take),
            "published_at": pub_col.take(take),
            "msg_id": _column_or_nulls(batch, "msg_id", STR).take(take),
            "headers": _headers(batch, take),
            "data": _column_or_nulls(batch, "data", BIN).take(take),
            "reason": pa.array(q_reason, STR),
            "detail": pa.array(q_detail, STR),
            "stage": pa.repeat(pa.scalar(STAGE, STR), n),
            "interval_id": pa.repeat(pa.scalar(interval_id, STR), n),
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
        schema=pa.schema([("stream", STR), ("stream_seq", I64), ("subject", STR),
                          S.UNION_SCHEMA.field("published_at"), ("msg_id", STR), ("data", BIN)]),
    )
    row = decode_batch(batch, interval_id, max_content_bytes=max_content_bytes).to_pylist()[0]
    if row["reason"] == INTERNAL_ERROR:
        raise RuntimeError(f"decoding {subject!r} failed unexpectedly: {row['detail']}")
    if row["reason"] is not None:
        raise codec.PlgdDecodeError(row["reason"], row["detail"])
    return {name: row[name] for name in S.EVENTS_COLUMNS}
