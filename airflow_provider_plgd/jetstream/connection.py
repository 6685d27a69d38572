"""Connection settings of the ``plgd_jetstream`` connection type, their fields and their checks.

Everything the client needs to know about a connection lives here (like the Amazon provider's
``utils/connection_wrapper.py``): the connection type and its extra fields (:data:`CONN_TYPE`,
:data:`CONN_FIELDS`, :data:`NKEY_SEED_EXTRA`; ``get_provider_info`` declares them to Airflow),
:class:`JetStreamSettings`, parsing of a connection object (:func:`settings_from_connection`: any
object with Airflow ``Connection``'s attributes) and the checks of server URLs and stream names.
No Airflow import: the Spark executors use it. Registering the secrets with Airflow's log masker
is the hook's (``hooks.base.mask_settings_secrets``); opening a client on the settings
(credentials, TLS, the clear-text guard) is :mod:`.client`.

Source: nats-py 2.x ``nats.connect`` options; NATS docs, "JetStream > Naming streams, consumers
and accounts".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

_log = logging.getLogger(__name__)

CONN_TYPE = "plgd_jetstream"
#: Extra that holds the NKEY user seed. Airflow redacts extras whose name contains a sensitive word
#: (``secret``, ``token``, ``password``, ...); the former name ``nkey_seed`` matches none of them.
NKEY_SEED_EXTRA = "nkey_seed_secret"


def _string_field(label: str, description: str, *, secret: bool = False, default: Any = None) -> dict:
    schema: dict[str, Any] = {"type": ["string", "null"]}
    if secret:
        schema["format"] = "password"
    if default is not None:
        schema["default"] = default
    return {"label": label, "description": description, "schema": schema}


#: Connection extra fields of ``plgd_jetstream``; one home, also used by the hook's form widgets.
CONN_FIELDS: dict[str, dict] = {
    # Airflow 3 shows an extra field's description under it but not a placeholder (placeholders
    # apply to the standard fields only), so each example is in the description.
    "servers": _string_field(
        "Servers",
        "Comma-separated nats://, tls://, ws:// or wss:// URLs, tried in order, e.g. "
        "tls://nats-1:4222,tls://nats-2:4222. No credentials in them (use Login/Password, Token or NKEY seed); "
        "no ws:// with TLS (use wss://). Overrides Host/Port when set.",
    ),
    "stream": _string_field("Stream", "JetStream stream that holds plgd events (subjects plgd.>); default EVENTS.",
                            default="EVENTS"),
    "token": _string_field("Token", "NATS authentication token.", secret=True),
    # The extra's name must contain a word Airflow treats as sensitive ("secret"): the UI and the
    # REST API redact extras by key name only (``should_hide_value_for_key``), not by ``format``.
    NKEY_SEED_EXTRA: _string_field("NKEY seed", "NKEY user seed (starts with SU).", secret=True),
    "creds_file": _string_field("Credentials file", "Path to a NATS .creds file (JWT + NKEY seed)."),
    "tls_ca": _string_field("TLS CA file", "Path to the CA certificate (PEM) that signed the server's cert."),
    "tls_cert": _string_field("TLS client certificate", "Path to the client certificate (PEM)."),
    "tls_key": _string_field("TLS client key", "Path to the client private key (PEM)."),
    "storage_root": _string_field(
        "Storage root",
        "Default root for staging and tables: a local path or an fsspec URL such as s3://bucket/plgd "
        "(s3a:// is read as s3://). S3 endpoint and credentials come from the AWS_* environment "
        "of the workers, never from this field.",
    ),
}


DEFAULT_STREAM = "EVENTS"
DEFAULT_PORT = 4222
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
    ``Credentials file ('creds_file')`` (labels from :data:`CONN_FIELDS`)."""
    return f"{CONN_FIELDS[key]['label']} ({key!r})"


def strip_userinfo(url: str) -> str:
    """``url`` without a ``user:password@`` / ``token@`` part: everything between ``://`` and the
    last ``@`` is dropped, so a password that contains ``/``, ``#``, ``?`` or ``@`` is removed too
    (the one credential stripper: NATS server URLs here, the UI links of ``links.py``)."""
    scheme, sep, rest = url.rpartition("://") if "://" in url else ("", "", url)
    if "@" not in rest:
        return url
    return f"{scheme}{sep}{rest.rsplit('@', 1)[1]}"


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
        plain = ", ".join(u for u, scheme in zip(servers, schemes, strict=True) if scheme == "ws")
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
