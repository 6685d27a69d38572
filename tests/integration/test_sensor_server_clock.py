"""The interval-complete sensor and trigger judge completeness on the NATS server's clock (a worker
clock ahead of the server's does not complete an interval: case 6) and never report "complete"
after a failed check (case 7); a trigger whose cancellation was swallowed still stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import pytest

from airflow_provider_plgd.sensors.interval_complete import JetStreamIntervalCompleteSensor
from airflow_provider_plgd.triggers.interval_complete import JetStreamIntervalCompleteTrigger
from tests.integration.conftest import publish_messages
from tests.integration.trigger_runs import O1, SUBJ, first_event

pytestmark = pytest.mark.airflow


# ---------------------------------------------------------------------------------------------
# completeness on the NATS server's clock (case 6), never "complete" after an error (case 7)
# ---------------------------------------------------------------------------------------------
class _SkewedClock:
    """The worker's/triggerer's wall clock, ``ahead_s`` seconds ahead of the NATS server's (one fake:
    the machine clock is the server's; ``time.time``/``time.time_ns`` of this process are shifted)."""

    def __init__(self, monkeypatch, ahead_s: float) -> None:
        real_time, real_time_ns = time.time, time.time_ns
        self.real_time_ns = real_time_ns
        monkeypatch.setattr(time, "time", lambda: real_time() + ahead_s)
        monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() + int(ahead_s * 1e9))


def _wait_real_until(clock: _SkewedClock, t_ns: int) -> None:
    while clock.real_time_ns() < t_ns:
        time.sleep(0.02)


def _deferred_trigger(sensor) -> JetStreamIntervalCompleteTrigger:
    """Run the sensor's deferrable execute (one check, then defer) and return its trigger, rebuilt
    from its JSON kwargs as the triggerer does."""
    from airflow.sdk.exceptions import TaskDeferred

    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    _classpath, kwargs = deferred.value.trigger.serialize()
    return JetStreamIntervalCompleteTrigger(**json.loads(json.dumps(kwargs)))


@pytest.mark.parametrize("deferrable", [False, True], ids=["poke", "deferrable"])
def test_worker_clock_ahead_of_the_server_does_not_complete_the_interval(jetstream, monkeypatch, storage_root,
                                                                          deferrable):
    """Case 6: with the worker's clock 1 h ahead of the NATS server (more than settle_seconds), the
    interval is complete only on the server's clock; the fetch after the sensor gets all 15 messages."""
    from airflow_provider_plgd.operators.jetstream_to_staging import JetStreamToStagingOperator

    end_ns = time.time_ns() + 4_000_000_000  # the interval ends 4 s from now on the server's clock
    start_ns = end_ns - 60_000_000_000
    publish_messages(jetstream.url, [(SUBJ, f"early-{i}".encode(), None) for i in range(10)])
    clock = _SkewedClock(monkeypatch, ahead_s=3600)
    sensor = JetStreamIntervalCompleteSensor(task_id="wait", subject_filter="plgd.owners.*.registrations.>",
                                             end_time=end_ns, settle_seconds=5, deferrable=deferrable,
                                             poke_interval=0.2, timeout=60)
    if deferrable:
        trigger = _deferred_trigger(sensor)  # its first check said "not complete"
        agen = trigger.run()
        loop = asyncio.new_event_loop()
        try:
            first = loop.create_task(agen.__anext__())
            loop.run_until_complete(asyncio.sleep(1.5))
            assert not first.done(), first.result().payload  # the skewed clock did not settle it
            publish_messages(jetstream.url, [(SUBJ, f"late-{i}".encode(), None) for i in range(5)])
            assert clock.real_time_ns() < end_ns, "the test machine was too slow"
            _wait_real_until(clock, end_ns + 100_000_000)
            publish_messages(jetstream.url, [(SUBJ, b"next interval", None)])
            result = loop.run_until_complete(asyncio.wait_for(first, 20)).payload
        finally:
            loop.run_until_complete(agen.aclose())
            loop.close()
    else:
        assert sensor.poke({}) is False
        publish_messages(jetstream.url, [(SUBJ, f"late-{i}".encode(), None) for i in range(5)])
        assert sensor.poke({}) is False
        assert clock.real_time_ns() < end_ns, "the test machine was too slow"
        _wait_real_until(clock, end_ns + 100_000_000)
        publish_messages(jetstream.url, [(SUBJ, b"next interval", None)])
        result = sensor.execute({})
    assert result["status"] == "success" and result["reason"] == "newer_message" and result["end_ns"] == end_ns
    assert result["newer_messages"] == 1 and end_ns <= result["server_time_ns"] < end_ns + 30_000_000_000
    out = JetStreamToStagingOperator(task_id="fetch", owner_id=O1, event_type="devicesregistered",
                                     start_time=start_ns, end_time=end_ns, storage_root=storage_root,
                                     settle_seconds=5).execute({"params": {}})
    from tests.integration.delta_read import staging_rows

    data = [r["data"] for r in staging_rows(storage_root, interval_id=out["interval_id"])]
    assert data == [f"early-{i}".encode() for i in range(10)] + [f"late-{i}".encode() for i in range(5)]


