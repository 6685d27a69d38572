"""Security of the JetStream connection against real nats-server processes: TLS, authentication,
secrets in errors and logs (secrets masked in Airflow task logs: ``test_secret_masking.py``).

Servers (each a real ``nats-server`` with JetStream, started once per module):

* ``tls_server``: TLS only, mutual TLS (client certificate required, ``verify: true``), with a
  self-signed CA generated at test time, and two users: user/password and an NKEY user;
* ``token_server``: plain, token authentication;
* ``operator_server``: decentralized JWT auth (operator, system and ``ETL`` accounts in a
  ``MEMORY`` resolver), clients log in with ``.creds`` files generated at test time.

Every failure must raise our typed error (``airflow_provider_plgd.exceptions``) with a clear message
that contains no secret -- checked in ``str(exc)`` and in every log record and console output of
the attempt (DEBUG level, all loggers).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import ssl
from pathlib import Path

import pytest

from airflow_provider_plgd.exceptions import JetStreamAuthError, JetStreamConnectionError, JetStreamError
from airflow_provider_plgd.hooks.jetstream import JetStreamHook
from airflow_provider_plgd.jetstream.connection import settings_from_connection
from airflow_provider_plgd.plgd.subjects import registrations_subject
from plgd_devtools.nats_server import (
    NatsServer,
    OperatorMode,
    new_nkey,
    recreate_stream,
    tls_block,
    write_tls_files,
)

OWNER = "e1407479-3136-56c0-9908-bb02fb0339e2"
SUBJECT = registrations_subject(OWNER, "devicesregistered")
PASSWORD = "pw-Kq8vZr2LmX"  # distinctive, so a leak anywhere is found by substring search
TOKEN = "tok-Hs93jdPq7Tz"
SMALL_STREAM = {"name": "EVENTS", "subjects": ["plgd.>"], "storage": "memory", "duplicate_window": 600_000_000_000}


def set_conn(monkeypatch, **fields) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT", json.dumps({"conn_type": "plgd_jetstream", **fields}))


def client_tls(files) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=files.ca)
    ctx.load_cert_chain(files.client_cert, files.client_key)
    return ctx


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """Two unrelated PKIs: ``good`` (the server's) and ``other`` (a CA the server does not use)."""
    directory = tmp_path_factory.mktemp("pki")
    return {"good": write_tls_files(directory), "other": write_tls_files(directory, prefix="other-")}


@pytest.fixture(scope="module")
def nkey_user():
    seed, public = new_nkey("user")
    return {"seed": seed, "public": public}


@pytest.fixture(scope="module")
def tls_server(pki, nkey_user):
    files = pki["good"]
    config = tls_block(files, verify_clients=True) + (
        "authorization {\n  users = [\n"
        f'    {{user: "etl", password: "{PASSWORD}"}}\n'
        f'    {{nkey: "{nkey_user["public"]}"}}\n'
        "  ]\n}\n"
    )
    with NatsServer(config=config, scheme="tls") as server:
        recreate_stream(server.url, SMALL_STREAM, tls=client_tls(files), user="etl", password=PASSWORD)
        yield server


@pytest.fixture(scope="module")
def token_server():
    with NatsServer(config=f'authorization {{ token: "{TOKEN}" }}\n') as server:
        recreate_stream(server.url, SMALL_STREAM, token=TOKEN)
        yield server


@pytest.fixture(scope="module")
def operator_mode(tmp_path_factory):
    mode = OperatorMode()
    mode.creds_path = mode.write_creds(tmp_path_factory.mktemp("creds") / "etl.creds")
    return mode


@pytest.fixture(scope="module")
def operator_server(operator_mode):
    with NatsServer(config=operator_mode.config) as server:
        recreate_stream(server.url, SMALL_STREAM, user_credentials=operator_mode.creds_path)
        yield server


@pytest.fixture
def no_leak(caplog, capfd):
    """Yield a checker: ``check(*secrets)`` asserts no secret in any log record or console output
    captured since the test started (all loggers at DEBUG)."""
    caplog.set_level(logging.DEBUG)

    def check(*secrets: str) -> None:
        out, err = capfd.readouterr()
        text = "\n".join([caplog.text, out, err, *(str(r.args) for r in caplog.records)])
        for secret in secrets:
            assert secret not in text

    return check


def round_trip(hook: JetStreamHook) -> None:
    """Publish one message and read it back through the hook (proves an authenticated JetStream session)."""
    seq = hook.publish(SUBJECT, b"payload", msg_id=f"m-{os.urandom(4).hex()}")
    got = [m for batch in hook.iter_batches(SUBJECT, start_seq=seq) for m in batch]
    assert [(m.stream_seq, m.subject, m.data) for m in got] == [(seq, SUBJECT, b"payload")]


def expect_error(kind: type[JetStreamError], *secrets: str, match: str | None = None) -> JetStreamError:
    with pytest.raises(kind) as info:
        JetStreamHook().stream_info()
    text = str(info.value)
    for secret in secrets:
        assert secret not in text
    if match:
        assert match in text, text
    return info.value


# ---------------------------------------------------------------------------------------------
# TLS (mutual) + user/password + NKEY


def test_mtls_with_user_password_and_nkey_works(tls_server, pki, nkey_user, monkeypatch, no_leak):
    files = pki["good"]
    tls = {"tls_ca": files.ca, "tls_cert": files.client_cert, "tls_key": files.client_key}
    # host/port + TLS extras -> tls://; login/password
    set_conn(monkeypatch, host=tls_server.host, port=tls_server.port, login="etl", password=PASSWORD, extra=tls)
    hook = JetStreamHook()
    assert hook.get_settings().servers == (f"tls://127.0.0.1:{tls_server.port}",)
    round_trip(hook)
    ok, message = hook.test_connection()
    assert ok and message.startswith(f"Connected to tls://127.0.0.1:{tls_server.port}; stream EVENTS")
    # extra servers + NKEY seed (prefixed extra names as the Airflow < 3.2 form stores them)
    set_conn(monkeypatch, extra={"extra__plgd_jetstream__servers": tls_server.url,
                                 "extra__plgd_jetstream__nkey_seed_secret": nkey_user["seed"],
                                 **{f"extra__plgd_jetstream__{k}": v for k, v in tls.items()}})
    round_trip(JetStreamHook())
    no_leak(PASSWORD, nkey_user["seed"])


def test_wrong_password_fails_with_auth_error_without_secret(tls_server, pki, monkeypatch, no_leak):
    files = pki["good"]
    set_conn(monkeypatch, host=tls_server.host, port=tls_server.port, login="etl", password="wrong-Zx81Qp",
             extra={"tls_ca": files.ca, "tls_cert": files.client_cert, "tls_key": files.client_key})
    err = expect_error(JetStreamAuthError, "wrong-Zx81Qp", PASSWORD, match="authentication to NATS")
    assert f"tls://127.0.0.1:{tls_server.port}" in str(err)
    no_leak("wrong-Zx81Qp", PASSWORD)


def test_password_in_server_url_is_refused_and_never_shown(tls_server, pki, monkeypatch, no_leak):
    """Airflow shows the Host field and the ``servers`` extra in clear text in its UI and REST API,
    so credentials inside a server URL are refused (before any connection), the message pointing
    to Login/Password; the same user and password in those fields work."""
    files = pki["good"]
    tls = {"tls_ca": files.ca, "tls_cert": files.client_cert, "tls_key": files.client_key}
    for url in (f"tls://etl:{PASSWORD}@127.0.0.1:{tls_server.port}", f"tls://etl:Xq7v/Lm#9w@127.0.0.1:{tls_server.port}",
                "tls://etl:Rt5k?Kp2j@127.0.0.1:x", f"tls://{TOKEN}@127.0.0.1:{tls_server.port}"):
        set_conn(monkeypatch, extra={"servers": url, **tls})
        with pytest.raises(ValueError) as info:
            JetStreamHook().get_settings()
        for part in (PASSWORD, TOKEN, "etl", "Xq7v", "Lm#9w", "Rt5k", "Kp2j"):
            assert part not in str(info.value)
        assert "server URL 'tls://127.0.0.1:" in str(info.value) and "User and Password fields" in str(info.value)
    set_conn(monkeypatch, login="etl", password=PASSWORD, extra={"servers": tls_server.url, **tls})
    round_trip(JetStreamHook())
    no_leak(PASSWORD, TOKEN, "Xq7v", "Lm#9w", "Rt5k", "Kp2j")


def test_unknown_nkey_fails_with_auth_error_without_seed(tls_server, pki, monkeypatch, no_leak):
    files = pki["good"]
    stranger, _public = new_nkey("user")
    set_conn(monkeypatch, extra={"servers": tls_server.url, "nkey_seed_secret": stranger, "tls_ca": files.ca,
                                 "tls_cert": files.client_cert, "tls_key": files.client_key})
    expect_error(JetStreamAuthError, stranger, match="authentication to NATS")
    no_leak(stranger)


@pytest.mark.parametrize("seed", [
    "not-a-seed-0123456789",
    "SUAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",  # right prefix, bad length/checksum
    new_nkey("account")[0],  # a valid seed, but of an account, not a user
], ids=["not-a-seed", "bad-checksum", "account-seed"])  # fixed IDs: each xdist worker draws its own seed
def test_malformed_nkey_seed_fails_before_connecting_without_seed(tls_server, pki, monkeypatch, seed, no_leak):
    files = pki["good"]
    set_conn(monkeypatch, extra={"servers": tls_server.url, "nkey_seed_secret": seed, "tls_ca": files.ca})
    expect_error(JetStreamAuthError, seed, match="NKEY seed ('nkey_seed_secret') is not a valid NKEY user seed")
    no_leak(seed)


def test_wrong_ca_fails_with_tls_verification_message(tls_server, pki, monkeypatch, no_leak):
    other = pki["other"]
    set_conn(monkeypatch, host=tls_server.host, port=tls_server.port, login="etl", password=PASSWORD,
             extra={"tls_ca": other.ca, "tls_cert": other.client_cert, "tls_key": other.client_key})
    err = expect_error(JetStreamConnectionError, PASSWORD, match="TLS verification failed")
    assert other.ca in str(err) and str(tls_server.port) in str(err)
    no_leak(PASSWORD)


def test_plain_nats_url_against_tls_only_server_fails_clearly(tls_server, monkeypatch, no_leak):
    # no TLS settings at all: the client must not silently talk to a TLS-only server
    set_conn(monkeypatch, extra={"servers": f"nats://127.0.0.1:{tls_server.port}"}, login="etl", password=PASSWORD)
    err = expect_error(JetStreamConnectionError, PASSWORD, match="TLS verification failed")
    assert "set TLS CA file ('tls_ca')" in str(err) and f"nats://127.0.0.1:{tls_server.port}" in str(err)
    no_leak(PASSWORD)


def test_missing_client_certificate_is_rejected(tls_server, pki, monkeypatch, no_leak):
    set_conn(monkeypatch, host=tls_server.host, port=tls_server.port, login="etl", password=PASSWORD,
             extra={"tls_ca": pki["good"].ca})
    err = expect_error(JetStreamConnectionError, PASSWORD)
    assert "cannot connect to NATS server(s)" in str(err) and str(tls_server.port) in str(err)
    no_leak(PASSWORD)


def test_unreadable_tls_files_name_the_paths(tmp_path, monkeypatch):
    set_conn(monkeypatch, host="127.0.0.1", port=1, extra={"tls_ca": str(tmp_path / "missing-ca.pem")})
    expect_error(JetStreamConnectionError, match=str(tmp_path / "missing-ca.pem"))


# ---------------------------------------------------------------------------------------------
# token


def test_token_auth_and_bad_token(token_server, monkeypatch, no_leak):
    set_conn(monkeypatch, host=token_server.host, port=token_server.port, extra={"token": TOKEN})
    round_trip(JetStreamHook())
    set_conn(monkeypatch, host=token_server.host, port=token_server.port, extra={"token": "tok-WRONG-77aa"})
    expect_error(JetStreamAuthError, "tok-WRONG-77aa", TOKEN, match="authentication to NATS")
    set_conn(monkeypatch, host=token_server.host, port=token_server.port)  # no credentials at all
    expect_error(JetStreamAuthError, TOKEN, match="authentication to NATS")
    no_leak(TOKEN, "tok-WRONG-77aa")


# ---------------------------------------------------------------------------------------------
# .creds files (operator / JWT mode)


def test_creds_file_auth_works(operator_server, operator_mode, monkeypatch, no_leak):
    set_conn(monkeypatch, host=operator_server.host, port=operator_server.port,
             extra={"creds_file": operator_mode.creds_path})
    round_trip(JetStreamHook())
    seed_line = Path(operator_mode.creds_path).read_text().split("BEGIN USER NKEY SEED-----\n")[1].split("\n")[0]
    no_leak(seed_line)


def test_creds_of_an_unknown_account_fail_with_auth_error(operator_server, operator_mode, tmp_path, monkeypatch,
                                                          no_leak):
    other_account, _ = new_nkey("account")
    path = operator_mode.write_creds(tmp_path / "stranger.creds", account_seed=other_account)
    seed_line = Path(path).read_text().split("BEGIN USER NKEY SEED-----\n")[1].split("\n")[0]
    set_conn(monkeypatch, host=operator_server.host, port=operator_server.port, extra={"creds_file": path})
    expect_error(JetStreamAuthError, seed_line, match="authentication to NATS")
    no_leak(seed_line)


@pytest.mark.parametrize("content", [None, "", "just some text\n", "-----BEGIN NATS USER JWT-----\nabc\n"])
def test_missing_or_malformed_creds_file_fails_fast_naming_the_path(operator_server, tmp_path, monkeypatch, content):
    path = tmp_path / "broken.creds"
    if content is not None:
        path.write_text(content)
    set_conn(monkeypatch, host=operator_server.host, port=operator_server.port, extra={"creds_file": str(path)})
    # nats-py alone loops forever on a file without the JWT marker: the hook checks the file first
    expect_error(JetStreamAuthError, match=f"Credentials file ('creds_file') {str(path)!r}")


def test_settings_repr_and_errors_hold_no_secret():
    from types import SimpleNamespace

    from airflow_provider_plgd.jetstream.connection import JetStreamSettings

    conn = SimpleNamespace(conn_id="c", host="nats://h", port=None, login="u", password="pw-123456",
                           extra_dejson={"token": "tok-123456", "nkey_seed_secret": "SUseed123456"})
    base = settings_from_connection(conn)
    # settings built by hand may still carry a URL password: repr and secret_values handle it
    settings = JetStreamSettings(**{**{k: getattr(base, k) for k in base.__dataclass_fields__},
                                    "servers": ("nats://u:url-pw-123@h:4222",)})
    text = repr(settings)
    for secret in ("url-pw-123", "pw-123456", "tok-123456", "SUseed123456"):
        assert secret not in text
    assert "hidden_secrets=4" in text
    assert sorted(settings.secret_values()) == sorted(["pw-123456", "tok-123456", "SUseed123456", "url-pw-123"])
    with pytest.raises(ValueError) as info:
        settings_from_connection(SimpleNamespace(conn_id="c", host=None, port=None, login=None, password=None,
                                                 extra_dejson={"servers": "nats://u:p/w-secret@h:x"}))
    assert "w-secret" not in str(info.value)
    with pytest.raises(ValueError) as info:
        settings_from_connection(SimpleNamespace(**{**vars(conn), "host": "nats://u:url-pw-123@h"}))
    assert "url-pw-123" not in str(info.value)


# ---------------------------------------------------------------------------------------------
# TLS downgrade: a TLS-configured client never sends credentials in clear text


class FakePlainServer:
    """A TCP server on loopback that greets like a NATS server without TLS (what a plain server, or
    a man in the middle who strips ``tls_required`` from the INFO line, sends) and records every
    byte the client sends."""

    INFO = b'INFO {"server_id":"FAKE","version":"2.15.1","go":"go1","host":"127.0.0.1","port":4222,' \
           b'"headers":true,"max_payload":1048576,"proto":1,"auth_required":true}\r\n'

    def __init__(self) -> None:
        import socket
        import threading

        self.received = bytearray()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:

        self.sock.settimeout(10)
        try:
            while True:
                conn, _ = self.sock.accept()
                with conn:
                    conn.sendall(self.INFO)
                    conn.settimeout(1.0)
                    try:
                        while chunk := conn.recv(65536):
                            self.received += chunk
                            if b"PING" in chunk:
                                conn.sendall(b"PONG\r\n")
                    except (TimeoutError, OSError):
                        pass
        except OSError:
            return

    def close(self) -> None:
        self.sock.close()


def test_tls_client_refuses_a_server_that_does_not_switch_to_tls(pki, monkeypatch, no_leak):
    fake = FakePlainServer()
    try:
        # TLS asked for by the tls_ca extra (host -> tls://) and by an explicit tls:// URL
        for fields in ({"host": "127.0.0.1", "port": fake.port},
                       {"extra": {"servers": f"tls://127.0.0.1:{fake.port}"}}):
            extra = {"tls_ca": pki["good"].ca, "token": TOKEN, **fields.pop("extra", {})}
            set_conn(monkeypatch, login="etl", password=PASSWORD, extra=extra, **fields)
            err = expect_error(JetStreamConnectionError, PASSWORD, TOKEN,
                               match="refusing to send credentials in clear text")
            assert f"tls://127.0.0.1:{fake.port}" in str(err)
        assert b"CONNECT" not in fake.received and PASSWORD.encode() not in fake.received
        assert TOKEN.encode() not in fake.received
        # control: without TLS settings the same server gets the CONNECT (so the check above is meaningful)
        set_conn(monkeypatch, host="127.0.0.1", port=fake.port, login="etl", password=PASSWORD)

        async def connect_only() -> None:
            with contextlib.suppress(JetStreamError):
                async with JetStreamHook().aconnect():
                    pass

        asyncio.run(connect_only())
        assert b"CONNECT" in fake.received and PASSWORD.encode() in fake.received
    finally:
        fake.close()
    no_leak(PASSWORD, TOKEN)


# ---------------------------------------------------------------------------------------------
# websocket servers (ws://, wss://): nats-py's aiohttp transport, and no credentials over plain ws
# when TLS is configured


def websocket_server(listen_port: int, pki_files=None) -> NatsServer:
    """A nats-server with user/password auth, its client port plain, and a websocket listener on
    ``listen_port``: plain (``no_tls``) without ``pki_files``, TLS with them. ``-DV`` logs every
    websocket client and every protocol line (``CONNECT``) into its log."""
    if pki_files is None:
        ws_tls = "  no_tls: true\n"
    else:
        ws_tls = (f"  tls {{\n    cert_file: {json.dumps(pki_files.server_cert)}\n"
                  f"    key_file: {json.dumps(pki_files.server_key)}\n  }}\n")
    config = (f'websocket {{\n  listen: "127.0.0.1:{listen_port}"\n{ws_tls}}}\n'
              f'authorization {{ users = [ {{user: "etl", password: "{PASSWORD}"}} ] }}\n')
    return NatsServer(config=config, extra_args=("-DV",))


def ws_connects(server: NatsServer) -> list[str]:
    """The ``CONNECT`` protocol lines the server traced from websocket clients (``wid:``)."""
    return [line for line in server.log_path.read_text(errors="replace").splitlines()
            if "wid:" in line and "<<- [CONNECT" in line]


def test_ws_and_wss_servers_work_with_the_providers_dependencies(pki, monkeypatch, no_leak):
    """``ws://`` and ``wss://`` need nats-py's aiohttp transport ("Could not import aiohttp
    transport" without it): publish and read back over a plain and a TLS websocket listener."""
    from plgd_devtools.nats_server import free_port

    files = pki["good"]
    for scheme, tls_files in (("ws", None), ("wss", files)):
        port = free_port()
        with websocket_server(port, tls_files) as server:
            recreate_stream(server.url, SMALL_STREAM, user="etl", password=PASSWORD)
            extra = {"servers": f"{scheme}://127.0.0.1:{port}"}
            if tls_files:
                extra["tls_ca"] = files.ca
            set_conn(monkeypatch, login="etl", password=PASSWORD, extra=extra)
            hook = JetStreamHook()
            round_trip(hook)
            ok, message = hook.test_connection()
            assert ok and message.startswith(f"Connected to {scheme}://127.0.0.1:{port}; stream EVENTS"), message
            assert len(ws_connects(server)) >= 2  # the traffic did go through the websocket listener
    no_leak(PASSWORD)


def test_ws_server_with_tls_settings_is_refused_before_connect(pki, monkeypatch, no_leak):
    """With ``tls_*`` extras (or a ``tls://``/``wss://`` server) a ``ws://`` server would get
    CONNECT with the user and password in clear text (nats-py never upgrades ``ws://``): the
    connection is refused when it is read, and the guard inside the handshake refuses too."""
    import nats.errors

    from airflow_provider_plgd.jetstream.client import _tls_guarded_client
    from plgd_devtools.nats_server import free_port

    files = pki["good"]
    port = free_port()
    with websocket_server(port) as server:
        url = f"ws://127.0.0.1:{port}"
        for extra in ({"tls_ca": files.ca, "tls_cert": files.client_cert, "tls_key": files.client_key},
                      {"tls_ca": files.ca}):
            set_conn(monkeypatch, login="etl", password=PASSWORD, extra={"servers": url, **extra})
            with pytest.raises(ValueError) as info:
                JetStreamHook().stream_info()
            assert f"server {url} is a plain websocket (ws://) but TLS is configured" in str(info.value)
            assert "use wss://" in str(info.value) and PASSWORD not in str(info.value)
        assert ws_connects(server) == []

        # the guard in the handshake (defense in depth, for settings built any other way)
        async def connect(require_tls: bool) -> list[BaseException]:
            seen: list[BaseException] = []

            async def error_cb(exc: BaseException) -> None:
                seen.append(exc)

            client = _tls_guarded_client(require_tls)
            try:
                await client.connect(servers=[url], user="etl", password=PASSWORD, allow_reconnect=False,
                                     max_reconnect_attempts=1, reconnect_time_wait=0.05, connect_timeout=5,
                                     error_cb=error_cb, tls=client_tls(files) if require_tls else None)
            except (nats.errors.NoServersError, ConnectionError) as exc:
                seen.append(exc)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.close(), 2.0)
            return seen

        seen = asyncio.run(connect(require_tls=True))
        assert any("refusing to send credentials in clear text; use wss://" in str(e) for e in seen), seen
        assert ws_connects(server) == []
        assert "wid:" in server.log_path.read_text(errors="replace")  # the websocket client did reach it
        # control: the same client without the TLS requirement sends CONNECT (so the checks above mean something)
        assert asyncio.run(connect(require_tls=False)) == []
        assert len(ws_connects(server)) == 1
    no_leak(PASSWORD)


# ---------------------------------------------------------------------------------------------
# owners discovered from stream subjects


def test_list_owners_skips_subjects_whose_owner_token_is_a_wildcard_or_path(jetstream, caplog, capfd):
    """JetStream stores messages published on ``plgd.owners.*.…`` literally; such a token must
    not become an owner the ETL then fetches (a subscription wildcard or a staging folder)."""
    import nats

    hostile = ["*", "a=b", "[x]", "a\\b"]

    async def publish() -> None:
        nc = await nats.connect(jetstream.url)
        try:
            for token in [OWNER, *hostile]:
                ack = await nc.request(f"plgd.owners.{token}.registrations.devicesregistered", b"x", timeout=5)
                assert json.loads(ack.data)["stream"] == "EVENTS"  # stored
        finally:
            await nc.close()

    asyncio.run(publish())
    caplog.set_level(logging.WARNING)
    owners = JetStreamHook().list_owners()
    assert owners == {OWNER: {SUBJECT: 1}}
    logged = caplog.text + "".join(capfd.readouterr())  # the hook logs through Airflow's structlog setup
    assert "Ignoring 4 subject(s) whose owner token is not a valid owner ID (4 messages)" in logged
