"""Unit tests of the staging layout, writer, commit protocol and readers (airflow_provider_plgd.staging)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_plgd import staging, storage, times

UTC = timezone.utc
T0 = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z in ns
OWNER = "e1407479-3136-56c0-9908-bb02fb0339e2"
SUBJ = f"plgd.owners.{OWNER}.registrations.devicesregistered"


def make_messages(n: int, first_seq: int = 1, *, size: int = 40, headers_every: int = 3) -> list[tuple]:
    """Messages as (stream_seq, subject, time_ns, headers, data) with varied payloads."""
    out = []
    for i in range(n):
        seq = first_seq + i
        headers = {"Nats-Msg-Id": f"id-{seq}", "X-Other": "v"} if headers_every and seq % headers_every == 0 else None
        out.append((seq, SUBJ, T0 + seq * 1_234_567, headers, hashlib.sha256(str(seq).encode()).digest() * (1 + seq % size)))
    return out


def write_batch(root, messages, *, chunks=(1000,), filters=("f1",), interval="seq-000000000001-000000001000", **kw):
    """Write messages (split across filters in equal parts) in batches of cycling sizes, then commit."""
    per_filter = -(-len(messages) // len(filters)) if messages else 0
    with staging.StagingWriter(root, stream="EVENTS", owner_id=OWNER, event_type="devicesregistered",
                               interval_id=interval, subject_filters=list(filters), bounds={"kind": "seq"}, **kw) as w:
        for fi, f in enumerate(filters):
            w.start_filter(f)
            part = messages[fi * per_filter:(fi + 1) * per_filter]
            i = k = 0
            while i < len(part):
                size = chunks[k % len(chunks)]
                w.write(part[i:i + size])
                i += size
                k += 1
        return w.commit()


def folder_digest(folder: str) -> dict[str, str]:
    return {name: hashlib.sha256(open(os.path.join(folder, name), "rb").read()).hexdigest()
            for name in sorted(os.listdir(folder))}


# ---------------------------------------------------------------------------------------------
# interval IDs and paths
# ---------------------------------------------------------------------------------------------
def test_interval_id_formats():
    start = datetime(2026, 1, 1, tzinfo=UTC)
    assert times.interval_id(start, start + timedelta(hours=1)) == "20260101T000000Z_20260101T010000Z"
    assert times.interval_id(start, start + timedelta(seconds=20, microseconds=5)) == \
        "20260101T000000Z_20260101T000020.000005Z"
    assert times.interval_id(T0, T0 + 1) == "20260101T000000Z_20260101T000000.000000001Z"
    assert times.interval_id("2026-01-01T01:00:00+01:00", "2026-01-01T00:00:01Z") == \
        "20260101T000000Z_20260101T000001Z"
    assert times.seq_interval_id(1, 1000) == "seq-000000000001-000000001000"
    assert times.durable_interval_id(5, 7) == "durable-000000000005-000000000007"


@pytest.mark.parametrize("iid", ["20260101T000000Z_20260101T000020.000005Z", "20260101T000000Z_20260101T000000.000000001Z",
                                 "seq-000000000001-000000001000", "durable-000000000005-000000000007"])
def test_parse_interval_id_round_trip(iid):
    parsed = times.parse_interval_id(iid)
    if parsed["kind"] == "time":
        assert times.interval_id(parsed["start_ns"], parsed["end_ns"]) == iid
    else:
        fn = times.seq_interval_id if parsed["kind"] == "seq" else times.durable_interval_id
        assert fn(parsed["first_seq"], parsed["last_seq"]) == iid


def test_interval_errors():
    start = datetime(2026, 1, 1, tzinfo=UTC)
    with pytest.raises(ValueError, match="must be after"):
        times.interval_id(start, start)
    with pytest.raises(ValueError, match="timezone-aware"):
        times.interval_id(datetime(2026, 1, 1), start)
    with pytest.raises(ValueError, match="not an ISO-8601"):
        times.to_ns("yesterday")
    with pytest.raises(TypeError):
        times.to_ns(1.5)
    with pytest.raises(ValueError, match="invalid stream sequence range"):
        times.seq_interval_id(10, 9)
    with pytest.raises(ValueError, match="not a staging interval ID"):
        times.parse_interval_id("last-week")


@pytest.mark.parametrize("bad", ["", "a/b", "..", "a b", "x=y", "a\\b", "tab\t"])
def test_partition_values_rejected(bad):
    with pytest.raises(ValueError, match="owner_id"):
        staging.batch_path("/r", "EVENTS", bad, "devicesregistered", "seq-000000000001-000000000001")


def test_batch_path_and_filter_key():
    assert staging.batch_path("s3://b/plgd/", "EVENTS", OWNER, "resourcechanged", "seq-000000000001-000000000002") == \
        f"s3://b/plgd/staging/EVENTS/owner_id={OWNER}/event_type=resourcechanged/interval=seq-000000000001-000000000002"
    key = staging.filter_key(["plgd.>"])
    assert key.startswith("f") and len(key) == 17 and key == staging.filter_key("plgd.>")
    assert key != staging.filter_key(["plgd.owners.*.>"])


def test_staging_module_imports_no_airflow():
    code = ("import sys, airflow_provider_plgd.staging; "
            "bad=[m for m in sys.modules if m == 'airflow' or m.startswith(('airflow.', 'pyspark'))]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------
# writer
# ---------------------------------------------------------------------------------------------
def test_schema_and_content(tmp_path):
    msgs = make_messages(10)
    manifest = write_batch(str(tmp_path), msgs)
    table = staging.read_batch(manifest)
    assert table.schema == staging.SCHEMA
    assert str(table.schema.field("published_at").type) == "timestamp[us, tz=UTC]"
    rows = table.to_pylist()
    assert [r["stream_seq"] for r in rows] == list(range(1, 11))
    assert all(r["stream"] == "EVENTS" and r["subject"] == SUBJ for r in rows)
    assert [r["data"] for r in rows] == [m[4] for m in msgs]
    # microseconds, truncated from the server's nanoseconds
    us = table.column("published_at").cast(pa.int64()).to_pylist()
    assert us == [m[2] // 1000 for m in msgs]
    assert [r["msg_id"] for r in rows] == [f"id-{s}" if s % 3 == 0 else None for s in range(1, 11)]
    assert rows[2]["headers"] == [("Nats-Msg-Id", "id-3"), ("X-Other", "v")] and rows[0]["headers"] is None
    assert manifest["count"] == 10 and manifest["bytes"] == sum(len(m[4]) for m in msgs)
    assert (manifest["first_seq"], manifest["last_seq"]) == (1, 10)


def test_row_groups_files_and_filters(tmp_path):
    msgs = make_messages(2500)
    m = write_batch(str(tmp_path), msgs, chunks=(7, 300, 1), filters=("f1", "f2"),
                    row_group_size=300, max_rows_per_file=1000, row_group_bytes=20_000)
    assert [(f["path"], f["rows"], f["subject_filter"]) for f in m["files"]] == [
        ("part-00000.parquet", 1000, "f1"), ("part-00001.parquet", 250, "f1"), ("part-00000-f1.parquet", 1000, "f2"),
        ("part-00001-f1.parquet", 250, "f2")]
    assert [f["count"] for f in m["filters"]] == [1250, 1250]
    assert m["filters"][1]["first_seq"] == 1251
    for f in m["files"]:
        meta = pq.ParquetFile(os.path.join(m["folder"], f["path"])).metadata
        assert meta.num_rows == f["rows"]
        groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
        assert all(g.num_rows <= 300 for g in groups)
        # a group is cut before its payload passes row_group_bytes (unless it is a single row)
        sizes = [sum(len(x) for x in pq.ParquetFile(os.path.join(m["folder"], f["path"])).read_row_group(i)
                     .column("data").to_pylist()) for i in range(meta.num_row_groups)]
        assert all(s <= 20_000 for s in sizes)
        assert os.path.getsize(os.path.join(m["folder"], f["path"])) == f["bytes"]
    assert staging.read_batch(m).column("stream_seq").to_pylist() == list(range(1, 2501))


def test_output_independent_of_fetch_batching(tmp_path):
    """Cut points depend only on the messages, so any fetch batching gives byte-identical files."""
    msgs = make_messages(3000)
    kw = dict(row_group_size=512, max_rows_per_file=1100, row_group_bytes=50_000)
    a = write_batch(str(tmp_path / "a"), msgs, chunks=(1000,), **kw)
    b = write_batch(str(tmp_path / "b"), msgs, chunks=(1, 17, 333, 2), **kw)
    assert folder_digest(a["folder"]) == folder_digest(b["folder"])


def test_interleaved_filters_give_the_files_of_filter_after_filter(tmp_path):
    """Rows of several filters written as they come (``write(rows, filter_index=i)``, what the
    owner-wide fetch does instead of spooling) give byte-identical files and manifest."""
    msgs = make_messages(2400)
    kw = dict(row_group_size=128, max_rows_per_file=500, row_group_bytes=30_000)
    sequential = write_batch(str(tmp_path / "a"), msgs, chunks=(50, 7), filters=("f1", "f2", "f3"), **kw)
    thirds = [msgs[0:800], msgs[800:1600], msgs[1600:2400]]
    with staging.StagingWriter(str(tmp_path / "b"), stream="EVENTS", owner_id=OWNER, event_type="devicesregistered",
                               interval_id="seq-000000000001-000000001000", subject_filters=["f1", "f2", "f3"],
                               bounds={"kind": "seq"}, **kw) as w:
        # the second filter gets nothing for a while, then all filters interleave in odd chunk sizes
        offsets = [0, 0, 0]
        for step in range(10_000):
            index = [0, 2, 0, 1, 2][step % 5] if step > 20 else 0
            size = (step % 37) + 1
            chunk = thirds[index][offsets[index]:offsets[index] + size]
            if chunk:
                w.write(chunk, filter_index=index)
                offsets[index] += len(chunk)
            if offsets == [800, 800, 800]:
                break
        interleaved = w.commit()
    assert folder_digest(interleaved["folder"]) == folder_digest(sequential["folder"])
    assert [f["path"] for f in interleaved["files"]][:3] == ["part-00000.parquet", "part-00001.parquet",
                                                             "part-00000-f1.parquet"]
    assert staging.read_batch(interleaved).column("stream_seq").to_pylist() == list(range(1, 2401))
    with pytest.raises(ValueError, match="filter_index 3"):
        staging.StagingWriter(str(tmp_path / "c"), stream="EVENTS", owner_id=OWNER, event_type="x",
                              interval_id="seq-000000000001-000000000001", subject_filters=["f1"],
                              bounds={}).__enter__().write(msgs[:1], filter_index=3)


def test_io_errors_name_the_path(tmp_path):
    """An I/O error of the writer names the file or folder (a bare ENOSPC names none)."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "staging").write_text("a file where the staging folder should be")
    with pytest.raises(OSError, match=f"cannot create the staging folder {root}/staging/EVENTS/owner_id="):
        write_batch(str(root), make_messages(10))
    # a full disk: the part file in progress is a link to /dev/full (every write fails with ENOSPC)
    with staging.StagingWriter(str(tmp_path / "root2"), stream="EVENTS", owner_id=OWNER,
                               event_type="devicesregistered", interval_id="seq-000000000001-000000001000",
                               subject_filters=["f1"], bounds={}, row_group_size=5) as w:
        tmp = os.path.join(w.folder, f".part-00000.parquet.{w._writer_id}.inprogress")
        os.symlink("/dev/full", tmp)
        with pytest.raises(OSError, match=f"cannot .* the part file {tmp}: .*No space left on device") as info:
            w.write(make_messages(400))
            w.commit()
        assert info.value.errno == 28


