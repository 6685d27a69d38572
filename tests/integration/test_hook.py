"""JetStreamHook against a real nats-server (fixtures ``nats_server``/``jetstream`` in conftest): stream
info and publish, subjects and owners, reads by time and sequence, consumer cleanup. Connecting,
its errors, the pure helpers and connections in ``dag.test()``: test_hook_connection.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import re
import time

import nats
import pytest

from airflow_provider_plgd.hooks import jetstream as js_module
from airflow_provider_plgd.hooks.jetstream import (
    JetStreamHook,
    StreamMessage,
    StreamNotFoundError,
    page_subjects,
)
from airflow_provider_plgd.jetstream import pull as pull_module
from tests.integration.hook_subjects import DEV_1, DEV_2, HREF_LIGHT, OWNER_A, OWNER_B, metadata_subject


async def bulk_publish(url: str, items, *, expect_total: int) -> None:
    """Core-NATS publish (fast), then wait until the stream holds ``expect_total`` messages."""
    nc = await nats.connect(url)
    try:
        for subject, data in items:
            await nc.publish(subject, data)
        await nc.flush()
        deadline = time.monotonic() + 30
        while True:
            info = json.loads((await nc.request("$JS.API.STREAM.INFO.EVENTS", b"", timeout=5)).data)
            if info["state"]["messages"] >= expect_total:
                assert info["state"]["messages"] == expect_total
                return
            assert time.monotonic() < deadline, f"stream has {info['state']['messages']} of {expect_total}"
            await asyncio.sleep(0.02)
    finally:
        await nc.close()


def read_all(hook: JetStreamHook, filter: str = "plgd.>", **bounds) -> list[StreamMessage]:
    return [m for batch in hook.iter_batches(filter, **bounds) for m in batch]


# ------------------------------------------------------------------ stream info, publish


def test_stream_info_has_bundle_config(jetstream):
    info = JetStreamHook().stream_info()
    cfg, state = info["config"], info["state"]
    assert cfg["name"] == "EVENTS" and cfg["subjects"] == ["plgd.>"]
    assert (cfg["retention"], cfg["storage"], cfg["discard"]) == ("limits", "file", "old")
    assert cfg["duplicate_window"] == 600_000_000_000
    assert state["messages"] == 0 and state["last_seq"] == 0


def test_publish_with_and_without_msg_id(jetstream):
    hook = JetStreamHook()
    subject = metadata_subject(OWNER_A, DEV_1)
    assert hook.publish(subject, b"one") == 1
    assert hook.publish(subject, b"one") == 2  # no id: stored twice
    assert hook.publish(subject, b"two", msg_id="ra:agg:7:x:1", headers={"X-Test": "yes"}) == 3
    assert hook.publish(subject, b"two", msg_id="ra:agg:7:x:1") == 3  # deduplicated: original's seq
    assert hook.stream_info()["state"]["messages"] == 3

    msgs = read_all(hook)
    assert [(m.stream_seq, m.subject, m.data) for m in msgs] == [
        (1, subject, b"one"),
        (2, subject, b"one"),
        (3, subject, b"two"),
    ]
    assert msgs[0].headers is None  # stored exactly like plgd's own messages
    assert msgs[2].headers == {"Nats-Msg-Id": "ra:agg:7:x:1", "X-Test": "yes"}
    assert all(isinstance(m.time_ns, int) and m.time_ns > 1_600_000_000 * 10**9 for m in msgs)


def test_each_role_hook_works_alone_and_direct_get_matches_the_read(jetstream):
    """The role hooks (produce, info, consume) on the same connection, each by itself; the API
    client's direct get returns what the pull read delivered (subject, time, headers, bytes)."""
    from airflow_provider_plgd.hooks.consume import JetStreamConsumeHook
    from airflow_provider_plgd.hooks.info import JetStreamInfoHook
    from airflow_provider_plgd.hooks.produce import JetStreamProduceHook
    from airflow_provider_plgd.jetstream.client import connect

    subject = metadata_subject(OWNER_A, DEV_1)
    producer = JetStreamProduceHook()
    assert [producer.publish(subject, b"a"), producer.publish(subject, b"b", msg_id="m-2", headers={"X": "1"})] == [1, 2]
    assert JetStreamInfoHook().count_messages(subject, start_seq=2) == 1
    read = [m for batch in JetStreamConsumeHook().iter_batches(subject) for m in batch]
    assert [(m.stream_seq, m.data, m.headers) for m in read] == [(1, b"a", None), (2, b"b", {"Nats-Msg-Id": "m-2", "X": "1"})]

    async def direct(seq: int):
        hook = JetStreamInfoHook()
        settings = await hook.aget_settings()
        async with connect(settings, hook.jetstream_conn_id) as nc:
            return await hook.api(nc).get_message("EVENTS", seq)

    assert [asyncio.run(direct(seq)) for seq in (1, 2)] == read
    with pytest.raises(js_module.JetStreamAPIError, match="no message found") as err:
        asyncio.run(direct(3))
    assert err.value.err_code == 10037


