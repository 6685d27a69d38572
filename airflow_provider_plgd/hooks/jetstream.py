"""Airflow hook for the plgd hub's NATS JetStream stream (connection type ``plgd_jetstream``).

Reads plgd events from a JetStream stream (default ``EVENTS`` on ``plgd.>``, docs/wire-format.md §1.5)
in bounded, server-side-filtered batches, counts and lists them cheaply, and publishes.

Everything talks to the JetStream JSON API over NATS request/reply with nats-py (the
connection, subscriptions and requests are nats-py's; only the small JSON bodies are ours):

- ``$JS.API.STREAM.INFO.<stream>`` with ``{"subjects_filter", "offset"}`` (subject counts, paged by
  the server at 100 000 subjects per answer: ``total``, ``offset``, ``limit``);
- ``$JS.API.CONSUMER.CREATE.<stream>.<name>`` (ephemeral consumer: ``inactive_threshold``,
  ``ack_policy`` none, ``deliver_policy`` ``all`` / ``by_start_time`` / ``by_start_sequence``,
  ``filter_subject``), ``$JS.API.CONSUMER.INFO`` (``num_pending``), ``$JS.API.CONSUMER.DELETE``;
- ``$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`` pull requests (``batch``, ``max_bytes``,
  ``expires`` ns) answered on our inbox; each message's reply subject
  ``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<timestamp ns>.<pending>``
  (or the 12-token form with domain and account hash after ``ACK``) carries its metadata;
  status messages ``100`` (heartbeat), ``404``/``408`` (no messages / request expired),
  ``409`` (max bytes reached, consumer deleted, ...), ``503`` (no responders).

Source: NATS docs, "JetStream wire API reference" (stream info paging, consumer create, pull
``MSG.NEXT`` requests and their status codes) and ADR-13/ADR-15 (pull requests, ack reply
subject); nats-py 2.x ``nats.connect`` options.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import json
import logging
import secrets
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

from airflow_provider_plgd.compat import BaseHook
from airflow_provider_plgd.exceptions import (
    JetStreamAPIError,
    JetStreamAuthError,
    JetStreamConnectionError,
    JetStreamError,
    JetStreamNotEnabledError,
    JetStreamTimeoutError,
    StreamNotFoundError,
)
from airflow_provider_plgd.get_provider_info import CONN_FIELDS, CONN_TYPE, NKEY_SEED_EXTRA, UI_FIELD_BEHAVIOUR

__all__ = [
    "JetStreamAPIError",
    "JetStreamAuthError",
    "JetStreamConnectionError",
    "JetStreamError",
    "JetStreamHook",
    "JetStreamNotEnabledError",
    "JetStreamTimeoutError",
    "StreamMessage",
    "StreamNotFoundError",
]

_log = logging.getLogger(__name__)

DEFAULT_STREAM = "EVENTS"
DEFAULT_PORT = 4222
#: Seconds allowed to open a TCP/TLS connection and complete the NATS handshake, per server.
CONNECT_TIMEOUT_S = 5
#: Seconds to wait for a JetStream API answer.
API_TIMEOUT_S = 10.0
#: Default messages per pull request (= per yielded batch) of :meth:`JetStreamHook.aiter_batches`.
DEFAULT_BATCH_SIZE = 2000
#: Pull requests kept in flight (or answered and not yet taken by the caller) while iterating.
PREFETCH_PULLS = 3
#: Bytes cap per pull request (raised to 2x the server's max_payload if that is larger).
PULL_MAX_BYTES = 8 * 1024 * 1024
#: Seconds a pull request waits on the server for messages before it expires (status 408).
PULL_EXPIRES_S = 30.0
#: Seconds after which the server deletes our ephemeral consumers if we vanish.
ITER_INACTIVE_THRESHOLD_S = 120.0
COUNT_INACTIVE_THRESHOLD_S = 10.0

_NS = 1_000_000_000
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_ERR_STREAM_NOT_FOUND = 10059
_ERR_JS_NOT_ENABLED = (10039, 10076)  # for the account / on the server
_EXTRA_PREFIX = f"extra__{CONN_TYPE}__"
_SERVER_SCHEMES = ("nats", "tls", "ws", "wss")
#: Former name of the ``nkey_seed_secret`` extra: still read, but Airflow's UI and REST API show it
#: in clear text (its name contains no word Airflow treats as sensitive).
_LEGACY_NKEY_SEED_EXTRA = "nkey_seed"


class StreamMessage(NamedTuple):
    """One stored JetStream message.

    :ivar stream_seq: stream sequence number (int, >= 1).
    :ivar subject: the subject it was published on.
    :ivar time_ns: JetStream server timestamp when stored, unix ns.
    :ivar headers: NATS headers (name -> value) or None when the message has none.
    :ivar data: the payload bytes.
    """

    stream_seq: int
    subject: str
    time_ns: int
    headers: dict[str, str] | None
    data: bytes


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
        return ", ".join(_strip_userinfo(s) for s in self.servers)

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


# --------------------------------------------------------------------------------------------
# small pure helpers


def _strip_userinfo(url: str) -> str:
    """``url`` without a ``user:password@`` / ``token@`` part: everything between ``://`` and the
    last ``@`` is dropped, so a password that contains ``/``, ``#``, ``?`` or ``@`` is removed too."""
    scheme, sep, rest = url.rpartition("://") if "://" in url else ("", "", url)
    if "@" not in rest:
        return url
    return f"{scheme}{sep}{rest.rsplit('@', 1)[1]}"


def _mask_settings_secrets(s: JetStreamSettings) -> None:
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
    try:
        from airflow.sdk.log import mask_secret
    except ImportError:  # pragma: no cover - Airflow 2.11
        try:
            from airflow.utils.log.secrets_masker import mask_secret
        except ImportError:
            return
    for value in values:
        mask_secret(value)


async def _amask_settings_secrets(s: JetStreamSettings) -> None:
    """Async :func:`_mask_settings_secrets` (``amask_secret`` on Airflow 3: the sync form must not
    talk to the supervisor from inside an event loop)."""
    values = s.secret_values()
    if not values:
        return
    try:
        from airflow.sdk.log import amask_secret
    except ImportError:  # pragma: no cover - Airflow 2.11 / older 3.x
        _mask_settings_secrets(s)
        return
    for value in values:
        await amask_secret(value)


