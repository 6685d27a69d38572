"""Interval-complete sensor (poke and deferrable, in real DAG runs), its trigger, and the nats message-queue trigger.

Completeness on the NATS server's clock and after a failed check: test_sensor_server_clock.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from airflow_provider_plgd.exceptions import IntervalNotCompleteError
from airflow_provider_plgd.sensors.interval_complete import JetStreamIntervalCompleteSensor
from airflow_provider_plgd.triggers.interval_complete import JetStreamIntervalCompleteTrigger
from airflow_provider_plgd.triggers.messages import JetStreamMessageTrigger
from tests.integration.conftest import load_dag, publish_messages, xcom_value
from tests.integration.trigger_runs import SUBJ, first_event

pytestmark = pytest.mark.airflow



SENSOR_DAG = """
from datetime import datetime, timezone
from airflow.sdk import DAG
from airflow_provider_plgd.sensors.interval_complete import JetStreamIntervalCompleteSensor

with DAG("DAG_ID", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc), catchup=False,
         params={"end_ns": 0, "settle": 60}) as dag:
    JetStreamIntervalCompleteSensor(task_id="wait", subject_filter="plgd.owners.*.registrations.>",
                                    end_time="{{ params.end_ns }}", settle_seconds="{{ params.settle }}",
                                    deferrable=DEFERRABLE, poke_interval=0.3, timeout=60)