def test_publish_errors(jetstream):
    with pytest.raises(StreamNotFoundError, match=re.escape("does not capture subject 'other.subject'")):
        JetStreamHook().publish("other.subject", b"x")
    with pytest.raises(ValueError, match="literal NATS subject"):
        JetStreamHook().publish("plgd.>", b"x")
    with pytest.raises(TypeError, match="must be bytes"):
        JetStreamHook().publish("plgd.a", "text")  # type: ignore[arg-type]


# ------------------------------------------------------------------ subjects and owners


def test_list_subjects_and_owners(jetstream):
    hook = JetStreamHook()
    expected = {
        metadata_subject(OWNER_A, DEV_1): 3,
        metadata_subject(OWNER_A, DEV_2, "devicemetadataupdatepending"): 1,
        f"plgd.owners.{OWNER_A}.devices.{DEV_1}.resources.{HREF_LIGHT}.resourcechanged": 2,
        f"plgd.owners.{OWNER_A}.devices.{DEV_1}.resources.{HREF_LIGHT}.resourcechanged.leadrt.core.light": 1,
        f"plgd.owners.{OWNER_B}.registrations.devicesregistered": 2,
        f"plgd.owners.{OWNER_B}.devices.{DEV_2}.resource-links.resourcelinkspublished": 1,
    }
    for subject, n in expected.items():
        for i in range(n):
            hook.publish(subject, b"%d" % i)
    assert hook.list_subjects() == expected
    assert hook.list_subjects(f"plgd.owners.{OWNER_B}.>") == {s: n for s, n in expected.items() if OWNER_B in s}
    assert hook.list_subjects("plgd.owners.*.devices.*.metadata.>") == {
        s: n for s, n in expected.items() if ".metadata." in s
    }
    owners = hook.list_owners()
    assert owners == {
        OWNER_A: {s: n for s, n in expected.items() if OWNER_A in s},
        OWNER_B: {s: n for s, n in expected.items() if OWNER_B in s},
    }


def test_page_subjects_pages_through_offsets():
    pages = {0: {"a": 1, "b": 2}, 2: {"c": 3, "d": 4}, 4: {"e": 5}}
    calls = []

    async def fake_request(subject, body):
        calls.append((subject, body))
        return {"total": 5, "offset": body["offset"], "limit": 2, "state": {"subjects": pages[body["offset"]]}}

    got = asyncio.run(page_subjects(fake_request, "EVENTS", "plgd.>"))
    assert got == {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}
    assert calls == [
        ("$JS.API.STREAM.INFO.EVENTS", {"subjects_filter": "plgd.>", "offset": n}) for n in (0, 2, 4)
    ]


# ------------------------------------------------------------------ bounds


def _publish_two_groups(hook: JetStreamHook) -> tuple[int, list[int], int, list[int], int]:
    """Group A (seqs 1-4), then group B (seqs 5-8); owners alternate. Returns t0, A, t1, B, t2 (ns)."""
    t0 = time.time_ns()
    time.sleep(0.02)
    group_a = [hook.publish(metadata_subject(OWNER_A if i % 2 else OWNER_B, DEV_1), b"a%d" % i) for i in range(4)]
    time.sleep(0.05)
    t1 = time.time_ns()
    time.sleep(0.05)
    group_b = [hook.publish(metadata_subject(OWNER_A if i % 2 else OWNER_B, DEV_1), b"b%d" % i) for i in range(4)]
    time.sleep(0.02)
    t2 = time.time_ns()
    return t0, group_a, t1, group_b, t2


