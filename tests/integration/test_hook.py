"""JetStreamHook against a real nats-server (fixtures ``nats_server``/``jetstream`` in conftest)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import re
import time
from types import SimpleNamespace

import nats
import pytest

from airflow_provider_plgd.hooks import jetstream as js_module
from airflow_provider_plgd.hooks.jetstream import (
    JetStreamAuthError,
    JetStreamConnectionError,
    JetStreamHook,
    JetStreamNotEnabledError,
    StreamMessage,
    StreamNotFoundError,
    page_subjects,
)
from airflow_provider_plgd.jetstream import pull as pull_module
from airflow_provider_plgd.jetstream.connection import settings_from_connection
from airflow_provider_plgd.jetstream.messages import parse_ack_reply
from airflow_provider_plgd.times import ns_to_rfc3339, to_ns
from plgd_devtools.nats_server import NatsServer, free_port

OWNER_A = "e1407479-3136-56c0-9908-bb02fb0339e2"
OWNER_B = "7c2b8a6e-4f0e-4b69-9a59-0c8a3f1d2e11"
DEV_1 = "00000000-0000-0000-0000-000000000001"
DEV_2 = "00000000-0000-0000-0000-000000000002"
HREF_LIGHT = "78baefb2-dcdc-50c3-bb55-5ff4c5e4c8b2"


def metadata_subject(owner: str, device: str, event_type: str = "devicemetadataupdated") -> str:
    return f"plgd.owners.{owner}.devices.{device}.metadata.{event_type}"


def set_conn(monkeypatch, **fields) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT", json.dumps({"conn_type": "plgd_jetstream", **fields}))


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


# ------------------------------------------------------------------ errors and test_connection


def test_test_connection_success(jetstream):
    JetStreamHook().publish(metadata_subject(OWNER_A, DEV_1), b"12345")
    ok, message = JetStreamHook().test_connection()
    assert ok, message
    assert f"127.0.0.1:{jetstream.port}" in message
    assert "stream EVENTS: 1 messages" in message and "first seq 1 (20" in message and "last seq 1 (20" in message


def test_unreachable_server_fails_fast(monkeypatch):
    port = free_port()
    set_conn(monkeypatch, host="127.0.0.1", port=port)
    started = time.monotonic()
    with pytest.raises(JetStreamConnectionError, match=f"nats://127.0.0.1:{port}"):
        JetStreamHook().stream_info()
    ok, message = JetStreamHook().test_connection()
    assert not ok and f"127.0.0.1:{port}" in message and "JetStreamConnectionError" in message
    assert time.monotonic() - started < 5


def test_missing_stream(jetstream):
    hook = JetStreamHook(stream="NOPE")
    for call in (hook.stream_info, lambda: hook.count_messages("plgd.>"), lambda: list(hook.iter_batches("plgd.>")),
                 hook.list_owners):
        with pytest.raises(StreamNotFoundError, match="stream 'NOPE' not found") as exc_info:
            call()
        assert exc_info.value.stream == "NOPE"
    ok, message = hook.test_connection()
    assert not ok and "stream 'NOPE' not found" in message


def test_auth_failure_has_no_secret(monkeypatch):
    with NatsServer(extra_args=("--user", "alice", "--pass", "s3cret-pw")) as server:
        set_conn(monkeypatch, host=server.host, port=server.port, login="alice", password="wrong-pw")
        with pytest.raises(JetStreamAuthError) as exc_info:
            JetStreamHook().stream_info()
        assert "wrong-pw" not in str(exc_info.value) and "s3cret" not in str(exc_info.value)
        assert f"127.0.0.1:{server.port}" in str(exc_info.value)
        set_conn(monkeypatch, host=server.host, port=server.port, login="alice", password="s3cret-pw",
                 extra={"stream": "NOPE"})
        with pytest.raises(StreamNotFoundError):  # authenticated; JetStream answers
            JetStreamHook().stream_info()


def test_token_auth(monkeypatch):
    with NatsServer(extra_args=("--auth", "tok-123")) as server:
        set_conn(monkeypatch, host=server.host, port=server.port, extra={"extra__plgd_jetstream__token": "tok-123"})
        assert JetStreamHook().test_connection()[0] is False  # stream EVENTS does not exist there
        with pytest.raises(StreamNotFoundError):
            JetStreamHook().stream_info()
        set_conn(monkeypatch, host=server.host, port=server.port, extra={"token": "bad-token"})
        with pytest.raises(JetStreamAuthError) as exc_info:
            JetStreamHook().stream_info()
        assert "bad-token" not in str(exc_info.value)


def _write_tls_files(directory) -> tuple[str, str, str]:
    """A CA and a server certificate for 127.0.0.1 (PEM files): returns (ca, cert, key) paths."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "plgd test CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(1).not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    cert = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(2)
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = [str(directory / name) for name in ("ca.pem", "server.pem", "server-key.pem")]
    for path, blob in zip(paths, (
        ca.public_bytes(serialization.Encoding.PEM),
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    ), strict=True):
        with open(path, "wb") as f:
            f.write(blob)
    return paths[0], paths[1], paths[2]


