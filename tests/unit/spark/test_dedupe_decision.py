"""airflow_provider_plgd.spark.dedupe_decision (the pyarrow keep/drop decision) and the snapshot bucket of a device, without Spark.

The Spark side of both (the window decision, Spark SQL ``xxhash64``) is compared with these in
tests/integration/test_dedupe_rebuild.py.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_provider_plgd.spark import dedupe_decision, snapshot_buckets


def keys(rows):
    """Key rows ``(msg_id, stream, stream_seq, subject, event_type[, content_digest])`` (digest 0
    when left out: one content per ID)."""
    rows = [tuple(r) + (0,) * (6 - len(r)) for r in rows]
    cols = list(zip(*rows, strict=True)) if rows else [[]] * 6
    return pa.table({
        "msg_id": pa.array(cols[0], pa.string()), "stream": pa.array(cols[1], pa.string()),
        "stream_seq": pa.array(cols[2], pa.int64()), "subject": pa.array(cols[3], pa.string()),
        "event_type": pa.array(cols[4], pa.string()), "content_digest": pa.array(cols[5], pa.int64()),
    })


def seen(pairs):
    return pa.table({"msg_id": pa.array([p[0] for p in pairs], pa.string()),
                     "content_digest": pa.array([p[1] for p in pairs], pa.int64())})


def test_a_reused_id_with_another_content_is_kept_and_counted_a_true_copy_is_dropped():
    """Issue 39: a publisher reuses a Nats-Msg-Id outside JetStream's duplicate window for another
    event: both rows stay (one ``id_conflict``); the same content again is a duplicate."""
    t = keys([
        ("x", "S", 5, "o1.a", "e", 11),
        ("x", "S", 2, "o2.b", "e", 22),   # another event under the same ID: kept, the ID's first row
        ("x", "S", 9, "o1.a", "e", 11),   # the same content as stream_seq 5: a duplicate
        ("y", "S", 3, "o1.c", "f", 33),
    ])
    d = dedupe_decision.decide(t)
    assert d.dropped_rows.to_pylist() == [2]
    assert d.id_conflicts == 1  # stream_seq 5: an ID-only dedupe would have dropped it
    assert d.index.to_pylist() == [{"msg_id": "x", "content_digest": 11}, {"msg_id": "x", "content_digest": 22},
                                   {"msg_id": "y", "content_digest": 33}]
    assert d.totals() == {"input": 4, "output": 3, "within_batch": 1, "cross_batch": 0}


def test_lookback_matches_id_and_content_and_an_old_index_without_digest_matches_every_content():
    t = keys([
        ("x", "S", 1, "o1.a", "e", 11),   # seen with this content: cross_batch
        ("x", "S", 2, "o2.b", "e", 22),   # seen with another content only: kept, an id_conflict
        ("x", "S", 3, "o2.b", "e", 22),   # its copy: within_batch
        ("o", "S", 4, "o3.c", "e", 44),   # an old index entry (null digest): cross_batch, any content
        ("n", "S", 5, "o3.d", "e", 55),   # never seen: kept
    ])
    d = dedupe_decision.decide(t, seen([("x", 11), ("o", None), ("zz", 1)]))
    assert d.dropped_rows.to_pylist() == [0, 2, 3]
    assert d.id_conflicts == 1
    assert d.totals() == {"input": 5, "output": 2, "within_batch": 1, "cross_batch": 2}
    # a plain array of IDs (every content) drops every row of those IDs, as before the digest
    d = dedupe_decision.decide(t, pa.array(["x"]))
    assert d.dropped_rows.to_pylist() == [0, 1, 2] and d.id_conflicts == 0


def test_seen_entries_reads_index_files_with_and_without_the_digest_column():
    found = dedupe_decision.seen_entries(pa.array(["a", "b"]), [
        pa.table({"msg_id": ["a", "q"], "content_digest": pa.array([7, 8], pa.int64())}),
        pa.table({"msg_id": ["b", "a"]}),             # written before content_digest existed
        pa.table({"msg_id": ["a"], "content_digest": pa.array([7], pa.int64())}),  # the same entry again
    ])
    assert sorted(found.to_pylist(), key=lambda r: (r["msg_id"], r["content_digest"] is None, r["content_digest"])) == [
        {"msg_id": "a", "content_digest": 7}, {"msg_id": "a", "content_digest": None},
        {"msg_id": "b", "content_digest": None}]


def test_content_digest_covers_subject_and_payload_columns_not_where_the_message_was_stored():
    from airflow_provider_plgd.spark.content_digest import content_digests

    base = {"stream": "S", "stream_seq": 1, "subject": "plgd.owners.o1.registrations.devicesregistered",
            "msg_id": "m", "content_data": b"\x01\x02", "device_ids": ["d1"], "version": 3}
    other_place = {**base, "stream": "T", "stream_seq": 99, "msg_id": "other"}
    rows = [base, other_place, {**base, "subject": "plgd.owners.o2.registrations.devicesregistered"},
            {**base, "content_data": b"\x01\x03"}, {**base, "device_ids": ["d1", "d2"]}, {**base, "version": None}]
    d = content_digests(pa.Table.from_pylist(rows)).to_pylist()
    assert d[0] == d[1] and len(set(d[:1] + d[2:])) == 5
    # a missing column counts as null; the event type can come from the partition value
    no_version = pa.Table.from_pylist([{k: v for k, v in base.items() if k != "version"}])
    assert content_digests(no_version).to_pylist() == [d[5]]
    one = pa.Table.from_pylist([base])
    assert content_digests(one, event_type="e").to_pylist() == \
        content_digests(one.append_column("event_type", pa.array(["e"]))).to_pylist() != [d[0]]
    # pinned: the digest is stored in msgid_index, so its definition must not drift
    assert d[0] == content_digests(pa.Table.from_pylist([base])).to_pylist()[0] == PINNED_DIGEST
    assert content_digests(pa.table({"subject": pa.array([], pa.string())})).to_pylist() == []


#: content_digests of the ``base`` row above (xxh64 of its repr): a change means old index entries
#: no longer match their messages (see the content_digest module docstring).
PINNED_DIGEST = 6687590414299072260


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
    assert d.index.column("msg_id").to_pylist() == ["a", "b", "c"]
    assert d.null_ids == 2 and not d.exact_copies and d.id_conflicts == 0
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
    assert d.per_type == {} and d.dropped_rows.to_pylist() == [] and d.index.num_rows == 0
    found = dedupe_decision.seen_entries(pa.array(["a", "b", "c"]), [
        pa.table({"msg_id": pa.chunked_array([["x", "b"], [None, "c"]])}), pa.table({"msg_id": ["c", "q"]})])
    assert sorted(found.column("msg_id").to_pylist()) == ["b", "c"]
    assert dedupe_decision.seen_entries(pa.array(["a"]), []).num_rows == 0


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


def test_key_task_adds_the_content_digest_batch_by_batch_and_reads_files_lacking_a_content_column(tmp_path):
    """``make_key_task`` on real Parquet files: the digests of a file read in several batches equal
    those of the whole table, and a file without a content column digests like nulls in it."""
    import pyarrow.parquet as pq

    from airflow_provider_plgd.spark import dedupe_job
    from airflow_provider_plgd.spark.content_digest import content_digests

    n = dedupe_job.DIGEST_BATCH_ROWS * 2 + 7
    full = pa.table({"stream": ["S"] * n, "stream_seq": pa.array(range(n), pa.int64()),
                     "subject": [f"plgd.owners.o{i % 3}.x" for i in range(n)],
                     "msg_id": [f"m{i % 1000}" for i in range(n)],
                     "device_ids": pa.array([None] * n, pa.list_(pa.string())),
                     "content_data": [bytes([i % 7]) for i in range(n)]})
    pq.write_table(full, tmp_path / "a.parquet")
    pq.write_table(full.drop_columns(["device_ids"]), tmp_path / "b.parquet")  # an older file's columns
    units = [[(str(tmp_path / "a.parquet"), 0, n, {"event_type": "e"}),
              (str(tmp_path / "b.parquet"), 1, n, {"event_type": "e"})]]
    out = pa.concat_tables(pa.ipc.open_stream(data).read_all()
                           for _, data in dedupe_job.make_key_task(partitions=1)(units))
    expected = content_digests(full, event_type="e").to_pylist()
    for number in (0, 1):
        rows = out.filter(pa.compute.equal(out.column("_file"), number)).sort_by("_row")
        assert rows.column("content_digest").to_pylist() == expected
        assert rows.column("_row").to_pylist() == list(range(n))
    assert len(set(expected)) == 3 * 7  # subject (3 owners) x payload (7 values)
