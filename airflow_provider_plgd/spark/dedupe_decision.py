"""The keep/drop decision of ``dedupe_events`` on the key columns, with pyarrow (no Spark).

``dedupe_events`` decides with it in one executor task per msg-ID bucket
(``dedupe_job.make_decide_task``): only the key columns of the bucket are held in memory (about
250 bytes per row), and the decision is much faster than Spark windows in a fresh JVM (figures:
docs/performance.md, "Measurements behind design choices", M15).
tests/integration/test_dedupe_rebuild.py compares it with Spark windows over the same rows.

A message is identified by its ``msg_id`` *and* its content: ``content_digest``
(:mod:`airflow_provider_plgd.spark.content_digest`). A ``Nats-Msg-Id`` that a publisher reuses
outside JetStream's duplicate window for another event is not a duplicate.

Rules (the module docstring of ``airflow_provider_plgd.spark_apps.dedupe_events``):

* rows sharing a non-null ``msg_id`` and ``content_digest``: the one with the lowest
  ``stream_seq`` is kept (ties: ``stream``, then ``subject``; nulls last), the others are
  ``within_batch`` duplicates;
* every row whose ``(msg_id, content_digest)`` is in ``seen`` (the index of the lookback
  intervals) is a ``cross_batch`` duplicate, the would-be keeper too; a ``seen`` entry with a
  null digest (an index written before the digest existed) matches every content of its ID;
* a kept row whose ``msg_id`` is also held by another content (a kept row of this interval with
  a lower ``(stream_seq, stream, subject)``, or a ``seen`` entry) is kept and counted as an
  ``id_conflict``: the rows an ID-only dedupe would have dropped;
* rows with a null ``msg_id`` are all kept.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

#: The content digest column of the keys and of ``msgid_index`` (int64).
DIGEST = "content_digest"
#: Input columns of :func:`decide`.
KEY_COLUMNS = ("msg_id", "stream", "stream_seq", "subject", "event_type", DIGEST)
#: Row classes, in the order of the summary.
CLASSES = ("kept", "within_batch", "cross_batch")


@dataclass
class Decision:
    """What :func:`decide` found.

    :ivar per_type: ``{event_type ("_none" for null): {"input", "output", "within_batch",
        "cross_batch"}}`` row counts.
    :ivar null_ids: rows with a null ``msg_id`` (all kept).
    :ivar id_conflicts: kept rows whose ``msg_id`` another content holds (in this interval or in
        the lookback): part of ``output``, the rows an ID-only dedupe would have dropped.
    :ivar exact_copies: True when ``(msg_id, stream, stream_seq)`` does not single out every row
        with a ``msg_id`` (a repeated key, or a null ``stream``/``stream_seq``): the rows to drop
        cannot be named by ``(stream, stream_seq)`` then.
    :ivar dropped_rows: ``pyarrow.Array`` (int64) of the positions in ``keys`` of the dropped rows
        (ascending): names every dropped row, exact copies too.
    :ivar index: ``pyarrow.Table`` ``(msg_id string, content_digest int64)`` of the distinct
        non-null message IDs with each of their contents, sorted.
    """

    per_type: dict[str, dict[str, int]] = field(default_factory=dict)
    null_ids: int = 0
    id_conflicts: int = 0
    exact_copies: bool = False
    dropped_rows: Any = None
    index: Any = None

    def merge(self, other: dict[str, Any]) -> None:
        """Add the counts of another decision (its ``per_type``, ``null_ids``, ``id_conflicts``
        and ``exact_copies``, e.g. one msg-ID bucket's) to this one."""
        for event_type, counts in other["per_type"].items():
            entry = self.per_type.setdefault(event_type, dict.fromkeys(counts, 0))
            for key, n in counts.items():
                entry[key] += n
        self.null_ids += other["null_ids"]
        self.id_conflicts += other.get("id_conflicts", 0)
        self.exact_copies = self.exact_copies or other["exact_copies"]

    def totals(self) -> dict[str, int]:
        """``{"input", "output", "within_batch", "cross_batch"}`` summed over the event types."""
        keys = ("input", "output", "within_batch", "cross_batch")
        return {k: sum(v[k] for v in self.per_type.values()) for k in keys}


def add_count(per_type: dict[str, dict[str, int]], event_type: str | None, row_class: str, n: int) -> None:
    """Add ``n`` rows of ``row_class`` (one of :data:`CLASSES`) to ``per_type`` (the
    :attr:`Decision.per_type` shape; a null event type counts as ``"_none"``)."""
    entry = per_type.setdefault(event_type if event_type is not None else "_none",
                                {"input": 0, "output": 0, "within_batch": 0, "cross_batch": 0})
    entry["input"] += n
    entry["output" if row_class == "kept" else row_class] += n


def seen_schema():
    """``pa.schema([("msg_id", string), ("content_digest", int64)])``: the rows of :func:`seen_entries`."""
    return pa.schema([("msg_id", pa.string()), (DIGEST, pa.int64())])


def seen_entries(current, previous: Iterable[Any]):
    """The entries of the lookback index whose ID is one of ``current``.

    :param current: ``pyarrow.Array`` of this interval's distinct message IDs.
    :param previous: iterable of ``pyarrow.Table`` with a ``msg_id`` column and, unless written
        before the digest existed, a ``content_digest`` column (one per lookback index file, read
        one at a time, so only one is held at once); a missing column counts as null digests.
    :return: ``pyarrow.Table`` of :func:`seen_schema` (distinct rows).
    """
    schema = seen_schema()
    found = []
    for table in previous:
        ids = table.column("msg_id")
        digests = (table.column(DIGEST) if DIGEST in table.column_names
                   else pa.nulls(table.num_rows, pa.int64()))
        hit = pc.fill_null(pc.is_in(ids, value_set=current), False)
        part = pa.table({"msg_id": ids, DIGEST: digests}).filter(hit)
        if part.num_rows:
            found.append(part.cast(schema))
    if not found:
        return schema.empty_table()
    return pa.concat_tables(found).group_by(["msg_id", DIGEST], use_threads=False).aggregate([])


def decide(keys, seen=None) -> Decision:
    """Decide which rows of one interval to keep.

    :param keys: ``pyarrow.Table`` with the :data:`KEY_COLUMNS` (``msg_id``, ``stream``,
        ``subject``, ``event_type`` strings; ``stream_seq``, ``content_digest`` int64), one row
        per ``events`` row. A ``keys`` table without ``content_digest`` counts as one content per ID.
    :param seen: the lookback entries: a ``pyarrow.Table`` of :func:`seen_schema` (a null digest
        matches every content), a ``pyarrow.Array`` of message IDs (every content), or None.
    :return: a :class:`Decision`.
    """
    n = keys.num_rows
    decision = Decision()
    if n == 0:
        decision.index = seen_schema().empty_table()
        decision.dropped_rows = pa.array([], pa.int64())
        return decision
    if DIGEST not in keys.column_names:
        keys = keys.append_column(DIGEST, pa.repeat(pa.scalar(0, pa.int64()), n))
    if seen is not None and not isinstance(seen, pa.Table):
        seen = pa.table({"msg_id": seen.cast(pa.string()), DIGEST: pa.nulls(len(seen), pa.int64())})
    order = pc.sort_indices(keys, sort_keys=[("msg_id", "ascending"), (DIGEST, "ascending"),
                                             ("stream_seq", "ascending"), ("stream", "ascending"),
                                             ("subject", "ascending")])
    rows = keys.select(list(KEY_COLUMNS)).take(order).combine_chunks()
    msg = rows.column("msg_id").chunk(0)
    digest = pc.fill_null(rows.column(DIGEST).chunk(0), 0)

    def previous(array):  # the value of the row before (null for the first row)
        return pa.concat_arrays([pa.nulls(1, array.type), array.slice(0, n - 1)])

    has_id = pc.is_valid(msg)
    same_id = pc.fill_null(pc.equal(msg, previous(msg)), False)  # nulls sort last, never "same"
    same_key = pc.and_(same_id, pc.fill_null(pc.equal(digest, previous(digest)), False))
    first = pc.and_(has_id, pc.invert(same_key))
    within = pc.and_(has_id, same_key)
    cross = pa.array([False] * n)
    seen_any = pa.array([], pa.string())
    if seen is not None and seen.num_rows:
        seen_any = pc.unique(seen.column("msg_id"))
        any_content = seen.filter(pc.is_null(seen.column(DIGEST))).column("msg_id")  # old index files
        exact = seen.filter(pc.is_valid(seen.column(DIGEST)))
        marked = pa.table({"msg_id": msg, DIGEST: digest, "_pos": pa.array(range(n), pa.int64())}) \
            .join(exact.append_column("_seen", pa.repeat(pa.scalar(True), exact.num_rows)),
                  keys=["msg_id", DIGEST], join_type="left outer")
        hit = pa.array([False] * n)
        if marked.num_rows:
            hit_pos = marked.filter(pc.fill_null(marked.column("_seen"), False)).column("_pos")
            hit = pc.is_in(pa.array(range(n), pa.int64()), value_set=hit_pos.combine_chunks())
        cross = pc.or_(hit, pc.fill_null(pc.is_in(msg, value_set=any_content.combine_chunks()), False))
    decision.null_ids = n - pc.sum(has_id.cast(pa.int64())).as_py()
    decision.index = pa.table({"msg_id": msg, DIGEST: digest}).filter(first)

    row_class = pc.if_else(cross, "cross_batch", pc.if_else(within, "within_batch", "kept"))
    counts = pa.table({"event_type": rows.column("event_type"), "_class": row_class}) \
        .group_by(["event_type", "_class"]).aggregate([("_class", "count")])
    for et, cls, cnt in zip(counts.column("event_type").to_pylist(), counts.column("_class").to_pylist(),
                            counts.column("_class_count").to_pylist(), strict=True):
        add_count(decision.per_type, et, cls, cnt)
    decision.per_type = dict(sorted(decision.per_type.items()))

    # id conflicts: kept rows with an ID that another content holds (an earlier kept row, or the lookback)
    kept = pc.and_(has_id, pc.invert(pc.or_(cross, within)))
    kept_rows = rows.filter(kept).sort_by([("msg_id", "ascending"), ("stream_seq", "ascending"),
                                           ("stream", "ascending"), ("subject", "ascending")])
    if kept_rows.num_rows:
        kept_ids = kept_rows.column("msg_id").combine_chunks()
        k = kept_rows.num_rows
        later = pc.fill_null(pc.equal(kept_ids, pa.concat_arrays([pa.nulls(1, pa.string()),
                                                                  kept_ids.slice(0, k - 1)])), False)
        conflict = pc.or_(later, pc.fill_null(pc.is_in(kept_ids, value_set=seen_any), False))
        decision.id_conflicts = pc.sum(conflict.cast(pa.int64())).as_py()
    # exact copies: (msg_id, stream, stream_seq) repeats or has a null part
    ids_only = keys.filter(pc.is_valid(keys.column("msg_id")))
    repeated = (ids_only.group_by(["msg_id", "stream", "stream_seq"], use_threads=False).aggregate([]).num_rows
                != ids_only.num_rows)
    null_key = pc.any(pc.or_(pc.is_null(ids_only.column("stream")), pc.is_null(ids_only.column("stream_seq"))))
    decision.exact_copies = bool(repeated or null_key.as_py())

    dropped = pc.or_(cross, within)
    positions = pc.filter(order, dropped).cast(pa.int64())  # ``order`` maps sorted rows to ``keys`` rows
    decision.dropped_rows = pc.take(positions, pc.array_sort_indices(positions))
    return decision