def test_tls_with_ca(monkeypatch, tmp_path):
    ca, cert, key = _write_tls_files(tmp_path)
    with NatsServer(extra_args=("--tls", "--tlscert", cert, "--tlskey", key)) as server:
        server_stream = {"name": "EVENTS", "subjects": ["plgd.>"], "storage": "memory"}
        set_conn(monkeypatch, host=server.host, port=server.port, extra={"tls_ca": ca})
        hook = JetStreamHook()
        assert hook.get_settings().servers == (f"tls://127.0.0.1:{server.port}",)

        async def create_stream():
            async with hook.aconnect() as nc:
                await nc.request("$JS.API.STREAM.CREATE.EVENTS", json.dumps(server_stream).encode(), timeout=5)

        asyncio.run(create_stream())
        assert hook.publish("plgd.owners.a.registrations.devicesregistered", b"x") == 1
        ok, message = hook.test_connection()
        assert ok and message.startswith(f"Connected to tls://127.0.0.1:{server.port}")
        set_conn(monkeypatch, host=server.host, port=server.port)  # plain client, TLS server
        with pytest.raises(JetStreamConnectionError, match=str(server.port)):
            JetStreamHook().stream_info()


def test_jetstream_not_enabled(monkeypatch):
    with NatsServer(jetstream=False) as server:
        set_conn(monkeypatch, host=server.host, port=server.port)
        with pytest.raises(JetStreamNotEnabledError, match="JetStream is not enabled"):
            JetStreamHook().stream_info()


def test_server_restart_keeps_store(jetstream):
    hook = JetStreamHook()
    hook.publish(metadata_subject(OWNER_A, DEV_1), b"kept")
    port, pid = jetstream.port, jetstream.pid
    jetstream.stop()
    assert jetstream.pid is None
    with pytest.raises(JetStreamConnectionError):
        hook.stream_info()
    jetstream.start()
    assert jetstream.port == port and jetstream.pid not in (None, pid)
    assert hook.stream_info()["state"]["messages"] == 1


# ------------------------------------------------------------------ pure helpers


def test_parse_ack_reply_both_forms():
    assert parse_ack_reply("$JS.ACK.EVENTS.c1.1.42.7.1700000000123456789.3") == (42, 7, 1700000000123456789, 3)
    new = "$JS.ACK.hub.ACCHASH.EVENTS.c1.1.42.7.1700000000123456789.3.Xy12"
    assert parse_ack_reply(new) == (42, 7, 1700000000123456789, 3)
    assert parse_ack_reply(new.rsplit(".", 1)[0]) == (42, 7, 1700000000123456789, 3)
    with pytest.raises(ValueError, match="not a JetStream ack reply subject"):
        parse_ack_reply("_INBOX.abc.1")


def test_settings_from_connection():
    conn = SimpleNamespace(
        conn_id="c", host=None, port=None, login="u", password="pw",
        extra_dejson={
            "servers": "nats://a:4222, b , tls://c:4443",
            "extra__plgd_jetstream__token": "tok",
            "extra__plgd_jetstream__stream": "S2",
            "storage_root": "s3://bucket/plgd",
        },
    )
    s = settings_from_connection(conn)
    assert s.servers == ("nats://a:4222", "nats://b:4222", "tls://c:4443")
    assert (s.user, s.password, s.token, s.stream, s.storage_root) == ("u", "pw", "tok", "S2", "s3://bucket/plgd")
    assert "pw" not in repr(s) and "tok" not in repr(s)
    assert settings_from_connection(conn, stream="X").stream == "X"

    conn = SimpleNamespace(conn_id="c", host="nats.example", port=None, login=None, password=None,
                           extra_dejson={"tls_ca": "/ca.pem"})
    s = settings_from_connection(conn)
    assert s.servers == ("tls://nats.example:4222",) and s.stream == "EVENTS"
    assert s.safe_servers() == "tls://nats.example:4222"
    with pytest.raises(ValueError, match="server URL 'nats://h:1' carries credentials") as err:
        settings_from_connection(SimpleNamespace(conn_id="c", host=None, port=None, login=None, password=None,
                                                 extra_dejson={"servers": "nats://u:secret@h:1"}))
    assert "secret" not in str(err.value)
    with pytest.raises(ValueError, match=r"neither a Host nor Servers \('servers'\)"):
        settings_from_connection(SimpleNamespace(conn_id="c", host=None, port=None, login=None, password=None,
                                                 extra_dejson={}))
    with pytest.raises(ValueError, match="invalid NATS server URL 'http://h:1'"):
        settings_from_connection(SimpleNamespace(conn_id="c", host=None, port=None, login=None, password=None,
                                                 extra_dejson={"servers": "http://h:1"}))


