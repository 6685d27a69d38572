"""``plgd-etl status`` on a real chain with a hole, against a real nats-server.

The chain is written with the project's own functions: the interval ledger (``ledger.plan_record``
of the sequence ranges the messages got when published, ``stream.json``; a ``summary.json`` that
does not reconcile), the interval tables (``plgd_devtools.interval_tables``: decode and dedupe
commits in the Spark applications' layout) and the snapshot record. Seven hourly intervals:

    I0 committed | I1 planned, messages, not committed (a hole) | I2, I3 committed (I3: the head)
    I4 planned, messages, decoded but not deduplicated, summary "does not reconcile" (unfinished, failed)
    I5 never planned | I6 planned, the stream held nothing (empty)

The expected lag is read independently with nats-py: the stream's messages after I3's range and
the last message's server time minus I3's end. The command runs as a subprocess
(``python -m airflow_provider_plgd.cli``, what the ``plgd-etl`` console script calls).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from deltalake import DeltaTable

from airflow_provider_plgd import times
from airflow_provider_plgd.simulator import SimulationConfig, generate
from airflow_provider_plgd.tables import ledger, storage
from airflow_provider_plgd.tables.layout import Layout
from plgd_devtools import interval_tables
from tests.integration.conftest import publish_messages, read_stream

REPO = Path(__file__).resolve().parents[2]
HOUR = 3600 * 10**9


def plan(root: str, interval_id: str, first_seq: int, end_seq: int, count: int) -> None:
    """Record ``stream.json`` of an interval whose messages are the sequences ``[first_seq, end_seq)``."""
    counted = {"stream": "EVENTS", "created": "2026-01-01T00:00:00Z", "state": {}, "first_seq": first_seq,
               "end_seq_exclusive": end_seq, "total": count, "scope_total": count, "read_total": count,
               "ranges": [{"first_seq": first_seq, "end_seq_exclusive": end_seq, "count": count}] if count else []}
    interval = times.Interval.from_id(interval_id)
    record = ledger.plan_record(counted, interval_id=interval_id, bounds=interval.bounds(), owners=None,
                                event_types=["resourcechanged"], read_filters=[ledger.SCOPE_FILTER])
    ledger.write_ledger_file(storage.join_path(ledger.interval_dir(Layout.of(root), "EVENTS", interval_id), "stream.json"), record)


def run_status(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "airflow_provider_plgd.cli", "status", *args], capture_output=True,
                          text=True, timeout=120, cwd=REPO)


def test_status_shows_the_chain_with_its_hole_the_tables_and_the_lag(jetstream, tmp_path):
    root = str(tmp_path / "root")
    start_ns = (time.time_ns() // HOUR - 8) * HOUR
    sim = generate(SimulationConfig(seed=9, owners=2, devices_per_owner=2, resources_per_device=2, intervals=7,
                                    steps_per_interval=6, interval_seconds=3600.0, start_time_ns=start_ns))
    ids = interval_tables.interval_ids(sim)
    decoded = interval_tables.decoded_intervals(sim)
    # publish each interval's messages except I5 and I6 (the stream held nothing for I6; I5 never planned)
    ranges: dict[int, tuple[int, int]] = {}
    for k in (0, 1, 2, 3, 4):
        msgs = [(m.subject, m.data, None) for m in sim.messages if m.interval == k]
        seqs = publish_messages(jetstream.url, msgs)
        ranges[k] = (seqs[0], seqs[-1] + 1)
    tail = publish_messages(jetstream.url, [(m.subject, m.data, None) for m in sim.messages if m.interval == 5])
    for k in (0, 1, 2, 3, 4):
        plan(root, ids[k], *ranges[k], ranges[k][1] - ranges[k][0])
    plan(root, ids[6], tail[-1] + 1, tail[-1] + 1, 0)
    for k in (0, 2, 3):
        interval_tables.commit_interval_tables(root, ids[k], *decoded[k])
    interval_tables.commit_snapshot_record(root, ids[3], [ids[0], ids[2], ids[3]])
    interval_tables.commit_interval_tables(root, ids[4], *decoded[4], dedupe=False)  # decoded, dedupe failed
    ledger.write_ledger_file(storage.join_path(ledger.interval_dir(Layout.of(root), "EVENTS", ids[4]), "summary.json"),
                      {"version": ledger.LEDGER_VERSION, "interval_id": ids[4], "stream": "EVENTS", "chain": {},
                       "problems": ["dedupe: no run summary"], "reconciled": False})

    # ground truth, read with nats-py and polars (not with the code under test)
    stored = read_stream(jetstream.url)
    behind = [seq for seq in stored if seq >= ranges[3][1]]
    last_ns = stored[max(stored)][1]
    rows = {t: pl.read_delta(str(Path(root) / t)).height for t in ("events", "events_deduped", "msgid_index")}

    proc = run_status("--root", root, "--json", "--servers", jetstream.url)
    assert proc.returncode == 1, proc.stderr  # a hole and a failed interval
    view = json.loads(proc.stdout)
    chain = view["chain"]
    assert chain["head"] == ids[3]
    assert chain["snapshot"]["interval_id"] == ids[3]
    assert (chain["planned"], chain["committed"], chain["empty"]) == (6, 3, 1)
    assert chain["holes"] == [{"interval_id": ids[1], "messages": ranges[1][1] - ranges[1][0]}]
    assert chain["unfinished"] == [{"interval_id": ids[4], "messages": ranges[4][1] - ranges[4][0]}]
    assert chain["failed"] == [{"interval_id": ids[4], "problem": "dedupe: no run summary"}]
    assert chain["never_planned"] == [{"start": times.ns_to_rfc3339(start_ns + 5 * HOUR),
                                       "end": times.ns_to_rfc3339(start_ns + 6 * HOUR)}]
    tables = view["tables"]
    for name, count in rows.items():
        table = DeltaTable(str(Path(root) / name))
        assert tables[name]["rows"] == count
        assert tables[name]["version"] == table.version()
        assert tables[name]["files"] == len(table.file_uris())
    assert tables["events"]["intervals"] == 4 and tables["msgid_index"]["intervals"] == 3
    assert tables["quarantine"]["rows"] == 0
    assert tables["snapshots/resources"]["version"] is None  # the record only, no snapshot rows here
    lag = view["lag"]
    assert lag["messages"] == len(behind) > 0
    assert lag["last_seq"] == max(stored)
    assert lag["seconds"] == pytest.approx((last_ns - (start_ns + 4 * HOUR)) / 1e9, abs=1e-3)

    text = run_status("--root", root, "--servers", jetstream.url)
    assert text.returncode == 1
    assert f"holes (1):\n    {ids[1]} ({ranges[1][1] - ranges[1][0]} messages)" in text.stdout
    assert f"lag {len(behind)} messages" in text.stdout
    assert f"chain: head {ids[3]}" in text.stdout


def test_status_of_an_empty_root_and_bad_arguments(tmp_path):
    proc = run_status("--root", str(tmp_path / "nothing"), "--json")
    assert proc.returncode == 0, proc.stderr
    view = json.loads(proc.stdout)
    assert view["chain"]["head"] is None and view["chain"]["planned"] == 0 and view["lag"] is None
    assert view["tables"]["events"] == {"uri": str(tmp_path / "nothing" / "events"), "version": None, "files": 0,
                                        "rows": 0, "intervals": None}
    bad = run_status("--root", str(tmp_path), "--servers", "nats://user:secret@127.0.0.1:4222")
    assert bad.returncode == 2 and "secret" not in bad.stderr and "credentials" in bad.stderr
    bad = run_status("--root", str(tmp_path), "--stream", "EV/ENTS")
    assert bad.returncode == 2 and "EV/ENTS" in bad.stderr


def _planned(root: str, interval_id: str, count: int, run_version_ms: int) -> None:
    """``stream.json`` of a run of the interval planned at ``run_version_ms`` (unix ms)."""
    plan(root, interval_id, 1, 1 + count, count)
    path = storage.join_path(ledger.interval_dir(Layout.of(root), "EVENTS", interval_id), "stream.json")
    record = ledger.read_ledger_file(path)
    record["run_version"] = run_version_ms
    ledger.write_ledger_file(path, record)


def _reconciled(root: str, interval_id: str, run_version_ms: int) -> None:
    """The ``summary.json`` the summary step writes for a run that reconciled."""
    ledger.write_ledger_file(storage.join_path(ledger.interval_dir(Layout.of(root), "EVENTS", interval_id),
                                               "summary.json"),
                             {"version": ledger.LEDGER_VERSION, "interval_id": interval_id, "stream": "EVENTS",
                              "chain": {}, "run_version": run_version_ms, "problems": [], "reconciled": True})


def test_status_counts_an_interval_done_only_when_its_newest_run_finished(tmp_path):
    """Issue 39, B. Three hourly intervals; I0 and I1 done (dedupe, the latest snapshot, a
    reconciled summary of their newest run): healthy. I2's rebuild is killed (dedupe committed, no
    snapshot, no summary) and its plan is 90 min old: not healthy, I2 named "not in the latest
    snapshot" (within --overdue-seconds it may still be running: healthy). Then I0 is rerun and
    its dedupe commits other rows (a message fewer): its old summary.json is an earlier run's, and
    I1 and I2 are stale (they were deduplicated before I0 changed); each is named."""
    root = str(tmp_path / "root")
    now_ms = time.time_ns() // 1_000_000
    start_ns = (time.time_ns() // HOUR - 4) * HOUR
    sim = generate(SimulationConfig(seed=4, owners=1, devices_per_owner=2, resources_per_device=2, intervals=3,
                                    steps_per_interval=6, interval_seconds=3600.0, start_time_ns=start_ns))
    ids = interval_tables.interval_ids(sim)
    decoded = interval_tables.decoded_intervals(sim)
    runs = {0: now_ms - 3 * 3600_000, 1: now_ms - 2 * 3600_000, 2: now_ms - 90 * 60_000}
    for k in (0, 1):
        _planned(root, ids[k], decoded[k][0].num_rows, runs[k])
        interval_tables.commit_interval_tables(root, ids[k], *decoded[k])
    interval_tables.commit_snapshot_record(root, ids[1], [ids[0], ids[1]])
    for k in (0, 1):
        _reconciled(root, ids[k], runs[k])
    healthy = run_status("--root", root, "--json")
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert json.loads(healthy.stdout).get("problems", []) == []

    # I2: planned, decoded and deduplicated; its rebuild killed (no snapshot, no summary)
    _planned(root, ids[2], decoded[2][0].num_rows, runs[2])
    interval_tables.commit_interval_tables(root, ids[2], *decoded[2])
    killed = run_status("--root", root, "--json")
    assert killed.returncode == 1, killed.stdout
    chain = json.loads(killed.stdout)["chain"]
    assert chain["newest_planned"] == ids[2] and chain["newest_overdue"] is True
    assert chain["not_done"] == [{"interval_id": ids[2],
                                  "reason": f"not in the latest snapshot {ids[1].split('_')[1]}"}]
    assert run_status("--root", root, "--overdue-seconds", "7200").returncode == 0  # may still be running

    # I0 rerun: planned again now, its dedupe commits one message fewer (the stream lost it); the
    # run stops before its summary
    _planned(root, ids[0], decoded[0][0].num_rows - 1, now_ms)
    events, quarantine = decoded[0]
    interval_tables.commit_interval_tables(root, ids[0], events.slice(1), quarantine)
    rerun = run_status("--root", root, "--json", "--overdue-seconds", "7200")
    assert rerun.returncode == 1, rerun.stdout
    chain = json.loads(rerun.stdout)["chain"]
    reasons = {n["interval_id"]: n["reason"] for n in chain["not_done"]}
    assert chain["stale"] == [ids[1], ids[2]]
    assert reasons[ids[1]].startswith(f"stale: deduplicated before {ids[0]} was deduplicated again")
    assert reasons[ids[0]].startswith(f"its newest run (planned at {now_ms} ms) has no summary")
    text = run_status("--root", root, "--overdue-seconds", "7200")
    assert text.returncode == 1 and "NOT HEALTHY" in text.stdout and f"{ids[1]}: stale" in text.stdout