def test_rerun_is_byte_identical_and_removes_strays(tmp_path):
    msgs = make_messages(1500)
    first = write_batch(str(tmp_path), msgs, max_rows_per_file=400)
    before = folder_digest(first["folder"])
    # leftovers of an interrupted run, and a part file from a bigger earlier batch
    for name in (".part-00000.parquet.inprogress", "part-00099.parquet", "junk.txt"):
        (tmp_path / first["folder"] / name).write_bytes(b"x")
    # a temp file of a killed writer is removed once it is older than STALE_INPROGRESS_S (a
    # younger one may belong to a concurrent writer of the same batch)
    stale = time.time() - storage.STALE_INPROGRESS_S - 60
    os.utime(tmp_path / first["folder"] / ".part-00000.parquet.inprogress", (stale, stale))
    again = write_batch(str(tmp_path), msgs, chunks=(13,), max_rows_per_file=400)
    assert folder_digest(again["folder"]) == before
    assert sorted(before) == ["_manifest.json", "part-00000.parquet", "part-00001.parquet", "part-00002.parquet",
                              "part-00003.parquet"]  # one filter: the names of earlier versions


def test_interrupted_rerun_leaves_folder_uncommitted(tmp_path):
    root = str(tmp_path)
    write_batch(root, make_messages(100))
    assert len(staging.list_committed(root, "EVENTS")) == 1
    with pytest.raises(RuntimeError, match="boom"):
        with staging.StagingWriter(root, stream="EVENTS", owner_id=OWNER, event_type="devicesregistered",
                                   interval_id="seq-000000000001-000000001000", subject_filters=["f1"],
                                   bounds={"kind": "seq"}, row_group_size=10) as w:
            w.write(make_messages(50))
            raise RuntimeError("boom")
    assert staging.list_committed(root, "EVENTS") == []  # old manifest gone, no new one
    folder = staging.batch_path(root, "EVENTS", OWNER, "devicesregistered", "seq-000000000001-000000001000")
    assert not any(n.endswith(".inprogress") for n in os.listdir(folder))
    with pytest.raises(FileNotFoundError, match="no committed manifest"):
        staging.read_manifest(folder)


