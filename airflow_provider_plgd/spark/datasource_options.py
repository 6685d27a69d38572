"""The options of the ``plgd-jetstream`` Spark data source (:mod:`.datasource`), checked and typed.

:func:`parse_options` turns the strings of ``spark.read``/``spark.readStream`` options into a
:class:`ReadOptions` (or raises ``ValueError`` naming the option and what was expected, never a
secret's value); :func:`options_from_settings` gives the options of a connection's settings;
:func:`redacted_options` is what may be logged. No pyspark here: the checks run anywhere.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from airflow_provider_plgd.coerce import non_negative_seconds, positive_int
from airflow_provider_plgd.jetstream.connection import NKEY_SEED_EXTRA, JetStreamSettings, settings_from_connection
from airflow_provider_plgd.plgd.subjects import check_filter_subject
from airflow_provider_plgd.times import to_ns

#: The data source's short name: ``spark.read.format(NAME)``.
NAME = "plgd-jetstream"
#: Default of the ``max_partition_messages`` option (messages per partition at most).
DEFAULT_MAX_PARTITION_MESSAGES = 100_000
#: Default of the ``settle_seconds`` option (s; as the interval sensor's).
DEFAULT_SETTLE_SECONDS = 60.0
#: Spark's default ``spark.redaction.regex``; :func:`redacted_options` hides the values of options
#: whose name matches it.
SECRET_OPTION = re.compile(r"(?i)secret|password|token|access[.]?key")
#: What :func:`redacted_options` shows instead of a secret (Spark's own text).
REDACTED = "*********(redacted)"
#: How connection errors name these settings (``connection '...'``).
SETTINGS_LABEL = f"{NAME} options"
#: Connection settings, by the field names of the ``plgd_jetstream`` connection type.
CONNECTION_OPTIONS = ("user", "password", "token", NKEY_SEED_EXTRA, "creds_file", "tls_ca", "tls_cert", "tls_key")
_COMMON_OPTIONS = ("servers", "stream", "subjects", "start", "start_seq", "max_partition_messages")
_BATCH_OPTIONS = ("end", "end_seq", "settle_seconds")
_STREAM_OPTIONS = ("maxmessagespertrigger",)  # Spark hands option names over in lower case


@dataclass(frozen=True)
class ReadOptions:
    """The checked options of one read (:func:`parse_options`).

    :ivar settings: connection settings (servers, stream, credentials, TLS files).
    :ivar subjects: subject filters (none: every subject of the stream).
    :ivar start_ns: ``start``, unix ns (server time), or None. :ivar end_ns: ``end`` (exclusive), or None.
    :ivar start_seq: ``start_seq`` or None. :ivar end_seq: ``end_seq`` (inclusive) or None.
    :ivar max_partition_messages: messages per partition at most (>= 1).
    :ivar settle_seconds: seconds after ``end`` on the server's clock after which it is complete.
    :ivar max_messages_per_trigger: streaming: sequences per micro-batch at most, or None.
    """

    settings: JetStreamSettings
    subjects: tuple[str, ...] = ()
    start_ns: int | None = None
    end_ns: int | None = None
    start_seq: int | None = None
    end_seq: int | None = None
    max_partition_messages: int = DEFAULT_MAX_PARTITION_MESSAGES
    settle_seconds: float = DEFAULT_SETTLE_SECONDS
    max_messages_per_trigger: int | None = None

    @property
    def stream(self) -> str:
        """The stream name."""
        return self.settings.stream

    @property
    def subject_filter(self) -> str | list[str] | None:
        """The consumers' filter: None (every subject), one filter, or a list (``filter_subjects``)."""
        if not self.subjects:
            return None
        return self.subjects[0] if len(self.subjects) == 1 else list(self.subjects)

    def describe(self) -> str:
        """``stream 'EVENTS' (subjects a, b)`` for messages."""
        return f"stream {self.stream!r} ({'subjects ' + ', '.join(self.subjects) if self.subjects else 'every subject'})"


