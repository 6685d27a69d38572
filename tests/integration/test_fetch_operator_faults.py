"""JetStreamToStagingOperator against a real nats-server, continued: a server restart in the middle
of a fetch, durable-consumer mode, progress logs, spooling, and a time-bounded fetch of an interval
not complete on the server's clock. Ground truth: ``conftest.read_stream`` (test_fetch_operator.py).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from airflow_provider_plgd import times
from airflow_provider_plgd.exceptions import (
    IntervalNotCompleteError,
    JetStreamError,
)
from airflow_provider_plgd.plgd.subjects import registrations_subject
from airflow_provider_plgd.tables import staging, staging_commits
from airflow_provider_plgd.tables.layout import Layout
from tests.integration.conftest import publish_messages, read_stream
from tests.integration.delta_read import staging_batches, staging_rows
from tests.integration.fetch_operator_runs import (
    EVENT_TYPES,
    O1,
    O2,
    batch_rows,
    committed_seqs,
    expected_seqs,
    make_messages,
    run_op,
)

pytestmark = pytest.mark.airflow

# ---------------------------------------------------------------------------------------------
# server restart in the middle of a fetch
# ---------------------------------------------------------------------------------------------
def test_server_restart_mid_fetch_then_retry_commits_no_gap_no_duplicate(jetstream, storage_root, monkeypatch):
    from airflow_provider_plgd.fetch.stager import Stager

    n = 6000
    subj = registrations_subject(O1, "devicesregistered")
    publish_messages(jetstream.url, [(subj, f"m{i}".encode() * 20, None) for i in range(n)], window=1000)
    truth = read_stream(jetstream.url)
    kw = dict(owner_id=O1, event_type="devicesregistered", storage_root=storage_root, start_seq=1,
              end_seq=max(truth), batch_size=50, row_group_size=500)
    # an earlier committed run of the same interval (e.g. before a clear + rerun)
    run_op(**kw)
    before = staging_rows(storage_root)
    assert [r["stream_seq"] for r in before] == sorted(truth)

    # slow the fetch down so the restart lands in the middle of it
    progress = {"rows": 0}
    real_add = Stager.add

    def slow_add(self, owner, event_type, messages):
        real_add(self, owner, event_type, messages)
        progress["rows"] += len(messages)
        time.sleep(0.01)

    monkeypatch.setattr(Stager, "add", slow_add)
    result: dict = {}

    def fetch():
        try:
            result["out"] = run_op(**kw)
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=fetch)
    thread.start()
    deadline = time.monotonic() + 30
    while progress["rows"] < 1000 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert 0 < progress["rows"] < n, progress
    jetstream.stop()
    # while the server is down: readers see the earlier commit whole, nothing of the rerun
    time.sleep(0.5)
    assert staging_rows(storage_root) == before
    jetstream.start()
    thread.join(60)
    assert not thread.is_alive()
    if "error" in result:  # failed cleanly: a typed error, the earlier commit still whole
        assert isinstance(result["error"], JetStreamError), repr(result["error"])
        assert staging_rows(storage_root) == before
    monkeypatch.setattr(Stager, "add", real_add)
    out = run_op(**kw)  # the retry
    assert [r["stream_seq"] for r in staging_rows(storage_root)] == sorted(truth)  # no gap, no duplicate
    assert out["count"] == n and len(staging.staged_files(Layout.of(storage_root), "EVENTS")) == out["batches"][0]["files"]


# ---------------------------------------------------------------------------------------------
# durable-consumer mode
# ---------------------------------------------------------------------------------------------
def test_durable_mode_batches_ack_after_commit_and_redeliver_on_failure(jetstream, storage_root, monkeypatch):
    publish_messages(jetstream.url, make_messages("dur", 10))
    truth = read_stream(jetstream.url)
    all_rc = expected_seqs(truth, O1, "resourcechanged", 0, 2**63)
    kw = dict(owner_id=O1, event_type="resourcechanged", storage_root=storage_root, durable="plgd_test_dur",
              max_messages=12, ack_wait_seconds=1.0)
    first = run_op(**kw)
    assert first["count"] == 12 and first["interval_id"].startswith("durable-")
    # a failed commit does not ack: the next run (after ack_wait) gets the same messages again
    real_commit = staging_commits.commit_batches
    monkeypatch.setattr(staging_commits, "commit_batches", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        run_op(**kw)
    monkeypatch.setattr(staging_commits, "commit_batches", real_commit)
    time.sleep(1.5)
    intervals = [first["interval_id"]]
    while True:
        out = run_op(**kw)
        if out["count"] == 0:
            break
        intervals.append(out["interval_id"])
    # at-least-once and, here, exactly once: every message of the selection once, in stream order per batch
    batches = staging_batches(storage_root)
    assert sorted(i for _o, _e, i in batches) == sorted(intervals) and len(intervals) == -(-len(all_rc) // 12)
    got = [r["stream_seq"] for rows in batches.values() for r in rows]
    assert sorted(got) == sorted(all_rc) and all(r["owner_id"] == O1 for rows in batches.values() for r in rows)


def test_progress_is_logged_during_long_fetches(jetstream, storage_root, caplog, capfd):
    publish_messages(jetstream.url, [(registrations_subject(O1, "devicesregistered"), b"p" * 100, None)] * 1000)
    run_op(owner_id=O1, event_type="devicesregistered", storage_root=storage_root, start_seq=1, batch_size=100,
           progress_every_messages=250, progress_interval_seconds=3600)
    text = caplog.text + capfd.readouterr().out
    lines = [x for x in text.splitlines() if "behind the stream head" in x]
    assert len(lines) >= 3, text[-3000:]
    assert "msgs/s" in lines[0] and "MB/s" in lines[0] and "at seq" in lines[0]


# ---------------------------------------------------------------------------------------------
# spooling: none for bounded fetches, a documented folder for durable mode
# ---------------------------------------------------------------------------------------------
def test_nothing_spills_to_tmpdir_and_spills_go_where_configured(jetstream, tmp_path, monkeypatch):
    """Before: the owner-wide fetch spooled every second filter to $TMPDIR, and durable mode too
    (``plgd-durable-*.arrow``, left behind by a kill; a bare ENOSPC). Now a fetch keeps its rows
    in memory up to ``range_buffer_bytes`` and writes nothing to $TMPDIR; past it, sorted runs go
    to the spill folder under the storage root (or ``spool_dir``), the leftovers of killed runs are
    removed, and a full disk names the spill file."""
    import tempfile

    publish_messages(jetstream.url, make_messages("spool", 12))
    truth = read_stream(jetstream.url)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-tmpdir"))  # any use of $TMPDIR fails
    root = str(tmp_path / "root")
    grouped = run_op(owner_ids=[O1, O2], event_types=EVENT_TYPES, storage_root=root, batch_size=7,
                     start_time="2020-01-01T00:00:00Z", end_time=time.time_ns())
    for batch in grouped["batches"]:
        assert committed_seqs(root, batch["owner_id"], batch["event_type"]) == \
            expected_seqs(truth, batch["owner_id"], batch["event_type"], 0, 2**63)
    assert not Path(root, "staging", "_spool").exists()

    spool = Path(root, "staging", "_spool")  # the default spill folder of a local storage root
    spool.mkdir(parents=True)
    stale = [spool / "plgd-durable-spool-c-f1-99-deadbeef.arrow", spool / "plgd-stage-99-deadbeef-0.arrow"]
    young = spool / "plgd-stage-98-feedf00d-0.arrow"  # may belong to a live run: kept
    for path in [*stale, young]:
        path.write_bytes(b"x" * 1000)
    old = time.time() - 2 * 3600
    for path in stale:
        os.utime(path, (old, old))
    out = run_op(owner_id=O1, event_type="resourcechanged", durable="plgd_spool", storage_root=root,
                 range_buffer_bytes=200, batch_size=5)  # spills every few messages
    assert committed_seqs(root, O1, "resourcechanged", out["interval_id"]) == \
        expected_seqs(truth, O1, "resourcechanged", 0, 2**63)
    assert os.listdir(spool) == [young.name]  # its runs were removed, and the stale files

    # spool_dir: where the user says; a full disk (the folder holds a link to /dev/full) names the file
    full = tmp_path / "spill-on-a-full-disk"
    full.mkdir()
    real_osfile = __import__("pyarrow").OSFile

    def to_full(path, mode="r"):
        return real_osfile("/dev/full" if str(path).startswith(str(full)) else path, mode)

    monkeypatch.setattr("pyarrow.OSFile", to_full)
    with pytest.raises(OSError, match=rf"cannot write the spill file {full}/plgd-stage-.*No space left") as info:
        run_op(owner_id=O1, event_type="resourcechanged", durable="plgd_spool2", storage_root=root,
               spool_dir=str(full), range_buffer_bytes=200, batch_size=5)
    assert info.value.errno == 28


# ---------------------------------------------------------------------------------------------
# a time-bounded fetch commits only intervals complete on the server's clock
# ---------------------------------------------------------------------------------------------
def test_fetch_of_an_interval_not_complete_on_the_server_clock_fails_and_commits_nothing(jetstream, storage_root):
    """The fetch checks completeness itself (not only the sensor): while the NATS server's clock is
    before the end (+ settle_seconds) and the stream holds no message at or after the end, it fails
    with the retryable IntervalNotCompleteError naming the interval and the server's time, and
    commits nothing; the retry after the end commits every message of the interval."""
    subj = registrations_subject(O1, "devicesregistered")
    end_ns = time.time_ns() + 3_000_000_000
    start_ns = end_ns - 60_000_000_000
    publish_messages(jetstream.url, [(subj, f"early-{i}".encode(), None) for i in range(10)])
    kw = dict(owner_id=O1, event_type="devicesregistered", storage_root=storage_root, start_time=start_ns,
              end_time=end_ns)
    with pytest.raises(IntervalNotCompleteError) as info:
        run_op(**kw)
    err = info.value
    assert isinstance(err, JetStreamError)
    assert (err.stream, err.start_ns, err.end_ns, err.settle_seconds) == ("EVENTS", start_ns, end_ns, 0.0)
    assert start_ns < err.last_ts_ns < err.server_time_ns < end_ns
    text = str(err)
    assert f"[{times.ns_to_rfc3339(start_ns)}, {times.ns_to_rfc3339(end_ns)})" in text
    assert f"the server's time is {times.ns_to_rfc3339(err.server_time_ns)}" in text
    assert "nothing was committed" in text and "Retry after the interval's end" in text
    assert os.listdir(storage_root) == []

    publish_messages(jetstream.url, [(subj, f"late-{i}".encode(), None) for i in range(5)])
    assert time.time_ns() < end_ns, "the test machine was too slow"
    while time.time_ns() < end_ns + 50_000_000:
        time.sleep(0.02)
    # the server's clock passed the end, but not end + settle_seconds, and no newer message: still refused
    with pytest.raises(IntervalNotCompleteError, match="settle_seconds=30"):
        run_op(settle_seconds="30", **kw)  # templated fields arrive as strings
    assert os.listdir(storage_root) == []
    # settle_seconds 0 (default): the server's clock passed the end, nothing older can be stored any more
    out = run_op(**kw)
    data = [r["data"] for r in batch_rows(storage_root, O1, "devicesregistered", out["interval_id"])]
    assert data == [f"early-{i}".encode() for i in range(10)] + [f"late-{i}".encode() for i in range(5)]
    # a stored message at or after the end completes it under any settle time
    publish_messages(jetstream.url, [(subj, b"next interval", None)])
    again = run_op(settle_seconds=3600, **kw)
    strip = lambda x: {**x, "batches": [{**b, "delta_version": None} for b in x["batches"]]}  # noqa: E731
    assert again["stream_last_seq"] == 16 and strip({**again, "stream_last_seq": 15}) == strip(out)
    with pytest.raises(ValueError, match="settle_seconds must be a number of seconds >= 0, got '-1'"):
        run_op(settle_seconds="-1", **kw)
