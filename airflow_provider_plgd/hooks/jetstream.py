"""Airflow hook for the plgd hub's NATS JetStream stream (connection type ``plgd_jetstream``): the
JetStream API client and its sync adapters.

Reads plgd events from a JetStream stream (default ``EVENTS`` on ``plgd.>``, docs/wire-format.md §1.5)
in bounded, server-side-filtered batches, counts and lists them cheaply, publishes, and opens the
durable consumer of the fetch operator's durable mode. All NATS access of the provider goes
through this hook. Its parts, one concept per module:

- :mod:`~airflow_provider_plgd.hooks.connection`: connection settings, their checks, opening a client;
- :mod:`~airflow_provider_plgd.hooks.api`: the JetStream JSON API client (requests, errors, ephemeral consumers);
- :mod:`~airflow_provider_plgd.hooks.counting`: the one counting algorithm (exact counts per sequence range);
- :mod:`~airflow_provider_plgd.hooks.messages`: :class:`StreamMessage` and the ack reply subject parser;
- :mod:`~airflow_provider_plgd.hooks.pull`: the pull engine behind :meth:`JetStreamHook.aiter_batches`;
- :mod:`~airflow_provider_plgd.hooks.durable`: the durable consumer (:meth:`JetStreamHook.adurable_consumer`).

The API client talks to the JetStream JSON API over NATS request/reply with nats-py (the
connection, subscriptions and requests are nats-py's; only the small JSON bodies are ours):
``$JS.API.STREAM.INFO.<stream>`` with ``{"subjects_filter", "offset"}`` (subject counts, paged by
the server at 100 000 subjects per answer: ``total``, ``offset``, ``limit``);
``$JS.API.CONSUMER.CREATE.<stream>.<name>`` (ephemeral consumer: ``inactive_threshold``,
``ack_policy`` none, ``deliver_policy`` ``all`` / ``by_start_time`` / ``by_start_sequence``,
``filter_subject``), ``$JS.API.CONSUMER.INFO`` (``num_pending``), ``$JS.API.CONSUMER.DELETE``.

Source: NATS docs, "JetStream wire API reference" (stream info paging, consumer create);
nats-py 2.x ``nats.connect`` options.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from typing import Any

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
from airflow_provider_plgd.get_provider_info import CONN_FIELDS, CONN_TYPE, UI_FIELD_BEHAVIOUR
from airflow_provider_plgd.hooks.connection import (
    JetStreamSettings,
    amask_settings_secrets,
    check_stream_name,
    connect,
    mask_settings_secrets,
    settings_from_connection,
)
from airflow_provider_plgd.hooks import counting
from airflow_provider_plgd.hooks.api import API_TIMEOUT_S, JetStreamApi, page_subjects
from airflow_provider_plgd.hooks.counting import COUNT_INACTIVE_THRESHOLD_S
from airflow_provider_plgd.hooks.durable import DurableConsumer
from airflow_provider_plgd.hooks.messages import StreamMessage
from airflow_provider_plgd.hooks.pull import DEFAULT_BATCH_SIZE, iterate_in_loop, read_batches
from airflow_provider_plgd.plgd.subjects import check_filter_subject, subject_owner
from airflow_provider_plgd.times import to_ns

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

    @classmethod
    def from_settings(cls, settings: JetStreamSettings) -> JetStreamHook:
        """A hook on ``settings`` instead of an Airflow connection (command-line tools,
        ``plgd-etl status --servers``): nothing is looked up, no secret is registered."""
        hook = cls(stream=settings.stream)
        hook._settings = settings
        return hook

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
            mask_settings_secrets(settings)
            self._settings = settings
        return self._settings

    async def aget_settings(self) -> JetStreamSettings:
        """Async :meth:`get_settings` (uses ``aget_connection`` and ``amask_secret`` on Airflow 3,
        which must not be replaced by the sync forms inside an event loop)."""
        if self._settings is None:
            conn = await self._aget_connection()
            settings = settings_from_connection(conn, self._stream_override)
            await amask_settings_secrets(settings)
            self._settings = settings
        return self._settings

    async def _aget_connection(self) -> Any:
        """The Airflow connection, looked up without blocking the event loop.

        Airflow 3: ``aget_connection`` first. When it says the connection "isn't defined", the sync
        lookup runs in a worker thread and its answer is used: under ``dag.test()`` /
        ``airflow dags test`` the task's in-process supervisor link has no async ``asend``
        (Task SDK 1.x ``InProcessSupervisorComms``), so the async lookup of a connection stored in
        the metadata DB fails, silently, while the sync lookup in the same task finds it. When both
        fail, the async lookup's error is raised.
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
        """The stream name in use (argument, else connection extra ``stream``, else ``EVENTS``).

        :raises ValueError: the argument is not a valid stream name (``hooks.connection.check_stream_name``).
        """
        return check_stream_name(self._stream_override) if self._stream_override else self.get_settings().stream

    @contextlib.asynccontextmanager
    async def aconnect(self) -> AsyncIterator[Any]:
        """Connect to the first reachable server and yield the nats-py client; close it on exit
        (:func:`~airflow_provider_plgd.hooks.connection.connect`: errors, TLS guard).

        A bare nats-py error raised while the client is in use (e.g. ``ConnectionClosedError``
        when the server goes away) becomes :class:`JetStreamConnectionError` naming the stream.
        """
        import nats.errors

        s = await self.aget_settings()
        async with connect(s, self.jetstream_conn_id) as nc:
            try:
                yield nc
            except nats.errors.Error as exc:
                raise JetStreamConnectionError(
                    f"connection to NATS lost while reading stream {s.stream!r} ({type(exc).__name__}: {exc}); "
                    "nothing was committed for the batch in progress, retry the task"
                ) from exc

    # ---- JetStream API ------------------------------------------------------------------

    def _client(self, nc: Any) -> JetStreamApi:
        """The JetStream API client (:mod:`.api`) over the open connection ``nc``."""
        s = self._settings
        return JetStreamApi(nc, s.safe_servers() if s else "NATS", self.log)

    async def _api(self, nc: Any, subject: str, body: dict | None = None, *, timeout: float = API_TIMEOUT_S) -> dict:
        """Send one ``$JS.API`` request and return the decoded answer (:meth:`.api.JetStreamApi.request`)."""
        return await self._client(nc).request(subject, body, timeout=timeout)

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
        self, end_time: dt.datetime | int, *, settle_seconds: float, subject_filter: str | None = None,
        source_wait_seconds: float | None = None,
    ) -> dict[str, Any]:
        """Is the interval ending at ``end_time`` complete, judged on the NATS server's clock?

        Complete when the stream holds a message (any subject) with a server timestamp at or after
        ``end_time``, or when the server's time (``ts`` of ``$JS.API.STREAM.INFO``, nats-server
        2.10+) is at or after ``end_time + settle_seconds`` and, for a mirror, its origin was in
        contact after that with ``lag`` 0; the local clock is never used. A ``settled`` decision
        on a mirror is confirmed by a second reading ``completeness.CONFIRM_SECONDS`` later.
        Rule and sources: :mod:`airflow_provider_plgd.completeness`.

        :param end_time: exclusive interval end: timezone-aware ``datetime`` or int unix ns.
        :param settle_seconds: seconds (>= 0) after the end, on the server's clock.
        :param subject_filter: when given and the interval is complete by a newer message, also
            count that filter's messages at or after the end (``newer_messages``).
        :param source_wait_seconds: seconds (>= 0) past end + settle after which a mirror that is
            still not current makes the status ``stale`` (None: the default of ``completeness``).
        :return: :func:`~airflow_provider_plgd.completeness.interval_status`'s dict plus
            ``"newer_messages": int``.
        :raises StreamNotFoundError: missing stream. :raises JetStreamAPIError: no server time
            in the answer (nats-server older than 2.10). :raises ValueError: bad arguments.
        """
        from airflow_provider_plgd.completeness import read_interval_status

        end_ns = to_ns(end_time, "end_time", text=False)
        if subject_filter is not None:
            check_filter_subject(subject_filter)
        s = await self.aget_settings()
        async with self.aconnect() as nc:
            status = await read_interval_status(lambda: self._client(nc).stream_info(s.stream), end_ns=end_ns,
                                                settle_seconds=settle_seconds,
                                                source_wait_seconds=source_wait_seconds)
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

    async def arequire_interval_complete(
        self, start_time: dt.datetime | int | None, end_time: dt.datetime | int, *, settle_seconds: Any,
        source_wait_seconds: Any = None,
    ) -> dict[str, Any]:
        """Fail unless the interval ``[start_time, end_time)`` is complete (:meth:`ainterval_status`).

        The check of the ETL's plan and of the fetch (time bounds) before they count or read.

        :return: the (complete) status.
        :raises IntervalNotCompleteError: not complete yet (retryable).
        :raises StreamSourceStaleError: a mirror's link still not current past
            ``end + settle_seconds + source_wait_seconds``.
        :raises ValueError: bad arguments.
        """
        from airflow_provider_plgd.completeness import require_interval_complete

        status = await self.ainterval_status(end_time, settle_seconds=settle_seconds,
                                             source_wait_seconds=source_wait_seconds)
        start_ns = to_ns(start_time, "start_time", text=False) if start_time is not None else None
        return require_interval_complete(status, (await self.aget_settings()).stream, start_ns)

    async def alist_subjects(self, filter: str = "plgd.>") -> dict[str, int]:  # noqa: A002
        """``{subject: number of messages}`` for the stream's subjects matching ``filter``.

        Pages through the server's ``subjects_filter`` answer (100 000 subjects per page), see
        :func:`page_subjects`.

        :raises ValueError: empty filter. :raises StreamNotFoundError: missing stream.
        """
        check_filter_subject(filter)
        s = await self.aget_settings()
        async with self.aconnect() as nc:
            return await page_subjects(lambda subj, body: self._api(nc, subj, body), s.stream, filter)

    async def alist_owners(self) -> dict[str, dict[str, int]]:
        """``{owner_id: {subject: message count}}`` from the subjects ``plgd.owners.<owner_id>.>``
        (owner id = subject token 2, docs/wire-format.md §1).

        Only owner tokens that pass :func:`~airflow_provider_plgd.plgd.subjects.subject_owner`
        are returned: JetStream stores messages published on subjects such as
        ``plgd.owners.*.registrations.x`` literally, and such a token must never become a
        subscription wildcard or a staging folder. Skipped subjects are logged (WARNING) with
        their message counts.
        """
        owners: dict[str, dict[str, int]] = {}
        skipped: dict[str, int] = {}
        for subject, count in (await self.alist_subjects("plgd.owners.>")).items():
            owner = subject_owner(subject)
            if owner is not None:
                owners.setdefault(owner, {})[subject] = count
            elif subject.count(".") >= 3:
                skipped[subject] = count
        if skipped:
            self.log.warning(
                "Ignoring %s subject(s) whose owner token is not a valid owner ID (%s messages), e.g. %s",
                len(skipped), sum(skipped.values()), sorted(skipped)[:5],
            )
        return owners

    async def _acreate_consumer(self, nc: Any, stream: str, filter_subject: str | Sequence[str] | None,
                                 **kwargs: Any) -> dict:
        """Create an ephemeral consumer (:meth:`.api.JetStreamApi.create_consumer`)."""
        return await self._client(nc).create_consumer(stream, filter_subject, **kwargs)

    async def _adelete_consumer(self, nc: Any, stream: str, name: str) -> None:
        """Delete a consumer, best effort (:meth:`.api.JetStreamApi.delete_consumer`)."""
        await self._client(nc).delete_consumer(stream, name)

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

        Bounds: ``[start_time, end_time)`` by server timestamp and ``[start_seq, end_seq]`` by
        sequence, combined with AND, and at most the stream's last sequence when called (the same
        set that :meth:`aiter_batches` would read). The one counting algorithm of the hook:
        :meth:`acount_interval` with this one filter (exact, or ``JetStreamTimeoutError``).

        :return: number of messages (>= 0).
        :raises ValueError/TypeError: bad filter or bounds. :raises StreamNotFoundError: missing stream.
        :raises JetStreamTimeoutError: matching messages kept arriving while counting.
        """
        counted = await self.acount_interval([filter], start_time=start_time, end_time=end_time,
                                             start_seq=start_seq, end_seq=end_seq, with_total=False)
        return int(counted["counts"][filter])

    async def acount_interval(
        self,
        filters: list[str] | tuple[str, ...],
        *,
        start_time: dt.datetime | int | None = None,
        end_time: dt.datetime | int | None = None,
        start_seq: int | None = None,
        end_seq: int | None = None,
        concurrency: int = 16,
        with_total: bool = True,
    ) -> dict[str, Any]:
        """What the stream holds for one interval: its stream-sequence range, and per filter a count.

        The interval is ``[start_time, end_time)`` by server timestamp and/or ``[start_seq, end_seq]``
        by stream sequence (both: their intersection), never past the stream's last sequence when
        called. Time bounds become the sequence range ``[first_seq,
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
        :param with_total: also count every subject (``total``; False: ``total`` is None).
        :return: ``{"stream", "created" (RFC 3339, the stream's creation time: it changes when the
            stream is deleted and re-created), "state" (stream state at the start: messages, bytes,
            first_seq, last_seq, first_ts, last_ts, num_deleted), "first_seq", "end_seq_exclusive",
            "total" (every subject), "counts": {filter: int}}``.
        :raises ValueError/TypeError: bad filters or bounds.
        :raises JetStreamError: server-side problems; ``JetStreamTimeoutError`` when the counts
            keep changing (more than 20 readings).
        """
        for f in filters:
            check_filter_subject(f)
        start_ns, end_ns, start_seq, end_seq = _check_bounds(start_time, end_time, start_seq, end_seq)
        s = await self.aget_settings()
        async with self.aconnect() as nc:
            return await counting.count_interval(self._client(nc), s.stream, filters, start_ns=start_ns,
                                                 end_ns=end_ns, start_seq=start_seq, end_seq=end_seq,
                                                 concurrency=concurrency, with_total=with_total)

    async def acount_ranges(
        self,
        read_filters: Sequence[str],
        *,
        start_time: dt.datetime | int,
        end_time: dt.datetime | int,
        range_messages: int,
        max_ranges: int,
        scope_filter: str = "plgd.>",
    ) -> dict[str, Any]:
        """Split an interval's stream-sequence range into contiguous ranges and count each exactly.

        The interval ``[start_time, end_time)`` by server timestamp becomes the sequence range
        ``[first_seq, end_seq_exclusive)`` (as in :meth:`acount_interval`). It is cut into
        ``n = min(max_ranges, ceil(messages / range_messages))`` ranges of equal sequence width
        (at least one), and the messages matching ``read_filters`` (one consumer with all of them
        as ``filter_subjects``) are counted in each range with one consumer per range boundary
        (:meth:`_acount_boundaries`): ``n + 1`` consumers, however many owners the stream has.

        :param read_filters: what the fetch reads: ``[scope_filter]``, or one filter per selected owner.
        :param range_messages: messages per range aimed at (>= 1); ``max_ranges``: at most this many (>= 1).
        :param scope_filter: also counted over the whole interval (``scope_total``).
        :return: ``{"stream", "created", "state", "first_seq", "end_seq_exclusive", "total" (every
            subject), "scope_total" (``scope_filter``), "read_total" (``read_filters``: the sum of the
            ranges), "ranges": [{"first_seq", "end_seq_exclusive", "count"}]}``.
        :raises ValueError/TypeError: bad filters, bounds or sizes.
        :raises JetStreamError: server-side problems; ``JetStreamTimeoutError`` when the counts keep changing.
        """
        for name, value in (("range_messages", range_messages), ("max_ranges", max_ranges)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        filters = list(dict.fromkeys(read_filters))
        if not filters:
            raise ValueError("read_filters must name at least one subject filter")
        for f in [*filters, scope_filter]:
            check_filter_subject(f)
        start_ns, end_ns, _, _ = _check_bounds(start_time, end_time, None, None)
        assert start_ns is not None and end_ns is not None  # both required by the signature
        s = await self.aget_settings()
        async with self.aconnect() as nc:
            return await counting.count_ranges(self._client(nc), s.stream, filters, start_ns=start_ns, end_ns=end_ns,
                                               range_messages=range_messages, max_ranges=max_ranges,
                                               scope_filter=scope_filter)

    async def aiter_batches(
        self,
        filter: str | Sequence[str],  # noqa: A002
        *,
        start_time: dt.datetime | int | None = None,
        end_time: dt.datetime | int | None = None,
        start_seq: int | None = None,
        end_seq: int | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> AsyncGenerator[list[StreamMessage], None]:
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

        :param filter: subject filter, e.g. ``plgd.owners.*.devices.*.metadata.>``, or a list of
            them (one consumer with ``filter_subjects``; nats-server >= 2.10).
        :param batch_size: messages per pull (>= 1).
        :raises ValueError/TypeError: bad filter, bounds or batch_size.
        :raises StreamNotFoundError: missing stream.
        :raises JetStreamConnectionError: connection lost. :raises JetStreamTimeoutError: the
            server stopped answering pulls. :raises JetStreamAPIError: consumer deleted or other
            409/503 status, or a message larger than the pull byte cap.
        """
        for f in [filter] if isinstance(filter, str) else filter:
            check_filter_subject(f)
        start_ns, end_ns, start_seq, end_seq = _check_bounds(start_time, end_time, start_seq, end_seq)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        s = await self.aget_settings()
        async with self.aconnect() as nc:
            batches = read_batches(self._client(nc), s.stream, filter, start_ns=start_ns, end_ns=end_ns,
                                   start_seq=start_seq, end_seq=end_seq, batch_size=batch_size)
            async with contextlib.aclosing(batches):
                async for batch in batches:
                    yield batch

    @contextlib.asynccontextmanager
    async def adurable_consumer(self, name: str, filters: Sequence[str], *,
                                ack_wait_seconds: float) -> AsyncIterator[DurableConsumer]:
        """Open durable pull consumer ``name`` of the stream (created on first use, ack policy
        explicit; see :class:`~airflow_provider_plgd.hooks.durable.DurableConsumer`) on a new
        connection, and yield it; the connection closes on exit.

        :param filters: its subject filters (one or more).
        :param ack_wait_seconds: how long a delivered, unacknowledged message stays invisible (s).
        :raises ValueError: bad filters, or an existing consumer that does not fit (other filters,
            ack policy, ``max_deliver``). :raises JetStreamError: server-side problems.
        """
        for f in filters:
            check_filter_subject(f)
        s = await self.aget_settings()
        async with self.aconnect() as nc:
            yield await DurableConsumer.open(nc, s.stream, name, filters, ack_wait_seconds=ack_wait_seconds)

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
        self, end_time: dt.datetime | int, *, settle_seconds: float, subject_filter: str | None = None,
        source_wait_seconds: float | None = None,
    ) -> dict[str, Any]:
        """Sync :meth:`ainterval_status`."""
        return _run(self.ainterval_status(end_time, settle_seconds=settle_seconds, subject_filter=subject_filter,
                                          source_wait_seconds=source_wait_seconds), "interval_status")

    def require_interval_complete(
        self, start_time: dt.datetime | int | None, end_time: dt.datetime | int, *, settle_seconds: Any,
        source_wait_seconds: Any = None,
    ) -> dict[str, Any]:
        """Sync :meth:`arequire_interval_complete`."""
        return _run(self.arequire_interval_complete(start_time, end_time, settle_seconds=settle_seconds,
                                                    source_wait_seconds=source_wait_seconds),
                    "require_interval_complete")

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

    def count_ranges(self, read_filters: Sequence[str], **kwargs: Any) -> dict[str, Any]:
        """Sync :meth:`acount_ranges` (same arguments)."""
        return _run(self.acount_ranges(read_filters, **kwargs), "count_ranges")

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
        yield from iterate_in_loop(self.aiter_batches(
            filter, start_time=start_time, end_time=end_time, start_seq=start_seq, end_seq=end_seq,
            batch_size=batch_size,
        ))

    def test_connection(self) -> tuple[bool, str]:
        """Connect and read the stream state (Airflow's "Test connection" button).

        :return: ``(True, "... N messages, B bytes, first seq F (time), last seq L (time)")`` (the
            first and last messages' server times, RFC 3339: where a DAG's start date can begin) or
            ``(False, <clear error message>)``; never raises for server-side problems.
        """
        try:
            s = self.get_settings()
            info = self.stream_info()
        except (JetStreamError, ValueError) as exc:
            return False, f"{type(exc).__name__}: {exc}"
        st = info.get("state", {})

        def when(key: str) -> str:  # JetStream reports 0001-01-01T00:00:00Z for an empty stream
            return f" ({st[key]})" if st.get("messages") and st.get(key) else ""

        return True, (
            f"Connected to {s.safe_servers()}; stream {info.get('config', {}).get('name', s.stream)}: "
            f"{st.get('messages', 0)} messages, {st.get('bytes', 0)} bytes, "
            f"first seq {st.get('first_seq', 0)}{when('first_ts')}, last seq {st.get('last_seq', 0)}{when('last_ts')}"
        )


# --------------------------------------------------------------------------------------------
# argument checks and sync helpers


def _check_bounds(start_time: Any, end_time: Any, start_seq: Any, end_seq: Any) -> tuple:
    start_ns = to_ns(start_time, "start_time", text=False) if start_time is not None else None
    end_ns = to_ns(end_time, "end_time", text=False) if end_time is not None else None
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
