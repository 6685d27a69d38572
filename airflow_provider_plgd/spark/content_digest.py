"""The content digest of an ``events`` row: with ``msg_id``, the identity of a message for dedupe.

A ``Nats-Msg-Id`` header only stands in for a message's identity: JetStream drops a repeated ID
only within the stream's ``duplicate_window`` (2 min by default), so a publisher that reuses an ID
later (a counter reset by a restart, a bridge that forwards IDs) stores two different messages
under one ID. ``dedupe_events`` therefore drops a row only when its ``msg_id`` *and* its content
digest were seen (:mod:`airflow_provider_plgd.spark.dedupe_decision`).

The ``events`` table does not hold the raw payload, so the digest is taken over what decode made
of it: the values of :data:`schemas.CONTENT_COLUMNS` (every ``events`` column except the stored
message's ``stream``/``stream_seq``/``published_at``, its ``msg_id`` and the partition columns
``interval_id``/``date``; ``subject`` and ``event_type`` included). Two payloads that decode to the
same columns (e.g. differing only in protobuf fields plgd's schema does not have) are one content.

Definition (stable across Python, pyarrow and xxhash versions; a change here changes every
digest, so a repeated ID across the change would count as an ID conflict and be kept twice):
``xxh64(repr([(column, value), ...]).encode("utf-8"), seed=0)`` as a signed int64 (like a Java
long), over the non-null content columns in schema order, ``value`` as ``pyarrow``'s
``to_pylist`` gives it (str, bytes, int, bool, list, dict of struct fields). A null column is left
out, so a column added to ``events`` later does not change the digests of rows without it; a field
added to a nested struct does (the struct's ``repr`` names it).

Cost: ~12 µs per row on one core (pure Python over ``to_pylist`` values; docs/performance.md).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from airflow_provider_plgd.spark.schemas import CONTENT_COLUMNS

__all__ = ["content_digests"]

_SIGN = 1 << 63


def content_digests(table: pa.Table, *, event_type: str | None = None) -> pa.Array:
    """The content digest of each row of ``table`` (module docstring).

    :param table: ``events`` rows: any subset of the ``events`` columns (a content column that is
        missing counts as null; the other columns are ignored).
    :param event_type: the ``event_type`` of every row when ``table`` has no such column (the
        ``events`` files hold it as a partition value, not a column).
    :return: ``pyarrow.Array`` of int64, one digest per row, never null.
    """
    import xxhash

    n = table.num_rows
    names: list[str] = []
    columns: list[Any] = []
    for name in CONTENT_COLUMNS:
        if name in table.column_names:
            column = table.column(name)
            if column.null_count == n:
                continue
            values = column.to_pylist()
        elif name == "event_type" and event_type is not None:
            values = [event_type] * n
        else:
            continue
        names.append(name)
        columns.append(values)
    digest = xxhash.xxh64_intdigest
    if not columns:
        out = [digest(b"[]")] * n
    else:
        out = [digest(repr([(k, v) for k, v in zip(names, row) if v is not None]).encode("utf-8"))
               for row in zip(*columns)]
    return pa.array([d - (1 << 64) if d >= _SIGN else d for d in out], pa.int64())
