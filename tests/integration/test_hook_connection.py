"""JetStreamHook against a real nats-server (fixtures ``nats_server``/``jetstream`` in conftest):
connecting and its errors (unreachable, missing stream, auth, token, TLS, JetStream off, restart),
the pure helpers, interval completeness on the server's clock, and the connection of the metadata
DB or the environment in ``dag.test()``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from types import SimpleNamespace

import pytest

from airflow_provider_plgd.hooks.jetstream import (
    JetStreamAuthError,
    JetStreamConnectionError,
    JetStreamHook,
    JetStreamNotEnabledError,
    StreamNotFoundError,
)
from airflow_provider_plgd.jetstream.connection import settings_from_connection
from airflow_provider_plgd.jetstream.messages import parse_ack_reply
from airflow_provider_plgd.times import ns_to_rfc3339, to_ns
from plgd_devtools.nats_server import NatsServer, free_port
from tests.integration.hook_subjects import DEV_1, DEV_2, OWNER_A, OWNER_B, metadata_subject


def set_conn(monkeypatch, **fields) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT", json.dumps({"conn_type": "plgd_jetstream", **fields}))



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