def redacted_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with the value of every option whose name matches :data:`SECRET_OPTION` replaced
    by :data:`REDACTED` (what this module logs)."""
    return {k: REDACTED if SECRET_OPTION.search(str(k)) else v for k, v in options.items()}


def parse_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """Check the options of ``spark.read`` (``streaming`` False) or ``spark.readStream`` and
    return them typed. Names are case-insensitive; values are strings (docs/spark-datasource.md).

    :raises ValueError: an unknown option, an option of the other mode (``end``, ``end_seq``,
        ``settle_seconds`` are batch only, ``maxMessagesPerTrigger`` streaming only), ``nkey_seed``
        (use ``nkey_seed_secret``), no ``servers``, credentials inside a server URL, a bad value
        (the message names the option and what was expected; never a secret's value), ``end``
        not after ``start``, ``end_seq`` before ``start_seq``, and the connection type's checks
        (``jetstream.connection.settings_from_connection``).
    """
    opts = {str(k).lower(): v for k, v in options.items() if v is not None}
    allowed = {*CONNECTION_OPTIONS, *_COMMON_OPTIONS, *(_STREAM_OPTIONS if streaming else _BATCH_OPTIONS)}
    if "nkey_seed" in opts:
        raise ValueError(
            f"option 'nkey_seed' is not read: pass the NKEY seed as {NKEY_SEED_EXTRA!r}, a name that Spark's "
            "spark.redaction.regex hides wherever Spark shows options (the value is not shown)"
        )
    unknown = sorted(set(opts) - allowed)
    if unknown:
        other = set(_BATCH_OPTIONS if streaming else _STREAM_OPTIONS) & set(unknown)
        hint = (f"; {sorted(other)} {'are' if len(other) > 1 else 'is'} only for "
                f"{'spark.read (a bounded read)' if streaming else 'spark.readStream'}") if other else ""
        raise ValueError(f"unknown option(s) {unknown} of the {NAME} data source{hint}; expected some of "
                         f"{sorted(allowed)}")
    servers = str(opts.get("servers") or "").strip()
    if not servers:
        raise ValueError("option 'servers' is required: comma-separated NATS URLs, e.g. nats://nats:4222")
    for url in servers.split(","):
        if "@" in url.split("://", 1)[-1]:
            raise ValueError(
                "option 'servers' holds a URL with credentials before '@' (not shown): pass them as the "
                "options 'user' and 'password' or 'token', which Spark redacts"
            )
    extra = {k: opts[k] for k in ("stream", "token", NKEY_SEED_EXTRA, "creds_file", "tls_ca", "tls_cert", "tls_key")
             if opts.get(k) not in (None, "")}
    conn = SimpleNamespace(conn_id=SETTINGS_LABEL, host=None, port=None, login=opts.get("user") or None,
                           password=opts.get("password") or None, extra_dejson={**extra, "servers": servers})
    settings = settings_from_connection(conn)
    subjects = tuple(dict.fromkeys(s.strip() for s in str(opts.get("subjects") or "").split(",") if s.strip()))
    for subject in subjects:
        check_filter_subject(subject, "option 'subjects': filter")
    start_ns = to_ns(str(opts["start"]), "option 'start'") if opts.get("start") not in (None, "") else None
    end_ns = to_ns(str(opts["end"]), "option 'end'") if opts.get("end") not in (None, "") else None
    if start_ns is not None and end_ns is not None and end_ns <= start_ns:
        raise ValueError(f"option 'end' ({opts['end']}) must be after option 'start' ({opts['start']})")
    start_seq = positive_int(opts["start_seq"], "option 'start_seq'") if opts.get("start_seq") not in (None, "") else None
    end_seq = positive_int(opts["end_seq"], "option 'end_seq'") if opts.get("end_seq") not in (None, "") else None
    if start_seq is not None and end_seq is not None and end_seq < start_seq:
        raise ValueError(f"option 'end_seq' ({end_seq}) must be >= option 'start_seq' ({start_seq}) (both inclusive)")
    per_trigger = opts.get("maxmessagespertrigger")
    return ReadOptions(
        settings=settings,
        subjects=subjects,
        start_ns=start_ns,
        end_ns=end_ns,
        start_seq=start_seq,
        end_seq=end_seq,
        max_partition_messages=positive_int(opts.get("max_partition_messages", DEFAULT_MAX_PARTITION_MESSAGES),
                                            "option 'max_partition_messages'"),
        settle_seconds=non_negative_seconds(opts.get("settle_seconds", DEFAULT_SETTLE_SECONDS),
                                            "option 'settle_seconds'"),
        max_messages_per_trigger=positive_int(per_trigger, "option 'maxMessagesPerTrigger'")
        if per_trigger not in (None, "") else None,
    )


def options_from_settings(settings: JetStreamSettings) -> dict[str, str]:
    """The data source options of a ``plgd_jetstream`` connection's settings (e.g.
    ``JetStreamHook().get_settings()`` in an Airflow task that starts Spark in-process): servers,
    stream, credentials and TLS files, the empty ones left out. Holds secrets: pass it to
    ``.options(**...)``, never log it (:func:`redacted_options`)."""
    values = {
        "servers": ",".join(settings.servers), "stream": settings.stream, "user": settings.user,
        "password": settings.password, "token": settings.token, NKEY_SEED_EXTRA: settings.nkey_seed,
        "creds_file": settings.creds_file, "tls_ca": settings.tls_ca, "tls_cert": settings.tls_cert,
        "tls_key": settings.tls_key,
    }
    return {k: str(v) for k, v in values.items() if v}
