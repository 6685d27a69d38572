"""airflow_provider_plgd.spark.dedupe_decision (the pyarrow keep/drop decision) and the snapshot bucket of a device, without Spark.

The Spark side of both (the window decision, Spark SQL ``xxhash64``) is compared with these in
tests/integration/test_dedupe_rebuild.py.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_provider_plgd.spark import dedupe_decision
from airflow_provider_plgd.spark import snapshot_buckets


def keys(rows):
    cols = list(zip(*rows)) if rows else [[]] * 5
    return pa.table({
        "msg_id": pa.array(cols[0], pa.string()), "stream": pa.array(cols[1], pa.string()),
        "stream_seq": pa.array(cols[2], pa.int64()), "subject": pa.array(cols[3], pa.string()),
        "event_type": pa.array(cols[4], pa.string()),
    })


def test_lowest_stream_seq_kept_copies_and_seen_ids_dropped_nulls_kept():
    t = keys([
        ("a", "S", 7, "s1", "resourcechanged"),
        ("a", "S", 3, "s1", "resourcechanged"),   # kept: lowest stream_seq of "a"
        ("b", "S", 4, "s2", "devicesregistered"),
        ("c", "S", 5, "s3", "resourcechanged"),   # seen earlier: dropped
        ("c", "S", 9, "s3", "resourcechanged"),   # seen earlier: dropped too
        (None, "S", 6, "s4", "resourcechanged"),  # no ID: kept
        (None, "S", 8, "s4", "resourcechanged"),
    ])
    d = dedupe_decision.decide(t, pa.array(["c", "zz"]))
    assert d.dropped_rows.to_pylist() == [0, 3, 4]  # stream_seq 7, 5 and 9
    assert d.index.to_pylist() == ["a", "b", "c"]
    assert d.null_ids == 2 and not d.exact_copies
    assert d.per_type == {
        "devicesregistered": {"input": 1, "output": 1, "within_batch": 0, "cross_batch": 0},
        "resourcechanged": {"input": 6, "output": 3, "within_batch": 1, "cross_batch": 2},
    }
    assert d.totals() == {"input": 7, "output": 4, "within_batch": 1, "cross_batch": 2}


def test_ties_on_stream_seq_break_on_stream_then_subject():
    d = dedupe_decision.decide(keys([("a", "T", 1, "x", "e"), ("a", "S", 1, "y", "e"), ("a", "S", 1, "x", "e")]))
    # all three share stream_seq 1; ("S", "x") is first; ("S", 1) repeats, so the key is ambiguous
    assert d.exact_copies
    d = dedupe_decision.decide(keys([("a", "T", 1, "x", "e"), ("a", "S", 1, "y", "e")]))
    assert d.dropped_rows.to_pylist() == [0] and not d.exact_copies  # ("T", 1)


@pytest.mark.parametrize("rows", [
    [("a", "S", 1, "x", "e"), ("a", "S", 1, "x", "e")],   # the same stored message staged twice
    [("a", None, 1, "x", "e"), ("a", "S", 2, "x", "e")],  # a null stream
    [("a", "S", None, "x", "e")],                         # a null stream_seq
])
def test_ambiguous_keys_are_reported(rows):
    assert dedupe_decision.decide(keys(rows)).exact_copies


def test_empty_input_and_seen_ids():
    d = dedupe_decision.decide(keys([]))
    assert d.per_type == {} and d.dropped_rows.to_pylist() == [] and d.index.to_pylist() == []
    found = dedupe_decision.seen_ids(pa.array(["a", "b", "c"]),
                                     [pa.chunked_array([["x", "b"], [None, "c"]]), pa.array(["c", "q"])])
    assert sorted(found.to_pylist()) == ["b", "c"]
    assert dedupe_decision.seen_ids(pa.array(["a"]), []).to_pylist() == []


#: Spark ``xxhash64`` values and buckets pinned from the pure-Python XXH64 this project used before
#: the ``xxhash`` wheel (and checked against Spark SQL by tests/integration/test_dedupe_rebuild.py):
#: (value, xxhash64, bucket of 32, bucket of 5). Snapshots written before keep their buckets.
KNOWN_BUCKETS = [
    ("", -7444071767201028348, 4, 2),
    ("a", -8582455328737087284, 12, 1),
    ("abcde", -990457398947679591, 25, 4),
    ("0123456789", -4230122786429606431, 1, 4),
    ("x" * 31, -1716462135722163746, 30, 4),
    ("y" * 32, 5202031258905353636, 4, 1),
    ("00000000-0000-4000-8000-000000001234", -6166844354232818858, 22, 2),
    ("é€😀-device", -2135587613609331485, 3, 0),
    ("00000000-0000-4000-8000-000000001234" * 3, 1915621983201245221, 5, 1),
]


def test_xxh64_reference_vectors_and_spark_sign():
    import xxhash

    # xxHash reference values (seed 0)
    assert xxhash.xxh64_intdigest(b"", 0) == 0xEF46DB3751D8E999
    assert xxhash.xxh64_intdigest(b"a", 0) == 0xD24EC4F1A98C6E5B
    assert xxhash.xxh64_intdigest(b"abc", 0) == 0x44BC2CF5AD770999
    # signed like a Java long; buckets in range for every length branch (<4, <8, <32, >=32 bytes)
    for value, h, b32, b5 in KNOWN_BUCKETS:
        assert snapshot_buckets.spark_xxhash64(value) == h
        assert -(1 << 63) <= h < (1 << 63)
        assert snapshot_buckets.device_bucket(value, 32) == b32 and snapshot_buckets.device_bucket(value, 5) == b5
    with pytest.raises(ValueError, match="buckets must be >= 1, got 0"):
        snapshot_buckets.device_bucket("a", 0)


def test_dropped_rows_name_exact_copies_by_position():
    # rows 0 and 2 are the same stored message staged twice (equal msg_id, stream, stream_seq):
    # the key cannot tell them apart, the positions can
    d = dedupe_decision.decide(keys([("m1", "S", 3, "s", "e"), ("m2", "S", 4, "s", "e"),
                                     ("m1", "S", 3, "s", "e"), ("m1", "S", 9, "s", "e")]))
    assert d.exact_copies is True
    assert d.dropped_rows.to_pylist() == [2, 3]
    assert d.totals() == {"input": 4, "output": 2, "within_batch": 2, "cross_batch": 0}


def test_decide_partitions_divide_the_buckets_and_follow_slots_and_rows():
    """A power of two that divides the 16 msg-ID buckets: 1 for a small interval, at most 2 per
    task slot, at most one per ROWS_PER_TASK rows, never more than the buckets."""
    from airflow_provider_plgd.spark.dedupe_job import MSGID_BUCKETS, ROWS_PER_TASK, decide_partitions

    assert decide_partitions(2, 0) == 1
    assert decide_partitions(2, 100_000) == 1
    assert decide_partitions(2, 1_000_000) == 4
    assert decide_partitions(1, 10_000_000) == 2
    assert decide_partitions(3, 10_000_000) == 4
    assert decide_partitions(64, 100_000_000) == MSGID_BUCKETS
    assert decide_partitions(64, 3 * ROWS_PER_TASK) == 2
    for slots in range(1, 40):
        for rows in (0, ROWS_PER_TASK, 7 * ROWS_PER_TASK, 10**9):
            assert MSGID_BUCKETS % decide_partitions(slots, rows) == 0


def test_merge_adds_the_counts_of_bucket_decisions():
    """``Decision.merge``: the decision of an interval split by msg-ID bucket adds up to the
    decision of the whole interval (counts, null IDs, exact copies)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from airflow_provider_plgd.spark import dedupe_job
    from airflow_provider_plgd.spark.dedupe_decision import Decision, decide

    keys = pa.table({"msg_id": ["a", "a", "b", None, "c", "c", "d"], "stream": ["S"] * 7,
                     "stream_seq": [1, 2, 3, 4, 5, 5, 6], "subject": ["x"] * 7,
                     "event_type": ["t1", "t1", "t2", "t2", None, None, "t1"]})
    whole = decide(keys, pa.array(["d"]))
    merged = Decision()
    bucket = pa.array([dedupe_job.msgid_bucket(m, 4) for m in keys.column("msg_id").to_pylist()])
    for b in range(4):
        part = keys.filter(pc.equal(bucket, b))
        one = decide(part, pa.array(["d"]))
        merged.merge({"per_type": one.per_type, "null_ids": one.null_ids, "exact_copies": one.exact_copies})
    assert dict(sorted(merged.per_type.items())) == whole.per_type
    assert merged.totals() == whole.totals() == {"input": 7, "output": 4, "within_batch": 2, "cross_batch": 1}
    assert (merged.null_ids, merged.exact_copies) == (whole.null_ids, whole.exact_copies) == (1, True)