class TlsDowngradeError(ConnectionError):
    """Raised inside the nats-py handshake when TLS was asked for but the server's INFO does not
    require TLS (nats-py would then send CONNECT, with the credentials, in clear text)."""


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
            f"connection {conn_id!r}: {NKEY_SEED_EXTRA!r} is not a valid NKEY user seed (expected the 58-character "
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
            f"connection {conn_id!r}: cannot read 'creds_file' {path!r}: {exc.strerror or type(exc).__name__}"
        ) from None
    lines = text.splitlines()
    try:
        jwt_line = lines[next(i for i, x in enumerate(lines) if "BEGIN NATS USER JWT" in x) + 1].strip()
        seed_line = lines[next(i for i, x in enumerate(lines) if "BEGIN USER NKEY SEED" in x) + 1].strip()
    except (StopIteration, IndexError):
        jwt_line = seed_line = ""
    if jwt_line.count(".") != 2 or not seed_line:
        raise JetStreamAuthError(
            f"connection {conn_id!r}: 'creds_file' {path!r} is not a NATS .creds file (expected the "
            "'BEGIN NATS USER JWT' and 'BEGIN USER NKEY SEED' sections that nsc writes)"
        )
    try:
        _check_user_seed(seed_line, conn_id)
    except JetStreamAuthError:
        raise JetStreamAuthError(
            f"connection {conn_id!r}: 'creds_file' {path!r} holds no valid NKEY user seed"
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
            f"{where}server URL {_strip_userinfo(value)!r} carries credentials before '@' (not shown); "
            "Airflow shows the Host field and the 'servers' extra in clear text in its UI and REST API, so "
            "put the user and password in the connection's Login/Password fields (a token in the 'token' "
            "extra) and list the server without them"
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
            f"connection {conn_id!r} has neither a host nor a 'servers' extra; expected e.g. host 127.0.0.1"
        )
    schemes = [urlsplit(u).scheme for u in servers]
    if "ws" in schemes and (use_tls or "tls" in schemes or "wss" in schemes):
        plain = ", ".join(u for u, scheme in zip(servers, schemes) if scheme == "ws")
        raise ValueError(
            f"connection {conn_id!r}: server {plain} is a plain websocket (ws://) but TLS is configured "
            "(tls_ca/tls_cert or a tls:// / wss:// server); nats-py never switches a ws:// connection to TLS, "
            "so the credentials would travel in clear text: use wss:// (or remove the TLS settings)"
        )
    if tls_key and not tls_cert:
        raise ValueError(f"connection {conn_id!r}: 'tls_key' is set but 'tls_cert' is not; set both or neither")
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
        raise ValueError(f"connection {conn_id!r}: set either {NKEY_SEED_EXTRA!r} or 'creds_file', not both")
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


