"""Fault injection on the fetch side: a real nats-server killed mid-fetch under Airflow retries,
messages that expired from the stream before a backfill reached them, and durable-consumer
redelivery after a crash between commit and ack.

Ground truth is read independently of the hook (``conftest.read_stream``: every stored message
with its server timestamp). Sections of docs/reliability.md: "Failures: NATS, Spark and
Airflow", "Expired messages and incomplete intervals", "Exactly-once output". Non-UTF-8 subjects,
a dead read loop and durable retries: test_faults_nats_subjects.py.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from datetime import datetime, timezone

import pytest

from airflow_provider_plgd import times
from airflow_provider_plgd.exceptions import MessagesExpiredError
from airflow_provider_plgd.fetch.retention import check_retained
from airflow_provider_plgd.plgd.subjects import registrations_subject
from airflow_provider_plgd.tables import staging
from airflow_provider_plgd.tables.layout import Layout
from plgd_devtools.nats_server import BUNDLE_STREAM_CONFIG, recreate_stream
from plgd_devtools.spark import spark_lock
from tests.integration.conftest import load_dag, publish_messages, read_stream
from tests.integration.delta_read import staging_batches, staging_rows
from tests.integration.fetch_faults import O1, _wait, committed, expected, run_op

pytestmark = pytest.mark.airflow

UTC = timezone.utc

# ---------------------------------------------------------------------------------------------
# nats-server SIGKILLed while fetch tasks run; Airflow retries
# ---------------------------------------------------------------------------------------------
DAG_FILE = """
import tempfile
from datetime import datetime, timedelta, timezone
from airflow.sdk import DAG
from airflow_provider_plgd.operators.jetstream_to_staging import JetStreamToStagingOperator

with DAG("plgd_test_faults_nats_kill", schedule=timedelta(seconds=INTERVAL),
         start_date=datetime(2026, 1, 1, tzinfo=timezone.utc), catchup=False, render_template_as_native_obj=True,
         default_args={"retries": 2, "retry_delay": timedelta(seconds=1)},
         params={"storage_root": "", "owners": [], "event_types": []}) as dag:
    # the storage_root param of a run may name a root below the temp folder (the operator's allowlist)
    first = JetStreamToStagingOperator(task_id="fetch_a", owner_ids="{{ params.owners }}",
                                       event_types="{{ params.event_types[:3] }}", batch_size=20, row_group_size=50,
                                       storage_roots=[tempfile.gettempdir()])
    second = JetStreamToStagingOperator(task_id="fetch_b", owner_ids="{{ params.owners }}",
                                        event_types="{{ params.event_types[3:] }}", batch_size=20, row_group_size=50,
                                        storage_roots=[tempfile.gettempdir()])
    first >> second
