"""The ETL reads a mirror of the hub's stream across a leafnode with JetStream domains, and the
leafnode link is cut: nothing may be lost ("No silent loss", case: mirrors and sourced streams).

Two real nats-servers: ``hub`` (JetStream domain ``hub``, the plgd stream ``EVENTS``) and
``analytics`` (domain ``analytics``) joined by a leafnode that runs through a
:class:`~plgd_devtools.tcp_proxy.TcpProxy`; ``analytics`` holds ``EVENTS_MIRROR``, a mirror of
``EVENTS`` over the hub's domain API ``$JS.hub.API``. The Airflow connection points at
``analytics`` with the stream extra ``EVENTS_MIRROR``, as in ``docs/operations.md``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from airflow_provider_plgd import times
from airflow_provider_plgd.etl import write_interval_ledger
from airflow_provider_plgd.exceptions import IntervalNotCompleteError, StreamSourceStaleError
from airflow_provider_plgd.hooks.jetstream import JetStreamHook
from airflow_provider_plgd.operators.jetstream_to_staging import JetStreamToStagingOperator
from airflow_provider_plgd.plgd.subjects import registrations_subject
from airflow_provider_plgd.sensors.interval_complete import JetStreamIntervalCompleteSensor
from airflow_provider_plgd.tables.layout import Layout
from airflow_provider_plgd.triggers.interval_complete import JetStreamIntervalCompleteTrigger
from plgd_devtools.nats_server import NatsServer, free_port, leafnode_config, recreate_stream
from plgd_devtools.tcp_proxy import TcpProxy
from tests.integration.conftest import publish_messages, read_stream
from tests.integration.delta_read import staging_rows

MIRROR = "EVENTS_MIRROR"
MIRROR_CONFIG = {"name": MIRROR, "storage": "file",
                 "mirror": {"name": "EVENTS", "external": {"api": "$JS.hub.API", "deliver": ""}}}
OWNERS = ("e1407479-3136-56c0-9908-bb02fb0339e2", "9b0b4a4a-4c7a-5b43-9f7e-3f4a5f2d7c11")
SETTLE = 1.0


@pytest.fixture(scope="module")
def pair():
    """``(hub, proxy, leaf)``: two nats-servers with JetStream domains, the leafnode through the proxy."""
    leaf_port = free_port()
    hub = NatsServer(config=leafnode_config(server_name="hub", domain="hub", leafnode_port=leaf_port)).start()
    proxy = TcpProxy(upstream_host="127.0.0.1", upstream_port=leaf_port).start()
    leaf = NatsServer(config=leafnode_config(server_name="analytics", domain="analytics",
                                             remotes=[f"nats-leaf://127.0.0.1:{proxy.port}"])).start()
    try:
        yield hub, proxy, leaf
    finally:
        leaf.cleanup()
        proxy.stop()
        hub.cleanup()


async def _amirror_info(url: str) -> dict:
    import nats

    nc = await nats.connect(url)
    try:
        return json.loads((await nc.request(f"$JS.API.STREAM.INFO.{MIRROR}", b"", timeout=5)).data)
    finally:
        await nc.close()


async def _arecreate_mirror(url: str, timeout: float = 20.0) -> None:
    """Re-create the mirror once the hub's domain API answers through the leafnode (else the mirror's
    first consumer request would wait for its 30 s timeout)."""
    import nats

    nc = await nats.connect(url)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                await nc.request("$JS.hub.API.INFO", b"", timeout=0.5)
                break
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                assert time.monotonic() < deadline, "the leafnode link to the hub did not come up"
                await asyncio.sleep(0.1)
        await nc.request(f"$JS.API.STREAM.DELETE.{MIRROR}", b"", timeout=5)
        body = json.loads((await nc.request(f"$JS.API.STREAM.CREATE.{MIRROR}", json.dumps(MIRROR_CONFIG).encode(),
                                            timeout=5)).data)
        assert not body.get("error"), body
    finally:
        await nc.close()


def wait_mirrored(leaf: NatsServer, last_seq: int, timeout: float = 20.0) -> dict:
    """Wait until the mirror holds ``last_seq`` and has heard from the hub; return its info."""
    deadline = time.monotonic() + timeout
    while True:
        info = asyncio.run(_amirror_info(leaf.url))
        if (info.get("state") or {}).get("last_seq") == last_seq and info["mirror"]["active"] >= 0:
            return info
        assert time.monotonic() < deadline, f"the mirror did not catch up: {info}"
        time.sleep(0.1)


@pytest.fixture
def mirror(pair, monkeypatch):
    """Fresh ``EVENTS`` on the hub and its mirror on ``analytics``; the default connection points at
    the mirror. Yields ``(hub, proxy, leaf)``; the link is restored afterwards."""
    hub, proxy, leaf = pair
    proxy.restore()
    recreate_stream(hub.url)
    asyncio.run(_arecreate_mirror(leaf.url))  # the leafnode may still be reconnecting after the previous test
    wait_mirrored(leaf, 0)
    monkeypatch.setenv("AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT", json.dumps(
        {"conn_type": "plgd_jetstream", "host": leaf.host, "port": leaf.port, "extra": {"stream": MIRROR}}))
    try:
        yield hub, proxy, leaf
    finally:
        proxy.restore()


def messages(tag: str, n: int) -> list[tuple]:
    return [(registrations_subject(OWNERS[i % 2], "devicesregistered"), f"{tag}-{i}".encode(), None)
            for i in range(n)]


def fetch(root: str, start_ns: int, end_ns: int, **kw) -> dict:
    op = JetStreamToStagingOperator(task_id="fetch", subject_filter="plgd.>", storage_root=root,
                                    start_time=start_ns, end_time=end_ns, settle_seconds=SETTLE, **kw)
    return op.execute({"params": {}})


async def first_event(trigger: JetStreamIntervalCompleteTrigger, timeout: float):
    """The trigger's first event, or None when it yields none within ``timeout`` seconds."""
    run = trigger.run()
    try:
        return (await asyncio.wait_for(run.__anext__(), timeout)).payload
    except asyncio.TimeoutError:
        return None
    finally:
        await run.aclose()