def to_unix_ns(value: dt.datetime | int, what: str) -> int:
    """Convert a timezone-aware ``datetime`` or an int of unix ns to unix ns.

    :raises ValueError: naive datetime or negative int. :raises TypeError: any other type.
    """
    if isinstance(value, bool) or not isinstance(value, (int, dt.datetime)):
        raise TypeError(
            f"{what} must be a timezone-aware datetime or int unix ns, got {type(value).__name__}: {value!r}"
        )
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{what} must be >= 0 unix ns, got {value}")
        return value
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware, got naive datetime {value.isoformat()}")
    # days/seconds/microseconds: also right for pendulum DateTimes (Airflow's data intervals), whose
    # difference is a pendulum Interval that does not support // timedelta
    delta = value.astimezone(dt.timezone.utc) - _EPOCH
    return ((delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds) * 1000


def _rfc3339_ns(ns: int) -> str:
    """Unix ns -> RFC 3339 UTC with 9 fraction digits (Go ``time.RFC3339Nano`` accepts it)."""
    secs, frac = divmod(ns, _NS)
    return dt.datetime.fromtimestamp(secs, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:09d}Z"


def parse_ack_reply(reply: str) -> tuple[int, int, int, int]:
    """Parse a JetStream message reply subject into ``(stream_seq, consumer_seq, time_ns, pending)``.

    Forms: ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts_ns>.<pending>`` (9 tokens)
    and ``$JS.ACK.<domain>.<acc hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts_ns>.<pending>[.<token>]``
    (11 or 12 tokens). Source: NATS ADR-15 (JetStream subject naming).

    :raises ValueError: not a JetStream ack subject (message names it).
    """
    t = reply.split(".")
    n = len(t)
    if n == 9:
        o = 5
    elif n >= 11:
        o = 7
    else:
        raise ValueError(f"not a JetStream ack reply subject: {reply!r}")
    if t[0] != "$JS" or t[1] != "ACK":
        raise ValueError(f"not a JetStream ack reply subject: {reply!r}")
    return int(t[o]), int(t[o + 1]), int(t[o + 2]), int(t[o + 3])


RequestFn = Callable[[str, "dict | None"], Awaitable[dict]]


async def page_subjects(request: RequestFn, stream: str, subjects_filter: str) -> dict[str, int]:
    """Collect ``{subject: message count}`` of ``stream`` for ``subjects_filter``, page by page.

    Sends ``$JS.API.STREAM.INFO.<stream>`` bodies ``{"subjects_filter": f, "offset": n}``; the
    server answers at most ``limit`` (100 000) subjects in ``state.subjects`` plus ``total`` and
    ``offset``; continues until ``total`` subjects were read or a page is empty.

    :param request: ``async (api_subject, body) -> dict`` (the decoded API answer).
    """
    subjects: dict[str, int] = {}
    offset = 0
    while True:
        resp = await request(f"$JS.API.STREAM.INFO.{stream}", {"subjects_filter": subjects_filter, "offset": offset})
        page = (resp.get("state") or {}).get("subjects") or {}
        subjects.update(page)
        offset += len(page)
        total = resp.get("total")
        if not page or total is None or offset >= total:
            return subjects


# --------------------------------------------------------------------------------------------
# the hook


class JetStreamHook(BaseHook):
    """Access the plgd hub's JetStream stream: stream info, subject/owner listing, counting,
    bounded batched reading, publishing.

    :param jetstream_conn_id: Airflow connection id of type ``plgd_jetstream``.
    :param stream: stream name; default: the connection's ``stream`` extra, else ``EVENTS``.

    Bounds used by :meth:`acount_messages` and :meth:`aiter_batches`: ``[start_time, end_time)``
    by JetStream server timestamp (timezone-aware ``datetime`` or int unix ns) and
    ``[start_seq, end_seq]`` by stream sequence; both are combined with AND, and reading never
    goes past the stream's last sequence taken when the call starts.

    Every public method raises :class:`~airflow_provider_plgd.exceptions.JetStreamError`
    subclasses for server-side problems (connection, auth, JetStream disabled, missing stream,
    API errors, timeouts) and ``ValueError``/``TypeError`` for bad arguments. Credentials are
    never logged; logs name the servers only.
    """

    conn_name_attr = "jetstream_conn_id"
    default_conn_name = "plgd_jetstream_default"
    conn_type = CONN_TYPE
    hook_name = "plgd JetStream"

    def __init__(self, jetstream_conn_id: str = default_conn_name, *, stream: str | None = None) -> None:
        super().__init__()
        self.jetstream_conn_id = jetstream_conn_id
        self._stream_override = stream
        self._settings: JetStreamSettings | None = None

    # ---- Airflow UI ---------------------------------------------------------------------

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        """Extra fields for the connection form of Airflow < 3.2 (from ``CONN_FIELDS``).

        Returns ``{}`` when flask_appbuilder/wtforms are not importable (Airflow 3 without the
        FAB provider reads ``conn-fields`` from the provider info instead).
        """
        try:
            from flask_appbuilder.fieldwidgets import BS3PasswordFieldWidget, BS3TextFieldWidget
            from flask_babel import lazy_gettext
            from wtforms import PasswordField, StringField
        except ImportError:
            return {}
        widgets: dict[str, Any] = {}
        for name, spec in CONN_FIELDS.items():
            schema = spec.get("schema", {})
            secret = schema.get("format") == "password"
            field_cls, widget = (PasswordField, BS3PasswordFieldWidget) if secret else (StringField, BS3TextFieldWidget)
            widgets[name] = field_cls(
                lazy_gettext(spec["label"]),
                description=spec.get("description", ""),
                widget=widget(),
                default=schema.get("default"),
            )
        return widgets

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """Hidden/relabelled fields and placeholders of the connection form.

        :return: ``{"hidden_fields": [str], "relabeling": {field: label}, "placeholders": {field: text}}``,
            the hook API's snake_case keys (Airflow's ``ProvidersManager`` validates them; the provider
            info's ``ui-field-behaviour`` keeps the kebab-case ``hidden-fields`` of
            ``provider_info.schema.json``). Source: ``get_provider_info.UI_FIELD_BEHAVIOUR``.
        """
        behaviour = json.loads(json.dumps(UI_FIELD_BEHAVIOUR))
        return {
            "hidden_fields": behaviour["hidden-fields"],
            "relabeling": behaviour["relabeling"],
            "placeholders": behaviour["placeholders"],
        }

    # ---- settings & connection ----------------------------------------------------------

    def get_settings(self) -> JetStreamSettings:
        """Read the Airflow connection once (sync) and return :class:`JetStreamSettings`.

        Registers every secret of the connection with Airflow's log masker (see
        :func:`_mask_settings_secrets`).
        """
        if self._settings is None:
            conn = self.get_connection(self.jetstream_conn_id)
            settings = settings_from_connection(conn, self._stream_override)
            _mask_settings_secrets(settings)
            self._settings = settings
        return self._settings

    async def aget_settings(self) -> JetStreamSettings:
        """Async :meth:`get_settings` (uses ``aget_connection`` and ``amask_secret`` on Airflow 3,
        which must not be replaced by the sync forms inside an event loop)."""
        if self._settings is None:
            conn = await self._aget_connection()
            settings = settings_from_connection(conn, self._stream_override)
            await _amask_settings_secrets(settings)
            self._settings = settings
        return self._settings

    async def _aget_connection(self) -> Any:
        """The Airflow connection, looked up without blocking the event loop.

        Airflow 3: ``aget_connection`` first. When it says the connection "isn't defined", the sync
        lookup runs in a worker thread and its answer is used: under ``dag.test()`` /
        ``airflow dags test`` the task's in-process supervisor link has no async ``asend``
        (Task SDK 1.x ``InProcessSupervisorComms``), so the async lookup of a connection stored in
        the metadata DB fails, silently, while the sync lookup in the same task finds it
        (issue #13, case 10). When both fail, the async lookup's error is raised.
        Airflow 2: the sync lookup.
        """
        aget = getattr(self, "aget_connection", None)
        if aget is None:
            return self.get_connection(self.jetstream_conn_id)
        try:
            return await aget(self.jetstream_conn_id)
        except Exception as exc:
            if type(exc).__name__ != "AirflowNotFoundException":
                raise
            try:
                conn = await asyncio.to_thread(self.get_connection, self.jetstream_conn_id)
            except Exception:  # noqa: BLE001 - the async lookup's error is the one to report
                raise exc from None
            self.log.debug("Connection %s found by the sync lookup after the async one did not find it",
                           self.jetstream_conn_id)
            return conn

    @property
    def stream(self) -> str:
        """The stream name in use (argument, else connection extra ``stream``, else ``EVENTS``)."""
        return self._stream_override or self.get_settings().stream

    def _connect_options(self, s: JetStreamSettings) -> dict[str, Any]:
        opts: dict[str, Any] = {}
        if s.user:
            opts["user"] = s.user
        if s.password:
            opts["password"] = s.password
        if s.token:
            opts["token"] = s.token
        if s.nkey_seed or s.creds_file:
            try:
                import nkeys  # noqa: F401  (nats-py needs it for NKEY/JWT auth)
            except ImportError:
                raise JetStreamAuthError(
                    f"{NKEY_SEED_EXTRA!r}/'creds_file' authentication needs the 'nkeys' package: "
                    "pip install 'nats-py[nkeys]'"
                ) from None
            if s.creds_file:
                _check_creds_file(s.creds_file, self.jetstream_conn_id)
                opts["user_credentials"] = s.creds_file
            else:
                _check_user_seed(s.nkey_seed, self.jetstream_conn_id)
                opts["nkeys_seed_str"] = s.nkey_seed.strip()
        if s.tls_ca or s.tls_cert or any(u.startswith(("tls://", "wss://")) for u in s.servers):
            try:
                ctx = ssl.create_default_context(cafile=s.tls_ca) if s.tls_ca else ssl.create_default_context()
                if s.tls_cert:
                    ctx.load_cert_chain(s.tls_cert, s.tls_key)
            except (OSError, ssl.SSLError) as exc:
                # paths only: ssl errors name the failing step (e.g. "[SSL] PEM lib"), never key bytes
                raise JetStreamConnectionError(
                    f"cannot load the TLS files of connection {self.jetstream_conn_id!r} "
                    f"(tls_ca={s.tls_ca!r}, tls_cert={s.tls_cert!r}, tls_key={s.tls_key!r}): "
                    f"{type(exc).__name__}: {getattr(exc, 'strerror', None) or exc}"
                ) from None
            opts["tls"] = ctx
        return opts

    @contextlib.asynccontextmanager
    async def aconnect(self) -> AsyncIterator[Any]:
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

        s = await self.aget_settings()
        opts = self._connect_options(s)
        self.log.debug("Connecting to NATS %s", s.safe_servers())
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
                raise JetStreamAuthError(f"authentication to NATS {_strip_userinfo(url)} failed: {exc}") from None
            except nats.errors.NoServersError:
                last = seen[-1] if seen else None
                errors.append(f"{_strip_userinfo(url)}: {_describe_connect_error(last, s) if last else 'no server'}")
            except nats.errors.Error as exc:
                text = str(exc)
                if "authorization" in text.lower() or "authentication" in text.lower():
                    raise JetStreamAuthError(
                        f"authentication to NATS {_strip_userinfo(url)} failed (server said {text!r}); "
                        f"check login/password, token, {NKEY_SEED_EXTRA} or creds_file"
                    ) from None
                errors.append(f"{_strip_userinfo(url)}: {text or type(exc).__name__}")
            except TlsDowngradeError as exc:
                errors.append(f"{_strip_userinfo(url)}: {exc}")
            except (OSError, asyncio.TimeoutError, ssl.SSLError) as exc:
                errors.append(f"{_strip_userinfo(url)}: {_describe_connect_error(exc, s)}")
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

    # ---- JetStream API ------------------------------------------------------------------

    async def _api(self, nc: Any, subject: str, body: dict | None = None, *, timeout: float = API_TIMEOUT_S) -> dict:
        """Send one ``$JS.API`` request and return the decoded answer, mapping errors."""
        import nats.errors

        s = self._settings
        where = s.safe_servers() if s else "NATS"
        payload = json.dumps(body).encode() if body is not None else b""
        try:
            msg = await nc.request(subject, payload, timeout=timeout)
        except nats.errors.NoRespondersError:
            raise JetStreamNotEnabledError(
                f"JetStream is not enabled on {where}: no responder for {subject}"
            ) from None
        except (nats.errors.TimeoutError, asyncio.TimeoutError):
            raise JetStreamTimeoutError(f"no answer from {where} to {subject} within {timeout}s") from None
        except nats.errors.ConnectionClosedError:
            raise JetStreamConnectionError(f"connection to {where} closed during {subject}") from None
        try:
            resp = json.loads(msg.data)
        except ValueError:
            raise JetStreamAPIError(f"{subject}: answer from {where} is not JSON: {msg.data[:200]!r}") from None
        err = resp.get("error")
        if err:
            code, err_code, desc = err.get("code"), err.get("err_code"), err.get("description", "")
            stream = self._stream_override or (s.stream if s else DEFAULT_STREAM)
            if err_code == _ERR_STREAM_NOT_FOUND:
                name = subject.split(".")[4] if subject.count(".") >= 4 else stream
                raise StreamNotFoundError(f"stream {name!r} not found on {where}", stream=name)
            if err_code in _ERR_JS_NOT_ENABLED:
                raise JetStreamNotEnabledError(f"JetStream is not enabled on {where}: {desc}")
            raise JetStreamAPIError(
                f"{subject} failed on {where}: {desc} (code {code}, err_code {err_code})",
                code=code,
                err_code=err_code,
                description=desc,
            )
        return resp

    async def astream_info(self, stream: str | None = None) -> dict:
        """Stream configuration and state (``$JS.API.STREAM.INFO.<stream>``).

        :return: the API answer as a dict: ``config`` (name, subjects, retention, storage,
            duplicate_window ns, ...), ``state`` (``messages``, ``bytes``, ``first_seq``,
            ``last_seq``, ``first_ts``/``last_ts`` RFC 3339, ``num_subjects``, ``consumer_count``),
            ``created``.
        :raises StreamNotFoundError: the stream does not exist.
        """
        s = await self.aget_settings()
        name = check_stream_name(stream) if stream is not None else s.stream
        async with self.aconnect() as nc:
            return await self._api(nc, f"$JS.API.STREAM.INFO.{name}")

    async def ainterval_status(
        self, end_time: dt.datetime | int, *, settle_seconds: float, subject_filter: str | None = None
    ) -> dict[str, Any]:
        """Is the interval ending at ``end_time`` complete, judged on the NATS server's clock?

        Complete when the stream holds a message (any subject) with a server timestamp at or after
        ``end_time``, or when the server's time (``ts`` of ``$JS.API.STREAM.INFO``, nats-server
        2.10+) is at or after ``end_time + settle_seconds``; the local clock is never used. Rule
        and sources: :mod:`airflow_provider_plgd.completeness`.

        :param end_time: exclusive interval end: timezone-aware ``datetime`` or int unix ns.
        :param settle_seconds: seconds (>= 0) after the end, on the server's clock.
        :param subject_filter: when given and the interval is complete by a newer message, also
            count that filter's messages at or after the end (``newer_messages``).
        :return: ``{"complete": bool, "reason": "newer_message" | "settled" | None, "end_ns",
            "server_time_ns", "last_ts_ns" | None, "settle_seconds", "newer_messages": int}``.
        :raises StreamNotFoundError: missing stream. :raises JetStreamAPIError: no server time
            in the answer (nats-server older than 2.10). :raises ValueError: bad arguments.
        """
        from airflow_provider_plgd.completeness import interval_status

        end_ns = to_unix_ns(end_time, "end_time")
        if subject_filter is not None:
            _check_filter(subject_filter)
        s = await self.aget_settings()
        async with self.aconnect() as nc:
            info = await self._api(nc, f"$JS.API.STREAM.INFO.{s.stream}")
            status = interval_status(info, end_ns=end_ns, settle_seconds=settle_seconds)
            status["newer_messages"] = 0
            if status["reason"] == "newer_message" and subject_filter is not None:
                consumer = await self._acreate_consumer(
                    nc, s.stream, subject_filter, start_ns=end_ns,
                    inactive_threshold_s=COUNT_INACTIVE_THRESHOLD_S, kind="count",
                )
                try:
                    status["newer_messages"] = int(consumer.get("num_pending") or 0)
                finally:
                    await self._adelete_consumer(nc, s.stream, consumer["name"])
        return status

    async def alist_subjects(self, filter: str = "plgd.>") -> dict[str, int]:  # noqa: A002
        """``{subject: number of messages}`` for the stream's subjects matching ``filter``.

        Pages through the server's ``subjects_filter`` answer (100 000 subjects per page), see
        :func:`page_subjects`.

        :raises ValueError: empty filter. :raises StreamNotFoundError: missing stream.
        """
        _check_filter(filter)
        s = await self.aget_settings()
        async with self.aconnect() as nc:
            return await page_subjects(lambda subj, body: self._api(nc, subj, body), s.stream, filter)

    async def alist_owners(self) -> dict[str, dict[str, int]]:
        """``{owner_id: {subject: message count}}`` from the subjects ``plgd.owners.<owner_id>.>``
        (owner id = subject token 2, docs/wire-format.md §1).

        Only owner tokens that pass :func:`~airflow_provider_plgd.plgd.subjects.validate_token`
        are returned: JetStream stores messages published on subjects such as
        ``plgd.owners.*.registrations.x`` literally, and such a token must never become a
        subscription wildcard or a staging folder. Skipped subjects are logged (WARNING) with
        their message counts.
        """
        from airflow_provider_plgd.plgd.subjects import validate_token

        owners: dict[str, dict[str, int]] = {}
        skipped: dict[str, int] = {}
        for subject, count in (await self.alist_subjects("plgd.owners.>")).items():
            tokens = subject.split(".")
            if len(tokens) > 3:
                try:
                    validate_token(tokens[2], "owner_id")
                except (TypeError, ValueError):
                    skipped[subject] = count
                    continue
                owners.setdefault(tokens[2], {})[subject] = count
        if skipped:
            self.log.warning(
                "Ignoring %s subject(s) whose owner token is not a valid owner ID (%s messages), e.g. %s",
                len(skipped), sum(skipped.values()), sorted(skipped)[:5],
            )
        return owners

    async def _acreate_consumer(
        self,
        nc: Any,
        stream: str,
        filter_subject: str | None,
        *,
        start_ns: int | None = None,
        start_seq: int | None = None,
        inactive_threshold_s: float,
        kind: str,
    ) -> dict:
        """Create an ephemeral, ack-none, memory-stored consumer (``filter_subject`` None: every
        subject of the stream) and return its info dict."""
        name = f"plgd_{kind}_{secrets.token_hex(8)}"
        config: dict[str, Any] = {
            "name": name,
            "ack_policy": "none",
            "inactive_threshold": int(inactive_threshold_s * _NS),
            "mem_storage": True,
            "num_replicas": 1,
        }
        if filter_subject:
            config["filter_subject"] = filter_subject
        if start_seq is not None:
            config.update(deliver_policy="by_start_sequence", opt_start_seq=max(1, start_seq))
        elif start_ns is not None:
            config.update(deliver_policy="by_start_time", opt_start_time=_rfc3339_ns(start_ns))
        else:
            config["deliver_policy"] = "all"
        return await self._api(
            nc, f"$JS.API.CONSUMER.CREATE.{stream}.{name}", {"stream_name": stream, "config": config}
        )

    async def _adelete_consumer(self, nc: Any, stream: str, name: str) -> None:
        try:
            if not nc.is_closed:
                await self._api(nc, f"$JS.API.CONSUMER.DELETE.{stream}.{name}", timeout=2.0)
        except Exception as exc:  # best effort; the server removes it after inactive_threshold
            self.log.warning("Could not delete consumer %s of stream %s: %s", name, stream, exc)

    async def acount_messages(
        self,
        filter: str,  # noqa: A002
        *,
        start_time: dt.datetime | int | None = None,
        end_time: dt.datetime | int | None = None,
        start_seq: int | None = None,
        end_seq: int | None = None,
    ) -> int:
        """Count the messages matching ``filter`` within the bounds, server-side.

        Bounds: ``[start_time, end_time)`` by server timestamp, ``[start_seq, end_seq]`` by
        sequence, and at most the stream's last sequence when called (the same set that
        :meth:`aiter_batches` would read). Method: ephemeral consumers positioned at each start
        and end bound (``by_start_time`` / ``by_start_sequence``, filtered, ack none); count =
        min(``num_pending`` of starts) - max(``num_pending`` of ends). The readings are repeated
        until no matching message arrived in between (up to 10 tries; under a constant stream of
        new matching messages the result may be off by those stored during the last reading,
        a few ms); consumers are deleted afterwards.

        :return: number of messages (>= 0).
        :raises ValueError/TypeError: bad filter or bounds. :raises StreamNotFoundError: missing stream.
        """
        _check_filter(filter)
        start_ns, end_ns, start_seq, end_seq = _check_bounds(start_time, end_time, start_seq, end_seq)
        s = await self.aget_settings()
        stream = s.stream
        async with self.aconnect() as nc:
            state = (await self._api(nc, f"$JS.API.STREAM.INFO.{stream}"))["state"]
            last = state["last_seq"] if end_seq is None else min(end_seq, state["last_seq"])
            if state["messages"] == 0 or (start_seq or 1) > last:
                return 0
            names: list[tuple[str, str]] = []  # (role, name)
            try:
                starts = []
                if start_seq is not None:
                    starts.append(dict(start_seq=start_seq))
                if start_ns is not None:
                    starts.append(dict(start_ns=start_ns))
                if not starts:
                    starts.append({})
                ends = [dict(start_seq=last + 1)]
                if end_ns is not None:
                    ends.append(dict(start_ns=end_ns))
                for role, bounds in [("s", b) for b in starts] + [("e", b) for b in ends]:
                    info = await self._acreate_consumer(
                        nc, stream, filter, inactive_threshold_s=COUNT_INACTIVE_THRESHOLD_S, kind="count", **bounds
                    )
                    names.append((role, info["name"]))
                for _ in range(10):
                    pend = [
                        (role, (await self._api(nc, f"$JS.API.CONSUMER.INFO.{stream}.{name}"))["num_pending"])
                        for role, name in names
                    ]
                    again = (await self._api(nc, f"$JS.API.CONSUMER.INFO.{stream}.{names[0][1]}"))["num_pending"]
                    if again == pend[0][1]:
                        break
                count = min(p for r, p in pend if r == "s") - max(p for r, p in pend if r == "e")
                return max(0, count)
            finally:
                for _, name in names:
                    await self._adelete_consumer(nc, stream, name)

    async def acount_interval(
        self,
        filters: list[str] | tuple[str, ...],
        *,
        start_time: dt.datetime | int | None = None,
        end_time: dt.datetime | int | None = None,
        start_seq: int | None = None,
        end_seq: int | None = None,
        concurrency: int = 16,
    ) -> dict[str, Any]:
        """What the stream holds for one interval: its stream-sequence range, and per filter a count.

        The interval is ``[start_time, end_time)`` by server timestamp, or ``[start_seq, end_seq]``
        by stream sequence (not both). Time bounds become the sequence range ``[first_seq,
        end_seq_exclusive)``: the first sequence stored at or after each bound (the starting
        sequence of an ephemeral ``by_start_time`` consumer, ``delivered.stream_seq + 1``; NATS
        "JetStream consumers": ``DeliverByStartTime``). Each count is then the number of stored
        messages matching the filter in that range: ``num_pending`` of a filtered consumer at the
        range start minus that of one at the range end, read as end/start/end until both end
        readings agree (no matching message arrived in between), so the count is exact; deleted
        messages are not counted.

        :param filters: subject filters (e.g. ``plgd.owners.<owner>.>`` per owner); each counted
            separately. An empty string counts every subject of the stream (the ``total``).
        :param concurrency: filters counted at once over the one connection.
        :return: ``{"stream", "created" (RFC 3339, the stream's creation time: it changes when the
            stream is deleted and re-created), "state" (stream state at the start: messages, bytes,
            first_seq, last_seq, first_ts, last_ts, num_deleted), "first_seq", "end_seq_exclusive",
            "total" (every subject), "counts": {filter: int}}``.
        :raises ValueError/TypeError: bad filters or bounds, or both kinds of bounds.
        :raises JetStreamError: server-side problems; ``JetStreamTimeoutError`` when the counts
            keep changing (more than 20 readings).
        """
        for f in filters:
            _check_filter(f)
        start_ns, end_ns, start_seq, end_seq = _check_bounds(start_time, end_time, start_seq, end_seq)
        if (start_ns is not None or end_ns is not None) and (start_seq is not None or end_seq is not None):
            raise ValueError("acount_interval takes time bounds or sequence bounds, not both")
        s = await self.aget_settings()
        stream = s.stream
        async with self.aconnect() as nc:
            info = await self._api(nc, f"$JS.API.STREAM.INFO.{stream}")
            state = info.get("state") or {}
            last = int(state.get("last_seq") or 0)

            async def seq_at(ns: int | None, default: int) -> int:
                if ns is None:
                    return default
                made = await self._acreate_consumer(nc, stream, None, start_ns=ns,
                                                    inactive_threshold_s=COUNT_INACTIVE_THRESHOLD_S, kind="count")
                try:
                    return int((made.get("delivered") or {}).get("stream_seq") or 0) + 1
                finally:
                    await self._adelete_consumer(nc, stream, made["name"])

            if start_seq is not None or end_seq is not None:
                first = start_seq or 1
                stop = (end_seq + 1) if end_seq is not None else last + 1
            else:
                first = await seq_at(start_ns, 1)
                stop = await seq_at(end_ns, last + 1)
            stop = max(stop, first)
            gate = asyncio.Semaphore(max(1, int(concurrency)))

            async def count(subject_filter: str) -> int:
                if stop <= first:
                    return 0
                async with gate:
                    return await self._acount_range(nc, stream, subject_filter or None, first, stop)

            wanted = list(dict.fromkeys(filters))
            results = await asyncio.gather(count(""), *(count(f) for f in wanted))
        keep = ("messages", "bytes", "first_seq", "last_seq", "first_ts", "last_ts", "num_deleted")
        return {
            "stream": stream,
            "created": info.get("created"),
            "state": {k: state.get(k) for k in keep},
            "first_seq": first,
            "end_seq_exclusive": stop,
            "total": results[0],
            "counts": dict(zip(wanted, results[1:])),
        }

    async def _acount_range(self, nc: Any, stream: str, subject_filter: str | None, first: int, stop: int) -> int:
        """Stored messages matching ``subject_filter`` (None: all) with ``first <= seq < stop``."""
        names: list[str] = []
        try:
            for seq in (stop, first):
                made = await self._acreate_consumer(nc, stream, subject_filter, start_seq=seq,
                                                    inactive_threshold_s=COUNT_INACTIVE_THRESHOLD_S, kind="count")
                names.append(made["name"])
            at_stop, at_first = names

            async def pending(name: str) -> int:
                return int((await self._api(nc, f"$JS.API.CONSUMER.INFO.{stream}.{name}"))["num_pending"])

            for _ in range(20):
                before = await pending(at_stop)
                from_first = await pending(at_first)
                after = await pending(at_stop)
                if before == after:
                    return max(0, from_first - after)
            raise JetStreamTimeoutError(
                f"counting {subject_filter or 'all subjects'} of stream {stream} in sequences [{first}, {stop}): "
                "matching messages kept arriving during 20 readings"
            )
        finally:
            for name in names:
                await self._adelete_consumer(nc, stream, name)

    async def aiter_batches(
        self,
        filter: str,  # noqa: A002
        *,
        start_time: dt.datetime | int | None = None,
        end_time: dt.datetime | int | None = None,
        start_seq: int | None = None,
        end_seq: int | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> AsyncIterator[list[StreamMessage]]:
        """Read the messages matching ``filter`` in stream order, as lists of :class:`StreamMessage`.

        Bounds: ``[start_time, end_time)`` by server timestamp, ``[start_seq, end_seq]`` by
        sequence, and never past the stream's last sequence read when the iteration starts (so it
        ends even while publishers keep writing). It stops at the first message with time >=
        end_time or seq beyond the bound, or when the server reports no more pending messages.

        Method: one ephemeral consumer (ack none, filter_subject ``filter``, deliver
        ``by_start_sequence``/``by_start_time``/``all``); up to ``PREFETCH_PULLS`` raw
        ``CONSUMER.MSG.NEXT`` pull requests of ``batch_size`` messages (and <= 8 MiB, or 2x the
        server's max_payload if larger) in flight into one inbox subscription; metadata parsed
        from the reply subject. Each yielded list is normally the answer to one pull: at most
        ``batch_size`` messages and at most the pull byte cap of payload. Memory is bounded by
        the pulls in flight (``PREFETCH_PULLS``) plus the batch the caller holds. The consumer
        is deleted at the end, on errors and on cancellation (close the iterator, e.g. with
        ``contextlib.aclosing``, when breaking out early).

        :param filter: subject filter, e.g. ``plgd.owners.*.devices.*.metadata.>``.
        :param batch_size: messages per pull (>= 1).
        :raises ValueError/TypeError: bad filter, bounds or batch_size.
        :raises StreamNotFoundError: missing stream.
        :raises JetStreamConnectionError: connection lost. :raises JetStreamTimeoutError: the
            server stopped answering pulls. :raises JetStreamAPIError: consumer deleted or other
            409/503 status, or a message larger than the pull byte cap.
        """
        _check_filter(filter)
        start_ns, end_ns, start_seq, end_seq = _check_bounds(start_time, end_time, start_seq, end_seq)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        s = await self.aget_settings()
        stream = s.stream
        async with self.aconnect() as nc:
            state = (await self._api(nc, f"$JS.API.STREAM.INFO.{stream}"))["state"]
            last = state["last_seq"] if end_seq is None else min(end_seq, state["last_seq"])
            if state["messages"] == 0 or (start_seq or 1) > last:
                return
            info = await self._acreate_consumer(
                nc, stream, filter, start_ns=start_ns, start_seq=start_seq,
                inactive_threshold_s=ITER_INACTIVE_THRESHOLD_S, kind="iter",
            )
            consumer = info["name"]
            reader = _PullReader(
                nc, stream, consumer,
                last_seq=last,
                start_seq=start_seq or 0,
                start_ns=start_ns or 0,
                end_ns=end_ns if end_ns is not None else float("inf"),
                batch_size=batch_size,
                max_bytes=max(PULL_MAX_BYTES, 2 * int(getattr(nc, "max_payload", 0) or 0)),
                where=s.safe_servers(),
            )
            self.log.info(
                "Reading %s of stream %s up to seq %s with consumer %s (%s pending)",
                filter, stream, last, consumer, info.get("num_pending"),
            )
            try:
                if info.get("num_pending", 1) == 0:
                    return
                await reader.start()
                while True:
                    batch = await reader.next_batch()
                    if batch is None:
                        return
                    yield batch
            finally:
                await reader.stop()
                await self._adelete_consumer(nc, stream, consumer)

    async def apublish(
        self, subject: str, data: bytes, *, msg_id: str | None = None, headers: dict[str, str] | None = None
    ) -> int:
        """Publish one message into the stream and wait for the JetStream PubAck.

        With ``msg_id`` the header ``Nats-Msg-Id`` is set: the server drops a second message with
        the same id within the stream's duplicate_window (10 min in the plgd bundle) and acks it
        with the first one's sequence. No other header is added, so a message without ``msg_id``
        and ``headers`` is stored exactly like plgd's own (docs/wire-format.md §2.4).

        :return: the stream sequence of the stored (or deduplicated original) message.
        :raises TypeError: data is not bytes. :raises ValueError: subject not a literal subject.
        :raises StreamNotFoundError: the stream does not exist, or ``subject`` is not stored by it.
        :raises JetStreamTimeoutError: no PubAck in time.
        """
        import nats.errors

        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data must be bytes, got {type(data).__name__}")
        if not subject or not isinstance(subject, str) or any(c in subject for c in " \t\r\n*>"):
            raise ValueError(f"subject must be a literal NATS subject, got {subject!r}")
        s = await self.aget_settings()
        hdrs = dict(headers or {})
        if msg_id is not None:
            hdrs["Nats-Msg-Id"] = str(msg_id)
        async with self.aconnect() as nc:
            try:
                msg = await nc.request(subject, bytes(data), timeout=API_TIMEOUT_S, headers=hdrs or None)
            except nats.errors.NoRespondersError:
                # Nobody stored it: find out why, for a clear error (raises if the stream is missing).
                await self._api(nc, f"$JS.API.STREAM.INFO.{s.stream}")
                raise StreamNotFoundError(
                    f"stream {s.stream!r} on {s.safe_servers()} does not capture subject {subject!r}", stream=s.stream
                ) from None
            except (nats.errors.TimeoutError, asyncio.TimeoutError):
                raise JetStreamTimeoutError(
                    f"no PubAck from {s.safe_servers()} for {subject} within {API_TIMEOUT_S}s"
                ) from None
            try:
                ack = json.loads(msg.data)
            except ValueError:
                raise JetStreamAPIError(f"publish to {subject}: not a PubAck: {msg.data[:200]!r}") from None
            err = ack.get("error")
            if err:
                raise JetStreamAPIError(
                    f"publish to {subject} failed: {err.get('description')}",
                    code=err.get("code"), err_code=err.get("err_code"), description=err.get("description"),
                )
            if ack.get("stream") != s.stream:
                raise StreamNotFoundError(
                    f"subject {subject!r} was stored by stream {ack.get('stream')!r}, not {s.stream!r}", stream=s.stream
                )
            return int(ack["seq"])

    # ---- sync wrappers -------------------------------------------------------------------

    def stream_info(self, stream: str | None = None) -> dict:
        """Sync :meth:`astream_info`."""
        return _run(self.astream_info(stream), "stream_info")

    def interval_status(
        self, end_time: dt.datetime | int, *, settle_seconds: float, subject_filter: str | None = None
    ) -> dict[str, Any]:
        """Sync :meth:`ainterval_status`."""
        return _run(self.ainterval_status(end_time, settle_seconds=settle_seconds, subject_filter=subject_filter),
                    "interval_status")

    def list_subjects(self, filter: str = "plgd.>") -> dict[str, int]:  # noqa: A002
        """Sync :meth:`alist_subjects`."""
        return _run(self.alist_subjects(filter), "list_subjects")

    def list_owners(self) -> dict[str, dict[str, int]]:
        """Sync :meth:`alist_owners`."""
        return _run(self.alist_owners(), "list_owners")

    def count_messages(
        self,
        filter: str,  # noqa: A002
        *,
        start_time: dt.datetime | int | None = None,
        end_time: dt.datetime | int | None = None,
        start_seq: int | None = None,
        end_seq: int | None = None,
    ) -> int:
        """Sync :meth:`acount_messages`."""
        coro = self.acount_messages(
            filter, start_time=start_time, end_time=end_time, start_seq=start_seq, end_seq=end_seq
        )
        return _run(coro, "count_messages")

    def count_interval(self, filters: list[str] | tuple[str, ...], **bounds: Any) -> dict[str, Any]:
        """Sync :meth:`acount_interval` (same arguments)."""
        return _run(self.acount_interval(filters, **bounds), "count_interval")

    def publish(
        self, subject: str, data: bytes, *, msg_id: str | None = None, headers: dict[str, str] | None = None
    ) -> int:
        """Sync :meth:`apublish`."""
        return _run(self.apublish(subject, data, msg_id=msg_id, headers=headers), "publish")

    def iter_batches(
        self,
        filter: str,  # noqa: A002
        *,
        start_time: dt.datetime | int | None = None,
        end_time: dt.datetime | int | None = None,
        start_seq: int | None = None,
        end_seq: int | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> Iterator[list[StreamMessage]]:
        """Sync generator over :meth:`aiter_batches` (same arguments).

        Drives a private event loop one batch at a time, so memory stays bounded; closing the
        generator (or leaving a ``for`` loop) deletes the consumer. Between batches the loop is
        idle: pauses longer than ``ITER_INACTIVE_THRESHOLD_S`` (120 s) let the server remove the
        consumer, and the next batch then fails with :class:`JetStreamAPIError`.
        """
        _no_running_loop("iter_batches")
        loop = asyncio.new_event_loop()
        agen = self.aiter_batches(
            filter, start_time=start_time, end_time=end_time, start_seq=start_seq, end_seq=end_seq,
            batch_size=batch_size,
        )
        try:
            while True:
                try:
                    batch = loop.run_until_complete(agen.__anext__())
                except StopAsyncIteration:
                    return
                yield batch
        finally:
            try:
                loop.run_until_complete(agen.aclose())
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    def test_connection(self) -> tuple[bool, str]:
        """Connect and read the stream state (Airflow's "Test connection" button).

        :return: ``(True, "... N messages, B bytes, first seq F, last seq L")`` or
            ``(False, <clear error message>)``; never raises for server-side problems.
        """
        try:
            s = self.get_settings()
            info = self.stream_info()
        except (JetStreamError, ValueError) as exc:
            return False, f"{type(exc).__name__}: {exc}"
        st = info.get("state", {})
        return True, (
            f"Connected to {s.safe_servers()}; stream {info.get('config', {}).get('name', s.stream)}: "
            f"{st.get('messages', 0)} messages, {st.get('bytes', 0)} bytes, "
            f"first seq {st.get('first_seq', 0)}, last seq {st.get('last_seq', 0)}"
        )


# --------------------------------------------------------------------------------------------
# pull reader


_DONE = object()
_new_tuple = tuple.__new__  # builds a StreamMessage without the NamedTuple __new__ frame


class _PullReader:
    """Pull-request pipeline of one consumer into one inbox subscription (see ``aiter_batches``).

    Pull requests are served by the server in order; ``self._pulls`` holds ``[id, remaining]``
    of the pulls in flight, the head receives the messages. A full pull, or a pull ended by a
    status, becomes one batch in ``self._queue``. New pulls are sent only by :meth:`next_batch`
    so that pulls in flight + batches waiting <= ``PREFETCH_PULLS``.
    """

    def __init__(self, nc: Any, stream: str, consumer: str, *, last_seq: int, start_seq: int, start_ns: int,
                 end_ns: float, batch_size: int, max_bytes: int, where: str) -> None:
        self.nc = nc
        self.stream = stream
        self.consumer = consumer
        self.last_seq = last_seq
        self.start_seq = start_seq
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.batch_size = batch_size
        self.max_bytes = max_bytes
        self.where = where
        self.inbox = nc.new_inbox()
        self.next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self.pull_body = json.dumps(
            {"batch": batch_size, "max_bytes": max_bytes, "expires": int(PULL_EXPIRES_S * _NS)}
        ).encode()
        self.sub = None
        self._pulls: collections.deque[list] = collections.deque()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._batch: list[StreamMessage] = []
        self._batch_bytes = 0
        self._done = False
        self._next_cseq = 1
        self._pull_id = 0
        self._owed = 0  # messages still due to pulls already ended by a status

    async def start(self) -> None:
        # Slack for pulls in flight: the byte cap bounds memory, these limits only must not drop.
        limit = (PREFETCH_PULLS + 1) * self.batch_size + 100
        self.sub = await self.nc.subscribe(
            self.inbox + ".*", cb=self._on_msg, pending_msgs_limit=limit, pending_bytes_limit=0
        )
        await self._refill()

    async def stop(self) -> None:
        self._done = True
        if self.sub is not None:
            with contextlib.suppress(Exception):
                await self.sub.unsubscribe()
            self.sub = None

    async def _refill(self) -> None:
        import nats.errors

        while not self._done and len(self._pulls) + self._queue.qsize() < PREFETCH_PULLS:
            self._pull_id += 1
            self._pulls.append([str(self._pull_id), self.batch_size])
            try:
                await self.nc.publish(self.next_subject, self.pull_body, reply=f"{self.inbox}.{self._pull_id}")
            except nats.errors.Error as exc:  # e.g. ConnectionClosedError when the server goes away
                raise JetStreamConnectionError(
                    f"connection to {self.where} lost while reading stream {self.stream} "
                    f"({type(exc).__name__})"
                ) from exc

    async def next_batch(self) -> list[StreamMessage] | None:
        """The next batch, or None when the iteration is complete."""
        waited = 0.0
        while True:
            try:
                item = await asyncio.wait_for(self._queue.get(), 1.0)
                break
            except asyncio.TimeoutError:
                waited += 1.0
                if self.nc.is_closed or not self.nc.is_connected:
                    raise JetStreamConnectionError(
                        f"connection to {self.where} lost while reading stream {self.stream}"
                    ) from None
                reading = getattr(self.nc, "_reading_task", None)  # nats-py 2.x: its read loop
                if reading is not None and reading.done():
                    # nats-py ends its read loop on an unexpected parser error and only logs it
                    # ("nats: encountered error"); the connection looks open but nothing is read.
                    raise JetStreamConnectionError(
                        f"the NATS client stopped reading from {self.where} while reading stream {self.stream} "
                        f"(consumer {self.consumer}, last delivered consumer sequence {self._next_cseq - 1}): "
                        "its read loop ended on an error logged as 'nats: encountered error'"
                    ) from None
                if waited > PULL_EXPIRES_S + 10:
                    raise JetStreamTimeoutError(
                        f"no message or status from {self.where} for consumer {self.consumer} of stream "
                        f"{self.stream} within {waited:.0f}s"
                    ) from None
        if item is _DONE:
            return None
        if isinstance(item, BaseException):
            raise item
        await self._refill()
        return item

    def _flush(self) -> None:
        if self._batch:
            self._queue.put_nowait(self._batch)
            self._batch = []
            self._batch_bytes = 0

    def _finish(self, error: BaseException | None = None) -> None:
        if self._done:
            return
        self._done = True
        if error is None:
            self._flush()
            self._queue.put_nowait(_DONE)
        else:
            self._queue.put_nowait(error)

    async def _on_msg(self, msg: Any) -> None:
        # Hot path (once per message): keep it flat.
        if self._done:
            return
        try:
            reply = msg.reply
            if not reply:
                self._on_status(msg)
                return
            t = reply.split(".")
            if len(t) == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
                sseq, cseq, ts, pending = int(t[5]), int(t[6]), int(t[7]), int(t[8])
            else:
                sseq, cseq, ts, pending = parse_ack_reply(reply)
            if cseq != self._next_cseq:
                raise JetStreamError(
                    f"consumer {self.consumer}: expected delivery {self._next_cseq}, got {cseq}; "
                    "messages were lost (slow consumer?)"
                )
            self._next_cseq = cseq + 1
            last = self.last_seq
            if ts >= self.end_ns or sseq > last:
                self._finish()
                return
            if sseq >= self.start_seq and ts >= self.start_ns:
                data = msg.data
                size = self._batch_bytes + len(data)
                if size > self.max_bytes and self._batch:  # keep each batch within the pull byte cap
                    self._flush()
                    size = len(data)
                self._batch_bytes = size
                self._batch.append(_new_tuple(StreamMessage, (sseq, msg.subject, ts, msg.headers, data)))
            if sseq >= last or pending == 0:
                self._finish()
                return
            if self._owed:
                self._owed -= 1
                return
            pulls = self._pulls
            if pulls:
                head = pulls[0]
                head[1] -= 1
                if head[1] <= 0:
                    pulls.popleft()
                    self._flush()
        except BaseException as exc:  # surfaces in next_batch()
            self._finish(exc)

    def _on_status(self, msg: Any) -> None:
        hdr = msg.headers or {}
        status = hdr.get("Status", "")
        desc = next((v for k, v in hdr.items() if k == "Description"), "")
        if status == "100":  # idle heartbeat / flow control: nothing to do
            return
        if status in ("404", "408"):
            # No message available now (404) or the pull expired without enough (408): every
            # message up to our last sequence was stored before the consumer existed, so none is left.
            self._finish()
        elif status == "409" and ("Batch Completed" in desc or "MaxBytes" in desc):
            # The pull ended: complete by count (sent when max_bytes is set), or the next message
            # would exceed max_bytes. Nats-Pending-Messages = how many of its batch it did not get.
            undelivered = hdr.get("Nats-Pending-Messages")
            entry = self._end_pull(msg.subject.rsplit(".", 1)[-1], int(undelivered) if undelivered else None)
            if entry is not None and "MaxBytes" in desc and undelivered and int(undelivered) == self.batch_size:
                raise JetStreamAPIError(
                    f"a message of stream {self.stream} is larger than the pull byte cap: {desc}",
                    code=409, description=desc,
                )
        elif status == "503":
            raise JetStreamAPIError(
                f"consumer {self.consumer} of stream {self.stream} is gone (deleted, or inactive for more "
                f"than {ITER_INACTIVE_THRESHOLD_S:.0f}s)",
                code=503, description=desc,
            )
        else:
            raise JetStreamAPIError(
                f"pull from consumer {self.consumer} of stream {self.stream} failed: {status} {desc}",
                code=int(status) if status.isdigit() else None, description=desc,
            )

    def _end_pull(self, pull_id: str, undelivered: int | None) -> list | None:
        """A status ended pull ``pull_id`` early. Fix the message attribution (the status may
        arrive after messages of the next pull, or before the last of its own) and flush."""
        entry = next((p for p in self._pulls if p[0] == pull_id), None)
        if entry is None:  # already complete by count
            return None
        self._pulls.remove(entry)
        counted = self.batch_size - entry[1]
        actual = counted if undelivered is None else self.batch_size - undelivered
        if actual > counted:  # some of its messages are still on the way
            self._owed += actual - counted
        else:  # messages of later pulls were counted against this one
            excess = counted - actual
            for nxt in self._pulls:
                if not excess:
                    break
                take = min(excess, nxt[1])
                nxt[1] -= take
                excess -= take
        self._flush()
        while self._pulls and self._pulls[0][1] <= 0:
            self._pulls.popleft()
        return entry


# --------------------------------------------------------------------------------------------
# argument checks and sync helpers


def _describe_connect_error(exc: BaseException, s: JetStreamSettings) -> str:
    """A one-line reason for a failed connect, with a hint for TLS problems (no secrets)."""
    text = f"{type(exc).__name__}: {exc or 'timed out'}"
    if isinstance(exc, ssl.SSLCertVerificationError):
        hint = ("the server's certificate is not trusted: set 'tls_ca' to the CA that signed it"
                if not s.tls_ca else f"the server's certificate is not signed by tls_ca {s.tls_ca!r} "
                "or does not name this host")
        return f"TLS verification failed ({hint}): {text}"
    lowered = str(exc).lower()
    if isinstance(exc, ssl.SSLError) and "certificate required" in lowered:
        return f"the server requires a client certificate: set 'tls_cert' and 'tls_key': {text}"
    if isinstance(exc, ssl.SSLError) or "tls" in lowered or "ssl" in lowered:
        return f"TLS handshake failed: {text}"
    return text


def _check_filter(value: Any) -> None:
    if not isinstance(value, str) or not value.strip() or any(c in value for c in " \t\r\n"):
        raise ValueError(f"filter must be a NATS subject filter such as 'plgd.owners.*.>', got {value!r}")


def _check_bounds(start_time: Any, end_time: Any, start_seq: Any, end_seq: Any) -> tuple:
    start_ns = to_unix_ns(start_time, "start_time") if start_time is not None else None
    end_ns = to_unix_ns(end_time, "end_time") if end_time is not None else None
    for name, v in (("start_seq", start_seq), ("end_seq", end_seq)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    return start_ns, end_ns, start_seq, end_seq


def _no_running_loop(name: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(f"JetStreamHook.{name}() is synchronous; inside an event loop use 'await hook.a{name}(...)'")


def _run(coro: Any, name: str) -> Any:
    try:
        _no_running_loop(name)
    except RuntimeError:
        coro.close()
        raise
    return asyncio.run(coro)