def test_count_and_iterate_by_time(jetstream):
    hook = JetStreamHook()
    t0, group_a, t1, group_b, t2 = _publish_two_groups(hook)
    assert (group_a, group_b) == ([1, 2, 3, 4], [5, 6, 7, 8])

    def seqs(filter="plgd.>", **b):
        return [m.stream_seq for m in read_all(hook, filter, **b)]

    assert seqs(start_time=t0, end_time=t1) == [1, 2, 3, 4]
    assert seqs(start_time=t1, end_time=t2) == [5, 6, 7, 8]
    assert seqs(start_time=t2) == [] and seqs(end_time=t0) == []
    assert hook.count_messages("plgd.>", start_time=t0, end_time=t1) == 4
    assert hook.count_messages("plgd.>", start_time=t1, end_time=t2) == 4
    assert hook.count_messages("plgd.>", start_time=t2) == 0
    # timezone-aware datetimes work like ns
    t1_dt = dt.datetime.fromtimestamp(t1 / 1e9, dt.timezone(dt.timedelta(hours=2)))
    assert seqs(end_time=t1_dt) == [1, 2, 3, 4]
    assert hook.count_messages("plgd.>", start_time=t1_dt) == 4
    # filter + time: owner A has the odd positions of each group
    assert seqs(f"plgd.owners.{OWNER_A}.>", start_time=t1) == [6, 8]
    assert hook.count_messages(f"plgd.owners.{OWNER_A}.>", start_time=t0, end_time=t1) == 2

    # Exact edge: a message whose server time equals the bound belongs to the later interval only.
    edge = read_all(hook, start_seq=5, end_seq=5)[0].time_ns
    assert seqs(start_time=t0, end_time=edge) == [1, 2, 3, 4]
    assert seqs(start_time=edge, end_time=t2) == [5, 6, 7, 8]
    assert seqs(start_time=edge, end_time=edge + 1) == [5]
    assert hook.count_messages("plgd.>", end_time=edge) == 4
    assert hook.count_messages("plgd.>", start_time=edge, end_time=edge + 1) == 1


def test_count_and_iterate_by_seq(jetstream):
    hook = JetStreamHook()
    _t0, _, t1, _, _ = _publish_two_groups(hook)
    seqs = lambda f="plgd.>", **b: [m.stream_seq for m in read_all(hook, f, **b)]  # noqa: E731
    assert seqs(start_seq=2, end_seq=4) == [2, 3, 4]
    assert seqs(start_seq=7) == [7, 8]
    assert seqs(end_seq=1) == [1]
    assert seqs(start_seq=9) == [] and seqs(start_seq=5, end_seq=4) == []
    assert seqs(f"plgd.owners.{OWNER_B}.>", start_seq=2, end_seq=7) == [3, 5, 7]
    assert seqs(start_seq=3, end_time=t1) == [3, 4]  # seq and time bounds combine
    assert seqs(start_seq=2, start_time=t1, end_seq=6) == [5, 6]
    assert hook.count_messages("plgd.>", start_seq=2, end_seq=4) == 3
    assert hook.count_messages("plgd.>", start_seq=7, end_seq=100) == 2
    assert hook.count_messages(f"plgd.owners.{OWNER_B}.>", start_seq=2, end_seq=7) == 3
    assert hook.count_messages("plgd.>", start_seq=3, end_time=t1) == 2
    assert hook.count_messages("plgd.>", start_seq=9) == 0
    assert hook.count_messages("plgd.>", start_seq=2, start_time=t1, end_seq=6) == 2
    assert hook.count_messages("nothing.matches") == 0 and seqs("nothing.matches") == []
    batches = list(hook.iter_batches("plgd.>", batch_size=3))
    assert [[m.stream_seq for m in b] for b in batches] == [[1, 2, 3], [4, 5, 6], [7, 8]]


def test_bad_arguments(jetstream):
    hook = JetStreamHook()
    with pytest.raises(ValueError, match="timezone-aware"):
        hook.count_messages("plgd.>", start_time=dt.datetime(2024, 1, 1))
    with pytest.raises(TypeError, match="end_time must be"):
        list(hook.iter_batches("plgd.>", end_time="2024-01-01"))
    with pytest.raises(ValueError, match="batch_size"):
        list(hook.iter_batches("plgd.>", batch_size=0))
    with pytest.raises(ValueError, match="start_seq"):
        hook.count_messages("plgd.>", start_seq=0)
    with pytest.raises(ValueError, match="filter"):
        hook.count_messages("")

    async def inside_loop():
        with pytest.raises(RuntimeError, match=re.escape("await hook.astream_info")):
            hook.stream_info()

    asyncio.run(inside_loop())


