"""The keep/drop decision of ``dedupe_events`` on the key columns, with pyarrow (no Spark).

``dedupe_events`` decides with it in one executor task per msg-ID bucket
(``dedupe_job.make_decide_task``): only the key columns of the bucket are held in memory (about
250 bytes per row), and the decision is much faster than Spark windows in a fresh JVM (figures:
docs/performance.md, "Measurements behind design choices", M15).
tests/integration/test_dedupe_rebuild.py compares it with Spark windows over the same rows.

Rules (the module docstring of ``airflow_provider_plgd.spark_apps.dedupe_events``):

* rows sharing a non-null ``msg_id``: the one with the lowest ``stream_seq`` is kept (ties:
  ``stream``, then ``subject``; nulls last), the others are ``within_batch`` duplicates;
* every row whose ``msg_id`` is in ``seen`` (the message IDs of the lookback intervals) is a
  ``cross_batch`` duplicate, the would-be keeper too;
* rows with a null ``msg_id`` are all kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

#: Input columns of :func:`decide`.
KEY_COLUMNS = ("msg_id", "stream", "stream_seq", "subject", "event_type")
#: Row classes, in the order of the summary.
CLASSES = ("kept", "within_batch", "cross_batch")


@dataclass
class Decision:
    """What :func:`decide` found.

    :ivar per_type: ``{event_type ("_none" for null): {"input", "output", "within_batch",
        "cross_batch"}}`` row counts.
    :ivar null_ids: rows with a null ``msg_id`` (all kept).
    :ivar exact_copies: True when ``(msg_id, stream, stream_seq)`` does not single out every row
        with a ``msg_id`` (a repeated key, or a null ``stream``/``stream_seq``): the rows to drop
        cannot be named by ``(stream, stream_seq)`` then.
    :ivar dropped_rows: ``pyarrow.Array`` (int64) of the positions in ``keys`` of the dropped rows
        (ascending): names every dropped row, exact copies too.
    :ivar index: ``pyarrow.Array`` (string) of the distinct non-null message IDs, sorted.
    """

    per_type: dict[str, dict[str, int]] = field(default_factory=dict)
    null_ids: int = 0
    exact_copies: bool = False
    dropped_rows: Any = None
    index: Any = None

    def merge(self, other: dict[str, Any]) -> None:
        """Add the counts of another decision (its ``per_type``, ``null_ids`` and ``exact_copies``,
        e.g. one msg-ID bucket's) to this one."""
        for event_type, counts in other["per_type"].items():
            entry = self.per_type.setdefault(event_type, dict.fromkeys(counts, 0))
            for key, n in counts.items():
                entry[key] += n
        self.null_ids += other["null_ids"]
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


def seen_ids(current, previous: Iterable[Any]):
    """The IDs of ``current`` that also occur in one of the ``previous`` arrays.

    :param current: ``pyarrow.Array`` of this interval's distinct message IDs.
    :param previous: iterable of ``pyarrow.Array``/``ChunkedArray`` (one per lookback interval,
        e.g. read one at a time from the ``msgid_index`` files, so only one is held at once).
    :return: ``pyarrow.Array`` (string) of the IDs found (distinct).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    found = []
    for ids in previous:
        hits = pc.filter(ids, pc.fill_null(pc.is_in(ids, value_set=current), False))
        if len(hits):
            found.append(hits.combine_chunks() if isinstance(hits, pa.ChunkedArray) else hits)
    if not found:
        return pa.array([], pa.string())
    return pc.unique(pa.concat_arrays([f.cast(pa.string()) for f in found]))


def decide(keys, seen=None) -> Decision:
    """Decide which rows of one interval to keep.

    :param keys: ``pyarrow.Table`` with the :data:`KEY_COLUMNS` (``msg_id``, ``stream``,
        ``subject``, ``event_type`` strings; ``stream_seq`` int64), one row per ``events`` row.
    :param seen: ``pyarrow.Array`` of message IDs seen in the lookback intervals, or None.
    :return: a :class:`Decision`.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    n = keys.num_rows
    decision = Decision()
    if n == 0:
        decision.index = pa.array([], pa.string())
        decision.dropped_rows = pa.array([], pa.int64())
        return decision
    order = pc.sort_indices(keys, sort_keys=[("msg_id", "ascending"), ("stream_seq", "ascending"),
                                             ("stream", "ascending"), ("subject", "ascending")])
    rows = keys.select(list(KEY_COLUMNS)).take(order).combine_chunks()
    msg = rows.column("msg_id").chunk(0)
    seq = rows.column("stream_seq").chunk(0)
    stream = rows.column("stream").chunk(0)

    def previous(array):  # the value of the row before (null for the first row)
        return pa.concat_arrays([pa.nulls(1, array.type), array.slice(0, n - 1)])

    has_id = pc.is_valid(msg)
    same_id = pc.fill_null(pc.equal(msg, previous(msg)), False)  # nulls sort last, never "same"
    first = pc.and_(has_id, pc.invert(same_id))
    within = pc.and_(has_id, same_id)
    cross = (pc.fill_null(pc.is_in(msg, value_set=seen), False) if seen is not None and len(seen)
             else pa.array([False] * n))
    repeated = pc.fill_null(pc.and_(same_id, pc.and_(pc.equal(seq, previous(seq)),
                                                     pc.equal(stream, previous(stream)))), False)
    null_key = pc.and_(has_id, pc.or_(pc.is_null(seq), pc.is_null(stream)))
    decision.exact_copies = bool(pc.any(pc.or_(repeated, null_key)).as_py())
    decision.null_ids = n - pc.sum(has_id.cast(pa.int64())).as_py()
    decision.index = pc.filter(msg, first)

    row_class = pc.if_else(cross, "cross_batch", pc.if_else(within, "within_batch", "kept"))
    counts = pa.table({"event_type": rows.column("event_type"), "_class": row_class}) \
        .group_by(["event_type", "_class"]).aggregate([("_class", "count")])
    for et, cls, cnt in zip(counts.column("event_type").to_pylist(), counts.column("_class").to_pylist(),
                            counts.column("_class_count").to_pylist()):
        add_count(decision.per_type, et, cls, cnt)
    decision.per_type = dict(sorted(decision.per_type.items()))

    dropped = pc.or_(cross, within)
    positions = pc.filter(order, dropped).cast(pa.int64())  # ``order`` maps sorted rows to ``keys`` rows
    decision.dropped_rows = pc.take(positions, pc.array_sort_indices(positions))
    return decision