@pytest.mark.parametrize("cause", ["undefined_connection", "server_stopped"])
@pytest.mark.parametrize("deferrable", [False, True], ids=["poke", "deferrable"])
def test_sensor_never_completes_when_the_check_fails(jetstream, monkeypatch, capfd, caplog, cause, deferrable):
    """Case 7: an interval whose settle time is long over, but the check cannot reach the server:
    poke mode pokes until its timeout and fails (AirflowSensorTimeout); the trigger keeps polling
    and yields no event. The cause is logged every time."""
    import logging

    from airflow.sdk.exceptions import AirflowSensorTimeout

    end_ns = time.time_ns() - 3_600_000_000_000  # an hour ago, settle 1 s: complete by any clock
    conn_id = "plgd_jetstream_default"
    if cause == "undefined_connection":
        conn_id = "plgd_no_such_connection"
        expected = "isn't defined"
    else:
        jetstream.stop()
        expected = "cannot connect to NATS"
    try:
        sensor = JetStreamIntervalCompleteSensor(task_id="wait", jetstream_conn_id=conn_id, end_time=end_ns,
                                                 settle_seconds=1, deferrable=deferrable, poke_interval=0.2,
                                                 timeout=1.5)
        caplog.set_level(logging.WARNING)
        if not deferrable:
            with pytest.raises(AirflowSensorTimeout):
                sensor.execute({})
        else:
            trigger = _deferred_trigger(sensor)
            assert trigger.jetstream_conn_id == conn_id
            with pytest.raises(asyncio.TimeoutError):
                asyncio.run(first_event(trigger, 2.0))
        logged = caplog.text + capfd.readouterr().out
        assert logged.count("Checking interval completeness failed, not complete") >= 3, logged[-3000:]
        assert expected in logged
        assert "is complete" not in logged
    finally:
        jetstream.start()
    # the same sensor against a reachable, defined server completes ("settled" on the server's clock)
    if cause == "server_stopped":
        result = JetStreamIntervalCompleteSensor(task_id="wait2", end_time=end_ns, settle_seconds=1,
                                                 poke_interval=0.2, timeout=10).execute({})
        assert result["reason"] == "settled" and result["server_time_ns"] >= end_ns + 1_000_000_000


def test_a_trigger_stops_when_its_cancellation_was_swallowed():
    """``raise_if_cancelling``: on Python 3.11 ``asyncio.wait_for`` inside nats-py can drop a
    cancellation (CPython gh-86296); the trigger's loop re-raises it after each poll, so the
    triggerer (or a caller's timeout) can always stop it. Before: a test's 1.5 s timeout around a
    trigger polling a cut mirror waited forever."""
    import sys

    from airflow_provider_plgd.triggers.interval_complete import raise_if_cancelling

    if sys.version_info < (3, 11):
        pytest.skip("Task.cancelling() exists from Python 3.11 (3.10's wait_for does not drop cancellations)")

    async def scenario():
        async def library_that_swallows():
            with contextlib.suppress(asyncio.CancelledError):  # dropped, as wait_for does in the race
                await asyncio.sleep(30)
            raise_if_cancelling()
            return "went on"

        task = asyncio.ensure_future(library_that_swallows())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