def test_ui_metadata_and_time_conversion():
    assert JetStreamHook.get_ui_field_behaviour()["hidden_fields"] == ["schema", "extra"]
    assert isinstance(JetStreamHook.get_connection_form_widgets(), dict)
    assert JetStreamHook.conn_type == "plgd_jetstream" and JetStreamHook.default_conn_name == "plgd_jetstream_default"
    when = dt.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=dt.timezone.utc)
    assert to_ns(when, "t", text=False) == 1714564800_123456000
    assert to_ns(5, "t", text=False) == 5
    assert ns_to_rfc3339(1714564800_123456789) == "2024-05-01T12:00:00.123456789Z"


# ---------------------------------------------------------------------------------------------
# interval completeness on the server's clock (case 6); connections of the metadata DB
# in `dag.test()` / `airflow dags test` (case 10)
# ---------------------------------------------------------------------------------------------
def test_get_interval_status_is_judged_on_the_server_clock(jetstream, monkeypatch):
    subject = metadata_subject(OWNER_A, DEV_1)
    hook = JetStreamHook()
    before = time.time_ns()
    empty = hook.get_interval_status(before - 10**9, settle_seconds=0, subject_filter="plgd.>")
    assert empty.complete and empty.reason == "settled" and empty.last_ts_ns is None
    assert before <= empty.server_time_ns <= time.time_ns()  # the server's ts (same machine clock)
    hook.publish(subject, b"x")
    end_ns = time.time_ns() + 10**9
    # the local clock an hour ahead changes nothing: only the server's values count
    real_time_ns = time.time_ns
    with monkeypatch.context() as patch:
        patch.setattr(time, "time_ns", lambda: real_time_ns() + 3600 * 10**9)
        status = JetStreamHook().get_interval_status(end_ns, settle_seconds=5, subject_filter=subject)
    assert status.complete is False and status.reason is None and status.newer_messages == 0
    assert status.last_ts_ns < status.server_time_ns < end_ns
    while time.time_ns() < end_ns:
        time.sleep(0.02)
    assert JetStreamHook().get_interval_status(end_ns, settle_seconds=5).complete is False
    # a message stored after the end completes it (any subject); newer_messages counts the filter's
    hook.publish(metadata_subject(OWNER_B, DEV_2), b"y")
    hook.publish(subject, b"z")
    status = JetStreamHook().get_interval_status(end_ns, settle_seconds=5, subject_filter=subject)
    assert (status.complete, status.reason, status.newer_messages) == (True, "newer_message", 1)
    assert status.last_ts_ns >= end_ns
    with pytest.raises(ValueError, match="settle_seconds"):
        JetStreamHook().get_interval_status(end_ns, settle_seconds=-1)
    with pytest.raises(StreamNotFoundError):
        JetStreamHook(stream="NOSUCH").get_interval_status(end_ns, settle_seconds=5)


SETTINGS_DAG = """
import asyncio
from datetime import datetime, timezone
from airflow.sdk import DAG, task
from airflow_provider_plgd.hooks.jetstream import JetStreamHook

with DAG("DAG_ID", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc), catchup=False) as dag:
    @task
    def settings_and_owners():
        settings = asyncio.run(JetStreamHook().aget_settings())  # the async lookup the ETL's plan uses
        owners = JetStreamHook().list_owners()  # what plan calls: aget_settings under asyncio.run
        return {"servers": list(settings.servers), "stream": settings.stream, "owners": sorted(owners)}
    settings_and_owners()
"""


@pytest.mark.parametrize("source", ["metadata_db", "env_var"])
def test_connection_from_the_metadata_db_or_env_in_dag_test(jetstream, dags_folder, monkeypatch, source):
    """Case 10: a real ``dag.test()`` run whose task awaits ``JetStreamHook.aget_settings()``, with
    ``plgd_jetstream_default`` stored in the metadata DB (as ``airflow connections add`` or the UI
    store it) or given as ``AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT``."""
    from airflow.models import Connection
    from airflow.utils.session import create_session

    from tests.integration.conftest import load_dag, publish_messages, xcom_value

    publish_messages(jetstream.url, [(metadata_subject(OWNER_A, DEV_1), b"x", None)])
    dag_id = f"plgd_test_conn_{source}"
    path = dags_folder / f"{dag_id}.py"
    path.write_text(SETTINGS_DAG.replace("DAG_ID", dag_id))
    if source == "metadata_db":
        monkeypatch.delenv("AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT")
        with create_session() as session:
            session.add(Connection(conn_id="plgd_jetstream_default", conn_type="plgd_jetstream",
                                   host=jetstream.host, port=jetstream.port, extra=json.dumps({"stream": "EVENTS"})))
    try:
        dr = load_dag(path, dag_id).test()
    finally:
        with create_session() as session:
            session.query(Connection).filter(Connection.conn_id == "plgd_jetstream_default").delete()
    assert "success" in str(dr.state).lower(), dr.state
    assert xcom_value(dr, "settings_and_owners") == {
        "servers": [f"nats://{jetstream.host}:{jetstream.port}"], "stream": "EVENTS", "owners": [OWNER_A]}