"""


def test_nats_killed_mid_fetch_airflow_retries_commit_exactly_the_published_messages(
        jetstream, dags_folder, storage_root, monkeypatch):
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    from airflow_provider_plgd.simulator import SimulationConfig, generate

    interval = 3.0
    path = dags_folder / "plgd_test_faults_nats_kill.py"
    path.write_text(DAG_FILE.replace("INTERVAL", str(interval)))
    dag = load_dag(path, "plgd_test_faults_nats_kill")
    sim = generate(SimulationConfig(seed=21, owners=2, devices_per_owner=3, resources_per_device=3, intervals=1,
                                    duplicates=0.05, leadrt="first", target_messages=1500))
    owners = sorted({m.owner_id for m in sim.messages})
    by_type = Counter(m.event_type for m in sim.messages)
    event_types = [et for et, _ in by_type.most_common()]
    start = (int(time.time() / interval) + 1) * interval
    time.sleep(max(0.0, start + 0.05 - time.time()))
    publish_messages(jetstream.url, [(m.subject, m.data, None) for m in sim.messages], window=500)
    assert time.time() < start + interval, "publishing took longer than the interval"
    time.sleep(max(0.0, start + interval - time.time()))
    truth = read_stream(jetstream.url)
    assert len(truth) == len(sim.messages)

    # Slow the reading down so the kill lands in the middle of fetch_a, while its consumer reads
    # (each owner's messages come through one consumer and are routed to their batches on the
    # client); the killer thread SIGKILLs nats-server after 200 routed messages and restarts it
    # (same port and store) 0.5 s later.
    from airflow_provider_plgd.fetch import router as fetch_module

    rows = {"n": 0}
    real_route = fetch_module.Router.route

    def slow_route(self, batch):
        rows["n"] += len(batch)
        time.sleep(0.02)
        return real_route(self, batch)

    monkeypatch.setattr(fetch_module.Router, "route", slow_route)
    killed = threading.Event()

    def killer():
        deadline = time.monotonic() + 60
        while rows["n"] < 200 and time.monotonic() < deadline:
            time.sleep(0.005)
        os.kill(jetstream.pid, signal.SIGKILL)
        killed.set()
        jetstream.stop()  # reaps the killed process
        time.sleep(0.5)
        jetstream.start()

    end = datetime.fromtimestamp(start + interval, tz=UTC)
    with spark_lock():  # DAG runs take the shared lock (2-core CI machine)
        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        dr = dag.test(logical_date=end, run_conf={"storage_root": storage_root, "owners": owners,
                                                  "event_types": event_types})
        thread.join(30)
    assert killed.is_set() and jetstream.pid is not None
    assert str(dr.state) in ("success", "DagRunState.SUCCESS"), dr.state
    with create_session() as session:
        tries = {ti.task_id: ti.try_number for ti in session.query(TaskInstance).filter(
            TaskInstance.dag_id == dag.dag_id, TaskInstance.run_id == dr.run_id)}
    assert tries["fetch_a"] >= 2, tries  # it failed once (the kill) and was retried by Airflow

    s_ns, e_ns = int(start * 1e9), int((start + interval) * 1e9)
    got = committed(storage_root, times.interval_id(s_ns, e_ns))
    assert set(got) == {(o, e) for o in owners for e in event_types}  # no _unknown message, no row
    for (owner, event_type), seqs in got.items():
        assert seqs == expected(truth, owner, event_type, s_ns, e_ns), (owner, event_type)
    all_seqs = sorted(s for seqs in got.values() for s in seqs)
    assert all_seqs == sorted(truth)  # every published message exactly once: no loss, no duplicate
    table = Layout.of(storage_root).staging_table("EVENTS")
    on_disk = sorted(os.path.relpath(os.path.join(p, f), table) for p, _, files in os.walk(table)
                     for f in files if f.endswith(".parquet"))
    assert on_disk == sorted(f.path for f in staging.staged_files(Layout.of(storage_root), "EVENTS"))  # no leftover


# ---------------------------------------------------------------------------------------------
# Messages that expired (max_age) before a backfill reached them
# ---------------------------------------------------------------------------------------------


def test_backfill_of_expired_messages_reports_the_missing_range(jetstream, storage_root):
    from airflow_provider_plgd.hooks.jetstream import JetStreamHook

    recreate_stream(jetstream.url, {**BUNDLE_STREAM_CONFIG, "max_age": 1_000_000_000,  # max_age 1 s
                                  "duplicate_window": 1_000_000_000})
    subj = registrations_subject(O1, "devicesregistered")
    old_start = time.time_ns()
    publish_messages(jetstream.url, [(subj, f"old-{i}".encode(), None) for i in range(20)])
    old_end = time.time_ns()
    # a backfill of that interval while the messages are still there commits all 20
    kw = dict(owner_id=O1, event_type="devicesregistered", storage_root=storage_root)
    assert run_op(start_time=old_start, end_time=old_end, **kw)["count"] == 20
    hook = JetStreamHook()
    _wait(lambda: hook.stream_info()["state"]["messages"] == 0, what="max_age expiry")

    # the stream is empty now: a rerun of the old interval fails clearly, and withdraws nothing
    # silently: the earlier committed batch stays as it was (the check runs before the writer opens)
    iid = times.interval_id(old_start, old_end)
    with pytest.raises(MessagesExpiredError) as info:
        run_op(start_time=old_start, end_time=old_end, **kw)
    err = info.value
    assert (err.missing_first_seq, err.missing_last_seq, err.first_seq) == (1, 20, 21)
    assert err.missing_start_ns == old_start and old_start < err.missing_end_ns <= old_end
    text = str(err)
    assert "no longer holds every message of the interval" in text and "1..20" in text and "it is empty" in text
    assert times.ns_to_rfc3339(old_start) in text and "nothing was committed" in text
    assert committed(storage_root, iid)[(O1, "devicesregistered")] == list(range(1, 21))

    publish_messages(jetstream.url, [(subj, f"new-{i}".encode(), None) for i in range(10)])
    new_end = time.time_ns()
    # a backfill that starts before the oldest retained message: fails, names range and sequences
    with pytest.raises(MessagesExpiredError, match=r"sequences 1\.\.20 were removed") as info:
        run_op(start_time=old_start, end_time=new_end, **kw)
    state = hook.stream_info()["state"]
    assert info.value.first_seq == 21 == state["first_seq"]
    assert "its oldest retained message (seq 21) is from" in str(info.value)
    assert committed(storage_root, times.interval_id(old_start, new_end)) == {}
    # sequence bounds: exactly the missing sequences
    with pytest.raises(MessagesExpiredError, match=r"no longer holds stream sequences 5\.\.20 of the requested "
                                                   r"range \[5, 30\]") as info:
        run_op(start_seq=5, end_seq=30, **kw)
    assert (info.value.missing_first_seq, info.value.missing_last_seq) == (5, 20)
    # intervals the stream still holds completely are fetched as usual
    after = run_op(start_seq=21, **kw)
    assert after["count"] == 10 and (after["first_seq"], after["last_seq"]) == (21, 30)
    newer = staging_rows(storage_root, interval_id=after["interval_id"])
    assert [r["data"] for r in newer] == [f"new-{i}".encode() for i in range(10)]


def test_expired_check_rule_without_a_server():
    """check_retained on hand-made stream states (the rule of docs/reliability.md)."""
    t0 = 1_767_225_600_000_000_000
    time_bounds = {"kind": "time", "start_ns": t0, "end_ns": t0 + 10**9}
    untouched = {"first_seq": 1, "messages": 5, "first_ts": "2026-01-01T00:00:05Z"}
    check_retained(untouched, "EVENTS", time_bounds, when="before the fetch")  # nothing ever removed
    older = {"first_seq": 9, "messages": 5, "first_ts": "2025-12-31T23:59:59.5Z"}
    check_retained(older, "EVENTS", time_bounds, when="before the fetch")  # removed ones predate start
    newer = {"first_seq": 9, "messages": 5, "first_ts": "2026-01-01T00:00:00.25Z"}
    with pytest.raises(MessagesExpiredError, match=r"\[2026-01-01T00:00:00Z, 2026-01-01T00:00:00.250000Z\) "
                                                   r"may be missing") as info:
        check_retained(newer, "EVENTS", time_bounds, when="during the fetch")
    assert "noticed during the fetch" in str(info.value) and info.value.missing_end_ns == t0 + 250_000_000
    empty_old = {"first_seq": 9, "messages": 0, "first_ts": "0001-01-01T00:00:00Z",
                 "last_ts": "2025-12-31T00:00:00Z"}
    check_retained(empty_old, "EVENTS", time_bounds, when="before the fetch")
    check_retained(newer, "EVENTS", {"kind": "seq", "start_seq": 9, "end_seq": 20}, when="before the fetch")
    with pytest.raises(MessagesExpiredError, match=r"sequences 2\.\.3 of the requested range \[2, 3\]"):
        check_retained(newer, "EVENTS", {"kind": "seq", "start_seq": 2, "end_seq": 3}, when="before the fetch")
    check_retained(newer, "EVENTS", {"kind": "durable", "consumer": "c", "max_messages": 5}, when="x")


# ---------------------------------------------------------------------------------------------
# Durable consumer: crash after the commit, before the ack -> redelivery into the next batch
# ---------------------------------------------------------------------------------------------
def test_durable_crash_between_commit_and_ack_redelivers_into_an_overlapping_batch(
        jetstream, storage_root, monkeypatch):
    """At-least-once: the redelivered messages are staged again, in an overlapping ``durable-`` batch
    when the retry's batch has other boundaries; every message is staged, and the overlap is exactly
    the unacknowledged batch. Dedupe drops such copies across batches
    (test_faults_spark.py::test_overlapping_durable_batches_are_deduplicated)."""
    from airflow_provider_plgd.jetstream.api import JetStreamApi

    subj = registrations_subject(O1, "devicesregistered")
    publish_messages(jetstream.url, [(subj, f"d-{i}".encode(), None) for i in range(25)])
    kw = dict(owner_id=O1, event_type="devicesregistered", storage_root=storage_root, durable="plgd_faults_dur",
              max_messages=10, ack_wait_seconds=1.0)
    first = run_op(**kw)
    assert (first["first_seq"], first["last_seq"]) == (1, 10)

    async def crash(self, *a, **k):
        raise ConnectionResetError("injected: worker died before the ack")

    real_ack = JetStreamApi.ack
    monkeypatch.setattr(JetStreamApi, "ack", crash)
    with pytest.raises(ConnectionResetError):
        run_op(**kw)  # batch 11..20 is committed, but not acknowledged
    monkeypatch.setattr(JetStreamApi, "ack", real_ack)
    lost_ack = staging_batches(storage_root)
    assert sorted(i for _o, _e, i in lost_ack) == [times.durable_interval_id(1, 10), times.durable_interval_id(11, 20)]
    publish_messages(jetstream.url, [(subj, f"d-{i}".encode(), None) for i in range(25, 30)])
    time.sleep(1.5)  # ack_wait: the unacknowledged messages are redelivered
    kw["max_messages"] = 15  # the retry's batch has other boundaries than the crashed one
    seqs = []
    while (out := run_op(**kw))["count"]:
        seqs.append((out["first_seq"], out["last_seq"]))
    assert seqs == [(11, 25), (26, 30)]
    staged = Counter(r["stream_seq"] for r in staging_rows(storage_root))
    assert sorted(staged) == list(range(1, 31))  # nothing lost
    assert sorted(s for s, n in staged.items() if n == 2) == list(range(11, 21))  # at-least-once overlap
    assert max(staged.values()) == 2
