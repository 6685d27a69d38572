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

Definition (stable across Python, pyarrow and xxhash versions):
``xxh64(repr(values).encode("utf-8"), seed=0)`` as a signed int64 (like a Java long), where
``values`` is the tuple of the row's :data:`schemas.CONTENT_COLUMNS` values in that order, as
``pyarrow``'s ``to_pylist`` gives them (str, bytes, int, bool, list, dict of struct fields; None
for a null, and for a column the file does not have). A change of that column list or of a
nested struct's fields changes every digest: for one lookback after such an upgrade, a repeat of
an earlier message counts as an ID conflict and is kept twice (never dropped wrongly; the
snapshot fold ignores a version it has applied). ``tests/unit/spark/test_dedupe_decision.py``
pins a digest.

Cost: ~8 µs per row on one core, reading the content columns included (pure Python over
``to_pylist`` values; docs/performance.md, M19).
"""

from __future__ import annotations

from itertools import repeat
from typing import Any

import pyarrow as pa
import xxhash

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
    n = table.num_rows
    columns: list[Any] = []
    for name in CONTENT_COLUMNS:
        column = table.column(name) if name in table.column_names else None
        if column is not None and column.null_count < n:
            columns.append(column.to_pylist())
        elif column is None and name == "event_type" and event_type is not None:
            columns.append(repeat(event_type, n))
        else:
            columns.append(repeat(None, n))
    digest = xxhash.xxh64_intdigest
    out = [digest(repr(values).encode("utf-8")) for values in zip(*columns, strict=True)]
    return pa.array([d - (1 << 64) if d >= _SIGN else d for d in out], pa.int64())