"""


def publish_later(url: str, delay: float, messages) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(delay), publish_messages(url, messages)))
    thread.start()
    return thread


def run_sensor_dag(dags_folder, deferrable: bool, end_ns: int, settle: float):
    dag_id = f"plgd_test_sensor_{'deferrable' if deferrable else 'poke'}"
    path = dags_folder / f"{dag_id}.py"
    path.write_text(SENSOR_DAG.replace("DAG_ID", dag_id).replace("DEFERRABLE", str(deferrable)))
    dag = load_dag(path, dag_id)
    return dag.test(run_conf={"end_ns": end_ns, "settle": settle})


@pytest.mark.parametrize("deferrable", [False, True], ids=["poke", "deferrable"])
def test_sensor_succeeds_on_a_newer_message(jetstream, dags_folder, deferrable, caplog, monkeypatch):
    from airflow_provider_plgd.hooks.jetstream import JetStreamHook

    end_ns = time.time_ns() + 1_500_000_000
    publish_messages(jetstream.url, [(SUBJ, b"before the end", None)])
    # The newer message is published only after the sensor (poke, or the check before deferring)
    # has judged the interval not complete, and after the end: deterministic on a busy machine,
    # where starting dag.test() can take longer than any fixed delay.
    not_complete = threading.Event()
    real_status = JetStreamHook.aget_interval_status

    async def observed_status(self, *args, **kwargs):
        status = await real_status(self, *args, **kwargs)
        if not status.complete:
            not_complete.set()
        return status

    monkeypatch.setattr(JetStreamHook, "aget_interval_status", observed_status)

    def publish_after_a_check() -> None:
        if not_complete.wait(120):
            time.sleep(max(0.0, (end_ns - time.time_ns()) / 1e9 + 0.2))
            # any subject completes the interval; newer_messages counts those of the sensor's filter
            publish_messages(jetstream.url, [(SUBJ, b"after the end", None),
                                             ("plgd.owners.other.metadata.x", b"other subject", None)])

    thread = threading.Thread(target=publish_after_a_check)
    thread.start()
    dr = run_sensor_dag(dags_folder, deferrable, end_ns, settle=120)
    thread.join()
    assert "success" in str(dr.state).lower()
    assert not_complete.is_set()  # it waited: at least one check said "not complete"
    result = xcom_value(dr, "wait")
    assert result["reason"] == "newer_message" and result["end_ns"] == end_ns and result["newer_messages"] == 1
    out = caplog.text
    # deferrable: the task deferred, dag.test ran the trigger in-process, and the task resumed
    assert ("[DAG TEST] running trigger in line" in out and "[DAG TEST] Trigger completed" in out) == deferrable


@pytest.mark.parametrize("deferrable", [False, True], ids=["poke", "deferrable"])
def test_sensor_succeeds_after_the_settle_time(jetstream, dags_folder, deferrable):
    end_ns = time.time_ns() + 500_000_000
    dr = run_sensor_dag(dags_folder, deferrable, end_ns, settle=1.0)
    assert "success" in str(dr.state).lower()
    assert time.time_ns() >= end_ns + 1_000_000_000
    assert xcom_value(dr, "wait")["reason"] == "settled"


def test_sensor_missing_stream_and_missing_interval(jetstream):
    sensor = JetStreamIntervalCompleteSensor(task_id="s", stream="NOSUCH", end_time=time.time_ns())
    with pytest.raises(ValueError, match="does not exist"):
        sensor.poke({})
    with pytest.raises(ValueError, match="has no data interval"):
        JetStreamIntervalCompleteSensor(task_id="s2").poke({"data_interval_end": None})
    with pytest.raises(IntervalNotCompleteError, match="not found"):
        sensor.execute_complete({}, {"status": "error", "reason": "missing_stream", "message": "stream 'NOSUCH' not found"})


def test_sensor_deferrable_default_follows_config(monkeypatch):
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "True")
    assert JetStreamIntervalCompleteSensor(task_id="a").deferrable is True
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "False")
    assert JetStreamIntervalCompleteSensor(task_id="b").deferrable is False


# ---------------------------------------------------------------------------------------------
# interval-complete trigger
# ---------------------------------------------------------------------------------------------
def test_interval_trigger_serializes_to_json_only_kwargs():
    trigger = JetStreamIntervalCompleteTrigger(end_ns=1_767_225_600_000_000_000, subject_filter="plgd.>", stream="EVENTS",
                                               settle_seconds=30, poll_interval=2)
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_provider_plgd.triggers.interval_complete.JetStreamIntervalCompleteTrigger"
    assert json.loads(json.dumps(kwargs)) == kwargs
    again = JetStreamIntervalCompleteTrigger(**json.loads(json.dumps(kwargs)))
    assert again.serialize() == (classpath, kwargs)




def test_interval_trigger_run_against_the_server(jetstream):
    end_ns = time.time_ns() + 500_000_000
    thread = publish_later(jetstream.url, 1.5, [(SUBJ, b"late", None)])
    trigger = JetStreamIntervalCompleteTrigger(end_ns=end_ns, subject_filter="plgd.>", settle_seconds=60,
                                               poll_interval=0.3)
    event = asyncio.run(first_event(trigger, 20))
    thread.join()
    server_time_ns = event.pop("server_time_ns")
    assert event == {"status": "success", "reason": "newer_message", "end_ns": end_ns, "newer_messages": 1}
    assert end_ns < server_time_ns < time.time_ns()
    # settle time, with no newer message of the filter
    trigger = JetStreamIntervalCompleteTrigger(end_ns=time.time_ns(), subject_filter="plgd.owners.nobody.>",
                                               settle_seconds=0.5, poll_interval=0.2)
    assert asyncio.run(first_event(trigger, 20))["reason"] == "settled"
    # a missing stream is an error event
    trigger = JetStreamIntervalCompleteTrigger(end_ns=time.time_ns(), stream="NOSUCH", settle_seconds=60)
    event = asyncio.run(first_event(trigger, 20))
    assert event["status"] == "error" and event["reason"] == "missing_stream"


# ---------------------------------------------------------------------------------------------
# message-queue trigger (event-driven scheduling)
# ---------------------------------------------------------------------------------------------
def test_message_trigger_serializes_and_resolves_through_common_messaging():
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

    trigger = JetStreamMessageTrigger(subject_filter="plgd.owners.*.registrations.>", poll_interval=1, start_seq=5)
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_provider_plgd.triggers.messages.JetStreamMessageTrigger"
    assert JetStreamMessageTrigger(**json.loads(json.dumps(kwargs))).serialize() == (classpath, kwargs)
    # the providers manager knows the nats scheme, and MessageQueueTrigger resolves to our trigger
    from airflow.providers_manager import ProvidersManager

    pm = ProvidersManager()
    pm.initialize_providers_queues()
    assert "airflow_provider_plgd.queues.nats.NatsMessageQueueProvider" in pm.queue_class_names
    mq = MessageQueueTrigger(scheme="nats", subject_filter="plgd.owners.*.registrations.>", poll_interval=1,
                             start_seq=5)
    assert isinstance(mq.trigger, JetStreamMessageTrigger)
    assert mq.serialize() == (classpath, kwargs)


def test_message_trigger_run_fires_on_new_messages(jetstream, monkeypatch):
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

    from airflow_provider_plgd.hooks.jetstream import JetStreamHook

    publish_messages(jetstream.url, [(SUBJ, b"old", None)] * 3)  # before the trigger starts: not reported
    # the trigger takes its cursor from its first stream info: publish only after that (no fixed delay)
    polled = asyncio.Event()
    real_info = JetStreamHook.astream_info

    async def observed_info(self, *args, **kwargs):
        info = await real_info(self, *args, **kwargs)
        polled.set()
        return info

    monkeypatch.setattr(JetStreamHook, "astream_info", observed_info)

    async def scenario():
        trigger = MessageQueueTrigger(scheme="nats", subject_filter="plgd.owners.*.registrations.>", poll_interval=0.2)
        agen = trigger.run()
        first = asyncio.ensure_future(agen.__anext__())
        await asyncio.wait_for(polled.wait(), 60)  # the trigger has taken its cursor
        await asyncio.to_thread(publish_messages, jetstream.url,
                                [(SUBJ, b"new", None), ("plgd.owners.x.devices.d.metadata.y", b"no", None),
                                 (SUBJ, b"new2", None)])
        e1 = (await asyncio.wait_for(first, 20)).payload
        await asyncio.to_thread(publish_messages, jetstream.url, [(SUBJ, b"new3", None)])
        e2 = (await asyncio.wait_for(agen.__anext__(), 20)).payload
        await agen.aclose()
        return e1, e2

    e1, e2 = asyncio.run(scenario())
    assert e1 == {"stream": "EVENTS", "subject_filter": "plgd.owners.*.registrations.>", "first_seq": 4,
                  "last_seq": 6, "count": 2}
    assert e2 == {"stream": "EVENTS", "subject_filter": "plgd.owners.*.registrations.>", "first_seq": 7,
                  "last_seq": 7, "count": 1}
    # start_seq: report from there (e.g. after a restart)
    trigger = JetStreamMessageTrigger(subject_filter="plgd.owners.*.registrations.>", poll_interval=0.2, start_seq=1)
    assert asyncio.run(first_event(trigger, 20))["count"] == 6


# ---------------------------------------------------------------------------------------------
# the asset watcher fires in a real triggerer, and the scheduler creates the asset-triggered run
# ---------------------------------------------------------------------------------------------
E2E_SCRIPT = r'''
import json, os, signal, subprocess, sys, time
from pathlib import Path
home = Path(os.environ["AIRFLOW_HOME"])
airflow = str(Path(sys.executable).parent / "airflow")
# the metadata database is migrated already (fixture airflow_postgres_db: a copy of the session's template)
from airflow.configuration import conf
dags = Path(conf.get("core", "dags_folder")); dags.mkdir(parents=True, exist_ok=True)
(dags / "plgd_asset_watcher.py").write_text("""
from airflow.sdk import DAG, Asset, AssetWatcher, task
from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
trigger = MessageQueueTrigger(scheme="nats", subject_filter="plgd.owners.*.registrations.>", poll_interval=0.5)
asset = Asset("plgd_registrations", watchers=[AssetWatcher(name="plgd_nats_watcher", trigger=trigger)])
with DAG("plgd_test_asset_watcher", schedule=[asset], catchup=False) as dag:
    @task
    def fetch_new(**context):
        return [e.extra for e in context["triggering_asset_events"][asset]]
    fetch_new()