def test_empty_batch_commits_empty_manifest(tmp_path):
    m = write_batch(str(tmp_path), [], filters=("a", "b"))
    assert m["count"] == 0 and m["files"] == [] and m["first_seq"] is None and m["bytes"] == 0
    assert [f["subject_filter"] for f in m["filters"]] == ["a", "b"]
    assert os.listdir(m["folder"]) == ["_manifest.json"]
    assert staging.read_batch(staging.read_manifest(m["folder"])).num_rows == 0


def test_manifest_content(tmp_path):
    m = write_batch(str(tmp_path), make_messages(5))
    on_disk = json.loads(open(os.path.join(m["folder"], "_manifest.json")).read())
    assert on_disk == {k: v for k, v in m.items() if k != "folder"}
    assert set(on_disk) == {"version", "stream", "owner_id", "event_type", "interval_id", "subject_filters", "fragment", "bounds",
                            "first_seq", "last_seq", "count", "bytes", "filters", "files", "schema", "created_by"}
    assert on_disk["created_by"].startswith("airflow-provider-plgd ")
    assert on_disk["schema"][3] == "published_at:timestamp[us, tz=UTC]"


def test_write_rejects_out_of_order(tmp_path):
    with staging.StagingWriter(str(tmp_path), stream="EVENTS", owner_id=OWNER, event_type="devicesregistered",
                               interval_id="seq-000000000001-000000000010", subject_filters=["a", "b"],
                               bounds={}) as w:
        with pytest.raises(ValueError, match="start_filter"):
            w.write(make_messages(1))
        with pytest.raises(ValueError, match="not the next subject filter"):
            w.start_filter("b")
        w.start_filter("a")
        w.write(make_messages(3, first_seq=5))
        with pytest.raises(ValueError, match="strictly increase"):
            w.write(make_messages(1, first_seq=7))