def utc(ns: int) -> datetime:
    """``ns`` (a whole number of microseconds) as an aware datetime."""
    return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=ns // 1000)


def sleep_until(ns: int) -> None:
    while time.time_ns() < ns:
        time.sleep(0.02)


def test_cut_mirror_link_is_not_complete_and_nothing_is_lost_after_it_returns(mirror, storage_root):
    """While the leafnode is cut the mirror's server passes end + settle_seconds, its ``lag`` stays
    0 (stale) and only ``active`` grows: the hook, the sensor (poke and trigger), the plan's check
    and the fetch all refuse the interval. After the link returns the interval completes and the
    fetch from the mirror stages every message the hub holds for it, with the hub's sequences,
    subjects and timestamps. Before the fix the interval was "settled" and the fetch staged 4 of 7."""
    hub, proxy, leaf = mirror
    start_ns = (time.time_ns() - 1_000_000_000) // 1000 * 1000  # whole microseconds: the plan takes datetimes
    publish_messages(hub.url, messages("before", 4))
    wait_mirrored(leaf, 4)

    proxy.cut()
    publish_messages(hub.url, messages("late", 3))  # into the interval, on the hub only
    end_ns = (time.time_ns() + 200_000_000) // 1000 * 1000
    sleep_until(end_ns + int(SETTLE * 1e9) + 200_000_000)  # end + settle has passed on every clock here

    hook = JetStreamHook()
    status = hook.get_interval_status(end_ns, settle_seconds=SETTLE)
    assert status.complete is False and status.reason is None and status.stale is False
    assert status.server_time_ns > end_ns + SETTLE * 1e9 and status.last_seq == 4
    (up,) = status.upstreams
    assert (up.kind, up.name, up.api, up.lag, up.current) == ("mirror", "EVENTS", "$JS.hub.API", 0, False)
    assert up.contact_ns is not None and up.contact_ns < end_ns + SETTLE * 1e9 and status.waiting_for == ("EVENTS",)
    sensor = JetStreamIntervalCompleteSensor(task_id="wait", end_time=end_ns, settle_seconds=SETTLE)
    assert sensor.poke({}) is False
    trigger = JetStreamIntervalCompleteTrigger(end_ns=end_ns, settle_seconds=SETTLE, poll_interval=0.5)
    assert asyncio.run(first_event(trigger, 1.5)) is None
    with pytest.raises(IntervalNotCompleteError, match=r"mirror 'EVENTS' via \$JS\.hub\.API: lag 0, last contact"):
        hook.require_interval_complete(start_ns, end_ns, settle_seconds=SETTLE)  # the ETL plan's check
    with pytest.raises(IntervalNotCompleteError, match="the mirror was not current after it") as info:
        fetch(os.path.join(storage_root, "fetch"), start_ns, end_ns)
    assert not isinstance(info.value, StreamSourceStaleError)
    assert os.listdir(storage_root) == []

    proxy.restore()
    event = asyncio.run(first_event(JetStreamIntervalCompleteTrigger(end_ns=end_ns, settle_seconds=SETTLE,
                                                                     poll_interval=0.5), 60))
    assert event is not None and (event["status"], event["reason"]) == ("success", "settled")
    assert sensor.poke({}) is True
    hook.require_interval_complete(start_ns, end_ns, settle_seconds=SETTLE)
    # the plan's ledger counts the mirror: every message of the interval, per owner
    start, end = utc(start_ns), utc(end_ns)
    record = write_interval_ledger(hook, Layout.of(os.path.join(storage_root, "plan")), times.Interval.of(start, end),
                                   list(OWNERS), ["devicesregistered"], accept_fewer=False)
    assert (record["stream"], record["total"], record["first_seq"], record["end_seq_exclusive"]) == (MIRROR, 7, 1, 8)
    assert record["owners"] == list(OWNERS) and [r["count"] for r in record["ranges"]] == [7]
    out = fetch(os.path.join(storage_root, "fetch"), start_ns, end_ns)

    truth = read_stream(hub.url)  # {seq: (subject, ts_ns, headers, data)} on the hub
    assert sorted(truth) == list(range(1, 8))
    table = pa.Table.from_pylist(staging_rows(os.path.join(storage_root, "fetch"), MIRROR))
    assert out["count"] == 7 and table.column("stream").to_pylist() == [MIRROR] * 7
    assert table.column("stream_seq").to_pylist() == list(range(1, 8))
    assert table.column("subject").to_pylist() == [truth[s][0] for s in range(1, 8)]
    assert table.column("data").to_pylist() == [m[1] for m in messages("before", 4) + messages("late", 3)]
    # a mirror keeps the origin's timestamps: the interval is the hub's
    assert [int(t.timestamp() * 1_000_000) for t in table.column("published_at").to_pylist()] == \
        [truth[s][1] // 1000 for s in range(1, 8)]


def test_mirror_link_down_past_source_wait_fails_loudly(mirror, storage_root):
    """Past end + settle_seconds + source_wait_seconds with the link still cut, the sensor (poke and
    deferrable), the plan's check and the fetch fail with StreamSourceStaleError naming the
    mirror's origin, its API prefix, lag and last contact; nothing is committed. Before the fix
    the sensor succeeded ("settled")."""
    hub, proxy, leaf = mirror
    start_ns = time.time_ns() - 1_000_000_000
    publish_messages(hub.url, messages("before", 2))
    wait_mirrored(leaf, 2)
    proxy.cut()
    publish_messages(hub.url, messages("late", 2))
    end_ns, wait = time.time_ns(), 1.0
    sleep_until(end_ns + int((SETTLE + wait) * 1e9) + 200_000_000)

    sensor = JetStreamIntervalCompleteSensor(task_id="wait", end_time=end_ns, settle_seconds=SETTLE,
                                             source_wait_seconds=str(wait))  # templated: a string
    with pytest.raises(StreamSourceStaleError) as info:
        sensor.poke({})
    err = info.value
    assert (err.stream, err.end_ns, err.source_wait_seconds) == (MIRROR, end_ns, wait)
    (up,) = err.upstreams
    assert (up["kind"], up["name"], up["api"], up["lag"]) == ("mirror", "EVENTS", "$JS.hub.API", 0)
    assert err.server_time_ns - up["contact_ns"] == up["active_ns"] > (SETTLE + wait) * 1e9
    text = str(err)
    assert f"stream {MIRROR!r}" in text and "source_wait_seconds=1" in text
    assert "mirror 'EVENTS' via $JS.hub.API: lag 0, last contact" in text and "Restore the link" in text

    event = asyncio.run(first_event(JetStreamIntervalCompleteTrigger(
        end_ns=end_ns, settle_seconds=SETTLE, source_wait_seconds=wait, poll_interval=0.5), 10))
    assert (event["status"], event["reason"]) == ("error", "source_stale")
    json.dumps(event)  # triggers carry JSON only
    with pytest.raises(StreamSourceStaleError, match="mirror 'EVENTS' via"):
        sensor.execute_complete({}, event)

    hook = JetStreamHook()
    with pytest.raises(StreamSourceStaleError):
        hook.require_interval_complete(start_ns, end_ns, settle_seconds=SETTLE, source_wait_seconds=wait)
    with pytest.raises(StreamSourceStaleError):
        fetch(storage_root, start_ns, end_ns, source_wait_seconds=wait)
    assert os.listdir(storage_root) == []
