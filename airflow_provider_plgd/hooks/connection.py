"""Connection settings of the ``plgd_jetstream`` connection type, their checks, and opening a client.

Everything the hook needs to know about an Airflow connection lives here (like the Amazon
provider's ``utils/connection_wrapper.py``): :class:`JetStreamSettings`, parsing of the Airflow
connection (:func:`settings_from_connection`), the checks of secrets, TLS files, ``.creds`` files,
NKEY seeds, server URLs and stream names, registering secrets with Airflow's log masker, and
:func:`connect`, which opens one nats-py client that refuses to send credentials in clear text.

Source: nats-py 2.x ``nats.connect`` options; NATS docs, "JetStream > Naming streams, consumers
and accounts"; Airflow's secrets masker (``mask_secret``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from airflow_provider_plgd.exceptions import JetStreamAuthError, JetStreamConnectionError, TlsDowngradeError
from airflow_provider_plgd.get_provider_info import CONN_FIELDS, CONN_TYPE, NKEY_SEED_EXTRA

_log = logging.getLogger(__name__)

DEFAULT_STREAM = "EVENTS"
DEFAULT_PORT = 4222
#: Seconds allowed to open a TCP/TLS connection and complete the NATS handshake, per server.
CONNECT_TIMEOUT_S = 5

_EXTRA_PREFIX = f"extra__{CONN_TYPE}__"
_SERVER_SCHEMES = ("nats", "tls", "ws", "wss")
#: Former name of the ``nkey_seed_secret`` extra: still read, but Airflow's UI and REST API show it
#: in clear text (its name contains no word Airflow treats as sensitive).
_LEGACY_NKEY_SEED_EXTRA = "nkey_seed"


@dataclass(frozen=True, repr=False)
class JetStreamSettings:
    """What the hook needs from an Airflow connection of type ``plgd_jetstream``.

    Secrets (password, token, nkey_seed) are not in ``repr``; use :meth:`safe_servers` for
    messages and logs and :meth:`secret_values` to register the secrets with Airflow's log masker.
    :func:`settings_from_connection` refuses credentials inside server URLs; settings built by hand
    may still carry them, so both methods handle them.
    """

    servers: tuple[str, ...]
    stream: str
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    nkey_seed: str | None = field(default=None, repr=False)
    creds_file: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    storage_root: str | None = None

    def safe_servers(self) -> str:
        """The server URLs, comma-separated, without any ``user:password@`` part."""
        return ", ".join(strip_userinfo(s) for s in self.servers)

    def secret_values(self) -> list[str]:
        """Every secret of the connection: password, token, nkey_seed, and the password (or the
        token, when there is no password) of ``user:password@`` / ``token@`` in server URLs."""
        values = [v for v in (self.password, self.token, self.nkey_seed) if v]
        for url in self.servers:
            parts = urlsplit(url)
            if parts.password:
                values.append(parts.password)
            elif parts.username:  # nats://<token>@host
                values.append(parts.username)
        return values

    def __repr__(self) -> str:
        shown = ("stream", "user", "creds_file", "tls_ca", "tls_cert", "tls_key", "storage_root")
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in shown)
        hidden = len(self.secret_values())
        return f"JetStreamSettings(servers={self.safe_servers()!r}, {fields}, hidden_secrets={hidden})"


def field_name(key: str) -> str:
    """How errors name a connection field: the connection form's label and the extra's key, e.g.
    ``Credentials file ('creds_file')`` (labels from ``get_provider_info.CONN_FIELDS``)."""
    return f"{CONN_FIELDS[key]['label']} ({key!r})"


def strip_userinfo(url: str) -> str:
    """``url`` without a ``user:password@`` / ``token@`` part: everything between ``://`` and the
    last ``@`` is dropped, so a password that contains ``/``, ``#``, ``?`` or ``@`` is removed too
    (the one credential stripper: NATS server URLs here, the UI links of ``links.py``)."""
    scheme, sep, rest = url.rpartition("://") if "://" in url else ("", "", url)
    if "@" not in rest:
        return url
    return f"{scheme}{sep}{rest.rsplit('@', 1)[1]}"


def mask_settings_secrets(s: JetStreamSettings) -> None:
    """Register the connection's secrets with Airflow's secrets masker (task logs show ``***``).

    Airflow masks the password and extras named like a secret (``token``, ``nkey_seed_secret``)
    itself when it reads a connection, but not the former ``nkey_seed`` extra; the hook registers
    every secret it uses, whatever the extra's name. Airflow does not mask values shorter than
    ``[logging] min_length_masked_secret`` (default 5 characters). On Airflow 3 the Task SDK's
    ``mask_secret`` also tells the supervisor process.
    """
    values = s.secret_values()
    if not values:
        return
    from airflow_provider_plgd.compat import mask_secret

    if mask_secret is None:  # pragma: no cover - no secrets masker in this Airflow
        return
    for value in values:
        mask_secret(value)


async def amask_settings_secrets(s: JetStreamSettings) -> None:
    """Async :func:`mask_settings_secrets` (``amask_secret`` on Airflow 3: the sync form must not
    talk to the supervisor from inside an event loop)."""
    values = s.secret_values()
    if not values:
        return
    from airflow_provider_plgd.compat import amask_secret

    if amask_secret is None:  # pragma: no cover - Airflow 2.11 / older 3.x
        mask_settings_secrets(s)
        return
    for value in values:
        await amask_secret(value)


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

            def _build_message(self, sid, subject, reply, data, headers):  # noqa: ANN001
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
    import nkeys

    ok = isinstance(seed, str) and seed.strip().startswith("SU")
    if ok:
        try:
            nkeys.from_seed(bytearray(seed.strip().encode())).wipe()
        except Exception:  # noqa: BLE001 - nkeys raises several error types (and binascii/nacl ones)
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


def _extra(extras: dict[str, Any], name: str) -> Any:
    """Read an extra both plain (``token``) and prefixed (``extra__plgd_jetstream__token``)."""
    for key in (name, _EXTRA_PREFIX + name):
        value = extras.get(key)
        if value not in (None, ""):
            return value
    return None


def _normalize_server(value: str, *, tls: bool, conn_id: str | None = None) -> str:
    """One server URL with its scheme (``tls://`` when ``tls``, else ``nats://``, for a bare
    ``host:port``) and, for ``nats``/``tls``, the default port 4222.

    :raises ValueError: credentials in the URL (``user:password@`` or ``token@``: Airflow shows the
        Host field and the ``servers`` extra in clear text in its UI and REST API), an unknown
        scheme, no host or a non-numeric port. The message never shows the part before ``@``.
    """
    value = value.strip()
    if "://" not in value:
        value = f"{'tls' if tls else 'nats'}://{value}"
    parts = urlsplit(value)
    after_scheme = value.split("://", 1)[1]
    where = f"connection {conn_id!r}: " if conn_id else ""
    if "@" in after_scheme:
        raise ValueError(
            f"{where}server URL {strip_userinfo(value)!r} carries credentials before '@' (not shown); "
            f"Airflow shows the Host field and the {field_name('servers')} field in clear text in its UI and "
            "REST API, so put the user and password in the connection's User and Password fields (a token in "
            f"{field_name('token')}) and list the server without them"
        )
    try:
        port = parts.port  # ValueError for a non-numeric port
    except ValueError:
        port = -1
    if parts.scheme not in _SERVER_SCHEMES or not parts.hostname or port == -1:
        raise ValueError(
            f"{where}invalid NATS server URL {value!r}: expected nats://host:port, tls://host:port, "
            "ws://host:port or wss://host:port"
        )
    if port is None and parts.scheme in ("nats", "tls"):
        value = urlunsplit(parts._replace(netloc=f"{parts.netloc}:{DEFAULT_PORT}"))
    return value


def settings_from_connection(conn: Any, stream: str | None = None) -> JetStreamSettings:
    """Build :class:`JetStreamSettings` from an Airflow ``Connection``.

    Servers: extra ``servers`` (comma-separated URLs) else ``host``/``port`` (default 4222; scheme
    ``tls://`` when a TLS extra is set). Credentials: login/password, extras ``token``,
    ``nkey_seed_secret`` (former name ``nkey_seed``, still read, with a warning: Airflow shows it in
    clear text), ``creds_file``; TLS extras ``tls_ca``, ``tls_cert``, ``tls_key``; ``stream``
    (default ``EVENTS``, overridden by the ``stream`` argument); ``storage_root``.

    :raises ValueError: no servers; a malformed URL or one with credentials (``user:password@``,
        ``token@``: Airflow would show them; the message never does); a plain ``ws://`` server while
        TLS is configured (``tls_ca``/``tls_cert`` or a ``tls://``/``wss://`` server); ``tls_key``
        without ``tls_cert``; two NKEY seeds or a seed and ``creds_file``; an invalid stream name
        (:func:`check_stream_name`).
    """
    conn_id = conn.conn_id
    extras = dict(getattr(conn, "extra_dejson", None) or {})
    tls_ca, tls_cert, tls_key = (_extra(extras, k) for k in ("tls_ca", "tls_cert", "tls_key"))
    use_tls = bool(tls_ca or tls_cert)
    raw_servers = _extra(extras, "servers")
    if raw_servers:
        items = raw_servers if isinstance(raw_servers, (list, tuple)) else str(raw_servers).split(",")
        servers = tuple(_normalize_server(s, tls=use_tls, conn_id=conn_id) for s in items if str(s).strip())
    elif conn.host:
        host = conn.host if "://" in conn.host else f"{conn.host}:{conn.port or DEFAULT_PORT}"
        servers = (_normalize_server(host, tls=use_tls, conn_id=conn_id),)
    else:
        servers = ()
    if not servers:
        raise ValueError(
            f"connection {conn_id!r} has neither a Host nor {field_name('servers')}; expected e.g. host 127.0.0.1"
        )
    schemes = [urlsplit(u).scheme for u in servers]
    if "ws" in schemes and (use_tls or "tls" in schemes or "wss" in schemes):
        plain = ", ".join(u for u, scheme in zip(servers, schemes) if scheme == "ws")
        raise ValueError(
            f"connection {conn_id!r}: server {plain} is a plain websocket (ws://) but TLS is configured "
            f"({field_name('tls_ca')}, {field_name('tls_cert')} or a tls:// / wss:// server); nats-py never "
            "switches a ws:// connection to TLS, so the credentials would travel in clear text: use wss:// (or remove the TLS settings)"
        )
    if tls_key and not tls_cert:
        raise ValueError(f"connection {conn_id!r}: {field_name('tls_key')} is set but {field_name('tls_cert')} is not; "
                         "set both or neither")
    nkey_seed, legacy_seed = _extra(extras, NKEY_SEED_EXTRA), _extra(extras, _LEGACY_NKEY_SEED_EXTRA)
    if nkey_seed and legacy_seed:
        raise ValueError(
            f"connection {conn_id!r}: set the NKEY seed once, in {NKEY_SEED_EXTRA!r}, and remove "
            f"{_LEGACY_NKEY_SEED_EXTRA!r} (Airflow shows that one in clear text)"
        )
    if legacy_seed:
        _log.warning(
            "Connection %r holds the NKEY seed in the extra %r, which the Airflow UI and REST API show in "
            "clear text (its name contains no word Airflow treats as sensitive); rename the extra to %r",
            conn_id,
            _LEGACY_NKEY_SEED_EXTRA,
            NKEY_SEED_EXTRA,
        )
        nkey_seed = legacy_seed
    creds_file = _extra(extras, "creds_file")
    if nkey_seed and creds_file:
        raise ValueError(f"connection {conn_id!r}: set either {field_name(NKEY_SEED_EXTRA)} or "
                         f"{field_name('creds_file')}, not both")
    return JetStreamSettings(
        servers=servers,
        stream=check_stream_name(stream or _extra(extras, "stream") or DEFAULT_STREAM),
        user=conn.login or None,
        password=conn.password or None,
        token=_extra(extras, "token"),
        nkey_seed=nkey_seed,
        creds_file=creds_file,
        tls_ca=tls_ca,
        tls_cert=tls_cert,
        tls_key=tls_key,
        storage_root=_extra(extras, "storage_root"),
    )


_BAD_STREAM_CHARS = frozenset(".*>/\\")


def check_stream_name(name: Any, what: str = "stream") -> str:
    """Return ``name`` if it is a valid JetStream stream name, else raise ValueError naming it.

    A stream name becomes a token of ``$JS.API.*`` subjects and the ``{stream}`` staging folder, so
    it must not contain whitespace, ``.``, ``*``, ``>``, ``/``, ``\\`` or non-printable characters
    (NATS docs, "JetStream > Naming streams, consumers and accounts").
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} must be a non-empty stream name, got {name!r}")
    if any(c in _BAD_STREAM_CHARS or c.isspace() or not c.isprintable() for c in name):
        raise ValueError(
            f"{what} {name!r} is not a valid JetStream stream name "
            "(no whitespace, '.', '*', '>', '/', '\\' or non-printable characters)"
        )
    return name


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