# ---------------------------------------------------------------------------------------------
# storage back ends and readers
# ---------------------------------------------------------------------------------------------
def test_memory_and_file_urls(tmp_path):
    msgs = make_messages(20)
    m1 = write_batch("memory://plgd-unit/root", msgs)
    assert m1["folder"].startswith("memory://")
    assert staging.read_batch(staging.list_committed("memory://plgd-unit/root", "EVENTS")[0]).num_rows == 20
    fs = fsspec.filesystem("memory")
    assert not [p for p in fs.find("/plgd-unit") if "inprogress" in p]
    m2 = write_batch(f"file://{tmp_path}", msgs)
    assert m2["folder"] == staging.batch_path(str(tmp_path), "EVENTS", OWNER, "devicesregistered",
                                              "seq-000000000001-000000001000")
    fs.rm("/plgd-unit", recursive=True)


def test_object_store_path_writes_final_names(tmp_path, monkeypatch):
    """On object stores (one PUT is atomic) parts and manifest are written under their final names."""
    from airflow_provider_plgd import storage

    monkeypatch.setattr(storage, "OBJECT_STORE_PROTOCOLS", storage.OBJECT_STORE_PROTOCOLS | {"memory"})
    fs = fsspec.filesystem("memory")
    calls = []
    monkeypatch.setattr(type(fs), "mv", lambda self, *a, **k: calls.append(a))
    m = write_batch("memory://plgd-obj/root", make_messages(30), max_rows_per_file=10)
    assert calls == [] and len(m["files"]) == 3
    assert staging.read_batch(staging.read_manifest(m["folder"])).num_rows == 30
    fs.rm("/plgd-obj", recursive=True)


def test_object_storage_path(tmp_path):
    from airflow_provider_plgd.compat import ObjectStoragePath

    root = ObjectStoragePath(f"file://{tmp_path}/osp")
    m = write_batch(root, make_messages(3))
    assert m["folder"].startswith(str(tmp_path / "osp"))
    assert staging.list_committed(root, "EVENTS")[0]["count"] == 3