def test_never_reads_past_last_seq_at_start(jetstream):
    hook = JetStreamHook()
    subject = metadata_subject(OWNER_A, DEV_1)
    asyncio.run(bulk_publish(jetstream.url, ((subject, b"x" * 100) for _ in range(5000)), expect_total=5000))

    async def publisher():
        nc = await nats.connect(jetstream.url)
        for i in range(2000):
            await nc.publish(subject, b"late")
            if i % 100 == 0:
                await nc.flush()
                await asyncio.sleep(0)
        await nc.flush()
        await nc.close()

    async def scenario():
        got, task, last_seq_while_reading = [], None, None
        async with contextlib.aclosing(hook.aiter_batches("plgd.>", batch_size=100)) as batches:
            async for batch in batches:
                got.extend(m.stream_seq for m in batch)
                if task is None:
                    task = asyncio.create_task(publisher())
                    await asyncio.sleep(0.3)  # late messages land while we are still reading
                    last_seq_while_reading = (await hook.astream_info())["state"]["last_seq"]
        await task
        return got, last_seq_while_reading

    got, last_seq_while_reading = asyncio.run(scenario())
    assert last_seq_while_reading > 5000  # matching messages were there to be (wrongly) read
    assert got == list(range(1, 5001))
    assert hook.stream_info()["state"]["last_seq"] == 7000


def test_100k_messages_round_trip(jetstream):
    hook = JetStreamHook()
    n = 100_000
    items = [
        (
            metadata_subject(OWNER_A if i % 3 else OWNER_B, f"{i % 97:08d}-0000-0000-0000-000000000000"),
            b"p" * (250 + i % 101),
        )
        for i in range(n)
    ]  # ~300-byte payloads (250..350)
    total_bytes = sum(len(d) for _, d in items)
    asyncio.run(bulk_publish(jetstream.url, items, expect_total=n))
    del items

    count = nbytes = max_batch = 0
    expected_seq = 1
    for batch in hook.iter_batches("plgd.>"):
        max_batch = max(max_batch, len(batch))
        for m in batch:
            assert m.stream_seq == expected_seq
            expected_seq += 1
            nbytes += len(m.data)
        count += len(batch)
    assert (count, nbytes) == (n, total_bytes)
    assert max_batch <= js_module.DEFAULT_BATCH_SIZE
    assert hook.count_messages("plgd.>") == n
    assert hook.count_messages(f"plgd.owners.{OWNER_B}.>") == len(range(0, n, 3))
    assert hook.stream_info()["state"]["consumer_count"] == 0


def test_pulls_capped_by_bytes(jetstream, monkeypatch):
    """Large messages: each pull ends at the byte cap (409 status); nothing is lost or reordered."""
    monkeypatch.setattr(pull_module, "PULL_MAX_BYTES", 0)  # cap = 2 x max_payload = 2 MiB
    subject = metadata_subject(OWNER_A, DEV_1)
    asyncio.run(bulk_publish(jetstream.url, ((subject, bytes([i]) * 200_000) for i in range(40)), expect_total=40))
    batches = list(JetStreamHook().iter_batches("plgd.>", batch_size=1000))
    assert [m.stream_seq for b in batches for m in b] == list(range(1, 41))
    assert [m.data[0] for b in batches for m in b] == list(range(40))
    assert len(batches) >= 4 and max(len(b) for b in batches) <= 11


# ------------------------------------------------------------------ cleanup of consumers


def test_consumer_deleted_on_early_exit_and_cancel(jetstream):
    hook = JetStreamHook()
    subject = metadata_subject(OWNER_A, DEV_1)
    asyncio.run(bulk_publish(jetstream.url, ((subject, b"x") for _ in range(1000)), expect_total=1000))

    it = hook.iter_batches("plgd.>", batch_size=10)
    assert len(next(it)) == 10
    it.close()
    assert hook.stream_info()["state"]["consumer_count"] == 0

    async def slow_reader():
        async for _ in hook.aiter_batches("plgd.>", batch_size=10):
            await asyncio.sleep(0.05)

    async def cancel_it():
        task = asyncio.create_task(slow_reader())
        await asyncio.sleep(0.3)
        info = await hook.astream_info()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return info["state"]["consumer_count"]

    assert asyncio.run(cancel_it()) == 1
    assert hook.stream_info()["state"]["consumer_count"] == 0
