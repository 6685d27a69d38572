"""Opening a nats-py client for the ``plgd_jetstream`` connection, refusing clear-text credentials.

:func:`connect` opens one nats-py client on :class:`~.connection.JetStreamSettings`: the first
reachable server, with the settings' credentials (user/password, token, NKEY seed, ``.creds`` file,
checked first without quoting them) and TLS files; a guard in the handshake refuses to send CONNECT
in clear text when TLS is configured, and the client delivers subjects that are not valid UTF-8.
Errors become ours (``exceptions.py``): :class:`JetStreamConnectionError`, :class:`JetStreamAuthError`.

Source: nats-py 2.x ``nats.connect`` options and ``Client`` internals (named where used).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import ssl
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

from airflow_provider_plgd.exceptions.jetstream import JetStreamAuthError, JetStreamConnectionError, TlsDowngradeError
from airflow_provider_plgd.jetstream.connection import (
    NKEY_SEED_EXTRA,
    JetStreamSettings,
    field_name,
    strip_userinfo,
)

_log = logging.getLogger(__name__)

#: Seconds allowed to open a TCP/TLS connection and complete the NATS handshake, per server.
CONNECT_TIMEOUT_S = 5

_CLIENT_CLASS: Any = None
#: How the client decodes a subject that is not valid UTF-8 (Python's codec error handler:
#: U+FFFD per invalid byte, like Go's ``encoding/json`` in the server's API answers).
NON_UTF8_REPLACEMENT = "replace"


def _tls_guarded_client(require_tls: bool) -> Any:
    """A nats-py client that refuses to send CONNECT in clear text when ``require_tls``.

    nats-py upgrades to TLS only when the server's INFO says ``tls_required`` (nats-py 2.x
    ``Client._process_connect_init``), even for a ``tls://`` URL with a TLS context: a server
    without TLS, or anyone in between who rewrites the clear-text INFO line, would get the
    CONNECT command with user/password/token in clear text. A ``ws://`` connection is never
    upgraded (nats-py 2.x skips the upgrade for the ``ws`` scheme; TLS on websockets is ``wss://``
    from the first byte), so with ``require_tls`` it is always refused. ``_connect_command`` runs
    after the upgrade step and just before CONNECT is written, so the check there sends nothing.

    The client also decodes a message subject that is not valid UTF-8 with U+FFFD in place of
    each invalid byte (:data:`NON_UTF8_REPLACEMENT`; what the server's own JSON API shows for
    it) instead of failing: nats-py 2.x ``Client._build_message`` calls ``subject.decode()``,
    and the ``UnicodeDecodeError`` ends its read loop while the connection stays open, so every
    later pull waited for answers that were never read. Any client allowed to publish on
    ``plgd.>`` can store such a subject with a raw ``PUB``; the message is now delivered (and
    staged; decode quarantines its subject as ``bad_subject``).
    """
    global _CLIENT_CLASS
    if _CLIENT_CLASS is None:
        # lazy: nats loads when a task talks to the server, not when a DAG file is parsed
        from nats.aio.client import Client

        class _GuardedClient(Client):
            plgd_require_tls = False

            def _connect_command(self) -> bytes:
                scheme = self._current_server.uri.scheme if self._current_server is not None else ""
                if self.plgd_require_tls and scheme == "ws":
                    raise TlsDowngradeError(
                        "TLS is configured but this server is a plain websocket (ws://), which nats-py never "
                        "switches to TLS: refusing to send credentials in clear text; use wss://"
                    )
                if self.plgd_require_tls and scheme in ("nats", "tls") and not (
                    self._server_info.get("tls_required") or self.options.get("tls_handshake_first")
                ):
                    raise TlsDowngradeError(
                        "TLS is configured but the server did not switch to TLS (its INFO has no tls_required): "
                        "refusing to send credentials in clear text; check that the server has a 'tls' block "
                        "(and no 'allow_non_tls'), or that nothing between strips TLS"
                    )
                return super()._connect_command()

            def _build_message(self, sid, subject, reply, data, headers):
                try:
                    return super()._build_message(sid, subject, reply, data, headers)
                except UnicodeDecodeError:
                    subject = bytes(subject).decode("utf-8", NON_UTF8_REPLACEMENT).encode()
                    reply = bytes(reply).decode("utf-8", NON_UTF8_REPLACEMENT).encode()
                    _log.warning("message on a subject that is not valid UTF-8, delivered as %r", subject.decode())
                    return super()._build_message(sid, subject, reply, data, headers)

        _CLIENT_CLASS = _GuardedClient
    client = _CLIENT_CLASS()
    client.plgd_require_tls = require_tls
    return client


def _check_user_seed(seed: str, conn_id: str) -> None:
    """Fail early, with a message that does not quote the seed, if it is not an NKEY user seed."""
    # lazy: nats loads when a task talks to the server, not when a DAG file is parsed
    import nkeys

    ok = isinstance(seed, str) and seed.strip().startswith("SU")
    if ok:
        try:
            nkeys.from_seed(bytearray(seed.strip().encode())).wipe()
        except Exception:  # nkeys raises several error types (and binascii/nacl ones)
            ok = False
    if not ok:
        raise JetStreamAuthError(
            f"connection {conn_id!r}: {field_name(NKEY_SEED_EXTRA)} is not a valid NKEY user seed (expected the 58-character "
            "seed starting with 'SU' that nsc or 'nk -gen user' prints); the value is not shown"
        )


def _check_creds_file(path: str, conn_id: str) -> None:
    """Fail early if ``path`` is not a readable ``.creds`` file with a user JWT and a user seed.

    nats-py reads the file during the handshake; a file without the JWT markers would make it loop
    forever. The message names the path, never the content.
    """
    try:
        with open(path, "rb") as f:
            text = f.read(1 << 20).decode("utf-8", errors="replace")
    except OSError as exc:
        raise JetStreamAuthError(
            f"connection {conn_id!r}: cannot read {field_name('creds_file')} {path!r}: {exc.strerror or type(exc).__name__}"
        ) from None
    lines = text.splitlines()
    try:
        jwt_line = lines[next(i for i, x in enumerate(lines) if "BEGIN NATS USER JWT" in x) + 1].strip()
        seed_line = lines[next(i for i, x in enumerate(lines) if "BEGIN USER NKEY SEED" in x) + 1].strip()
    except (StopIteration, IndexError):
        jwt_line = seed_line = ""
    if jwt_line.count(".") != 2 or not seed_line:
        raise JetStreamAuthError(
            f"connection {conn_id!r}: {field_name('creds_file')} {path!r} is not a NATS .creds file (expected the "
            "'BEGIN NATS USER JWT' and 'BEGIN USER NKEY SEED' sections that nsc writes)"
        )
    try:
        _check_user_seed(seed_line, conn_id)
    except JetStreamAuthError:
        raise JetStreamAuthError(
            f"connection {conn_id!r}: {field_name('creds_file')} {path!r} holds no valid NKEY user seed"
        ) from None


def _describe_connect_error(exc: BaseException, s: JetStreamSettings) -> str:
    """A one-line reason for a failed connect, with a hint for TLS problems (no secrets)."""
    text = f"{type(exc).__name__}: {exc or 'timed out'}"
    if isinstance(exc, ssl.SSLCertVerificationError):
        hint = (f"the server's certificate is not trusted: set {field_name('tls_ca')} to the CA that signed it"
                if not s.tls_ca else f"the server's certificate is not signed by {field_name('tls_ca')} {s.tls_ca!r} "
                "or does not name this host")
        return f"TLS verification failed ({hint}): {text}"
    lowered = str(exc).lower()
    if isinstance(exc, ssl.SSLError) and "certificate required" in lowered:
        return (f"the server requires a client certificate: set {field_name('tls_cert')} and "
                f"{field_name('tls_key')}: {text}")
    if isinstance(exc, ssl.SSLError) or "tls" in lowered or "ssl" in lowered:
        return f"TLS handshake failed: {text}"
    return text


def connect_options(s: JetStreamSettings, conn_id: str) -> dict[str, Any]:
    """The ``nats.connect`` keyword arguments for the settings' credentials and TLS (checked first).

    :raises JetStreamAuthError: NKEY/creds authentication without the ``nkeys`` package, a malformed
        seed or ``.creds`` file (never quoted). :raises JetStreamConnectionError: unreadable TLS files.
    """
    opts: dict[str, Any] = {}
    if s.user:
        opts["user"] = s.user
    if s.password:
        opts["password"] = s.password
    if s.token:
        opts["token"] = s.token
    if s.nkey_seed or s.creds_file:
        try:
            importlib.import_module("nkeys")  # nats-py needs it for NKEY/JWT auth
        except ImportError:
            raise JetStreamAuthError(
                f"{field_name(NKEY_SEED_EXTRA)} / {field_name('creds_file')} authentication needs the 'nkeys' package: "
                "pip install 'nats-py[nkeys]'"
            ) from None
        if s.creds_file:
            _check_creds_file(s.creds_file, conn_id)
            opts["user_credentials"] = s.creds_file
        elif s.nkey_seed:
            _check_user_seed(s.nkey_seed, conn_id)
            opts["nkeys_seed_str"] = s.nkey_seed.strip()
    if s.tls_ca or s.tls_cert or any(u.startswith(("tls://", "wss://")) for u in s.servers):
        try:
            ctx = ssl.create_default_context(cafile=s.tls_ca) if s.tls_ca else ssl.create_default_context()
            if s.tls_cert:
                ctx.load_cert_chain(s.tls_cert, s.tls_key)
        except (OSError, ssl.SSLError) as exc:
            # paths only: ssl errors name the failing step (e.g. "[SSL] PEM lib"), never key bytes
            raise JetStreamConnectionError(
                f"cannot load the TLS files of connection {conn_id!r} "
                f"(tls_ca={s.tls_ca!r}, tls_cert={s.tls_cert!r}, tls_key={s.tls_key!r}): "
                f"{type(exc).__name__}: {getattr(exc, 'strerror', None) or exc}"
            ) from None
        opts["tls"] = ctx
    return opts


@contextlib.asynccontextmanager
async def connect(s: JetStreamSettings, conn_id: str) -> AsyncIterator[Any]:
    """Connect to the first reachable server and yield the nats-py client; close it on exit.

    One-shot connection: ``allow_reconnect=False``, connect timeout ``CONNECT_TIMEOUT_S``
    seconds per server, servers tried in order.

    :raises JetStreamConnectionError: no server reachable (names the servers), TLS failure
        (certificate not trusted: check ``tls_ca``; server requires a client certificate:
        set ``tls_cert``/``tls_key``; TLS required but not configured; TLS configured but the
        server does not switch to TLS, or is a plain ``ws://`` websocket: refused before
        CONNECT is sent).
    :raises JetStreamAuthError: credentials rejected or unusable (malformed ``nkey_seed_secret``,
        unreadable or malformed ``creds_file``); the message never contains a secret.
    """
    # lazy: nats loads when a task talks to the server, not when a DAG file is parsed
    import nats.errors

    opts = connect_options(s, conn_id)
    _log.debug("Connecting to NATS %s", s.safe_servers())
    errors: list[str] = []
    nc = None
    for url in s.servers:
        seen: list[BaseException] = []

        async def error_cb(exc: BaseException, seen: list = seen) -> None:
            seen.append(exc)
            _log.debug("nats client error: %s", exc)

        # wss:// is TLS from the first byte; nats://, tls:// and ws:// need the guard
        require_tls = "tls" in opts and urlsplit(url).scheme in ("nats", "tls", "ws")
        client = _tls_guarded_client(require_tls)
        try:
            # nats-py keeps retrying a refused server unless max_reconnect_attempts > 0:
            # 1 means at most two attempts, 50 ms apart, then NoServersError.
            try:
                await client.connect(
                    servers=[url],
                    allow_reconnect=False,
                    max_reconnect_attempts=1,
                    reconnect_time_wait=0.05,
                    connect_timeout=CONNECT_TIMEOUT_S,
                    error_cb=error_cb,
                    name="airflow-provider-plgd",
                    **opts,
                )
            except BaseException:
                # nats-py leaves the socket open when the handshake fails without reconnects
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.close(), 2.0)
                raise
            nc = client
            break
        except (nats.errors.AuthorizationError, nats.errors.InvalidUserCredentialsError) as exc:
            raise JetStreamAuthError(f"authentication to NATS {strip_userinfo(url)} failed: {exc}") from None
        except nats.errors.NoServersError:
            last = seen[-1] if seen else None
            errors.append(f"{strip_userinfo(url)}: {_describe_connect_error(last, s) if last else 'no server'}")
        except nats.errors.Error as exc:
            text = str(exc)
            if "authorization" in text.lower() or "authentication" in text.lower():
                raise JetStreamAuthError(
                    f"authentication to NATS {strip_userinfo(url)} failed (server said {text!r}); "
                    f"check User and Password, {field_name('token')}, {field_name(NKEY_SEED_EXTRA)} or "
                    f"{field_name('creds_file')}"
                ) from None
            errors.append(f"{strip_userinfo(url)}: {text or type(exc).__name__}")
        except TlsDowngradeError as exc:
            errors.append(f"{strip_userinfo(url)}: {exc}")
        except (OSError, asyncio.TimeoutError, ssl.SSLError) as exc:
            errors.append(f"{strip_userinfo(url)}: {_describe_connect_error(exc, s)}")
    if nc is None:
        raise JetStreamConnectionError(
            f"cannot connect to NATS server(s) {s.safe_servers()} (timeout {CONNECT_TIMEOUT_S}s each): "
            + "; ".join(errors)
        )
    try:
        yield nc
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
