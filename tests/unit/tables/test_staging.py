"""Unit tests of the staging contract (airflow_provider_plgd.tables.staging) and its writer (fetch.stager).

Real deltalake tables on local disk; the tests read them back with deltalake and Polars.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_plgd import times
from airflow_provider_plgd.exceptions import LedgerError, TableCommitError
from airflow_provider_plgd.fetch.stager import Stager
from airflow_provider_plgd.tables import staging, staging_commits, storage
from airflow_provider_plgd.tables.layout import Layout

UTC = timezone.utc
T0 = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z in ns
IID = "20260101T000000Z_20260101T010000Z"
OWNERS = [f"{i:08x}-0000-4000-8000-000000000000" for i in range(40)]


def make_messages(n: int, first_seq: int = 1, *, size: int = 40, headers_every: int = 3) -> list[tuple]:
    """``(owner, event type, (stream_seq, subject, time_ns, headers, data))``: owners interleaved
    in stream order (as a fleet publishes), two event types, varied payloads and headers."""
    out = []
    for i in range(n):
        seq = first_seq + i
        owner = OWNERS[(seq * 7) % len(OWNERS)]
        event_type = "resourcechanged" if seq % 3 else "devicesregistered"
        headers = {"Nats-Msg-Id": f"id-{seq}", "X-Other": "v"} if headers_every and seq % headers_every == 0 else None
        data = hashlib.sha256(str(seq).encode()).digest() * (1 + seq % size)
        out.append((owner, event_type, (seq, f"plgd.owners.{owner}.x.{event_type}", T0 + seq * 1_234_567, headers, data)))
    return out


def stage(root, messages, *, index=0, version=100, chunk=100, **kw) -> tuple[Stager, list[dict]]:
    """Add ``messages`` in chunks of ``chunk`` (grouped per batch as the router does), write range files."""
    kw.setdefault("spill_dir", None)
    stager = Stager(stream="EVENTS", **kw)
    for start in range(0, len(messages), chunk):
        by_batch: dict[tuple[str, str], list] = {}
        for owner, event_type, msg in messages[start:start + chunk]:
            by_batch.setdefault((owner, event_type), []).append(msg)
        for (owner, event_type), rows in by_batch.items():
            stager.add(owner, event_type, rows)
    records = stager.write(staging.table_uri(Layout.of(root), "EVENTS"), IID,
                           staging.range_file_prefix(index, version, staging.new_write_id()))
    stager.close()
    return stager, records


def delta_rows(root) -> list[dict]:
    from deltalake import DeltaTable

    return DeltaTable(staging.table_uri(Layout.of(root), "EVENTS")).to_pyarrow_table().to_pylist()


# ---------------------------------------------------------------------------------------------
# interval IDs, names and paths
# ---------------------------------------------------------------------------------------------
def test_interval_id_formats():
    start = datetime(2026, 1, 1, tzinfo=UTC)
    assert times.interval_id(start, start + timedelta(hours=1)) == "20260101T000000Z_20260101T010000Z"
    assert times.interval_id(start, start + timedelta(seconds=20, microseconds=5)) == \
        "20260101T000000Z_20260101T000020.000005Z"
    assert times.interval_id(T0, T0 + 1) == "20260101T000000Z_20260101T000000.000000001Z"
    assert times.seq_interval_id(1, 1000) == "seq-000000000001-000000001000"
    assert times.durable_interval_id(5, 7) == "durable-000000000005-000000000007"


@pytest.mark.parametrize("iid", ["20260101T000000Z_20260101T000020.000005Z", "seq-000000000001-000000001000",
                                 "durable-000000000005-000000000007"])
def test_parse_interval_id_round_trip(iid):
    parsed = times.parse_interval_id(iid)
    if parsed["kind"] == "time":
        assert times.interval_id(parsed["start_ns"], parsed["end_ns"]) == iid
    else:
        fn = times.seq_interval_id if parsed["kind"] == "seq" else times.durable_interval_id
        assert fn(parsed["first_seq"], parsed["last_seq"]) == iid


@pytest.mark.parametrize("bad", ["", "a/b", "..", "a b", "x=y", "a\\b", "tab\t", "*", "a?"])
def test_partition_values_rejected(bad):
    with pytest.raises(ValueError, match="event_type"):
        staging.partition_folder(IID, bad)
    with pytest.raises(ValueError, match="owner_id"):
        staging.batch_file_prefix(bad, "w")


def test_names_paths_and_filter_key():
    assert staging.table_uri(Layout.of("s3://b/plgd/"), "EVENTS") == "s3://b/plgd/staging/EVENTS"
    assert staging.partition_folder(IID, "resourcechanged") == f"interval_id={IID}/event_type=resourcechanged"
    prefix = staging.range_file_prefix(3, 1767229200123, "abc")
    assert prefix == "r0003-v1767229200123-abc"
    assert staging.file_range(f"interval_id={IID}/event_type=x/{prefix}-00001.parquet") == (3, 1767229200123)
    assert staging.file_range("interval_id=i/event_type=x/b.o1.abc-00000.parquet") is None
    owner = OWNERS[0]
    assert staging.file_batch_owner(f"x/{staging.batch_file_prefix(owner, 'w1')}-00000.parquet") == owner
    assert staging.file_batch_owner(f"x/{prefix}-00000.parquet") is None
    with pytest.raises(ValueError, match=re.escape("cannot hold '.'")):
        staging.batch_file_prefix("a.b", "w")
    key = staging.filter_key(["plgd.>"])
    assert key.startswith("f") and len(key) == 17 and key == staging.filter_key("plgd.>")
    assert key != staging.filter_key(["plgd.owners.*.>"])
    assert staging.TABLE_SCHEMA.names == [*staging.SCHEMA.names, "owner_id", "interval_id", "event_type"]


def test_staging_module_imports_no_airflow_spark_or_deltalake():
    code = ("import sys, airflow_provider_plgd.tables.staging; "
            "bad=[m for m in sys.modules if m in ('airflow', 'deltalake') or m.startswith(('airflow.', 'pyspark'))]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------
# the writer: files per event type, rows ordered by owner then stream sequence, cut by size
# ---------------------------------------------------------------------------------------------
def test_files_per_event_type_sorted_by_owner_cut_by_size_with_delta_statistics(tmp_path):
    msgs = make_messages(3000)
    stager, records = stage(tmp_path, msgs, target_file_bytes=60_000, row_group_rows=200)
    table = staging.table_uri(Layout.of(tmp_path), "EVENTS")
    by_type: dict[str, list[dict]] = {}
    for rec in records:
        by_type.setdefault(rec["partition"]["event_type"], []).append(rec)
    for event_type, recs in by_type.items():
        payload = sum(len(m[2][4]) for m in msgs if m[1] == event_type)
        assert len(recs) <= -(-payload // 60_000) and len(recs) > 1  # ceil(bytes / target), here several
        rows = []
        for rec in recs:
            pf = pq.ParquetFile(os.path.join(table, rec["path"]))
            assert pf.schema_arrow == staging.FILE_SCHEMA
            assert all(pf.metadata.row_group(g).num_rows <= 200 for g in range(pf.metadata.num_row_groups))
            got = pf.read()
            keys = list(zip(got.column("owner_id").to_pylist(), got.column("stream_seq").to_pylist(), strict=True))
            assert keys == sorted(keys)
            import json

            stats = json.loads(rec["stats"])
            assert stats["numRecords"] == got.num_rows == rec["rows"]
            assert (stats["minValues"]["owner_id"], stats["maxValues"]["owner_id"]) == (keys[0][0], keys[-1][0])
            rows += got.to_pylist()
        # files follow each other in the sort order: an owner's batch is one run across them
        keys = [(r["owner_id"], r["stream_seq"]) for r in rows]
        assert keys == sorted(keys)
        expected = sorted((o, m) for o, t, m in msgs if t == event_type)
        assert [(r["owner_id"], r["stream_seq"], r["subject"], r["data"]) for r in rows] == \
            [(o, m[0], m[1], m[4]) for o, m in expected]
        headers = {r["stream_seq"]: (r["msg_id"], r["headers"]) for r in rows}
        for _o, m in expected:
            want = (m[3]["Nats-Msg-Id"], sorted(m[3].items())) if m[3] else (None, None)
            assert (headers[m[0]][0], sorted(headers[m[0]][1]) if headers[m[0]][1] else None) == want
        s = stager.summaries[event_type]
        assert (s.count, s.files, s.first_seq, s.last_seq) == (len(expected), len(recs), min(m[0] for _o, m in expected),
                                                               max(m[0] for _o, m in expected))
        assert s.batches == len({o for o, _m in expected}) and s.bytes == payload
    assert stager.owners == len({o for o, _t, _m in msgs})
    # published_at: server time truncated to microseconds
    one = pq.read_table(os.path.join(table, records[0]["path"])).slice(0, 1).to_pylist()[0]
    seq = one["stream_seq"]
    assert one["published_at"] == datetime.fromtimestamp((T0 + seq * 1_234_567) // 1000 / 1e6, tz=UTC)


def test_spilled_runs_give_the_same_rows_and_files_as_memory(tmp_path):
    msgs = make_messages(2500)
    spill = tmp_path / "spill"
    small, small_records = stage(tmp_path / "a", msgs, buffer_bytes=20_000, spill_dir=str(spill),
                                 target_file_bytes=50_000, row_group_rows=300, chunk=37)
    big, big_records = stage(tmp_path / "b", msgs, buffer_bytes=10**9, target_file_bytes=50_000, row_group_rows=300)
    assert small.spills > 10 and big.spills == 0
    assert os.listdir(spill) == []  # closed: the runs are deleted
    assert [(r["path"].rsplit("-", 2)[0], r["rows"]) for r in small_records] == \
        [(r["path"].rsplit("-", 2)[0], r["rows"]) for r in big_records]
    for a, b in zip(small_records, big_records, strict=True):
        ta = pq.read_table(os.path.join(staging.table_uri(Layout.of(tmp_path / "a"), "EVENTS"), a["path"]))
        tb = pq.read_table(os.path.join(staging.table_uri(Layout.of(tmp_path / "b"), "EVENTS"), b["path"]))
        assert ta.equals(tb)
    with pytest.raises(ValueError, match="no spill folder"):
        stage(tmp_path / "c", msgs, buffer_bytes=1000)


def test_count_only_summarizes_without_rows():
    msgs = make_messages(500)
    stager = Stager(stream="EVENTS", spill_dir=None, count_only=True)
    for owner, event_type, msg in msgs:
        stager.add(owner, event_type, [msg])
    stager.summarize()
    for event_type in ("resourcechanged", "devicesregistered"):
        mine = [(o, m) for o, t, m in msgs if t == event_type]
        s = stager.summaries[event_type]
        assert (s.count, s.batches, s.first_seq, s.last_seq, s.bytes) == (
            len(mine), len({o for o, _ in mine}), min(m[0] for _, m in mine), max(m[0] for _, m in mine),
            sum(len(m[4]) for _, m in mine))
    assert stager.owners == len({o for o, _t, _m in msgs}) and stager.pending_bytes == 0


def test_io_errors_name_the_path(tmp_path):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the spill folder should be")
    stager = Stager(stream="EVENTS", spill_dir=str(blocked / "spill"), buffer_bytes=10)
    with pytest.raises(OSError, match="blocked/spill"):
        owner, event_type, msg = make_messages(1)[0]
        stager.add(owner, event_type, [msg])


# ---------------------------------------------------------------------------------------------
# commits: one append per range; a run begins with removing the interval; batches replace
# ---------------------------------------------------------------------------------------------
def test_a_run_of_ranges_commits_once_each_and_a_rerun_replaces_exactly_the_interval(tmp_path):
    root = str(tmp_path)
    msgs = make_messages(1200)
    other_interval = "20260101T010000Z_20260101T020000Z"
    staging_commits.begin_interval(Layout.of(root), "EVENTS", IID, 100)
    _, r0 = stage(root, msgs[:600], index=0)
    _, r1 = stage(root, msgs[600:], index=1)
    first = staging_commits.commit_range(Layout.of(root), "EVENTS", IID, 0, 100, r0)
    second = staging_commits.commit_range(Layout.of(root), "EVENTS", IID, 1, 100, r1)
    assert second.version == first.version + 1 and len(first.files) == len(r0)
    # a retried commit of the range is a no-op; the files are those of the first commit
    again = staging_commits.commit_range(Layout.of(root), "EVENTS", IID, 0, 100, r0)
    assert again.version is None and again.files == first.files
    assert staging_commits.committed_range(Layout.of(root), "EVENTS", IID, 0, 100).files == first.files
    assert staging_commits.committed_range(Layout.of(root), "EVENTS", IID, 2, 100) is None
    rows = delta_rows(root)
    assert sorted(r["stream_seq"] for r in rows) == list(range(1, 1201))
    assert {r["interval_id"] for r in rows} == {IID}
    # another interval's run is left alone by this interval's rerun
    staging_commits.begin_interval(Layout.of(root), "EVENTS", other_interval, 7)
    _, other = stage(root, msgs[:5], index=0, version=7)
    for rec in other:
        rec["partition"]["interval_id"] = other_interval
        rec["path"] = rec["path"].replace(IID, other_interval)
        os.makedirs(os.path.dirname(os.path.join(staging.table_uri(Layout.of(root), "EVENTS"), rec["path"])), exist_ok=True)
        os.rename(os.path.join(staging.table_uri(Layout.of(root), "EVENTS"), rec["path"].replace(other_interval, IID)),
                  os.path.join(staging.table_uri(Layout.of(root), "EVENTS"), rec["path"]))
    staging_commits.commit_range(Layout.of(root), "EVENTS", other_interval, 0, 7, other)

    # the rerun: the plan begins run 101; the earlier run's tasks are refused from then on
    begun = staging_commits.begin_interval(Layout.of(root), "EVENTS", IID, 101)
    assert len(begun.files) == len(r0) + len(r1)
    assert staging_commits.begin_interval(Layout.of(root), "EVENTS", IID, 101).version is None  # a retried plan
    assert staging.staged_files(Layout.of(root), "EVENTS", interval_id=IID) == []
    assert len(staging.staged_files(Layout.of(root), "EVENTS", interval_id=other_interval)) == len(other)
    with pytest.raises(TableCommitError, match=r"a newer plan of interval .* began its run"):
        staging_commits.commit_range(Layout.of(root), "EVENTS", IID, 1, 100, r1)
    with pytest.raises(TableCommitError, match=r"a newer run .* first"):
        staging_commits.begin_interval(Layout.of(root), "EVENTS", IID, 100)
    with pytest.raises(LedgerError, match="records no start of the plan's run 102"):
        staging_commits.commit_range(Layout.of(root), "EVENTS", IID, 0, 102, r0)
    with pytest.raises(LedgerError, match="records no start"):
        staging_commits.committed_range(Layout.of(root), "EVENTS", "20260102T000000Z_20260102T010000Z", 0, 1)
    # Polars reads the same table
    import polars as pl

    frame = pl.read_delta(staging.table_uri(Layout.of(root), "EVENTS"))
    assert frame.height == 5 and set(frame.get_column("interval_id").to_list()) == {other_interval}


def test_two_commits_of_one_range_at_once_one_wins_and_nothing_is_doubled(tmp_path):
    """Two tasks of the same range commit from the same table version at the same time (a zombie
    and its retry): Delta refuses the second commit (the same app transaction in a concurrent
    commit); its retry sees the first's transaction and does not commit. Other ranges' concurrent
    appends both commit."""
    root = str(tmp_path)
    msgs = make_messages(400)
    staging_commits.begin_interval(Layout.of(root), "EVENTS", IID, 5)
    _, a = stage(root, msgs[:200], index=0, version=5)
    _, b = stage(root, msgs[:200], index=0, version=5)
    _, c = stage(root, msgs[200:], index=1, version=5)
    start = threading.Barrier(3)
    results: dict[str, object] = {}

    def commit(name, index, records):
        start.wait()
        try:
            results[name] = staging_commits.commit_range(Layout.of(root), "EVENTS", IID, index, 5, records)
        except Exception as exc:  # recorded for the assertion
            results[name] = exc

    threads = [threading.Thread(target=commit, args=args) for args in (("a", 0, a), ("b", 0, b), ("c", 1, c))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    versions = [results[n].version for n in ("a", "b")]
    assert sorted(v is None for v in versions) == [False, True], results  # exactly one of the two committed
    assert results["c"].version is not None
    rows = delta_rows(root)
    assert sorted(r["stream_seq"] for r in rows) == list(range(1, 401))  # nothing doubled


def test_batches_replace_their_own_rows_only(tmp_path):
    root = str(tmp_path)
    iid = "seq-000000000001-000000000100"

    def write(owner, n, first, version, types=("devicesregistered",)):
        stager = Stager(stream="EVENTS", spill_dir=None)
        for i in range(n):
            stager.add(owner, types[i % len(types)], [(first + i, f"plgd.owners.{owner}.x", T0 + i, None, b"d%d" % i)])
        records = stager.write(staging.table_uri(Layout.of(root), "EVENTS"), iid,
                               staging.batch_file_prefix(owner, staging.new_write_id()))
        return staging_commits.commit_batches(Layout.of(root), "EVENTS", iid, owner, list(types), records, version)

    a, b = OWNERS[:2]
    write(a, 5, 1, 10)
    write(b, 3, 20, 11)
    assert sorted(r["stream_seq"] for r in delta_rows(root)) == [1, 2, 3, 4, 5, 20, 21, 22]
    done = write(a, 2, 1, 12)  # a rerun of owner a's batch: replaces only a's rows
    assert sorted(r["stream_seq"] for r in delta_rows(root)) == [1, 2, 20, 21, 22]
    assert {f.event_type for f in done.files} == {"devicesregistered"}
    with pytest.raises(TableCommitError, match="newer run"):
        write(a, 4, 1, 11)  # an older task's commit
    write(a, 0, 1, 13)  # an empty batch: a's rows are gone, b's stay
    assert sorted((r["owner_id"], r["stream_seq"]) for r in delta_rows(root)) == [(b, 20), (b, 21), (b, 22)]
    # another event type of owner b is its own batch
    write(b, 2, 30, 14, types=("resourcechanged",))
    assert sorted(r["stream_seq"] for r in delta_rows(root)) == [20, 21, 22, 30, 31]


# ---------------------------------------------------------------------------------------------
# readers: the log's statistics, an owner's rows, the owners of an interval
# ---------------------------------------------------------------------------------------------
def test_readers_find_a_batch_by_statistics_and_count_owners_by_a_column_scan(tmp_path):
    root = str(tmp_path)
    msgs = make_messages(2000)
    staging_commits.begin_interval(Layout.of(root), "EVENTS", IID, 1)
    _, records = stage(root, msgs, target_file_bytes=30_000, row_group_rows=100)
    staging_commits.commit_range(Layout.of(root), "EVENTS", IID, 0, 1, records)
    files = staging.staged_files(Layout.of(root), "EVENTS", interval_id=IID)
    assert len(files) == len(records) > 4 and sum(f.rows for f in files) == 2000
    owner = OWNERS[7]
    mine = staging.staged_files(Layout.of(root), "EVENTS", interval_id=IID, event_types=["resourcechanged"], owners=[owner])
    assert 1 <= len(mine) < len([f for f in files if f.event_type == "resourcechanged"])  # pruned by statistics
    got = staging.read_staged(Layout.of(root), "EVENTS", IID, owners=[owner], event_types=["resourcechanged"])
    want = sorted(m[0] for o, t, m in msgs if o == owner and t == "resourcechanged")
    assert got.column("stream_seq").to_pylist() == want
    assert set(got.column("owner_id").to_pylist()) == {owner} and got.schema.names == staging.TABLE_SCHEMA.names
    counts = staging.owners_with_messages(Layout.of(root), "EVENTS", IID)
    assert counts == {o: sum(1 for oo, _t, _m in msgs if oo == o) for o in {o for o, _t, _m in msgs}}
    assert staging.owners_with_messages(Layout.of(root), "EVENTS", "seq-000000000001-000000000002") == {}
    assert staging.staged_files(Layout.of(tmp_path / "missing"), "EVENTS") == []
    every = staging.read_staged(Layout.of(root), "EVENTS", IID, columns=["stream_seq", "event_type"])
    assert every.num_rows == 2000 and every.column_names == ["stream_seq", "event_type"]


# ---------------------------------------------------------------------------------------------
# retention
# ---------------------------------------------------------------------------------------------
def test_expiry_removes_old_committed_intervals_and_vacuums_their_files(tmp_path):
    root = str(tmp_path)
    msgs = make_messages(300)
    old, new = IID, "20260101T010000Z_20260101T020000Z"
    for iid, version in ((old, 1), (new, 2)):
        staging_commits.begin_interval(Layout.of(root), "EVENTS", iid, version)
        stager = Stager(stream="EVENTS", spill_dir=None)
        for owner, event_type, msg in msgs:
            stager.add(owner, event_type, [msg])
        records = stager.write(staging.table_uri(Layout.of(root), "EVENTS"), iid,
                               staging.range_file_prefix(0, version, staging.new_write_id()))
        staging_commits.commit_range(Layout.of(root), "EVENTS", iid, 0, version, records)
        time.sleep(0.05)
    cutoff = staging.staged_intervals(Layout.of(root), "EVENTS")[old]["modified_ms"] / 1000 + 0.01
    # a killed fetch's file that no commit names
    orphan = os.path.join(staging.table_uri(Layout.of(root), "EVENTS"), staging.partition_folder(new, "x"), "r0009-v2-dead-00000.parquet")
    os.makedirs(os.path.dirname(orphan))
    pq.write_table(pa.table({"a": [1]}), orphan)
    # nothing is committed yet: kept
    kept = staging_commits.expire_intervals(Layout.of(root), "EVENTS", retention_seconds=0, now_s=cutoff, committed=lambda i: False,
                                    vacuum_retention_hours=-1)
    assert kept.intervals == () and len(staging.staged_intervals(Layout.of(root), "EVENTS")) == 2
    done = staging_commits.expire_intervals(Layout.of(root), "EVENTS", retention_seconds=0, now_s=cutoff, committed=lambda i: True,
                                    vacuum_retention_hours=0)
    assert done.intervals == (old,) and done.rows == 300 and done.files >= 2
    assert set(staging.staged_intervals(Layout.of(root), "EVENTS")) == {new}
    assert done.vacuumed == done.files + 1 and not os.path.exists(orphan)  # removed files and the orphan
    assert {r["interval_id"] for r in delta_rows(root)} == {new}
    with pytest.raises(ValueError, match=">= 0 seconds"):
        staging_commits.expire_intervals(Layout.of(root), "EVENTS", retention_seconds=-1)


def test_map_io_keeps_the_order_runs_calls_at_once_and_raises_the_first_error():
    names: set[str] = set()
    gate = threading.Barrier(4, timeout=10)  # passes only when 4 calls run at the same time

    def call(i: int) -> int:
        names.add(threading.current_thread().name)
        if i < 4:
            gate.wait()
        return i * i

    assert storage.map_io(call, list(range(20))) == [i * i for i in range(20)]
    assert len(names) > 1 and all(n.startswith("plgd-io") for n in names)
    assert storage.map_io(lambda i: i + 1, [1, 2], threads=1) == [2, 3]

    def fail_on_odd(i: int) -> int:
        if i % 2:
            raise ValueError(f"item {i}")
        return i

    with pytest.raises(ValueError, match="item 1"):
        storage.map_io(fail_on_odd, list(range(10)))
