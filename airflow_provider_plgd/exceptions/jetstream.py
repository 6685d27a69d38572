"""The errors of JetStream access (the hook, the JetStream library and the Spark data source): all
derive from :class:`JetStreamError`, so callers can catch one type. Import them from
:mod:`airflow_provider_plgd.exceptions`.

Messages name the servers, stream or consumer involved and never contain credentials. Source of
the JetStream error codes: NATS server ``server/errors.json`` (``err_code`` 10059 stream not found,
10039/10076 JetStream not enabled), as returned in the ``error`` object of ``$JS.API.*`` responses.
"""

from __future__ import annotations

from airflow_provider_plgd.exceptions.base import PlgdError


class JetStreamError(PlgdError):
    """Base class of every error raised by :class:`~airflow_provider_plgd.hooks.jetstream.JetStreamHook`."""


class JetStreamConnectionError(JetStreamError):
    """No NATS server could be reached (refused, timed out, TLS failure) or the connection was
    lost during an operation. The message names the servers (without credentials)."""


class JetStreamAuthError(JetStreamError):
    """The server rejected the credentials (login/password, token, NKEY, creds file), or the
    credentials could not be used. The message never contains a secret."""


class JetStreamNotEnabledError(JetStreamError):
    """JetStream is not enabled on the server or for the account (no responder on ``$JS.API``)."""


class StreamNotFoundError(JetStreamError):
    """The stream does not exist (JetStream ``err_code`` 10059), or no stream captures a subject.

    :ivar stream: the stream name.
    """

    def __init__(self, message: str, *, stream: str) -> None:
        super().__init__(message)
        self.stream = stream


class JetStreamTimeoutError(JetStreamError):
    """The server did not answer a JetStream API request or a pull in time."""


class JetStreamAPIError(JetStreamError):
    """Any other error answer of the JetStream API.

    :ivar code: HTTP-like status code (e.g. 400, 404, 500), or None.
    :ivar err_code: JetStream error code (e.g. 10014 consumer not found), or None.
    :ivar description: the server's description.
    """

    def __init__(self, message: str, *, code: int | None = None, err_code: int | None = None,
                 description: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.err_code = err_code
        self.description = description


class MessagesExpiredError(JetStreamError):
    """The stream no longer holds every message of the requested bounds: messages were removed
    (``max_age``, ``max_msgs``, ``max_bytes``, purge) before the fetch reached them, so a batch
    committed now would silently hold less. Raised by the fetch operator before it commits.

    :ivar stream: the stream name.
    :ivar first_seq: the stream's first retained sequence when checked.
    :ivar missing_first_seq: first stream sequence that may be missing (int).
    :ivar missing_last_seq: last stream sequence that may be missing (int, ``first_seq - 1``
        or the requested ``end_seq``).
    :ivar missing_start_ns: start of the time range that may be missing (unix ns) or None (sequence bounds).
    :ivar missing_end_ns: exclusive end of that time range (unix ns) or None.
    """

    def __init__(self, message: str, *, stream: str, first_seq: int, missing_first_seq: int,
                 missing_last_seq: int, missing_start_ns: int | None = None,
                 missing_end_ns: int | None = None) -> None:
        super().__init__(message)
        self.stream = stream
        self.first_seq = first_seq
        self.missing_first_seq = missing_first_seq
        self.missing_last_seq = missing_last_seq
        self.missing_start_ns = missing_start_ns
        self.missing_end_ns = missing_end_ns


class RangeChangedError(JetStreamError):
    """A stream-sequence range no longer holds what was counted when the read was planned: a
    partition of the Spark data source ``plgd-jetstream`` read another number of messages than the
    server counted for its range and subject filters (messages purged, deleted or expired
    during the read), or the stream was deleted and re-created (its ``created`` time differs).
    The Spark task fails, so the job commits nothing; a new read plans again.

    :ivar stream: the stream name.
    :ivar first_seq: the range's first stream sequence. :ivar end_seq_exclusive: its end (exclusive).
    :ivar expected: messages counted when planned. :ivar found: messages read, or None when the
        stream itself changed.
    """

    def __init__(self, message: str, *, stream: str, first_seq: int, end_seq_exclusive: int, expected: int,
                 found: int | None) -> None:
        super().__init__(message)
        self.stream = stream
        self.first_seq = first_seq
        self.end_seq_exclusive = end_seq_exclusive
        self.expected = expected
        self.found = found


class IntervalNotCompleteError(JetStreamError):
    """A time-bounded fetch was asked for an interval that is not complete yet on the NATS
    server's clock: the stream holds no message with a server timestamp at or after the
    interval's end, and the server's time is before ``end + settle_seconds``. Messages of the
    interval may still arrive, so the fetch commits nothing. Retryable: a retry after the end
    (plus ``settle_seconds``) on the server's clock succeeds. Raised by the fetch operator; and
    by the interval sensor in deferrable mode when its wait ended without the interval being
    complete (e.g. the stream does not exist; then only the message is set, the fields are None).

    :ivar stream: the stream name.
    :ivar start_ns: interval start, unix ns (inclusive).
    :ivar end_ns: interval end, unix ns (exclusive).
    :ivar server_time_ns: the server's time when checked (``ts`` of ``$JS.API.STREAM.INFO``), unix ns.
    :ivar last_ts_ns: server timestamp of the stream's last message (unix ns), or None.
    :ivar settle_seconds: the settle time used, in seconds.
    """

    def __init__(self, message: str, *, stream: str | None = None, start_ns: int | None = None,
                 end_ns: int | None = None, server_time_ns: int | None = None, last_ts_ns: int | None = None,
                 settle_seconds: float | None = None) -> None:
        super().__init__(message)
        self.stream = stream
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.server_time_ns = server_time_ns
        self.last_ts_ns = last_ts_ns
        self.settle_seconds = settle_seconds


class StreamSourceStaleError(IntervalNotCompleteError):
    """The stream is a mirror of another stream (often across a leafnode or JetStream domain), and
    the mirror is still not current past ``end + settle_seconds + source_wait_seconds`` on the
    server's clock: its link is down or stale (``active`` grows), or it still lags. Messages of
    the interval may still wait on the other side, so the sensor, the plan and the fetch fail
    loudly instead of calling the interval complete or waiting forever.
    Retrying succeeds once the link is back and the mirror has caught up
    (:mod:`airflow_provider_plgd.jetstream.completeness`).

    :ivar upstreams: the mirror's origin, not current: ``[{"kind": "mirror" | "source", "name", "api",
        "lag", "active_ns", "contact_ns", "error"}]`` (ns; ``contact_ns``: server time of the last
        contact, or None when never in contact).
    :ivar source_wait_seconds: the limit used, in seconds.
    """

    def __init__(self, message: str, *, upstreams: list[dict], source_wait_seconds: float, **kwargs) -> None:
        super().__init__(message, **kwargs)
        self.upstreams = upstreams
        self.source_wait_seconds = source_wait_seconds


class TlsDowngradeError(PlgdError, ConnectionError):
    """Raised inside the nats-py handshake when TLS was asked for but the server's INFO does not
    require TLS (nats-py would then send CONNECT, with the credentials, in clear text)."""