""")
from airflow.dag_processing.bundles.manager import DagBundlesManager
from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db
DagBundlesManager().sync_bundles_to_db()
bag = BundleDagBag(dag_folder=str(dags), bundle_path=str(dags), bundle_name="dags-folder")
assert not bag.import_errors, bag.import_errors
sync_bag_to_db(bag, "dags-folder", None)
from sqlalchemy import select
from airflow.models.asset import AssetDagRunQueue, AssetEvent
from airflow.models.dagrun import DagRun
from airflow.models.trigger import Trigger
from airflow.utils.session import create_session
out = {}
with create_session() as s:
    out["triggers"] = [[t.classpath, t.kwargs] for t in s.scalars(select(Trigger))]
log_path = home / "triggerer.log"
with open(log_path, "wb") as log:
    proc = subprocess.Popen([airflow, "triggerer"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
try:
    deadline = time.monotonic() + 120
    while b"Watching plgd.owners" not in log_path.read_bytes():
        assert time.monotonic() < deadline and proc.poll() is None, log_path.read_text()[-3000:]
        time.sleep(0.5)
    from tests.integration.conftest import publish_messages
    publish_messages(os.environ["NATS_URL"], [("plgd.owners.o1.registrations.devicesregistered", b"x", None)] * 3
                     + [("plgd.owners.o1.devices.d1.metadata.devicemetadataupdated", b"y", None)])
    while True:
        with create_session() as s:
            events = [e.extra for e in s.scalars(select(AssetEvent))]
            queued = [q.target_dag_id for q in s.scalars(select(AssetDagRunQueue))]
        if sum(e["payload"]["count"] for e in events) >= 3:
            break
        assert time.monotonic() < deadline, log_path.read_text()[-3000:]
        time.sleep(0.5)
    out["events"], out["queued"] = events, queued
finally:
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
subprocess.run([airflow, "scheduler", "--num-runs", "2"], check=True, capture_output=True, timeout=300)
with create_session() as s:
    out["dag_runs"] = [[r.dag_id, str(r.run_type), [e.extra for e in r.consumed_asset_events]]
                       for r in s.scalars(select(DagRun))]
print("E2E_RESULT " + json.dumps(out))
'''


def test_asset_watcher_fires_in_the_triggerer_and_schedules_a_dag_run(jetstream, airflow_postgres_db, tmp_path):
    """Real ``airflow triggerer`` and ``airflow scheduler`` processes on their own AIRFLOW_HOME and a
    fresh PostgreSQL metadata database (the triggerer writes while the script reads)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from plgd_devtools.nats_server import free_port

    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "home"), "NATS_URL": jetstream.url,
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
           "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
           "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
           "PYTHONPATH": str(Path(__file__).resolve().parents[2]), **airflow_postgres_db.airflow_env()}
    env.pop("AIRFLOW__CORE__UNIT_TEST_MODE", None)
    script = tmp_path / "e2e.py"
    script.write_text(E2E_SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("E2E_RESULT ")), None)
    assert line, (proc.stdout[-3000:], proc.stderr[-3000:])
    out = json.loads(line[len("E2E_RESULT "):])
    assert out["triggers"] == [["airflow_provider_plgd.triggers.messages.JetStreamMessageTrigger",
                                {"subject_filter": "plgd.owners.*.registrations.>", "stream": None,
                                 "jetstream_conn_id": "plgd_jetstream_default", "poll_interval": 0.5,
                                 "start_seq": None}]]
    # normally one event {first_seq 1, last_seq 4, count 3}; a poll between the publishes may split it
    events = out["events"]
    assert all(e["from_trigger"] and e["payload"]["stream"] == "EVENTS" for e in events)
    assert sum(e["payload"]["count"] for e in events) == 3
    assert events[0]["payload"]["first_seq"] == 1 and events[-1]["payload"]["last_seq"] == 4
    assert out["queued"] == ["plgd_test_asset_watcher"]
    # the scheduler created the asset-triggered run, which consumes the trigger's events
    assert out["dag_runs"] == [["plgd_test_asset_watcher", "asset_triggered", events]]