def test_list_committed_filters(tmp_path):
    root = str(tmp_path)
    for owner in ("o1", "o2"):
        for et in ("devicesregistered", "resourcechanged"):
            for iid in ("seq-000000000001-000000000002", "seq-000000000003-000000000004"):
                with staging.StagingWriter(root, stream="EVENTS", owner_id=owner, event_type=et, interval_id=iid,
                                           subject_filters=["x"], bounds={}) as w:
                    w.commit()
    # an uncommitted folder is ignored
    os.makedirs(staging.batch_path(root, "EVENTS", "o3", "devicesregistered", "seq-000000000001-000000000002"))
    assert len(staging.list_committed(root, "EVENTS")) == 8
    got = staging.list_committed(root, "EVENTS", interval_id="seq-000000000001-000000000002", owner_ids=["o2"])
    assert [(m["owner_id"], m["event_type"]) for m in got] == [("o2", "devicesregistered"), ("o2", "resourcechanged")]
    got = staging.list_committed(root, "EVENTS", owner_ids=["o1", "o2"], event_types=["resourcechanged"])
    assert len(got) == 4 and {m["event_type"] for m in got} == {"resourcechanged"}
    assert staging.list_committed(root, "OTHER") == []
    assert staging.list_committed(str(tmp_path / "missing"), "EVENTS") == []


def test_read_manifest_rejects_unknown_version(tmp_path):
    m = write_batch(str(tmp_path), make_messages(1))
    path = os.path.join(m["folder"], "_manifest.json")
    data = json.loads(open(path).read())
    data["version"] = 99
    open(path, "w").write(json.dumps(data))
    with pytest.raises(ValueError, match="version 99"):
        staging.read_manifest(path)


# ---------------------------------------------------------------------------------------------
# fragments: one batch folder written by several range fetches
# ---------------------------------------------------------------------------------------------
def test_fragments_of_one_batch_commit_and_clean_up_only_their_own_files(tmp_path):
    """Range fetches commit a batch in fragments (``_manifest-rNNNN.json``, ``part-rNNNN-…``); a
    fragment's commit and rerun never touch another fragment's files, nor does a whole-batch
    commit; the listing returns each committed fragment."""
    root = str(tmp_path)
    first, second = make_messages(30), make_messages(20, first_seq=100)
    a = write_batch(root, first, fragment=staging.fragment_name(0), max_rows_per_file=10)
    b = write_batch(root, second, fragment=staging.fragment_name(7))
    folder = a["folder"]
    assert a["folder"] == b["folder"] and (a["fragment"], b["fragment"]) == ("r0000", "r0007")
    assert sorted(os.listdir(folder)) == ["_manifest-r0000.json", "_manifest-r0007.json", "part-r0000-00000.parquet",
                                          "part-r0000-00001.parquet", "part-r0000-00002.parquet",
                                          "part-r0007-00000.parquet"]
    listed = staging.list_committed(root, "EVENTS")
    assert [(m["fragment"], m["count"]) for m in listed] == [("r0000", 30), ("r0007", 20)]
    assert staging.read_batch(staging.read_manifest(folder, "r0007")).column("stream_seq").to_pylist() == \
        [m[0] for m in second]
    # a rerun of fragment r0000 with fewer rows: its own stale part file goes, r0007 stays
    write_batch(root, first[:15], fragment="r0000", max_rows_per_file=10)
    assert sorted(os.listdir(folder)) == ["_manifest-r0000.json", "_manifest-r0007.json", "part-r0000-00000.parquet",
                                          "part-r0000-00001.parquet", "part-r0007-00000.parquet"]
    # a whole-batch commit in the same folder leaves the fragments alone
    write_batch(root, first[:3])
    assert {"_manifest-r0007.json", "part-r0007-00000.parquet", "_manifest.json"} <= set(os.listdir(folder))
    for bad in ("0003", "r12", "r00x1", "../r0001", "r0001/x"):
        with pytest.raises(ValueError, match="fragment must be"):
            write_batch(root, first, fragment=bad)


def test_flush_writes_pending_rows_without_changing_them(tmp_path):
    msgs = make_messages(40)
    with staging.StagingWriter(str(tmp_path), stream="EVENTS", owner_id=OWNER, event_type="devicesregistered",
                               interval_id="seq-000000000001-000000001000", subject_filters=["f1"],
                               bounds={"kind": "seq"}) as w:
        w.write(msgs[:25])
        assert w.pending_bytes == sum(len(m[4]) for m in msgs[:25])
        w.flush()
        assert w.pending_bytes == 0
        w.write(msgs[25:])
        manifest = w.commit()
    table = staging.read_batch(manifest)
    assert table.column("stream_seq").to_pylist() == [m[0] for m in msgs]
    assert [f["rows"] for f in manifest["files"]] == [40]


def test_map_io_keeps_the_order_runs_calls_at_once_and_raises_the_first_error():
    import threading

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
